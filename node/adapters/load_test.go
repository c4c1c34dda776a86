package adapters_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/gateway"
	"github.com/clawmesh/clawmesh/node/swap"
	"github.com/clawmesh/clawmesh/pool"
)

// held is the weights service as a follower sees it, with every version
// already fetched: the mesh is not what these tests are about.
type held struct {
	dir    *weights.Dir
	latest atomic.Pointer[chunks.Manifest]
}

func (h *held) Latest() *chunks.Manifest { return h.latest.Load() }
func (h *held) Dir() *weights.Dir        { return h.dir }
func (h *held) Fetch(context.Context, *chunks.Manifest, func(weights.Progress)) error {
	return fmt.Errorf("not held")
}
func (h *held) Sources(*chunks.Manifest) []weights.Source { return nil }

// hold packs the adapter in dir as version v.
func (h *held) hold(t *testing.T, dir string, v uint64) *chunks.Manifest {
	t.Helper()
	b, err := weights.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := signed(t, b, v, nil)
	if err := h.dir.Add(m, b); err != nil {
		t.Fatal(err)
	}
	return m
}

// signed is bundle b's manifest as version v with evaluations evals.
func signed(t *testing.T, b []byte, v uint64, evals []chunks.Eval) *chunks.Manifest {
	t.Helper()
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.Version, m.Term, m.Index, m.Evals = v, 1, 10*v, evals
	// Signed, as every manifest kept is (the follower does not check it:
	// the weights service did).
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	sk, _ := ic.UnmarshalEd25519PrivateKey(key)
	id, _ := peer.IDFromPrivateKey(sk)
	cert, err := member.IssueCertificate(admin, nil, member.CertSpec{Subject: id.String(), SubjectKey: pub, Role: member.RoleTrainer}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sign(key, cert, time.Now()); err != nil {
		t.Fatal(err)
	}
	return m
}

// reply is one streamed reply as the client saw it.
type reply struct {
	version  string
	text     string
	logprobs []float64
	done     bool // the stream ended with [DONE]
	err      error
}

// stream makes one streaming chat call with log-probs and reads it whole.
func stream(ctx context.Context, url string) reply {
	body, _ := json.Marshal(map[string]any{"model": "tiny", "stream": true, "temperature": 0, "max_tokens": 6, "logprobs": true,
		"messages": []map[string]string{{"role": "user", "content": "name a colour"}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	r := reply{version: resp.Header.Get(serveapi.AdapterHeader)}
	if resp.StatusCode != 200 {
		r.err = fmt.Errorf("status %d", resp.StatusCode)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.done = true
			break
		}
		var ch struct {
			Choices []struct {
				Delta    struct{ Content string }
				Logprobs *struct {
					Content []struct{ Logprob float64 }
				}
			}
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			r.err = err
			return r
		}
		for _, c := range ch.Choices {
			r.text += c.Delta.Content
			if c.Logprobs != nil {
				for _, l := range c.Logprobs.Content {
					r.logprobs = append(r.logprobs, l.Logprob)
				}
			}
		}
	}
	if r.err == nil {
		r.err = sc.Err()
	}
	return r
}

func same(a, b reply) bool {
	if a.text != b.text || len(a.logprobs) != len(b.logprobs) {
		return false
	}
	for i := range a.logprobs {
		if math.Abs(a.logprobs[i]-b.logprobs[i]) > 1e-4 {
			return false
		}
	}
	return true
}

// TestSwapUnderStreamingLoad: clients stream replies through a real
// gateway in front of a real `clawmesh serve` while the follower swaps
// v1, v2 and v3 in; no call fails, every stream completes, and every
// reply is, token for token and log-prob for log-prob, the reply of the
// one version that its header names: none mixes two.
func TestSwapUnderStreamingLoad(t *testing.T) {
	ctx := context.Background()
	tiny := servetest.Start(t, "", 4)
	wd, err := weights.OpenDir(filepath.Join(t.TempDir(), "weights"))
	if err != nil {
		t.Fatal(err)
	}
	h := &held{dir: wd}
	var ms []*chunks.Manifest
	for i, steps := range []int{2, 5, 9} {
		ms = append(ms, h.hold(t, tiny.Adapter(t, steps, 0.1), uint64(i+1)))
	}

	drv, err := swap.New("clawmesh", swap.Config{Upstream: tiny.URL})
	if err != nil {
		t.Fatal(err)
	}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(t.TempDir(), "adapters"), Weights: h, Driver: drv, Retry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(filepath.Join(t.TempDir(), "pool"), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	caps, _ := node.Caps("clawmesh")
	gw, err := gateway.New(gateway.Config{Upstream: tiny.URL, Caps: caps, Store: p, Route: func() gateway.Route {
		r := f.Route()
		return gateway.Route{Model: r.Model, Adapter: r.Version}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithCancel(ctx)
	gdone := make(chan struct{})
	go func() { gw.Run(gctx, ln); close(gdone) }()
	t.Cleanup(func() { gcancel(); <-gdone })
	url := "http://" + ln.Addr().String() + "/v1"

	base := stream(ctx, url)
	if base.err != nil || !base.done || base.version != "base" {
		t.Fatalf("before any swap: %+v", base)
	}
	fctx, fcancel := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() { f.Run(fctx); close(fdone) }()
	t.Cleanup(func() { fcancel(); <-fdone })

	var (
		mu      sync.Mutex
		replies []reply
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000 && !stop.Load(); i++ {
				r := stream(ctx, url)
				mu.Lock()
				replies = append(replies, r)
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(replies) }
	for _, m := range ms {
		h.latest.Store(m)
		f.Notify()
		for end := time.Now().Add(time.Minute); f.Route().Version != m.Name(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s never served: %+v", m.Name(), f.Status())
			}
		}
		for n, end := count(), time.Now().Add(time.Minute); count() < n+8 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		}
	}
	stop.Store(true)
	wg.Wait()

	// The reference reply of each version, asked of the server alone.
	ref := map[string]reply{"base": base}
	for _, m := range ms {
		if err := tiny.Srv.LoadAdapter(ctx, f.VersionDir(m.Name()), m.Name()); err != nil {
			t.Fatal(err)
		}
		ref[m.Name()] = stream(ctx, tiny.URL)
	}
	for a := range ref {
		for b := range ref {
			if a < b && same(ref[a], ref[b]) {
				t.Fatalf("%s and %s reply alike: the test could not tell them apart", a, b)
			}
		}
	}
	per := map[string]int{}
	for i, r := range replies {
		if r.err != nil || !r.done {
			t.Fatalf("call %d under load failed: %+v", i, r)
		}
		want, ok := ref[r.version]
		if !ok || !same(r, want) {
			t.Fatalf("call %d: a reply named %q is not that version's reply:\n got %q %v\nwant %q %v", i, r.version, r.text, r.logprobs, want.text, want.logprobs)
		}
		per[r.version]++
	}
	for _, m := range ms {
		if per[m.Name()] == 0 {
			t.Errorf("no call served by %s (%v)", m.Name(), per)
		}
	}
	t.Logf("%d calls under load: %v", len(replies), per)

	// Every call was recorded, naming the version that served it.
	steps, err := p.List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	rec := map[string]int{}
	for _, s := range steps {
		rec[s.Adapter]++
	}
	for v, n := range per {
		if v == "base" {
			continue
		}
		if rec[v] != n {
			t.Errorf("%d calls served by %s, %d steps recorded with it (%v)", n, v, rec[v], rec)
		}
	}
}
