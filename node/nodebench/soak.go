package nodebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/gateway"
)

// SoakOptions configures Soak.
type SoakOptions struct {
	// Binary is the clawmesh binary run as the node (required).
	Binary string
	// Clients, if positive, send the load closed loop: each sends its
	// next call when the last one is answered, as fast as the node
	// answers; Rate is then ignored. Otherwise Rate calls a second are
	// sent open loop.
	Clients     int
	Rate        int           // calls a second, open loop (required without Clients)
	Duration    time.Duration // of the load (required)
	Idle        time.Duration // measured after the load
	Every       time.Duration // between samples (required)
	MaxSessions int           // the node's --max-sessions (0: its default)
	SessionDone bool          // end each conversation (X-Session-Done)
	MemoryLimit string        // the node's --memory-limit ("": its default)
	NodeLog     io.Writer     // where the node's log goes too (nil: kept for errors)
	// Progress gets a line per sample as the soak runs (nil: none).
	Progress io.Writer
}

// Validate reports options Soak cannot run.
func (o SoakOptions) Validate() error {
	if o.Binary == "" {
		return errors.New("nodebench: no binary to run as the node")
	}
	if (o.Rate <= 0 && o.Clients <= 0) || o.Clients < 0 || o.Duration <= 0 || o.Idle < 0 || o.Every <= 0 || o.MaxSessions < 0 {
		return errors.New("nodebench: the rate (or the clients), duration and time between samples must be positive, the idle time and sessions not negative")
	}
	return nil
}

// SoakSample is one look at the node under a soak.
type SoakSample struct {
	At       float64 `json:"at_s"` // seconds since the load started
	RSS      int64   `json:"rss_bytes"`
	CPU      float64 `json:"cpu_percent"` // of one core, since the last sample
	Sent     int64   `json:"sent"`
	Answered int64   `json:"answered"`
	Failed   int64   `json:"failed"`
	// Scored, Backlog and Shed are the node's scorer counters
	// (node.ScorerStats): the scoring lag is Backlog.
	Scored  uint64 `json:"scored"`
	Backlog int    `json:"backlog"`
	Shed    uint64 `json:"shed"`
	// Unrecorded counts the calls the gateway served without recording.
	Unrecorded uint64 `json:"unrecorded"`
	// ClosuresWaiting are the closures (ends of steps) queued for the
	// gateway's background writer; ClosuresDropped those it had no room for.
	ClosuresWaiting int    `json:"closures_waiting"`
	ClosuresDropped uint64 `json:"closures_dropped"`
}

// The goals of a node under stress at its defaults (`clawmesh bench
// soak`): resident memory at most GoalSoakRSS, and flat over the last
// minute of the load (growing by at most GoalSoakSlope bytes a minute).
const (
	GoalSoakRSS   = 300 << 20
	GoalSoakSlope = 5 << 20
)

// SoakResult is what `clawmesh bench soak --json` prints.
type SoakResult struct {
	Clients     int     `json:"clients,omitempty"` // closed loop; 0: open loop at Rate
	Rate        int     `json:"rate,omitempty"`
	DurationS   float64 `json:"duration_s"`
	IdleS       float64 `json:"idle_s"`
	MaxSessions int     `json:"max_sessions,omitempty"`
	MemoryLimit string  `json:"memory_limit,omitempty"`
	SessionDone bool    `json:"session_done"`
	Sent        int64   `json:"sent"`
	Answered    int64   `json:"answered"`
	Failed      int64   `json:"failed"`
	// NotSent counts the calls the load generator skipped because 2,048
	// were already in flight (the node answering slower than the rate).
	NotSent int64 `json:"not_sent"`
	// RSS: after start-up (the reward plugins compiled, before the load),
	// the highest seen, at the end of the load and at the end of the idle
	// time.
	RSSStart int64 `json:"rss_start_bytes"`
	RSSPeak  int64 `json:"rss_peak_bytes"`
	RSSLoad  int64 `json:"rss_end_of_load_bytes"`
	RSSIdle  int64 `json:"rss_end_of_idle_bytes"`
	// RSSAt120 is the RSS 120 s into the load (0 if it was shorter), and
	// SlopeLastMin how fast the RSS grew over the last minute of the load,
	// in bytes a minute (a least-squares fit of the samples; the whole
	// load if shorter). Met says whether the peak under load and the
	// slope meet GoalSoakRSS and GoalSoakSlope.
	RSSAt120     int64   `json:"rss_at_120s_bytes"`
	SlopeLastMin float64 `json:"slope_last_min_bytes_per_min"`
	GoalRSS      int64   `json:"goal_rss_bytes"`
	GoalSlope    int64   `json:"goal_slope_bytes_per_min"`
	Met          bool    `json:"met"`
	// ScoredPerS is the scorer's rate over the load; AnsweredPerS the
	// calls' rate. BacklogEnd is the scoring lag when the load stopped,
	// DrainS how long the scorer then took to empty it (-1: not within
	// the idle time).
	ScoredPerS   float64      `json:"scored_per_s"`
	AnsweredPerS float64      `json:"answered_per_s"`
	BacklogPeak  int          `json:"backlog_peak"`
	BacklogEnd   int          `json:"backlog_end_of_load"`
	Shed         uint64       `json:"shed"`
	DrainS       float64      `json:"drain_s"`
	Samples      []SoakSample `json:"samples"`
}

// Soak runs o.Binary as a node in front of a scripted upstream, sends it
// Rate calls a second for Duration (each call its own conversation), then
// leaves it idle for Idle, sampling its resident memory, CPU and scorer
// counters (from /proc, Linux only, and its admin API).
func Soak(ctx context.Context, o SoakOptions) (*SoakResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	progress := o.Progress
	dir, err := os.MkdirTemp("", "clawmesh-bench-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	upstream, err := scriptedUpstream(ctx)
	if err != nil {
		return nil, err
	}

	data := filepath.Join(dir, "data")
	args := []string{"node", "--data", data, "--listen", "127.0.0.1:0", "--log", "warn", "--log-requests=false",
		"--upstream", upstream, "--min-free", "0"}
	if o.MaxSessions > 0 {
		args = append(args, "--max-sessions", strconv.Itoa(o.MaxSessions))
	}
	if o.MemoryLimit != "" {
		args = append(args, "--memory-limit", o.MemoryLimit)
	}
	n, err := startNode(ctx, o.Binary, data, args, nil, o.NodeLog)
	if err != nil {
		return nil, err
	}
	defer stop(n.cmd)
	base, admin, pid := "http://"+n.addr, n.admin, n.cmd.Process.Pid

	rate := o.Rate
	if o.Clients > 0 {
		rate = 0
	}
	r := &SoakResult{Clients: o.Clients, GoalRSS: GoalSoakRSS, GoalSlope: GoalSoakSlope, Rate: rate, DurationS: o.Duration.Seconds(), IdleS: o.Idle.Seconds(), MaxSessions: o.MaxSessions, MemoryLimit: o.MemoryLimit, SessionDone: o.SessionDone, DrainS: -1}
	r.RSSStart, err = rss(pid)
	if err != nil {
		return nil, fmt.Errorf("reading /proc (Linux only): %w", err)
	}
	// The peak counts the start too: the heap the plugins' compilation
	// left may be returned to the system under the load.
	r.RSSPeak = r.RSSStart

	var sent, answered, failed, notSent atomic.Int64
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}
	var inflight sync.WaitGroup
	sem := make(chan struct{}, 2048) // calls in flight at most
	call := func(k int64) {
		defer inflight.Done()
		defer func() { <-sem }()
		body := fmt.Sprintf(`{"model":"soak","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"call %d: say something"}]}`, k)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		if o.SessionDone {
			req.Header.Set("X-Session-Done", "true")
		}
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			failed.Add(1)
			return
		}
		answered.Add(1)
	}

	start := time.Now()
	ticks0, _ := cpuTicks(pid)
	lastTicks, lastAt := ticks0, start
	var mu sync.Mutex // one sample at a time
	sample := func() SoakSample {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		s := SoakSample{At: now.Sub(start).Seconds(), Sent: sent.Load(), Answered: answered.Load(), Failed: failed.Load()}
		s.RSS, _ = rss(pid)
		if t, err := cpuTicks(pid); err == nil {
			s.CPU = float64(t-lastTicks) / now.Sub(lastAt).Seconds() // ticks are 1/100 s
			lastTicks, lastAt = t, now
		}
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		if sc, err := admin.Scorer(sctx); err == nil {
			s.Scored, s.Backlog, s.Shed = sc.Scored, sc.Backlog, sc.Shed
		}
		h := health(sctx, base)
		s.Unrecorded, s.ClosuresWaiting, s.ClosuresDropped = h.Unrecorded, h.ClosuresWaiting, h.ClosuresDropped
		scancel()
		r.RSSPeak = max(r.RSSPeak, s.RSS)
		r.BacklogPeak = max(r.BacklogPeak, s.Backlog)
		r.Samples = append(r.Samples, s)
		if progress != nil {
			fmt.Fprintf(progress, "%6.0fs  rss %7.1f MiB  cpu %4.0f%%  answered %8d  failed %d  unrecorded %d  closing %6d (dropped %d)  scored %8d  backlog %6d  shed %d\n",
				s.At, float64(s.RSS)/(1<<20), s.CPU, s.Answered, s.Failed, s.Unrecorded, s.ClosuresWaiting, s.ClosuresDropped, s.Scored, s.Backlog, s.Shed)
		}
		return s
	}

	if o.Clients > 0 {
		// Closed loop: each client sends its next call once the last is
		// answered; samples on their own clock.
		var next atomic.Int64
		loadEnd := start.Add(o.Duration)
		for range o.Clients {
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				for time.Now().Before(loadEnd) && ctx.Err() == nil {
					sem <- struct{}{}
					sent.Add(1)
					inflight.Add(1)
					call(next.Add(1) - 1)
				}
			}()
		}
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			t := time.NewTicker(o.Every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-t.C:
					if !now.Before(loadEnd) {
						return
					}
					sample()
				}
			}
		}()
		inflight.Wait()
		<-sampled
	}
	// Open loop: call k leaves at start + k/Rate, whatever the replies do.
	total := int64(rate) * int64(o.Duration/time.Millisecond) / 1000
	nextSample := start.Add(o.Every)
	for k := int64(0); k < total; k++ {
		at := start.Add(time.Duration(k) * time.Second / time.Duration(rate))
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(d):
			}
		}
		if time.Now().After(nextSample) {
			go sample() // not on the sender's path
			nextSample = nextSample.Add(o.Every)
		}
		select {
		case sem <- struct{}{}:
			sent.Add(1)
			inflight.Add(1)
			go call(k)
		default:
			notSent.Add(1) // the load generator's own bound on calls in flight
		}
	}
	inflight.Wait()
	loadEnd := sample()
	r.RSSLoad = loadEnd.RSS
	r.BacklogEnd = loadEnd.Backlog
	loadSecs := loadEnd.At
	r.ScoredPerS = float64(loadEnd.Scored) / loadSecs
	r.AnsweredPerS = float64(loadEnd.Answered) / loadSecs
	r.RSSAt120, r.SlopeLastMin = loadFigures(r.Samples, loadSecs)
	r.Met = r.RSSPeak <= r.GoalRSS && r.SlopeLastMin <= float64(r.GoalSlope)

	// Idle: the backlog drains, memory settles.
	idleStart := time.Now()
	for time.Since(idleStart) < o.Idle {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.Every):
		}
		s := sample()
		if s.Backlog == 0 && r.DrainS < 0 {
			r.DrainS = time.Since(idleStart).Seconds()
		}
		r.RSSIdle = s.RSS
	}
	last := r.Samples[len(r.Samples)-1]
	r.Sent, r.Answered, r.Failed, r.Shed, r.NotSent = sent.Load(), last.Answered, last.Failed, last.Shed, notSent.Load()
	return r, nil
}

// loadFigures returns, from the samples of a load that lasted end seconds,
// the RSS at 120 s (the first sample from then on; 0 if none) and the
// least-squares slope of the RSS over the last minute, in bytes a minute.
func loadFigures(samples []SoakSample, end float64) (at120 int64, slope float64) {
	for _, s := range samples {
		if s.At >= 120 && s.At <= end {
			at120 = s.RSS
			break
		}
	}
	var n, sx, sy, sxx, sxy float64
	for _, s := range samples {
		if s.At < end-60 || s.At > end {
			continue
		}
		x, y := s.At/60, float64(s.RSS)
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	if d := n*sxx - sx*sx; n >= 2 && d != 0 {
		slope = (n*sxy - sx*sy) / d
	}
	return at120, slope
}

// adminClient is a client of the admin API of the node running on the
// data directory data, as the commands that ask a running node find it.
func adminClient(data string) (*node.Client, error) {
	if hc, ok := adminapi.SocketClient(data); ok {
		return &node.Client{Base: adminapi.SocketBase, HTTP: hc}, nil
	}
	addr, err := node.ReadAddr(data)
	if err != nil {
		return nil, fmt.Errorf("no node runs on %s", data)
	}
	return &node.Client{Base: "http://" + addr, Token: adminapi.ClientToken(data, "")}, nil
}

// health reads the gateway's /clawmesh/v1/health.
func health(ctx context.Context, base string) gateway.Health {
	var h gateway.Health
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/clawmesh/v1/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return h
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&h)
	return h
}

// Print writes the soak's figures for a person.
func (r *SoakResult) Print(w io.Writer) {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	if r.Clients > 0 {
		fmt.Fprintf(w, "load      %d clients, closed loop, for %.0fs, each call its own conversation", r.Clients, r.DurationS)
	} else {
		fmt.Fprintf(w, "load      %d calls/s for %.0fs, each its own conversation", r.Rate, r.DurationS)
	}
	if r.SessionDone {
		fmt.Fprint(w, " (ended with X-Session-Done)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "calls     %d sent, %d answered (%.0f/s), %d failed; %d not sent (2,048 already in flight)\n", r.Sent, r.Answered, r.AnsweredPerS, r.Failed, r.NotSent)
	fmt.Fprintf(w, "memory    rss %s after start-up, %s at most, %s when the load stopped, %s after %.0fs idle\n",
		mib(r.RSSStart), mib(r.RSSPeak), mib(r.RSSLoad), mib(r.RSSIdle), r.IdleS)
	verdict := "met"
	if !r.Met {
		verdict = "NOT MET"
	}
	at120 := "-"
	if r.RSSAt120 > 0 {
		at120 = mib(r.RSSAt120)
	}
	fmt.Fprintf(w, "          rss %s at 120s, %s at %.0fs; over the last minute %+.1f MiB/min; goal <= %s at most and <= %+.1f MiB/min: %s\n",
		at120, mib(r.RSSLoad), r.DurationS, r.SlopeLastMin/(1<<20), mib(r.GoalRSS), float64(r.GoalSlope)/(1<<20), verdict)
	fmt.Fprintf(w, "scoring   %.0f steps/s during the load; backlog %d at most, %d when the load stopped; %d shed", r.ScoredPerS, r.BacklogPeak, r.BacklogEnd, r.Shed)
	if r.DrainS >= 0 {
		fmt.Fprintf(w, "; drained %.0fs after\n", r.DrainS)
	} else {
		fmt.Fprintln(w, "; not drained within the idle time")
	}
}

// scriptedUpstream runs the scripted LLM server the node benchmarks load a
// node with, until ctx is done, and returns its base URL with /v1.
func scriptedUpstream(ctx context.Context) (string, error) {
	up := fakeupstream.New(fakeupstream.Script{Forget: true, Turns: []fakeupstream.Turn{{Text: "The quick brown fox jumps over the lazy dog, twice over, as a reply."}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go up.Run(ctx, ln)
	return "http://" + ln.Addr().String() + "/v1", nil
}

// benchNode is a node process a benchmark started, its reward plugins ready.
type benchNode struct {
	cmd    *exec.Cmd
	addr   string // the gateway's host:port
	admin  *node.Client
	stderr *bytes.Buffer
}

// startNode runs bin with args as a node on data (env added to this
// process's environment, its stderr also to log when not nil), and waits
// until it listens and its reward plugins are ready. On success the caller
// stops it with stop(n.cmd).
func startNode(ctx context.Context, bin, data string, args, env []string, log io.Writer) (*benchNode, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	n := &benchNode{cmd: cmd, stderr: &bytes.Buffer{}}
	cmd.Stderr = n.stderr
	if log != nil {
		cmd.Stderr = io.MultiWriter(n.stderr, log)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			stop(cmd)
		}
	}()
	for i := 0; i < 1200 && n.addr == ""; i++ { // start-up compiles the plugins: up to 2 min
		if a, err := node.ReadAddr(data); err == nil {
			n.addr = a
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if n.addr == "" {
		return nil, fmt.Errorf("the node did not start: %s", n.stderr.String())
	}
	var err error
	if n.admin, err = adminClient(data); err != nil {
		return nil, err
	}
	// The reward plugins compile at a node's first start (seconds).
	for i := 0; ; i++ {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		sc, err := n.admin.Scorer(sctx)
		scancel()
		if err == nil && sc.Ready {
			break
		}
		if i == 1800 { // 3 min
			return nil, fmt.Errorf("the node's reward plugins were not ready after 3 minutes (%v): %s", err, n.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ok = true
	return n, nil
}
