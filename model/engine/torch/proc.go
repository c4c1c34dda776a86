package torch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// errDied reports a worker that exited or closed its connection during a
// request; the engine restarts it and replays its state.
var errDied = errors.New("torch: the worker died")

// proc is one running worker (with its torchrun ranks, a process group).
type proc struct {
	cmd     *exec.Cmd
	conn    net.Conn
	frames  chan *frame // replies and events, closed when the connection ends
	readErr error       // why frames closed (valid once it is)
	exited  chan struct{}
	hello   helloMeta
	nextID  uint32
	log     *slog.Logger
	tail    *tail
	wmu     sync.Mutex
	killed  sync.Once
}

type helloMeta struct {
	Protocol  int    `json:"protocol"`
	Torch     string `json:"torch"`
	PID       int    `json:"pid"`
	CUDA      bool   `json:"cuda"`
	GPUs      int    `json:"gpus"`
	WorldSize int    `json:"world_size"`
}

// tail keeps a worker's last log lines for error messages.
type tail struct {
	mu    sync.Mutex
	lines []string
}

func (t *tail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	t.lines = append(t.lines, s)
	if len(t.lines) > 12 {
		t.lines = t.lines[len(t.lines)-12:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// startProc starts the worker and waits for its HELLO on a Unix socket in
// dir.
func startProc(ctx context.Context, o *Options, pyPath, dir string, log *slog.Logger) (*proc, error) {
	sock := filepath.Join(dir, "w.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWorker, err)
	}
	defer ln.Close()
	args := []string{"-m", "clawmesh_torch", "--socket", sock}
	if o.Procs > 1 {
		// --redirects and --tee name each stream explicitly: torch 1.13's
		// torchrun cannot parse its own default ("0") under Python 3.11.
		// The workers write nothing to stdout; stderr (their logs) is teed
		// here with a rank prefix.
		args = []string{"-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
			"--nproc_per_node", strconv.Itoa(o.Procs), "--log_dir", filepath.Join(dir, "torchrun"),
			"--redirects", "1", "--tee", "2", "--module", "clawmesh_torch", "--socket", sock}
	}
	cmd := exec.Command(o.Python, args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyPath, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1")
	if o.Device == DeviceCPU && o.Procs > 1 {
		cmd.Env = append(cmd.Env, "CLAWMESH_DIST_BACKEND=gloo", "OMP_NUM_THREADS="+strconv.Itoa(max(1, o.Threads)))
	}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, frames: make(chan *frame, 4), exited: make(chan struct{}), log: log, tail: &tail{}}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWorker, err)
	}
	var logs sync.WaitGroup
	for _, r := range []io.Reader{stderr, stdout} {
		logs.Add(1)
		go func() {
			defer logs.Done()
			forwardLogs(r, log, p.tail)
		}()
	}
	go func() {
		logs.Wait() // the pipes are read to the end before Wait closes them
		_ = cmd.Wait()
		close(p.exited)
	}()
	type accepted struct {
		c   net.Conn
		err error
	}
	ach := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ach <- accepted{c, err}
	}()
	timer := time.NewTimer(o.StartTimeout)
	defer timer.Stop()
	select {
	case a := <-ach:
		if a.err != nil {
			p.kill()
			return nil, fmt.Errorf("%w: %v", ErrWorker, a.err)
		}
		p.conn = a.c
	case <-p.exited:
		return nil, fmt.Errorf("%w: exited before connecting (%s)\n%s", ErrWorker, cmd.ProcessState, p.tail)
	case <-timer.C:
		p.kill()
		return nil, fmt.Errorf("%w: did not connect within %s\n%s", ErrWorker, o.StartTimeout, p.tail)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
	go p.readLoop()
	hello, err := p.next(ctx)
	if err != nil {
		p.kill()
		return nil, err
	}
	if hello.op != opHello {
		p.kill()
		return nil, fmt.Errorf("%w: first frame op %d, want HELLO", ErrProtocol, hello.op)
	}
	if err := json.Unmarshal(hello.meta, &p.hello); err != nil || p.hello.Protocol != ProtocolVersion {
		p.kill()
		return nil, fmt.Errorf("%w: worker speaks protocol %d (%v), want %d", ErrProtocol, p.hello.Protocol, err, ProtocolVersion)
	}
	log.Debug("worker started", "pid", p.hello.PID, "torch", p.hello.Torch, "cuda", p.hello.CUDA, "world_size", p.hello.WorldSize)
	return p, nil
}

func (p *proc) readLoop() {
	defer close(p.frames)
	for {
		f, err := readFrame(p.conn)
		if err != nil {
			p.readErr = err
			return
		}
		p.frames <- f
	}
}

// next returns the next frame from the worker, errDied when the worker
// went away, or ctx's error.
func (p *proc) next(ctx context.Context) (*frame, error) {
	select {
	case f, ok := <-p.frames:
		if !ok {
			if errors.Is(p.readErr, ErrProtocol) {
				return nil, p.readErr
			}
			// Give the process a moment to exit so the tail has its last words.
			select {
			case <-p.exited:
			case <-time.After(2 * time.Second):
			}
			return nil, fmt.Errorf("%w (%v)\n%s", errDied, p.readErr, p.tail)
		}
		return f, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *proc) send(f *frame) error {
	b, err := f.encode(nil)
	if err != nil {
		return err
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if _, err := p.conn.Write(b); err != nil {
		return fmt.Errorf("%w (%v)\n%s", errDied, err, p.tail)
	}
	return nil
}

// kill ends the worker's process group.
func (p *proc) kill() {
	p.killed.Do(func() {
		if p.conn != nil {
			p.conn.Close()
		}
		if p.cmd.Process != nil {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		}
	})
}

// stop asks the worker to exit and kills it if it has not within d.
func (p *proc) stop(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	p.nextID++
	if p.send(&frame{op: opShutdown, id: p.nextID}) == nil {
		_, _ = p.next(ctx)
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
	}
	p.kill()
	<-p.exited
}

// forwardLogs turns the worker's JSON log lines into slog records; any
// other line (a traceback, a library's warning) is logged as a warning.
func forwardLogs(r io.Reader, log *slog.Logger, t *tail) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		t.add(line)
		var rec map[string]any
		js := line
		if strings.HasPrefix(js, "[") { // torchrun's "[default0]:" before a rank's line
			if i := strings.Index(js, "]:"); i > 0 {
				js = js[i+2:]
			}
		}
		if json.Unmarshal([]byte(js), &rec) != nil {
			log.Warn("worker output", "line", line)
			continue
		}
		level := slog.LevelInfo
		switch rec["level"] {
		case "debug":
			level = slog.LevelDebug
		case "warn", "warning":
			level = slog.LevelWarn
		case "error":
			level = slog.LevelError
		}
		msg, _ := rec["msg"].(string)
		delete(rec, "level")
		delete(rec, "msg")
		attrs := make([]slog.Attr, 0, len(rec))
		for k, v := range rec {
			attrs = append(attrs, slog.Any(k, v))
		}
		log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func textLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
