package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node/session"
	"github.com/clawmesh/clawmesh/pool"
)

// spyStore wraps the test store: it logs every write ("put a", "update a",
// "apply put b closed, change a") and lets a test hold writes at a gate.
type spyStore struct {
	mem *memStore

	mu  sync.Mutex
	ops []string
	// gate, if set, is called before a write with its log line; it may
	// block.
	gate func(op string)
}

func (s *spyStore) write(op string) {
	s.mu.Lock()
	s.ops = append(s.ops, op)
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		gate(op)
	}
}

func (s *spyStore) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ops)
}

func (s *spyStore) setGate(g func(op string)) {
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
}

func (s *spyStore) Put(ctx context.Context, st *core.Step) error {
	s.write(fmt.Sprintf("put %s %s", st.ID, st.State))
	return s.mem.Put(ctx, st)
}

func (s *spyStore) Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error {
	s.write("update " + string(id))
	return s.mem.Update(ctx, id, fn)
}

func (s *spyStore) Apply(ctx context.Context, puts []*core.Step, changes []pool.Change) error {
	var parts []string
	for _, p := range puts {
		parts = append(parts, fmt.Sprintf("put %s %s", p.ID, p.State))
	}
	for _, c := range changes {
		parts = append(parts, "change "+string(c.ID))
	}
	s.write("apply " + strings.Join(parts, ", "))
	return s.mem.Apply(ctx, puts, changes)
}

// seqIDs numbers steps s1, s2, ... so that tests can name them.
func seqIDs() func() core.StepID {
	var mu sync.Mutex
	n := 0
	return func() core.StepID {
		mu.Lock()
		defer mu.Unlock()
		n++
		return core.StepID(fmt.Sprintf("s%d", n))
	}
}

// stopEnv stops the gateway and waits for Run (and so for the background
// writer) to return.
func stopEnv(t *testing.T, e *env) {
	t.Helper()
	e.stop()
	waitRun(t, e)
}

// waitRun waits for the stopped gateway's Run to return, and requires nil.
func waitRun(t *testing.T, e *env) {
	t.Helper()
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		e.done <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestChainOneWrite: a call that continues a chain is stored with its
// parent's next state in one write, and a call that ends its session
// (X-Session-Done) is stored closed in that same write, with no write after.
func TestChainOneWrite(t *testing.T) {
	spy := &spyStore{mem: newMemStore()}
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "first"}, {Text: "bye"}}}, func(c *Config) {
		c.Store = spy
		c.NewID = seqIDs()
	})
	post(t, e.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}]}`, map[string]string{"X-Session-Id": "c"})
	if st, _, b := post(t, e.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"first"},{"role":"user","content":"thanks"}]}`,
		map[string]string{"X-Session-Id": "c", "X-Session-Done": "true"}); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	stopEnv(t, e)
	want := []string{"put s1 open", "apply put s2 closed, change s1"}
	if got := spy.log(); !slices.Equal(got, want) {
		t.Fatalf("writes %q, want %q", got, want)
	}
	if s := spy.mem.get(t, "s1"); s.State != core.StateClosed || s.NextState == nil || s.NextState.Messages[0].Content != "thanks" {
		t.Errorf("parent: %s %+v", s.State, s.NextState)
	}
}

// TestOtherClosuresOffReplyPath: a call that evicts another session's step
// (MaxSessions 1) gets its reply while the write closing that step is held;
// the step is closed once the write goes through.
func TestOtherClosuresOffReplyPath(t *testing.T) {
	spy := &spyStore{mem: newMemStore()}
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Store = spy
		c.NewID = seqIDs()
		c.Sessions = session.Options{MaxSessions: 1}
	})
	post(t, e.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": "x"})
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	spy.setGate(func(op string) {
		if strings.Contains(op, "s1") {
			held <- struct{}{}
			<-release
		}
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	replied := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("X-Session-Id", "y")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			replied <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		replied <- resp.StatusCode
	}()
	select {
	case st := <-replied:
		if st != 200 {
			t.Fatalf("status %d", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply while another session's closure was held: it is on the reply path")
	}
	// The reply came back; the eviction's write is (or will be) held.
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the evicted step was never written")
	}
	if s := spy.mem.get(t, "s1"); s.State != core.StateOpen {
		t.Fatalf("evicted step written while its write was held: %s", s.State)
	}
	close(release)
	stopEnv(t, e)
	if s := spy.mem.get(t, "s1"); s.State != core.StateClosed || s.NextState != nil {
		t.Errorf("evicted step after its write: %s %+v", s.State, s.NextState)
	}
	if got := spy.log(); !slices.Contains(got, "put s2 open") || !slices.Contains(got, "update s1") {
		t.Errorf("writes %q", got)
	}
}

// evictWhileHeld starts a gateway on store that follows one session at a
// time, holds the background write whose log line is held, and makes calls
// calls of as many sessions, each evicting the one before it (steps s1,
// s2, ...): s1's closure is the one held, the others queue behind it. It
// returns the gateway and what lets the held write go (safe to call twice;
// the test's end calls it too).
func evictWhileHeld(t *testing.T, spy *spyStore, store Store, held string, calls int) (*env, func()) {
	t.Helper()
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Store = store
		c.NewID = seqIDs()
		c.Sessions = session.Options{MaxSessions: 1}
	})
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	spy.setGate(func(op string) {
		if op == held {
			<-gate
		}
	})
	for i := range calls {
		if st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": fmt.Sprint("x", i)}); st != 200 {
			t.Fatalf("call %d: %d %s", i, st, b)
		}
	}
	return e, release
}

// TestOtherClosuresInChunks: closures that queue while the background
// writer is held (an overloaded store) are written in commits of at most
// laterChunk, not in one commit of everything that queued, and none is lost.
func TestOtherClosuresInChunks(t *testing.T) {
	defer func(n int) { laterChunk = n }(laterChunk)
	laterChunk = 2
	spy := &spyStore{mem: newMemStore()}
	const calls = 8
	e, release := evictWhileHeld(t, spy, spy, "update s1", calls)
	release()
	stopEnv(t, e)
	chunked := false
	for _, op := range spy.log() {
		if !strings.HasPrefix(op, "apply change") {
			continue
		}
		switch n := strings.Count(op, "change "); {
		case n > laterChunk:
			t.Errorf("one background write of %d closures (%q), more than %d", n, op, laterChunk)
		case n == laterChunk:
			chunked = true
		}
	}
	if !chunked {
		t.Errorf("no background write of %d closures: %q", laterChunk, spy.log())
	}
	for i := 1; i < calls; i++ {
		if s := spy.mem.get(t, core.StepID(fmt.Sprint("s", i))); s.State != core.StateClosed {
			t.Errorf("evicted step s%d is %s", i, s.State)
		}
	}
}

// unsyncedSpy is a spyStore that can also write without syncing, as
// *pool.Pool can.
type unsyncedSpy struct{ *spyStore }

func (s unsyncedSpy) ApplyUnsynced(ctx context.Context, changes []pool.Change) error {
	var parts []string
	for _, c := range changes {
		parts = append(parts, "change "+string(c.ID))
	}
	s.write("unsynced " + strings.Join(parts, ", "))
	return s.mem.Apply(ctx, nil, changes)
}

// TestOtherClosuresStepByStep: with a store that writes without syncing,
// the background closures are written a step at a time (a commit of many
// would take all their write locks behind the calls' synced writes), and
// every one lands.
func TestOtherClosuresStepByStep(t *testing.T) {
	spy := &spyStore{mem: newMemStore()}
	const calls = 8
	e, release := evictWhileHeld(t, spy, unsyncedSpy{spy}, "unsynced change s1", calls)
	release()
	stopEnv(t, e)
	n := 0
	for _, op := range spy.log() {
		if strings.HasPrefix(op, "unsynced") {
			n++
			if strings.Count(op, "change ") != 1 {
				t.Errorf("a background write of several steps: %q", op)
			}
		}
	}
	if n != calls-1 {
		t.Errorf("%d background writes, want %d: %q", n, calls-1, spy.log())
	}
	for i := 1; i < calls; i++ {
		if s := spy.mem.get(t, core.StepID(fmt.Sprint("s", i))); s.State != core.StateClosed {
			t.Errorf("evicted step s%d is %s", i, s.State)
		}
	}
}

// TestOtherClosuresBounded: while the background writer is held, at most
// laterMax closures wait; the rest are dropped and counted, their steps
// left open, and the writer goes on with what waits once it can.
func TestOtherClosuresBounded(t *testing.T) {
	defer func(n int) { laterMax = n }(laterMax)
	laterMax = 3
	spy := &spyStore{mem: newMemStore()}
	const calls = 8 // s1's closure held, s2..s4's wait, s5..s7's dropped
	e, release := evictWhileHeld(t, spy, unsyncedSpy{spy}, "unsynced change s1", calls)
	if st := e.gw.Stats(); st.ClosuresWaiting != laterMax || st.ClosuresDropped != 3 {
		t.Errorf("while held: %d closures waiting, %d dropped; want %d and 3", st.ClosuresWaiting, st.ClosuresDropped, laterMax)
	}
	release()
	stopEnv(t, e)
	for i := 1; i < calls; i++ {
		want := core.StateClosed
		if i >= 5 {
			want = core.StateOpen
		}
		if s := spy.mem.get(t, core.StepID(fmt.Sprint("s", i))); s.State != want {
			t.Errorf("step s%d is %s, want %s", i, s.State, want)
		}
	}
	if st := e.gw.Stats(); st.ClosuresWaiting != 0 {
		t.Errorf("%d closures still waiting after the writer was let go", st.ClosuresWaiting)
	}
}

// TestReplyWaitsForStore: while the store holds the step's write, the client
// gets neither a stream's terminal event nor a non-streaming body; when the
// write returns, they arrive. For the first call of a chain (a Put) and the
// next (an Apply with the parent's next state).
func TestReplyWaitsForStore(t *testing.T) {
	spy := &spyStore{mem: newMemStore()}
	e := newEnv(t, fakeupstream.Script{Chunks: 4, Turns: []fakeupstream.Turn{{Text: "abcdefgh"}}}, func(c *Config) {
		c.Store = spy
		c.NewID = seqIDs()
	})
	unblock := make(chan struct{}) // on failure, lets held writes go so the gateway can stop
	t.Cleanup(func() { close(unblock) })
	history := `{"role":"user","content":"a"}`
	for i, tc := range []struct {
		stream bool
		op     string
	}{
		{true, "put s1 open"},
		{false, "apply put s2 open, change s1"},
		{true, "apply put s3 open, change s2"},
		{false, "apply put s4 open, change s3"},
	} {
		release := make(chan struct{})
		held := make(chan string, 1)
		spy.setGate(func(op string) {
			held <- op
			select {
			case <-release:
			case <-unblock:
			}
		})
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[%s]}`, tc.stream, history)
		req, _ := http.NewRequest(http.MethodPost, e.url+"/s/order/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		type result struct {
			lines []string
			err   error
		}
		lines := make(chan string, 64)
		done := make(chan result, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			var all []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				lines <- sc.Text()
				all = append(all, sc.Text())
			}
			done <- result{lines: all, err: sc.Err()}
		}()

		select {
		case op := <-held:
			if op != tc.op {
				t.Fatalf("call %d: write %q, want %q", i, op, tc.op)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: the step was never written", i)
		}
		// The write is held. Whatever reaches the client now must not be
		// the end of the reply.
		deadline := time.After(200 * time.Millisecond)
	watch:
		for {
			select {
			case l := <-lines:
				if l == "data: [DONE]" || (!tc.stream && l != "") {
					t.Fatalf("call %d: %q reached the client while the step's write was held", i, l)
				}
			case r := <-done:
				t.Fatalf("call %d: the reply ended (%v) while the step's write was held", i, r.err)
			case <-deadline:
				break watch
			}
		}
		close(release)
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: no reply after the write returned", i)
		}
		text := strings.TrimSpace(strings.Join(r.lines, "\n"))
		if r.err != nil || (tc.stream && !strings.HasSuffix(text, "data: [DONE]")) || (!tc.stream && !strings.Contains(text, `"abcdefgh"`)) {
			t.Fatalf("call %d: reply %q, %v", i, text, r.err)
		}
		history += `,{"role":"assistant","content":"abcdefgh"},{"role":"user","content":"more"}`
	}
	spy.setGate(nil)
}

// TestPoolChainOneCommit: against the Pebble pool, the second call of a
// chain leaves both steps as the chain rule says, the parent closed with its
// next state by the same commit that stored the child.
func TestPoolChainOneCommit(t *testing.T) {
	p, err := pool.Open(t.TempDir(), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "one"}, {Text: "two"}}}, func(c *Config) { c.Store = p })
	post(t, e.url+"/s/k/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}]}`, nil)
	post(t, e.url+"/s/k/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"one"},{"role":"user","content":"b"}]}`,
		map[string]string{"X-Session-Done": "true"})
	steps, err := p.List(context.Background(), pool.Filter{Session: "k"})
	if err != nil || len(steps) != 2 {
		t.Fatalf("%d steps, %v", len(steps), err)
	}
	if steps[0].State != core.StateClosed || steps[0].NextState == nil || steps[0].NextState.StepID != steps[1].ID {
		t.Errorf("parent: %s %+v", steps[0].State, steps[0].NextState)
	}
	if steps[1].State != core.StateClosed || steps[1].NextState != nil {
		t.Errorf("last step of a done session: %s %+v", steps[1].State, steps[1].NextState)
	}
}
