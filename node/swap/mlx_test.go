package swap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/mlx/mlxtest"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/safetensors"
	"github.com/clawmesh/clawmesh/node/gateway"
)

// fakeMLX stands in for mlx_lm.server and follows its request handling
// (mlx_lm/server.py): APIHandler.do_POST (the routes, Content-Length
// required, a JSON object body, "model" defaulting to "default_model",
// "adapters", validate_model_parameters' types), ModelProvider.load (a
// request without "model" gets the --model and --adapter-path the server
// was started with; each new (model, adapters) pair reloads the model; an
// adapter directory is loaded by load_adapters, here model/mlx's reference
// loader, and a failed load is answered 404 {"error": message}), and
// handle_models_request. It answers with the native engine running the
// tiny model with the adapter folded in, greedily. It does not stream.
type fakeMLX struct {
	model string // --model, an absolute directory
	txt   modeldir.Text
	// distributed refuses adapters as ModelProvider._load does when the
	// server runs over several machines.
	distributed bool

	mu    sync.Mutex
	key   *[2]string // the (model, adapters) loaded; nil: none
	eng   *native.Engine
	loads int
	seen  []map[string]json.RawMessage // bodies of chat completions
	tmp   string
}

func newFakeMLX(t *testing.T, model string, txt modeldir.Text) *fakeMLX {
	f := &fakeMLX{model: model, txt: txt, tmp: t.TempDir()}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.eng != nil {
			f.eng.Close()
		}
	})
	return f
}

func (f *fakeMLX) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/models"):
			writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
				map[string]any{"id": f.model, "object": "model", "created": 1}}})
		case r.URL.Path == "/health":
			writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
		default:
			http.Error(w, "Not Found", http.StatusNotFound)
		}
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/chat/completions":
	default:
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	if r.ContentLength < 0 {
		writeJSON(w, http.StatusLengthRequired, map[string]any{"error": "Content-Length header is required"})
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil || body == nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("Invalid JSON in request body: %v", err)})
		return
	}
	f.mu.Lock()
	f.seen = append(f.seen, body)
	f.mu.Unlock()
	var req struct {
		Model    any            `json:"model"`
		Adapters any            `json:"adapters"`
		Messages []core.Message `json:"messages"`
	}
	json.Unmarshal(raw, &req)
	var mt struct {
		MaxTokens *int `json:"max_tokens"`
	}
	json.Unmarshal(raw, &mt)
	model, adapter := "default_model", ""
	hasAdapter := false
	// validate_model_parameters raises a ValueError do_POST does not
	// catch: the connection closes with no reply.
	switch m := req.Model.(type) {
	case nil:
	case string:
		model = m
	default:
		panic(http.ErrAbortHandler)
	}
	switch a := req.Adapters.(type) {
	case nil:
	case string:
		adapter, hasAdapter = a, true
	default:
		panic(http.ErrAbortHandler)
	}
	maxTokens := 512 // mlx_lm.server's --max-tokens default
	if mt.MaxTokens != nil {
		maxTokens = *mt.MaxTokens
	}
	eng, err := f.load(model, adapter, hasAdapter)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": err.Error()})
		return
	}
	text, err := f.txt.Renderer.Render(req.Messages, nil, true)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": err.Error()})
		return
	}
	toks, _, err := eng.Generate(r.Context(), f.txt.Tokenizer.Encode(text), engine.GenOptions{MaxTokens: maxTokens})
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": err.Error()})
		return
	}
	finish := "length"
	if n := len(toks); n > 0 && f.txt.Tokenizer.IsSpecial(toks[n-1]) {
		toks, finish = toks[:n-1], "stop"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model, "system_fingerprint": "fp",
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish,
			"message": map[string]any{"role": "assistant", "content": f.txt.Tokenizer.Decode(toks)}}},
		"usage": map[string]any{"prompt_tokens": 1, "completion_tokens": len(toks), "total_tokens": 1 + len(toks)},
	})
}

// load follows ModelProvider.load and _load.
func (f *fakeMLX) load(model, adapter string, hasAdapter bool) (*native.Engine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if model == "default_model" {
		model, adapter, hasAdapter = f.model, "", false
	}
	key := [2]string{model, "\x00"}
	if hasAdapter {
		key[1] = adapter
	}
	if f.key != nil && *f.key == key {
		return f.eng, nil
	}
	// _load drops the model it held before loading the next.
	f.key = nil
	if f.eng != nil {
		f.eng.Close()
		f.eng = nil
	}
	if hasAdapter && f.distributed {
		return nil, errors.New("Loading with adapters or draft models not supported in distributed mode")
	}
	if model != f.model {
		return nil, fmt.Errorf("Repository Not Found for url: https://huggingface.co/api/models/%s/revision/main.", model)
	}
	dir := model
	if hasAdapter {
		// load_adapters: Path(adapter_path).exists(), then the config and
		// the tensors, checked against the model.
		if _, err := os.Stat(adapter); err != nil {
			return nil, fmt.Errorf("The adapter path does not exist: %s", adapter)
		}
		f.loads++
		dir = filepath.Join(f.tmp, fmt.Sprint(f.loads))
		if err := mlxtest.Merge(model, adapter, dir); err != nil {
			if errors.Is(err, mlx.ErrFormat) {
				return nil, fmt.Errorf("Adapter at %s contains incompatible tensors:\n  %v", adapter, err)
			}
			return nil, err
		}
	} else {
		f.loads++
	}
	eng, err := native.Open(context.Background(), dir, native.Options{Threads: 1})
	if err != nil {
		return nil, err
	}
	f.key, f.eng = &key, eng
	return eng, nil
}

// loaded counts the models the server loaded.
func (f *fakeMLX) loaded() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads
}

// bodies returns the chat completion bodies the server received.
func (f *fakeMLX) bodies() []map[string]json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]json.RawMessage(nil), f.seen...)
}

// tinyMLX is the tiny model in a directory, served by a fakeMLX.
type tinyMLX struct {
	dir string // the model directory (absolute)
	cfg native.Config
	txt modeldir.Text
	srv *fakeMLX
	url string // with /v1
}

func startTinyMLX(t *testing.T) *tinyMLX {
	t.Helper()
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "Qwen3-tiny")
	if err := native.CreateTiny(dir, cfg, 21); err != nil {
		t.Fatal(err)
	}
	srv := newFakeMLX(t, dir, txt)
	return &tinyMLX{dir: dir, cfg: cfg, txt: txt, srv: srv, url: serveFake(t, srv) + "/v1"}
}

// adapter writes, under its own directory, a PEFT adapter named version
// for the tiny model whose B matrices are drawn at random from seed (a
// fresh adapter's are zero), so that it changes what the model says.
func (m *tinyMLX) adapter(t *testing.T, version string, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), version)
	if err := native.WriteFreshAdapter(dir, m.cfg, native.LoRAConfig{Rank: 4, Alpha: 8}, seed, m.dir); err != nil {
		t.Fatal(err)
	}
	wp := filepath.Join(dir, weightsFile)
	sf, err := safetensors.ReadFile(wp)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 2))
	var ts []safetensors.Tensor
	for _, name := range sf.Names() {
		v, shape, err := sf.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(name, "lora_B") {
			for i := range v {
				v[i] = float32(r.NormFloat64() * 0.3)
			}
		}
		tn, err := safetensors.F32Tensor(name, safetensors.F32, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tn)
	}
	if err := safetensors.WriteFile(wp, ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// say is what the tiny model says to prompt, greedily, with the PEFT
// adapter in dir ("": none), run by the native engine itself.
func (m *tinyMLX) say(t *testing.T, dir, prompt string, n int) string {
	t.Helper()
	e, err := native.Open(context.Background(), m.dir, native.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if dir != "" {
		if err := e.LoadAdapter(context.Background(), dir); err != nil {
			t.Fatal(err)
		}
	}
	text, err := m.txt.Renderer.Render([]core.Message{{Role: "user", Content: prompt}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	toks, _, err := e.Generate(context.Background(), m.txt.Tokenizer.Encode(text), engine.GenOptions{MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	if k := len(toks); k > 0 && m.txt.Tokenizer.IsSpecial(toks[k-1]) {
		toks = toks[:k-1]
	}
	// As a JSON reply carries it: invalid UTF-8 becomes U+FFFD.
	var said string
	b, _ := json.Marshal(m.txt.Tokenizer.Decode(toks))
	json.Unmarshal(b, &said)
	return said
}

// memStore is the least Store a gateway records steps in.
type memStore struct {
	mu    sync.Mutex
	steps map[core.StepID]core.Step
}

func (s *memStore) Put(_ context.Context, st *core.Step) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.steps == nil {
		s.steps = map[core.StepID]core.Step{}
	}
	s.steps[st.ID] = *st
	return nil
}

func (s *memStore) Update(_ context.Context, id core.StepID, fn func(*core.Step) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.steps[id]
	if !ok {
		return fmt.Errorf("no step %s", id)
	}
	if err := fn(&st); err != nil {
		return err
	}
	s.steps[id] = st
	return nil
}

// startGateway runs a real gateway in front of upstream whose route is the
// Target in route, as the node routes by its Follower's Target.
func startGateway(t *testing.T, upstream string, route *atomic.Pointer[Target]) string {
	t.Helper()
	gw, err := gateway.New(gateway.Config{Upstream: upstream, Store: &memStore{}, Route: func() gateway.Route {
		tg := route.Load()
		return gateway.Route{Model: tg.Model, Adapter: tg.Version, Upstream: tg.Upstream, Fields: tg.Fields}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	return "http://" + ln.Addr().String() + "/v1"
}

// ask sends a chat completion to url (a client that names a model of its
// own) and returns the reply's text and model.
func ask(t *testing.T, url, prompt string, n int) (string, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "my-model", "max_tokens": n, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := http.Post(url+"/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, rb)
	}
	var cr struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(rb, &cr); err != nil || len(cr.Choices) != 1 {
		t.Fatalf("chat completion: %s (%v)", rb, err)
	}
	return cr.Choices[0].Message.Content, cr.Model
}

// TestMLXSwap swaps versions into a stand-in mlx_lm.server through the
// driver and a real gateway: each version's replies are what the native
// engine says with that version's PEFT adapter, so the mlx-lm copy the
// driver wrote, loaded as mlx-lm loads it, is that adapter.
func TestMLXSwap(t *testing.T) {
	ctx := ctxT(t)
	m := startTinyMLX(t)
	d, err := New("mlx", Config{Upstream: m.url})
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind() != "mlx" {
		t.Fatalf("Kind %q", d.Kind())
	}
	base, err := d.Base(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if base != (Target{Version: BaseVersion, Model: m.dir}) {
		t.Fatalf("Base: %+v, want the model /v1/models lists and no fields", base)
	}
	if err := d.Warm(ctx, base); err != nil {
		t.Fatalf("Warm(base): %v", err)
	}

	p1, p2 := m.adapter(t, "v1", 1), m.adapter(t, "v2", 2)
	v1, err := d.Load(ctx, "v1", p1)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"adapters":%q}`, p1+".mlx")
	if v1 != (Target{Version: "v1", Model: m.dir, Fields: want}) {
		t.Fatalf("Load: %+v, want the base model and fields %s", v1, want)
	}
	if _, err := mlx.Read(p1 + ".mlx"); err != nil {
		t.Fatalf("the copy Load wrote: %v", err)
	}
	loads := m.srv.loaded()
	if err := d.Warm(ctx, v1); err != nil {
		t.Fatalf("Warm(v1): %v", err)
	}
	if m.srv.loaded() != loads+1 {
		t.Fatalf("Warm(v1) did not have the server load the adapter (%d loads, then %d)", loads, m.srv.loaded())
	}
	last := m.srv.bodies()[len(m.srv.bodies())-1]
	if string(last["adapters"]) != fmt.Sprintf("%q", p1+".mlx") || string(last["max_tokens"]) != "1" {
		t.Fatalf("the warm-up sent %v", last)
	}
	v2, err := d.Load(ctx, "v2", p2)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Warm(ctx, v2); err != nil {
		t.Fatalf("Warm(v2): %v", err)
	}

	// Through the gateway, as the node flips its route.
	var route atomic.Pointer[Target]
	route.Store(&base)
	gw := startGateway(t, m.url, &route)
	const prompt, n = "Tell me about the mesh.", 12
	replies := map[string]string{}
	for _, tg := range []Target{base, v1, v2, base, v1} {
		route.Store(&tg)
		got, model := ask(t, gw, prompt, n)
		if model != m.dir {
			t.Fatalf("%s: answered as model %q, want %q", tg.Version, model, m.dir)
		}
		dir := map[string]string{"v1": p1, "v2": p2}[tg.Version]
		if want := m.say(t, dir, prompt, n); got != want {
			t.Fatalf("%s: the server said %q; the native engine with the version's PEFT adapter says %q", tg.Version, got, want)
		}
		if prev, ok := replies[tg.Version]; ok && prev != got {
			t.Fatalf("%s said %q, then %q", tg.Version, prev, got)
		}
		replies[tg.Version] = got
		last := m.srv.bodies()[len(m.srv.bodies())-1]
		if a, ok := last["adapters"]; (tg.Fields == "") == ok || (ok && string(a) != fmt.Sprintf("%q", strings.TrimSuffix(strings.TrimPrefix(tg.Fields, `{"adapters":"`), `"}`))) {
			t.Fatalf("%s: the server got adapters %s for fields %s", tg.Version, a, tg.Fields)
		}
	}
	if replies["base"] == replies["v1"] || replies["v1"] == replies["v2"] || replies["base"] == replies["v2"] {
		t.Fatalf("the versions do not change the replies: %q", replies)
	}

	// The server applies "adapters" only to a request that names its
	// model: a Target without the model would serve the base.
	b, _ := json.Marshal(map[string]any{"adapters": p1 + ".mlx", "max_tokens": n,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := http.Post(m.url+"/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var cr struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	json.NewDecoder(resp.Body).Decode(&cr)
	resp.Body.Close()
	if len(cr.Choices) != 1 || cr.Choices[0].Message.Content != replies["base"] {
		t.Fatalf("a request with adapters and no model: %+v, want the base model's %q", cr, replies["base"])
	}

	// Unload frees nothing: a request routed before the flip may still
	// be queued with v1.
	if err := d.Unload(ctx, v1); err != nil {
		t.Fatal(err)
	}
	if err := d.Warm(ctx, v1); err != nil {
		t.Fatalf("Warm(v1) after Unload: %v", err)
	}
}

// TestMLXRefusals checks what the driver makes of what mlx_lm.server
// refuses, and that it cleans up the copies of pruned versions.
func TestMLXRefusals(t *testing.T) {
	ctx := ctxT(t)
	m := startTinyMLX(t)
	d, err := New("mlx", Config{Upstream: m.url})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ghost", func(t *testing.T) {
		ghost := Target{Version: "v9", Model: m.dir, Fields: `{"adapters":"/nonexistent/v9.mlx"}`}
		if err := d.Warm(ctx, ghost); !errors.Is(err, ErrWarm) || !contains(err, "does not exist", "same path") {
			t.Fatalf("Warm of a version never written: %v, want ErrWarm saying where the server looks", err)
		}
	})
	t.Run("another model", func(t *testing.T) {
		// An adapter shaped for another model: mlx-lm's load_adapters
		// refuses its tensors when the server loads it.
		other := writeAdapter(t, 4, []string{"q_proj", "v_proj"}, 1)
		tg, err := d.Load(ctx, "v3", other)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Warm(ctx, tg); !errors.Is(err, ErrWarm) || !contains(err, "incompatible tensors", "404") {
			t.Fatalf("Warm of an adapter for another model: %v, want ErrWarm with the server's message", err)
		}
	})
	t.Run("dora", func(t *testing.T) {
		p := m.adapter(t, "v4", 4)
		b, _ := os.ReadFile(filepath.Join(p, configFile))
		os.WriteFile(filepath.Join(p, configFile), bytes.Replace(b, []byte(`"use_dora": false`), []byte(`"use_dora": true`), 1), 0o644)
		if _, err := d.Load(ctx, "v4", p); !errors.Is(err, ErrRefused) || !contains(err, "use_dora") {
			t.Fatalf("Load of a DoRA adapter: %v, want ErrRefused naming it", err)
		}
		if _, err := os.Stat(p + ".mlx"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused load left its copy: %v", err)
		}
	})
	t.Run("bad version", func(t *testing.T) {
		if _, err := d.Load(ctx, "../v1", m.adapter(t, "v1", 1)); !errors.Is(err, ErrConfig) {
			t.Fatalf("Load with a bad version name: %v", err)
		}
		if _, err := d.Load(ctx, "v1", t.TempDir()); !errors.Is(err, ErrAdapter) {
			t.Fatalf("Load of an empty directory: %v", err)
		}
	})
	t.Run("pruned", func(t *testing.T) {
		root := t.TempDir()
		for _, v := range []string{"v5", "v6"} {
			if err := os.Rename(m.adapter(t, v, 5), filepath.Join(root, v)); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Load(ctx, v, filepath.Join(root, v)); err != nil {
				t.Fatal(err)
			}
		}
		// The node prunes v5; the next load removes v5's copy, not v6's.
		os.RemoveAll(filepath.Join(root, "v5"))
		os.Mkdir(filepath.Join(root, ".mlx-v7-123"), 0o755) // an interrupted write
		// A version whose own directory ends in .mlx is never taken for a
		// copy.
		if err := os.Rename(m.adapter(t, "x", 9), filepath.Join(root, "x.mlx")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(m.adapter(t, "v7", 7), filepath.Join(root, "v7")); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Load(ctx, "v7", filepath.Join(root, "v7")); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(root)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if got := strings.Join(names, " "); got != "v6 v6.mlx v7 v7.mlx x.mlx" {
			t.Fatalf("after pruning v5: %s", got)
		}
	})
	t.Run("distributed", func(t *testing.T) {
		tg, err := d.Load(ctx, "v8", m.adapter(t, "v8", 8))
		if err != nil {
			t.Fatal(err)
		}
		m.srv.mu.Lock()
		m.srv.distributed = true
		m.srv.mu.Unlock()
		defer func() {
			m.srv.mu.Lock()
			m.srv.distributed = false
			m.srv.mu.Unlock()
		}()
		if err := d.Warm(ctx, tg); !errors.Is(err, ErrUnsupported) || !contains(err, "one machine") {
			t.Fatalf("Warm on a distributed server: %v, want ErrUnsupported", err)
		}
	})
	t.Run("several models", func(t *testing.T) {
		// The server lists its --model and the mlx models in the Hugging
		// Face cache: with more than one the node must be told.
		url := serveFake(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
				map[string]any{"id": "mlx-community/Qwen3-4B-4bit"}, map[string]any{"id": m.dir}}})
		})) + "/v1"
		d, err := New("mlx", Config{Upstream: url})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Base(ctx); !errors.Is(err, ErrConfig) || !contains(err, "several models") {
			t.Fatalf("Base with two models listed: %v", err)
		}
		d, err = New("mlx", Config{Upstream: url, BaseModel: "mlx-community/Qwen3-4B-4bit"})
		if err != nil {
			t.Fatal(err)
		}
		if tg, err := d.Base(ctx); err != nil || tg.Model != "mlx-community/Qwen3-4B-4bit" {
			t.Fatalf("Base with the model named: %+v, %v", tg, err)
		}
	})
}
