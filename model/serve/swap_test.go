package serve

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/serveapi"
)

// noFork hides the native engine's Fork: the server then swaps adapters
// in place, waiting for requests in flight.
type noFork struct{ engine.Engine }

func TestHotSwapForking(t *testing.T) { testHotSwap(t, true) }
func TestHotSwapInPlace(t *testing.T) { testHotSwap(t, false) }

// served is one completed request of the swap test.
type served struct {
	version  string
	prompt   []int
	tokens   []int
	logprobs []float64
	lo, hi   int64 // loads done before it started, loads begun when it ended
}

func testHotSwap(t *testing.T, forking bool) {
	e, tok := newTinyEngine(t, 9)
	ctx := context.Background()
	train := tok.Encode("<|im_start|>assistant\nThe quick brown fox jumps over the lazy dog.<|im_end|>")
	dirs := []string{trainAdapter(t, e, train, 1), trainAdapter(t, e, train, -1)}

	// Reference engines: the base adapter and each trained one, made
	// before the server can touch e.
	refs := map[string]engine.Engine{}
	ref := func(dir string) engine.Engine {
		f, err := e.Fork()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if dir != "" {
			if err := f.LoadAdapter(ctx, dir); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	refs[""] = ref("")
	for _, d := range dirs {
		refs[d] = ref(d)
	}
	// The adapters must really change the policy, or the test proves
	// nothing.
	probe := append(tok.Encode("<|im_start|>user\nhi<|im_end|>\n"), train...)
	var lps [3][]float32
	for i, d := range []string{"", dirs[0], dirs[1]} {
		lp, err := refs[d].Logprobs(ctx, [][]int{probe}, false)
		if err != nil {
			t.Fatal(err)
		}
		lps[i] = lp[0]
	}
	for _, pair := range [][2]int{{0, 1}, {0, 2}, {1, 2}} {
		var d float64
		for i := range probe {
			d = max(d, math.Abs(float64(lps[pair[0]][i]-lps[pair[1]][i])))
		}
		if d < 0.05 {
			t.Fatalf("adapters %v differ by at most %.4f in logprob", pair, d)
		}
	}

	const (
		workers  = 4
		perW     = 3
		maxLoads = 200
	)
	// names[i] is the version after load i; dirOf maps it to its adapter.
	names := []string{DefaultAdapter}
	dirOf := map[string]string{DefaultAdapter: ""}
	for i := 1; i <= maxLoads; i++ {
		n := fmt.Sprintf("v%d", i)
		names = append(names, n)
		dirOf[n] = dirs[i%2]
	}
	var model engine.Engine = e
	if !forking {
		model = noFork{e}
	}
	srv, base := startServer(t, Config{Model: model, Tokenizer: tok, MaxConcurrent: 2})
	c := sdk(base)

	var loadsStarted, loadsDone atomic.Int64
	mid := make(chan struct{}, 1) // a request is streaming
	stop := make(chan struct{})
	loaderDone := make(chan error, 1)
	go func() {
		for i := 1; i <= maxLoads; i++ {
			select {
			case <-mid:
			case <-stop:
				loaderDone <- nil
				return
			}
			loadsStarted.Add(1)
			if err := srv.LoadAdapter(ctx, dirOf[names[i]], names[i]); err != nil {
				loaderDone <- err
				return
			}
			loadsDone.Add(1)
		}
		loaderDone <- nil
	}()

	var mu sync.Mutex
	var results []served
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range perW {
				p := userParams(fmt.Sprintf("Request %d of worker %d: write a long answer.", r, w), 48)
				p.Temperature = openai.Float(1)
				p.Seed = openai.Int(int64(w*100 + r))
				p.Logprobs = openai.Bool(true)
				var hr *http.Response
				s := served{lo: loadsDone.Load()}
				st := c.Chat.Completions.NewStreaming(ctx, p, option.WithJSONSet("return_token_ids", true), option.WithResponseInto(&hr))
				for st.Next() {
					ck := st.Current()
					if raw := ck.JSON.ExtraFields["prompt_token_ids"].Raw(); raw != "" && raw != "null" {
						s.prompt = ints(t, raw)
						select {
						case mid <- struct{}{}:
						default:
						}
					}
					for _, cc := range ck.Choices {
						if raw := cc.JSON.ExtraFields["token_ids"].Raw(); raw != "" && raw != "null" {
							s.tokens = append(s.tokens, ints(t, raw)...)
						}
						for _, l := range cc.Logprobs.Content {
							s.logprobs = append(s.logprobs, l.Logprob)
						}
					}
				}
				if err := st.Err(); err != nil {
					t.Errorf("worker %d request %d failed: %v", w, r, err)
					return
				}
				s.hi = loadsStarted.Load()
				s.version = hr.Header.Get(serveapi.AdapterHeader)
				mu.Lock()
				results = append(results, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-loaderDone; err != nil {
		t.Fatalf("LoadAdapter: %v", err)
	}
	if len(results) != workers*perW {
		t.Fatalf("%d of %d requests completed", len(results), workers*perW)
	}
	overlapped := 0
	for i, s := range results {
		idx := -1
		for j, n := range names {
			if n == s.version {
				idx = j
			}
		}
		if idx < int(s.lo) || idx > int(s.hi) {
			t.Errorf("request %d served by %q; versions %d..%d existed during it", i, s.version, s.lo, s.hi)
			continue
		}
		if s.hi > s.lo {
			overlapped++
		}
		if len(s.tokens) == 0 {
			t.Errorf("request %d: no tokens", i)
			continue
		}
		// Every token came from the version the header names.
		checkLogprobs(t, refs[dirOf[s.version]], s.prompt, s.tokens, s.logprobs)
	}
	if overlapped == 0 {
		t.Errorf("no load happened while a request was in flight (%d loads)", loadsDone.Load())
	}
	t.Logf("%d requests, %d loads, %d overlapped a load", len(results), loadsDone.Load(), overlapped)

	// New requests run on the last version.
	last := names[loadsDone.Load()]
	if srv.Adapter() != last {
		t.Fatalf("Adapter() = %q, want %q", srv.Adapter(), last)
	}
	var hr *http.Response
	p := userParams("After the swaps.", 16)
	p.Logprobs = openai.Bool(true)
	r, err := c.Chat.Completions.New(ctx, p, option.WithJSONSet("return_token_ids", true), option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	if hr.Header.Get(serveapi.AdapterHeader) != last {
		t.Errorf("served by %q after loading %q", hr.Header.Get(serveapi.AdapterHeader), last)
	}
	var got []float64
	for _, l := range r.Choices[0].Logprobs.Content {
		got = append(got, l.Logprob)
	}
	checkLogprobs(t, refs[dirOf[last]], ints(t, r.JSON.ExtraFields["prompt_token_ids"].Raw()), ints(t, r.Choices[0].JSON.ExtraFields["token_ids"].Raw()), got)
}

func TestAdapterEndpoint(t *testing.T) {
	e, tok := newTinyEngine(t, 10)
	dir := trainAdapter(t, e, tok.Encode("hello world"), 1)
	srv, base := startServer(t, Config{Model: e, Tokenizer: tok})
	url := base + "/clawmesh/v1/adapter"
	if status, _ := post(t, url, `{"path":"`+t.TempDir()+`/missing","version":"v9"}`); status != 400 {
		t.Errorf("missing adapter: %d", status)
	}
	if status, _ := post(t, url, `{"path":""}`); status != 400 {
		t.Errorf("empty body: %d", status)
	}
	if srv.Adapter() != DefaultAdapter {
		t.Fatalf("a failed load changed the adapter to %q", srv.Adapter())
	}
	status, v := post(t, url, `{"path":"`+dir+`","version":"v1"}`)
	if status != 200 || v["version"] != "v1" || v["previous"] != DefaultAdapter || srv.Adapter() != "v1" {
		t.Errorf("load: %d %v, adapter %q", status, v, srv.Adapter())
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get(serveapi.AdapterHeader) != "v1" {
		t.Errorf("GET adapter header %q", resp.Header.Get(serveapi.AdapterHeader))
	}
	if err := srv.LoadAdapter(context.Background(), dir, ""); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("empty version accepted: %v", err)
	}
}
