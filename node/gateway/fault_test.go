package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/pool"
)

// wedgedStore never returns from a write until released: a disk that
// stopped answering.
type wedgedStore struct {
	*memStore
	release chan struct{}
	calls   atomic.Int64
}

func (w *wedgedStore) Put(ctx context.Context, s *core.Step) error {
	w.calls.Add(1)
	<-w.release
	return w.memStore.Put(ctx, s)
}

func (w *wedgedStore) Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error {
	w.calls.Add(1)
	<-w.release
	return w.memStore.Update(ctx, id, fn)
}

// TestWedgedStoreReleasesReplies: a store that never answers holds no reply
// longer than StoreTimeout: the client gets its reply, the call is counted
// unrecorded, and shutting down does not wait for the store.
func TestWedgedStoreReleasesReplies(t *testing.T) {
	ws := &wedgedStore{memStore: newMemStore(), release: make(chan struct{})}
	defer close(ws.release)
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Store = ws
		c.StoreTimeout = 50 * time.Millisecond
	})
	for _, body := range []string{chatBody, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`} {
		st, _, b := post(t, e.url+"/v1/chat/completions", body, nil)
		if st != 200 || !strings.Contains(string(b), "Hello") {
			t.Fatalf("reply through a wedged store: %d %s", st, b)
		}
	}
	if s := e.gw.Stats(); s.Unrecorded != 2 || s.Recorded != 0 || ws.calls.Load() == 0 {
		t.Fatalf("stats %+v, store calls %d: want 2 unrecorded", s, ws.calls.Load())
	}
	e.stop()
	select {
	case err := <-e.done:
		e.done <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("Run waits for a wedged store")
	}
}

// pausedStore says recording is paused and fails the test if it is used.
type pausedStore struct {
	*memStore
	t *testing.T
}

func (p pausedStore) Health() pool.Health {
	return pool.Health{Recording: false, Paused: "no space left on device"}
}

func (p pausedStore) Put(ctx context.Context, s *core.Step) error {
	p.t.Error("Put called while recording is paused")
	return nil
}

// TestPausedStoreIsNotCalled: while the Store says recording is paused,
// calls are served, not stored, counted, and the health endpoint says why.
func TestPausedStoreIsNotCalled(t *testing.T) {
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.Store = pausedStore{newMemStore(), t} })
	for range 3 {
		if st, _, b := post(t, e.url+"/v1/chat/completions", chatBody, nil); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
	}
	resp, err := http.Get(e.url + "/clawmesh/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if h.Status != "recording_paused" || h.Recording || h.Paused != "recording paused: no space left on device" || h.Unrecorded != 3 {
		t.Fatalf("health %+v", h)
	}
}

// walFault fails writes and syncs of the WAL with err while on.
type walFault struct {
	on  atomic.Bool
	err error
}

func (f *walFault) MaybeError(op errorfs.Op) error {
	if f.on.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && op.Kind != errorfs.OpFileClose {
		return f.err
	}
	return nil
}

func (f *walFault) String() string { return "wal fault" }

// TestDiskFullMidLoad: a real pool whose WAL disk fills up in the middle of
// concurrent calls. No call fails or hangs; the calls made during the fault
// are counted unrecorded; recording resumes by itself when space is back;
// and the pool, opened again, holds every step recorded.
func TestDiskFullMidLoad(t *testing.T) {
	dir := t.TempDir()
	fault := &walFault{err: syscall.ENOSPC}
	p, err := pool.Open(dir, pool.Options{FS: errorfs.Wrap(vfs.Default, fault), ReopenInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) { c.Store = p; c.StoreTimeout = 5 * time.Second })
	call := func(i int) {
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"q%d"}]}`, i%2 == 0, i)
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Session-Id", fmt.Sprintf("s%d", i))
		client := &http.Client{Timeout: time.Minute} // a watchdog, not a measure
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("call %d: %v", i, err)
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), "Hello") {
			t.Errorf("call %d: %d %v %.80s", i, resp.StatusCode, err, b)
		}
	}
	load := func(from, to int) {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + w; i < to; i += 8 {
					call(i)
				}
			}()
		}
		wg.Wait()
	}
	load(0, 40)
	fault.on.Store(true)
	load(40, 120)
	mid := e.gw.Stats()
	if mid.Unrecorded == 0 {
		t.Fatalf("no call was left unrecorded during the fault: %+v", mid)
	}
	if h := e.gw.Health(); h.Recording || !strings.Contains(h.Paused, "no space left on device") {
		t.Fatalf("health during the fault: %+v", h)
	}
	fault.on.Store(false)
	eventually(t, "recording to resume", func() bool { return e.gw.Health().Recording })
	load(120, 160)
	end := e.gw.Stats()
	if end.Unrecorded != mid.Unrecorded {
		t.Errorf("calls left unrecorded after recovery: %d then %d", mid.Unrecorded, end.Unrecorded)
	}
	if end.Recorded+end.Unrecorded != 160 {
		t.Errorf("recorded %d + unrecorded %d != 160 calls", end.Recorded, end.Unrecorded)
	}
	e.stop()
	err = <-e.done
	e.done <- err // for the cleanup
	if err := p.Close(); err != nil {
		t.Log(err)
	}
	q, err := pool.Open(dir, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	steps, err := q.List(context.Background(), pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(steps)) != end.Recorded {
		t.Errorf("the pool holds %d steps; the gateway recorded %d", len(steps), end.Recorded)
	}
	t.Logf("%d calls recorded, %d unrecorded", end.Recorded, end.Unrecorded)
}

// switchStore is a memStore whose recording can be paused.
type switchStore struct {
	*memStore
	paused atomic.Bool
}

func (s *switchStore) Health() pool.Health {
	if s.paused.Load() {
		return pool.Health{Recording: false, Paused: "no space left on device"}
	}
	return pool.Health{Recording: true}
}

// lockedBuffer is a log destination safe for the gateway's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// TestPauseLoggedOnce: while recording is paused, the cause is logged at
// the first call left unrecorded, then at most once a minute with the
// number of calls left unrecorded meanwhile; the end of the pause is
// logged, and a new pause is logged again.
func TestPauseLoggedOnce(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var logs lockedBuffer
	st := &switchStore{memStore: newMemStore()}
	st.paused.Store(true)
	e := newEnv(t, fakeupstream.Script{}, func(c *Config) {
		c.Store, c.Now, c.Logger = st, clock, slog.New(slog.NewTextHandler(&logs, nil))
	})
	calls := func(n int) {
		t.Helper()
		for range n {
			if code, _, b := post(t, e.url+"/v1/chat/completions", chatBody, nil); code != 200 {
				t.Fatalf("%d %s", code, b)
			}
		}
	}
	const paused, still = "recording paused: calls are served but not recorded", "recording still paused"
	calls(5)
	advance(30 * time.Second)
	calls(5)
	if p, s := logs.count(paused), logs.count(still); p != 1 || s != 0 {
		t.Fatalf("within the first minute of the pause: %d cause lines and %d reminders, want 1 and 0:\n%s", p, s, logs.b.String())
	}
	advance(31 * time.Second)
	calls(3)
	if p, s := logs.count(paused), logs.count(still); p != 1 || s != 1 || logs.count("unrecorded=10") != 1 {
		t.Fatalf("a minute into the pause: %d cause lines and %d reminders, want 1 and 1 counting the 10 calls since:\n%s", p, s, logs.b.String())
	}
	st.paused.Store(false)
	calls(1)
	if logs.count("recording resumed") != 1 {
		t.Fatalf("the end of the pause is not logged:\n%s", logs.b.String())
	}
	st.paused.Store(true)
	calls(2)
	if p := logs.count(paused); p != 2 {
		t.Fatalf("a second pause: %d cause lines in all, want 2:\n%s", p, logs.b.String())
	}
	if s := e.gw.Stats(); s.Unrecorded != 15 || s.Recorded != 1 {
		t.Fatalf("stats %+v: want 15 unrecorded, 1 recorded", s)
	}
}

// TestClosedHandedOver: Config.Closed is given each step as its closure is
// written, closed and with its next state: on the reply path (the next
// call of the conversation continues it) and in the background (a
// conversation evicted from the tracker), and never a step left open.
func TestClosedHandedOver(t *testing.T) {
	var mu sync.Mutex
	var got []*core.Step
	e := newEnv(t, fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Hello"}}}, func(c *Config) {
		c.Sessions.MaxSessions = 1
		c.Closed = func(s *core.Step) { mu.Lock(); got = append(got, s); mu.Unlock() }
	})
	first := `{"model":"m","messages":[{"role":"user","content":"first"}]}`
	second := `{"model":"m","messages":[{"role":"user","content":"first"},{"role":"assistant","content":"Hello"},{"role":"user","content":"second"}]}`
	other := `{"model":"m","messages":[{"role":"user","content":"another conversation"}]}`
	for _, body := range []string{first, second, other} {
		if code, _, b := post(t, e.url+"/v1/chat/completions", body, nil); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	// The second step is closed in the background: the third call's
	// conversation evicted its own.
	eventually(t, "two steps handed over", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	mu.Lock()
	defer mu.Unlock()
	for i, s := range got {
		if stored := e.mem.get(t, s.ID); s.State != core.StateClosed || stored.State != core.StateClosed {
			t.Errorf("step %d handed over in state %s, stored in state %s", i, s.State, stored.State)
		}
	}
	if got[0].ID == got[1].ID {
		t.Errorf("step %s handed over twice", got[0].ID)
	}
	if ns := got[0].NextState; ns == nil || len(ns.Messages) == 0 || ns.Messages[len(ns.Messages)-1].Content != "second" {
		t.Errorf("the first step handed over without the next state the second call gave it: %+v", got[0].NextState)
	}
}
