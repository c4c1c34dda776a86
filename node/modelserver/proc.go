package modelserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process states, as Status reports them.
const (
	StateStarting = "starting" // spawned, not answering its health check yet
	StateReady    = "ready"    // answering
	StateBackoff  = "restarting"
	StateFailed   = "failed" // gave up: it crashed MaxRestarts times in a row before it answered
	StateStopped  = "stopped"
)

// procConfig is one supervised model server process.
type procConfig struct {
	name   string                  // for logs: "llama-server v3"
	bin    string                  // the program
	args   func(port int) []string // its arguments, for a port to listen on
	health string                  // the path answered 200 once it serves
	log    string                  // the file its stdout and stderr are appended to
	logger *slog.Logger
	t      Timing
}

// proc runs one model server process and keeps it running: it picks a
// free loopback port for each start, polls the health path, restarts the
// process when it exits or stops answering (with backoff, up to
// Timing.MaxRestarts times in a row without it ever answering), and stops
// it on stop. Its proxy is the stable address in front of it.
type proc struct {
	cfg   procConfig
	log   *slog.Logger
	proxy *proxy

	mu       sync.Mutex
	state    string
	pid      int
	port     int
	starts   int   // processes spawned
	err      error // why it failed for good
	changed  chan struct{}
	stopping bool

	stop chan struct{} // closed by close
	done chan struct{} // closed once the loop has ended and the process is gone
	once sync.Once
}

// startProc starts the process and its supervising loop; it does not wait
// for the process to answer (see ready).
func startProc(cfg procConfig) (*proc, error) {
	px, err := newProxy(cfg.logger)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.log), 0o700); err != nil {
		px.close()
		return nil, fmt.Errorf("modelserver: log directory: %w", err)
	}
	p := &proc{cfg: cfg, log: cfg.logger.With("server", cfg.name), proxy: px, state: StateStarting,
		changed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p, nil
}

// set changes the state and wakes those waiting on it.
func (p *proc) set(state string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == state && err == nil {
		return
	}
	p.state = state
	if err != nil {
		p.err = err
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// Status is what a process is doing.
type Status struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	PID      int    `json:"pid,omitempty"`
	Port     int    `json:"port,omitempty"`
	Starts   int    `json:"starts"`
	InFlight int64  `json:"in_flight"`
	Log      string `json:"log"`
	Err      string `json:"error,omitempty"`
}

func (p *proc) status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Status{Name: p.cfg.name, State: p.state, PID: p.pid, Port: p.port, Starts: p.starts, InFlight: p.proxy.inFlight(), Log: p.cfg.log}
	if p.err != nil && p.state == StateFailed {
		s.Err = p.err.Error()
	}
	return s
}

// ready waits until the process answers its health check, and fails once
// it has failed for good, is stopped, or ctx is done.
func (p *proc) ready(ctx context.Context) error {
	for {
		p.mu.Lock()
		state, err, ch := p.state, p.err, p.changed
		p.mu.Unlock()
		switch state {
		case StateReady:
			return nil
		case StateFailed:
			return err
		case StateStopped:
			return fmt.Errorf("%w: %s was stopped", ErrStopped, p.cfg.name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// close stops the process (SIGTERM, then SIGKILL after Timing.StopGrace)
// and its proxy, and waits for both.
func (p *proc) close() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
	p.proxy.close()
}

// loop spawns the process and spawns it again whenever it exits, until
// stop, or until it has failed MaxRestarts times in a row.
func (p *proc) loop() {
	defer close(p.done)
	failures := 0
	for {
		answered, err := p.runOnce()
		select {
		case <-p.stop:
			p.set(StateStopped, nil)
			return
		default:
		}
		if answered {
			failures = 0
		}
		failures++
		if failures > p.cfg.t.MaxRestarts {
			err = fmt.Errorf("%w: %s: %v, %d times in a row (its log: %s)%s", ErrFailed, p.cfg.name, err, failures, p.cfg.log, logTail(p.cfg.log))
			p.log.Error("the model server keeps failing: giving up", "err", err)
			p.set(StateFailed, err)
			<-p.stop
			p.set(StateStopped, nil)
			return
		}
		wait := backoff(p.cfg.t.Backoff, p.cfg.t.MaxBackoff, failures)
		p.log.Warn("the model server stopped: restarting it", "err", err, "in", wait, "log", p.cfg.log)
		p.set(StateBackoff, nil)
		t := time.NewTimer(wait)
		select {
		case <-p.stop:
			t.Stop()
			p.set(StateStopped, nil)
			return
		case <-t.C:
		}
	}
}

// backoff is the wait before restart number n (1, 2, ...): base doubled
// each time, at most limit.
func backoff(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// runOnce runs the process once, until it exits, stops answering for
// Timing.HangAfter, does not answer within Timing.StartTimeout, or stop.
// It reports whether the process answered, and why it ended.
func (p *proc) runOnce() (answered bool, err error) {
	port, err := freePort()
	if err != nil {
		return false, err
	}
	lf, err := openLog(p.cfg.log)
	if err != nil {
		return false, err
	}
	defer lf.Close()
	// The thread that starts the server is the one Linux's parent-death
	// signal watches (sysProcAttr): it stays this goroutine's, and
	// alive, until the server has exited.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	args := p.cfg.args(port)
	cmd := exec.Command(p.cfg.bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = sysProcAttr()
	fmt.Fprintf(lf, "\n--- %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), p.cfg.bin, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(lf, "--- %v\n", err)
		return false, fmt.Errorf("starting %s: %w", p.cfg.bin, err)
	}
	fmt.Fprintf(lf, "--- pid %d\n", cmd.Process.Pid)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	p.mu.Lock()
	p.pid, p.port = cmd.Process.Pid, port
	p.starts++
	p.mu.Unlock()
	base := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p.proxy.retarget(base)
	p.set(StateStarting, nil)
	p.log.Info("model server started", "pid", cmd.Process.Pid, "port", port, "log", p.cfg.log)

	client := &http.Client{Timeout: p.cfg.t.HealthTimeout}
	// Until it answers, the health check is asked often (from 10ms,
	// doubling up to Poll), so that a server quick to load is in service
	// at once; then every Poll.
	every := min(10*time.Millisecond, p.cfg.t.Poll)
	tick := time.NewTimer(every)
	defer tick.Stop()
	started := time.Now()
	lastOK := time.Time{}
	for {
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("exited")
			}
			fmt.Fprintf(lf, "--- %s: %v\n", time.Now().UTC().Format(time.RFC3339), err)
			p.mu.Lock()
			p.pid = 0
			p.mu.Unlock()
			return answered, err
		case <-p.stop:
			p.terminate(cmd, exited)
			return answered, nil
		case <-tick.C:
		}
		if !answered {
			every = min(2*every, p.cfg.t.Poll)
		} else {
			every = p.cfg.t.Poll
		}
		tick.Reset(every)
		now := time.Now()
		if healthy(client, base+p.cfg.health) {
			lastOK = now
			if !answered {
				p.log.Info("model server ready", "pid", cmd.Process.Pid, "took", now.Sub(started).Round(time.Millisecond))
			}
			answered = true
			p.set(StateReady, nil)
			continue
		}
		switch {
		case !answered && now.Sub(started) > p.cfg.t.StartTimeout:
			p.kill(cmd, exited)
			return false, fmt.Errorf("not answering %s after %v", p.cfg.health, p.cfg.t.StartTimeout)
		case answered && now.Sub(lastOK) > p.cfg.t.HangAfter:
			p.kill(cmd, exited)
			return true, fmt.Errorf("stopped answering %s for %v", p.cfg.health, p.cfg.t.HangAfter)
		}
	}
}

// terminate asks the process group to stop, and kills it after the grace.
func (p *proc) terminate(cmd *exec.Cmd, exited <-chan error) {
	signalGroup(cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(p.cfg.t.StopGrace)
	defer t.Stop()
	select {
	case <-exited:
		signalGroup(cmd.Process.Pid, syscall.SIGKILL) // what it left behind
	case <-t.C:
		p.log.Warn("the model server did not stop in time: killing it", "pid", cmd.Process.Pid, "grace", p.cfg.t.StopGrace)
		p.kill(cmd, exited)
	}
	p.log.Info("model server stopped", "pid", cmd.Process.Pid)
}

// kill kills the process group and waits for the process.
func (p *proc) kill(cmd *exec.Cmd, exited <-chan error) {
	signalGroup(cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// healthy reports whether GET url answers 200.
func healthy(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freePort picks a free port on 127.0.0.1. Another process may take it
// before the server binds it; the server then fails to start, and is
// started again on another.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("modelserver: no free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// maxLog is the size past which a log file is moved aside (to NAME.1,
// replacing the previous one) when the process is started again.
const maxLog = 16 << 20

func openLog(path string) (*os.File, error) {
	if st, err := os.Stat(path); err == nil && st.Size() > maxLog {
		os.Rename(path, path+".1")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("modelserver: log: %w", err)
	}
	return f, nil
}

// logTail is the end of a log file, to quote in an error: its last lines,
// at most 2 KiB.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const n = 2048
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(0, st.Size()-n)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return "; it ends:\n" + s
}
