// Package bench measures the gateway for `clawmesh bench gateway`: it sets
// up a scripted model server, a gateway recording into a real pool and a
// bare Go reverse proxy (net/http/httputil) on loopback, drives the same
// load through the bare proxy and through the gateway, interleaved, and
// reports the gateway's added latency against that baseline measured in the
// same run, beside the goal.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node/gateway"
	"github.com/clawmesh/clawmesh/pool"
)

// GatewayOptions configures the gateway benchmark. Zero values are defaults.
type GatewayOptions struct {
	// Rate is requests per second sent through the gateway; the same rate
	// goes to the upstream directly, interleaved. Default 1000.
	Rate int
	// Duration of the measured load; default 10s.
	Duration time.Duration
	// Warmup load before measuring; default 1s.
	Warmup time.Duration
	// Chunks per streamed reply; default 8.
	Chunks int
	// DataDir for the pool; default a temporary directory, removed after.
	DataDir string
	// Memory records into memory instead of the Pebble pool, to separate the
	// gateway's own cost from the synced write that makes a step durable.
	Memory bool
	// Realistic sends requests the size of an agent's (OpenClaw's): a
	// 40,000-character system prompt, twelve tools and a history that
	// grows by a turn per call, in sessions of Turns calls that continue
	// each other, SessionsAtOnce sessions under way at a time. Without it,
	// each call is a two-message request that is a session of its own.
	Realistic bool
	// Turns per session in the realistic mode; default 12.
	Turns int
	// SessionsAtOnce is how many realistic sessions run interleaved;
	// default 64.
	SessionsAtOnce int
	// Metrics observes every recorded call in a Prometheus histogram, as a
	// node does for its /metrics (gateway.Config.OnCall), and serves it.
	Metrics bool
}

// Latency summarises one series of measurements.
type Latency struct {
	N      int
	Errors int
	P50    time.Duration
	P99    time.Duration
}

// GatewayResult holds the figures of one run. For each kind of call the
// direct and through-gateway latencies are measured under the same
// interleaved open-loop load; Added is the difference of their percentiles.
type GatewayResult struct {
	Rate     int
	Duration time.Duration
	// Achieved is completed requests per second through the gateway.
	Achieved float64
	Series   []Series
	// Memory says steps were recorded in memory, not synced to Pebble.
	Memory bool
	// Realistic says requests were agent-sized (see GatewayOptions);
	// RequestBytes is their mean size.
	Realistic    bool
	Turns        int
	RequestBytes int
	// Fsync is the latency of a synced 4 KiB write to the pool's disk,
	// measured before the load: the floor under the durable path's added
	// latency (zero with Memory).
	Fsync Latency
	// GC is what the Go collector did in this process (load generator,
	// bare proxy, server and gateway together) during the measured load.
	GC GCStats
}

// GCStats counts the collector's work over a window.
type GCStats struct {
	Cycles   int
	PauseSum time.Duration // stop-the-world pauses, summed
	PauseMax time.Duration // the longest of them
	Goal     uint64        // the heap size the next cycle starts at, bytes, at the end
}

func gcSince(before *runtime.MemStats) GCStats {
	var now runtime.MemStats
	runtime.ReadMemStats(&now)
	st := GCStats{Cycles: int(now.NumGC - before.NumGC), PauseSum: time.Duration(now.PauseTotalNs - before.PauseTotalNs), Goal: now.NextGC}
	first := before.NumGC + 1 // cycle k's pause is PauseNs[(k+255)%256], the last 256 kept
	if now.NumGC > 256 && first < now.NumGC-255 {
		first = now.NumGC - 255
	}
	for k := first; k <= now.NumGC; k++ {
		st.PauseMax = max(st.PauseMax, time.Duration(now.PauseNs[(k+255)%256]))
	}
	return st
}

// Series is one kind of measurement, through the bare proxy (Direct) and
// through the gateway.
type Series struct {
	Name     string  // "non-streaming", "streaming: first byte", "streaming: last byte"
	Direct   Latency // through the bare reverse proxy
	Through  Latency
	AddedP50 time.Duration
	AddedP99 time.Duration
}

// request kinds in the interleaving.
const (
	kindProxyPlain = iota
	kindGatewayPlain
	kindProxyStream
	kindGatewayStream
	numKinds
)

type sample struct {
	kind     int
	ttfb     time.Duration
	total    time.Duration
	failed   bool
	measured bool
}

// Gateway runs the gateway benchmark: a scripted upstream and a gateway
// recording into a Pebble pool on disk, both on loopback, and an open-loop
// load generator that sends each request at its scheduled time whatever the
// previous ones are doing.
func Gateway(ctx context.Context, o GatewayOptions) (*GatewayResult, error) {
	if o.Rate <= 0 {
		o.Rate = 1000
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = time.Second
	}
	if o.Chunks <= 0 {
		o.Chunks = 8
	}
	if o.Turns <= 0 {
		o.Turns = 12
	}
	if o.SessionsAtOnce <= 0 {
		o.SessionsAtOnce = 64
	}
	dir := o.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "clawmesh-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	load := newLoad(o)
	up := fakeupstream.New(fakeupstream.Script{Chunks: o.Chunks, Respond: load.respond, Forget: true})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go up.Run(ctx, upLn)
	bare, err := bareProxy(ctx, "http://"+upLn.Addr().String())
	if err != nil {
		return nil, err
	}

	res := &GatewayResult{Rate: o.Rate, Duration: o.Duration, Memory: o.Memory, Realistic: o.Realistic, Turns: o.Turns}
	var store gateway.Store = &memStore{steps: map[core.StepID]*core.Step{}}
	if !o.Memory {
		fs, err := FsyncLatency(dir, 200)
		if err != nil {
			return nil, err
		}
		res.Fsync = fs
		p, err := pool.Open(dir, pool.Options{})
		if err != nil {
			return nil, err
		}
		defer p.Close()
		store = p
	}
	upURL := "http://" + upLn.Addr().String() + "/v1"
	gc := gateway.Config{Upstream: upURL, Store: store}
	if o.Metrics {
		reg := prometheus.NewRegistry()
		calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "clawmesh_gateway_call_seconds", Help: "Recorded calls' durations.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}, []string{"api"})
		reg.MustRegister(calls)
		chat := calls.WithLabelValues(string(core.APIChat))
		gc.OnCall = func(api core.APIKind, d time.Duration) {
			if api == core.APIChat {
				chat.Observe(d.Seconds())
			}
		}
		gc.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	gw, err := gateway.New(gc)
	if err != nil {
		return nil, err
	}
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gwCtx, stopGW := context.WithCancel(ctx)
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Run(gwCtx, gwLn) }()
	defer func() { stopGW(); <-gwDone }()
	gwURL := "http://" + gwLn.Addr().String() + "/v1"

	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}, Timeout: 30 * time.Second}

	// Each target sees Rate requests per second, so the interleaved stream
	// is 2·Rate, alternating plain and streaming calls.
	interval := time.Second / time.Duration(2*o.Rate)
	total := int((o.Warmup + o.Duration) / interval)
	warm := int(o.Warmup / interval)
	samples := make([]sample, total)
	var wg sync.WaitGroup
	start := time.Now()
	var gcBefore runtime.MemStats
	gcTaken := false
	for i := 0; i < total; i++ {
		if i == warm && !gcTaken {
			runtime.ReadMemStats(&gcBefore)
			gcTaken = true
		}
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(d):
			}
		}
		kind := i % numKinds
		wg.Add(1)
		go func(i, kind int) {
			defer wg.Done()
			base := bare
			if kind == kindGatewayPlain || kind == kindGatewayStream {
				base = gwURL
			}
			stream := kind == kindProxyStream || kind == kindGatewayStream
			body, hdr := load.request(i/2, stream)
			ttfb, tot, err := oneCall(ctx, client, base, body, hdr)
			samples[i] = sample{kind: kind, ttfb: ttfb, total: tot, failed: err != nil, measured: i >= warm}
		}(i, kind)
	}
	wg.Wait()
	elapsed := time.Since(start.Add(o.Warmup))
	if gcTaken {
		res.GC = gcSince(&gcBefore)
	}

	var byKind [numKinds][]sample
	for _, s := range samples {
		if s.measured {
			byKind[s.kind] = append(byKind[s.kind], s)
		}
	}
	lat := func(ss []sample, f func(sample) time.Duration) Latency {
		var l Latency
		var ds []time.Duration
		for _, s := range ss {
			if s.failed {
				l.Errors++
				continue
			}
			ds = append(ds, f(s))
		}
		l.N = len(ds)
		l.P50, l.P99 = percentile(ds, 0.50), percentile(ds, 0.99)
		return l
	}
	ttfb := func(s sample) time.Duration { return s.ttfb }
	ttlb := func(s sample) time.Duration { return s.total }
	mk := func(name string, d, g []sample, f func(sample) time.Duration) Series {
		s := Series{Name: name, Direct: lat(d, f), Through: lat(g, f)}
		s.AddedP50 = s.Through.P50 - s.Direct.P50
		s.AddedP99 = s.Through.P99 - s.Direct.P99
		return s
	}
	res.RequestBytes = load.meanBytes()
	res.Series = []Series{
		mk("non-streaming", byKind[kindProxyPlain], byKind[kindGatewayPlain], ttlb),
		mk("streaming: first byte", byKind[kindProxyStream], byKind[kindGatewayStream], ttfb),
		mk("streaming: last byte", byKind[kindProxyStream], byKind[kindGatewayStream], ttlb),
	}
	okThrough := res.Series[0].Through.N + res.Series[2].Through.N
	res.Achieved = float64(okThrough) / elapsed.Seconds()
	if okThrough == 0 {
		return res, errors.New("bench: no request through the gateway succeeded")
	}
	return res, nil
}

// bareProxy serves a bare Go reverse proxy to upstream on loopback (until
// ctx ends) and returns its base URL: the baseline the gateway is measured
// against, a proxy that only passes the bytes on, flushing each write as the
// gateway does for a stream.
func bareProxy(ctx context.Context, upstream string) (string, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return "", err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0) // a failed call is counted, not logged
	rp.Transport = &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return "http://" + ln.Addr().String() + "/v1", nil
}

// oneCall makes one chat completion call and returns its time to the first
// byte of the body and to the end of the body.
func oneCall(ctx context.Context, c *http.Client, base string, body []byte, hdr http.Header) (time.Duration, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header = hdr
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		return 0, 0, err
	}
	ttfb := time.Since(t0)
	if _, err := io.Copy(io.Discard, br); err != nil {
		return 0, 0, err
	}
	tot := time.Since(t0)
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return ttfb, tot, nil
}

// benchTurnHeader tells the scripted upstream which turn of which session a
// realistic call is, so that it answers with that turn's reply and the next
// call's history holds what the upstream really said.
const benchTurnHeader = "X-Bench-Turn"

// load makes the requests, the same sequence for both targets: call k of a
// target is turn k/sessions%turns of a session (the realistic mode), or a
// session of its own. Every session's last call carries X-Session-Done, so
// that the gateway ends it as an agent would.
type load struct {
	realistic       bool
	turns, sessions int
	gen             *pool.StepGen
	head            []byte // realistic: {"model":..,"tools":[..],"messages":[<system>

	bytes, calls atomic.Int64
}

func newLoad(o GatewayOptions) *load {
	l := &load{realistic: o.Realistic, turns: o.Turns, sessions: o.SessionsAtOnce}
	if !l.realistic {
		return l
	}
	l.gen = pool.NewStepGen("bench", o.Turns)
	type fn struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	type tool struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	var tools []tool
	for _, t := range l.gen.Tools() {
		tools = append(tools, tool{Type: "function", Function: fn{t.Name, t.Description, t.Parameters}})
	}
	tj, _ := json.Marshal(tools)
	sys, _ := json.Marshal(chatMessage{Role: core.RoleSystem, Content: l.gen.Messages(0, 0)[0].Content})
	l.head = fmt.Appendf(nil, `"model":"bench","tools":%s,"messages":[%s`, tj, sys)
	return l
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// where returns the session and turn of call k.
func (l *load) where(k int) (sess, turn int) {
	block := k / (l.sessions * l.turns)
	j := k % (l.sessions * l.turns)
	return block*l.sessions + j%l.sessions, j / l.sessions
}

// request returns the body and headers of call k.
func (l *load) request(k int, stream bool) ([]byte, http.Header) {
	hdr := http.Header{"Content-Type": {"application/json"}}
	var b []byte
	if !l.realistic {
		b = fmt.Appendf(nil, `{"model":"bench","stream":%v,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"request %d: say something"}]}`, stream, k)
		hdr.Set("X-Session-Done", "true")
	} else {
		sess, turn := l.where(k)
		b = make([]byte, 0, len(l.head)+1024*(turn+1))
		b = fmt.Appendf(b, `{"stream":%v,`, stream)
		b = append(b, l.head...)
		for _, m := range l.gen.Messages(sess, turn)[1:] {
			mj, _ := json.Marshal(chatMessage{Role: m.Role, Content: m.Content})
			b = append(append(b, ','), mj...)
		}
		b = append(b, "]}"...)
		hdr.Set(benchTurnHeader, fmt.Sprintf("%d %d", sess, turn))
		if turn == l.turns-1 {
			hdr.Set("X-Session-Done", "true")
		}
	}
	l.bytes.Add(int64(len(b)))
	l.calls.Add(1)
	return b, hdr
}

// respond is the upstream's script: a realistic call gets its turn's reply.
func (l *load) respond(n int, r fakeupstream.Request) fakeupstream.Turn {
	var sess, turn int
	if _, err := fmt.Sscanf(r.Header.Get(benchTurnHeader), "%d %d", &sess, &turn); err == nil && l.realistic {
		return fakeupstream.Turn{Text: l.gen.Reply(sess, turn).Content}
	}
	return fakeupstream.Turn{Text: "The quick brown fox jumps over the lazy dog, twice over, to show a streamed reply."}
}

func (l *load) meanBytes() int {
	if n := l.calls.Load(); n > 0 {
		return int(l.bytes.Load() / n)
	}
	return 0
}

// FsyncLatency measures n synced 4 KiB writes to a file in dir: each
// overwrites a block of a preallocated file and syncs its data (fdatasync
// where there is one), the cheapest durable write the disk offers and so
// the floor under a durable write-ahead log's commit.
func FsyncLatency(dir string, n int) (Latency, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return Latency{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const block, blocks = 4096, 256
	buf := make([]byte, block)
	for i := 0; i < blocks; i++ {
		if _, err := f.Write(buf); err != nil {
			return Latency{}, err
		}
	}
	if err := f.Sync(); err != nil {
		return Latency{}, err
	}
	ds := make([]time.Duration, n)
	for i := range ds {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%blocks)*block); err != nil {
			return Latency{}, err
		}
		if err := syncData(f); err != nil {
			return Latency{}, err
		}
		ds[i] = time.Since(t0)
	}
	return Latency{N: n, P50: percentile(ds, 0.50), P99: percentile(ds, 0.99)}, nil
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(q * float64(len(ds)-1))
	return ds[i]
}

// Print writes r as a table.
func (r *GatewayResult) Print(w io.Writer) {
	fmt.Fprintf(w, "gateway: open-loop %d req/s through a bare reverse proxy and %d req/s through the gateway, interleaved, for %s\n", r.Rate, r.Rate, r.Duration)
	if r.Realistic {
		fmt.Fprintf(w, "agent-sized requests (mean %d bytes): a 40,000-character system prompt, 12 tools, sessions of %d calls whose history grows\n", r.RequestBytes, r.Turns)
	} else {
		fmt.Fprintf(w, "small requests (mean %d bytes), each call a session of its own\n", r.RequestBytes)
	}
	store := "a Pebble pool on disk, every step synced before the reply's last byte"
	if r.Memory {
		store = "memory (no durability: the gateway's own cost)"
	}
	fmt.Fprintf(w, "steps recorded into %s\n", store)
	if !r.Memory {
		fmt.Fprintf(w, "the disk: a synced 4 KiB write takes %s p50, %s p99 (the floor under the durable path)\n", ms(r.Fsync.P50), ms(r.Fsync.P99))
	}
	fmt.Fprintf(w, "through the gateway: %.0f req/s completed\n", r.Achieved)
	fmt.Fprintf(w, "Go GC in this process (load, proxy, server, gateway) while measured: %d cycles, pauses %s in all, longest %s, heap goal %.0f MiB\n",
		r.GC.Cycles, ms(r.GC.PauseSum), ms(r.GC.PauseMax), float64(r.GC.Goal)/(1<<20))
	fmt.Fprintf(w, "baseline: a bare Go reverse proxy (httputil) to the same server, %d req/s, interleaved\n\n", r.Rate)
	fmt.Fprintf(w, "%-24s %10s %10s %10s %10s %10s %10s %7s\n", "", "proxy p50", "gw p50", "added p50", "proxy p99", "gw p99", "added p99", "errors")
	for _, s := range r.Series {
		fmt.Fprintf(w, "%-24s %10s %10s %10s %10s %10s %10s %7d\n", s.Name,
			ms(s.Direct.P50), ms(s.Through.P50), ms(s.AddedP50), ms(s.Direct.P99), ms(s.Through.P99), ms(s.AddedP99), s.Direct.Errors+s.Through.Errors)
	}
	fmt.Fprintf(w, "\ngoal: added p50 <= +%s, p99 <= +%s, plain and streamed (last byte)\n", ms(GoalP50), ms(GoalP99))
	for _, s := range r.Series {
		if s.Name == "streaming: first byte" {
			continue
		}
		verdict := "met"
		if s.AddedP50 > GoalP50 || s.AddedP99 > GoalP99 {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "  %-22s added p50 %s, p99 %s: %s\n", s.Name, ms(s.AddedP50), ms(s.AddedP99), verdict)
	}
}

// The goal for the gateway's added latency beyond a bare reverse proxy.
const (
	GoalP50 = 300 * time.Microsecond
	GoalP99 = 2 * time.Millisecond
)

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }

// memStore is an in-memory gateway.Store (and gateway.Applier) for measuring
// the gateway alone. It keeps the pool's rules (storetest checks it) but
// not copies: a stored step is the caller's.
type memStore struct {
	mu    sync.Mutex
	steps map[core.StepID]*core.Step
}

func (m *memStore) Put(ctx context.Context, s *core.Step) error {
	return m.Apply(ctx, []*core.Step{s}, nil)
}

func (m *memStore) Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error {
	return m.Apply(ctx, nil, []pool.Change{{ID: id, Fn: fn}})
}

func (m *memStore) Apply(ctx context.Context, puts []*core.Step, changes []pool.Change) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[core.StepID]*core.Step, len(puts)+len(changes))
	for _, s := range puts {
		if s.State == core.StateUnknown {
			s.State = core.StateOpen
		}
		if err := m.check(out, s); err != nil {
			return err
		}
		out[s.ID] = s
	}
	for _, c := range changes {
		old, ok := m.steps[c.ID]
		if !ok {
			return fmt.Errorf("bench: step %s: %w", c.ID, pool.ErrNotFound)
		}
		s := *old
		if err := c.Fn(&s); err != nil {
			return err
		}
		if err := m.check(out, &s); err != nil {
			return err
		}
		out[c.ID] = &s
	}
	maps.Copy(m.steps, out)
	return nil
}

// check refuses a step written twice in one Apply and what pool.Transition
// refuses.
func (m *memStore) check(out map[core.StepID]*core.Step, s *core.Step) error {
	if _, dup := out[s.ID]; dup {
		return fmt.Errorf("bench: step %s twice: %w", s.ID, pool.ErrInvalid)
	}
	if old, ok := m.steps[s.ID]; ok && !pool.Transition(old.State, s.State) {
		return fmt.Errorf("bench: step %s from %s to %s: %w", s.ID, old.State, s.State, pool.ErrTransition)
	}
	return nil
}
