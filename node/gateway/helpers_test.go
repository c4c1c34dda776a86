package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/pool"
)

// memStore is an in-memory Store for unit tests. It keeps JSON copies so a
// test sees exactly what would have been serialized.
type memStore struct {
	mu    sync.Mutex
	steps map[core.StepID][]byte
	order []core.StepID
	fail  error
}

func newMemStore() *memStore { return &memStore{steps: map[core.StepID][]byte{}} }

func (m *memStore) Put(ctx context.Context, s *core.Step) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	if s.State == core.StateUnknown {
		s.State = core.StateOpen
	}
	if err := m.checkMove(s); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if _, ok := m.steps[s.ID]; !ok {
		m.order = append(m.order, s.ID)
	}
	m.steps[s.ID] = b
	return nil
}

func (m *memStore) Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.steps[id]
	if !ok {
		return fmt.Errorf("mem: %s: %w", id, pool.ErrNotFound)
	}
	var s core.Step
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if err := fn(&s); err != nil {
		return err
	}
	if err := m.checkMove(&s); err != nil {
		return err
	}
	b, err := json.Marshal(&s)
	if err != nil {
		return err
	}
	m.steps[id] = b
	return nil
}

// Apply is pool.Pool.Apply in memory: all or nothing.
func (m *memStore) Apply(ctx context.Context, puts []*core.Step, changes []pool.Change) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	out := map[core.StepID][]byte{}
	for _, s := range puts {
		if s.State == core.StateUnknown {
			s.State = core.StateOpen
		}
		if _, dup := out[s.ID]; dup {
			return fmt.Errorf("mem: %s twice: %w", s.ID, pool.ErrInvalid)
		}
		if err := m.checkMove(s); err != nil {
			return err
		}
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		out[s.ID] = b
	}
	for _, c := range changes {
		b, ok := m.steps[c.ID]
		if !ok {
			return fmt.Errorf("mem: %s: %w", c.ID, pool.ErrNotFound)
		}
		if _, dup := out[c.ID]; dup {
			return fmt.Errorf("mem: %s twice: %w", c.ID, pool.ErrInvalid)
		}
		var s core.Step
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if err := c.Fn(&s); err != nil {
			return err
		}
		if err := m.checkMove(&s); err != nil {
			return err
		}
		nb, err := json.Marshal(&s)
		if err != nil {
			return err
		}
		out[c.ID] = nb
	}
	for _, s := range puts {
		if _, ok := m.steps[s.ID]; !ok {
			m.order = append(m.order, s.ID)
		}
	}
	for id, b := range out {
		m.steps[id] = b
	}
	return nil
}

// checkMove refuses what pool.Transition refuses; the caller holds mu.
func (m *memStore) checkMove(s *core.Step) error {
	b, ok := m.steps[s.ID]
	if !ok {
		return nil
	}
	var old core.Step
	if err := json.Unmarshal(b, &old); err != nil {
		return err
	}
	if !pool.Transition(old.State, s.State) {
		return fmt.Errorf("mem: %s from %s to %s: %w", s.ID, old.State, s.State, pool.ErrTransition)
	}
	return nil
}

func (m *memStore) get(t *testing.T, id core.StepID) *core.Step {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.steps[id]
	if !ok {
		t.Fatalf("step %s not recorded", id)
	}
	var s core.Step
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// all returns the recorded steps in the order they were first put.
func (m *memStore) all(t *testing.T) []*core.Step {
	t.Helper()
	m.mu.Lock()
	ids := append([]core.StepID(nil), m.order...)
	m.mu.Unlock()
	out := make([]*core.Step, len(ids))
	for i, id := range ids {
		out[i] = m.get(t, id)
	}
	return out
}

// env is a gateway in front of a fake upstream, and a twin of that fake
// (same script) to call directly, all on 127.0.0.1.
type env struct {
	up, direct       *fakeupstream.Server
	upURL, directURL string // base URLs without /v1
	gw               *Gateway
	url              string // gateway base URL without /v1
	store            Store
	mem              *memStore
	stop             context.CancelFunc
	done             chan error
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func serveFake(t testing.TB, s *fakeupstream.Server) string {
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

// newEnv starts the pair. edit may change the gateway config (Store is a
// memStore unless edit sets one).
func newEnv(t testing.TB, script fakeupstream.Script, edit func(*Config)) *env {
	t.Helper()
	e := &env{up: fakeupstream.New(script), direct: fakeupstream.New(script)}
	e.upURL = serveFake(t, e.up)
	e.directURL = serveFake(t, e.direct)
	e.mem = newMemStore()
	cfg := Config{Upstream: e.upURL + "/v1", Store: e.mem, Adapter: func() string { return "v7" }}
	if edit != nil {
		edit(&cfg)
	}
	e.store = cfg.Store
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.gw = gw
	ln := listen(t)
	e.url = "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	e.stop, e.done = cancel, make(chan error, 1)
	go func() { e.done <- gw.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-e.done:
		case <-time.After(30 * time.Second):
			t.Error("gateway Run did not return")
		}
	})
	return e
}

// post sends a raw request and returns status, headers and body.
func post(t testing.TB, url, body string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// lastRequest is the last request the fake received.
func lastRequest(t testing.TB, s *fakeupstream.Server) fakeupstream.Request {
	t.Helper()
	rs := s.Requests()
	if len(rs) == 0 {
		t.Fatal("upstream received nothing")
	}
	return rs[len(rs)-1]
}

// eventually polls cond (bounded) for things that happen after a response
// completes by design (a disconnect noticed by the server).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func jsonKeys(t testing.TB, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
