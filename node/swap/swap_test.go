package swap

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	up := Config{Upstream: "http://127.0.0.1:8000/v1"}
	for _, c := range []struct {
		kind string
		cfg  Config
		want error  // nil: a driver
		as   string // its Kind, or what the error must say
	}{
		{"vllm", up, nil, "vllm"},
		{"VLLM", up, nil, "vllm"},
		{"sglang", up, nil, "sglang"},
		{"ollama", up, nil, "ollama"},
		{"clawmesh", up, nil, "clawmesh"},
		{"llamacpp", up, nil, "llamacpp"},
		{"llama.cpp", up, nil, "llamacpp"},
		{"openai", up, ErrUnsupported, `kind "openai", so it keeps serving the base model`},
		{"", up, ErrUnsupported, `kind "openai", so it keeps serving the base model`},
		{"none", up, ErrUnsupported, `kind "none", so it keeps serving the base model`},
		{"tgi", up, ErrConfig, `unknown upstream kind "tgi"`},
		{"tgi", Config{}, ErrConfig, `unknown upstream kind "tgi"`},
		{"vllm", Config{}, ErrConfig, "no upstream"},
		{"vllm", Config{Upstream: "127.0.0.1:8000"}, ErrConfig, "not an http(s) URL"},
		{"vllm", Config{Upstream: "ftp://127.0.0.1/v1"}, ErrConfig, "not an http(s) URL"},
		{"vllm", Config{Upstream: up.Upstream, Prefix: "a b"}, ErrConfig, "prefix"},
	} {
		d, err := New(c.kind, c.cfg)
		if c.want == nil {
			if err != nil || d.Kind() != c.as {
				t.Errorf("New(%q): %v, %v; want kind %q", c.kind, d, err, c.as)
			}
			continue
		}
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.as) {
			t.Errorf("New(%q, %+v): %v; want %v saying %q", c.kind, c.cfg, err, c.want, c.as)
		}
		if strings.Count(err.Error(), "swap:") != 1 {
			t.Errorf("New(%q): %q repeats the package prefix", c.kind, err)
		}
	}
}

func TestURLs(t *testing.T) {
	for _, c := range []struct{ up, api, root string }{
		{"http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:11434", "http://127.0.0.1:11434/v1", "http://127.0.0.1:11434"},
		{"https://gpu.lan/llm/v1", "https://gpu.lan/llm/v1", "https://gpu.lan/llm"},
	} {
		cl := newClient("vllm", Config{Upstream: c.up}.withDefaults())
		if cl.api != c.api || cl.root != c.root {
			t.Errorf("%s: api %s root %s, want %s %s", c.up, cl.api, cl.root, c.api, c.root)
		}
	}
}

func TestReplyMessage(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"error": {"message": "LoRA rank 64 is greater than max_lora_rank 16.", "type": "BadRequestError", "code": 400}}`, "LoRA rank 64 is greater than max_lora_rank 16."},
		{`{"object": "error", "message": "The model x does not exist", "type": "NotFoundError", "code": 404}`, "The model x does not exist"},
		{`{"error": "LoRA adapters are no longer supported"}`, "LoRA adapters are no longer supported"},
		{`{"detail": "Not Found"}`, "Not Found"},
		{`{"detail": [{"loc": ["body", "lora_name"], "msg": "Field required"}]}`, `[{"loc": ["body", "lora_name"], "msg": "Field required"}]`},
		{`{"success": false, "error_message": "LoRA is not enabled."}`, "LoRA is not enabled."},
		{"Internal Server Error", "Internal Server Error"},
		{"", "Bad Gateway"},
		{strings.Repeat("x", 400), strings.Repeat("x", 300) + "..."},
	} {
		r := &reply{status: http.StatusBadGateway, body: []byte(c.body)}
		if got := r.message(); got != c.want {
			t.Errorf("message of %q: %q, want %q", c.body, got, c.want)
		}
	}
}

func TestReadAdapter(t *testing.T) {
	dir := writeAdapter(t, 8, []string{"q_proj", "v_proj"}, 1)
	abs, info, err := readAdapter(dir)
	if err != nil || abs != dir || info.Rank != 8 || !slices.Equal(info.TargetModules, []string{"q_proj", "v_proj"}) {
		t.Fatalf("readAdapter: %s %+v %v", abs, info, err)
	}
	// rank_pattern can raise one module's rank above r; target_modules may
	// be one regular expression.
	cfg := `{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 32}, "target_modules": ".*proj"}`
	if err := os.WriteFile(filepath.Join(dir, configFile), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, info, err = readAdapter(dir); err != nil || info.Rank != 32 || !slices.Equal(info.TargetModules, []string{".*proj"}) {
		t.Fatalf("readAdapter with a rank_pattern: %+v %v", info, err)
	}
	// A relative directory comes back absolute: the server does not share
	// the node's working directory.
	t.Chdir(filepath.Dir(dir))
	if abs, _, err := readAdapter(filepath.Base(dir)); err != nil || abs != dir {
		t.Fatalf("readAdapter(relative): %s %v", abs, err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readAdapter(dir); !errors.Is(err, ErrAdapter) {
		t.Fatalf("readAdapter of a broken config: %v", err)
	}
	os.Remove(filepath.Join(dir, weightsFile))
	if _, _, err := readAdapter(dir); !errors.Is(err, ErrAdapter) || !contains(err, weightsFile) {
		t.Fatalf("readAdapter without weights: %v", err)
	}
}

func TestVLLMRank(t *testing.T) {
	for rank, want := range map[int]int{1: 1, 2: 8, 8: 8, 9: 16, 16: 16, 17: 32, 300: 320, 512: 512, 513: 0} {
		if got := vllmRank(rank); got != want {
			t.Errorf("vllmRank(%d) = %d, want %d", rank, got, want)
		}
	}
}

// A server that answers a warm-up with another model (silently falling
// back to the base) fails it.
func TestWarmNamesTheModel(t *testing.T) {
	ctx := ctxT(t)
	f := newFakeVLLM()
	d, err := New("vllm", Config{Upstream: serveFake(t, f) + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	v1, err := d.Load(ctx, "v1", writeAdapter(t, 8, []string{"q_proj"}, 1))
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.echoBase = true
	f.mu.Unlock()
	if err := d.Warm(ctx, v1); !errors.Is(err, ErrWarm) || !contains(err, `asked for model "clawmesh-v1", answered by "Qwen/Qwen3-0.6B"`) {
		t.Fatalf("Warm answered by the base: %v", err)
	}
}

// Loading a version the server already holds (the node restarted) is a
// success: the name means the same adapter.
func TestLoadAgain(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang", "ollama"} {
		t.Run(kind, func(t *testing.T) {
			ctx := ctxT(t)
			var h http.Handler
			switch kind {
			case "vllm":
				h = newFakeVLLM()
			case "sglang":
				h = newFakeSGLang()
			case "ollama":
				h = newFakeOllama("llama3.2:1b")
			}
			cfg := Config{Upstream: serveFake(t, h) + "/v1"}
			dir := writeAdapter(t, 8, []string{"q_proj"}, 1)
			var first Target
			for i := range 2 {
				d, err := New(kind, cfg) // a new node process each time
				if err != nil {
					t.Fatal(err)
				}
				tg, err := d.Load(ctx, "v1", dir)
				if err != nil {
					t.Fatalf("Load #%d: %v", i+1, err)
				}
				if i == 0 {
					first = tg
				} else if tg != first {
					t.Fatalf("Load again gave %+v, first %+v", tg, first)
				}
				if err := d.Warm(ctx, tg); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestBaseModel(t *testing.T) {
	ctx := ctxT(t)
	t.Run("configured", func(t *testing.T) {
		d, err := New("ollama", Config{Upstream: serveFake(t, newFakeOllama("qwen3:8b", "llama3.2:1b")) + "/v1", BaseModel: "llama3.2:1b"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := d.Base(ctx)
		if err != nil || b != (Target{Version: BaseVersion, Model: "llama3.2:1b"}) {
			t.Fatalf("Base: %+v %v", b, err)
		}
		if err := d.Warm(ctx, b); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("several listed", func(t *testing.T) {
		d, err := New("ollama", Config{Upstream: serveFake(t, newFakeOllama("qwen3:8b", "llama3.2:1b")) + "/v1"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = d.Base(ctx)
		if !errors.Is(err, ErrConfig) || !contains(err, "several models", "qwen3:8b", "llama3.2:1b", "name the base model") {
			t.Fatalf("Base with two models listed: %v", err)
		}
		if _, err := d.Load(ctx, "v1", writeAdapter(t, 8, []string{"q_proj"}, 1)); !errors.Is(err, ErrConfig) {
			t.Fatalf("Load with no base model: %v", err)
		}
	})
	t.Run("adapters are not the base", func(t *testing.T) {
		// vLLM lists each loaded adapter beside the base, with a parent.
		f := newFakeVLLM()
		url := serveFake(t, f) + "/v1"
		d, err := New("vllm", Config{Upstream: url})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Load(ctx, "v1", writeAdapter(t, 8, []string{"q_proj"}, 1)); err != nil {
			t.Fatal(err)
		}
		d2, err := New("vllm", Config{Upstream: url})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := d2.Base(ctx); err != nil || b.Model != f.base {
			t.Fatalf("Base with an adapter listed: %+v %v", b, err)
		}
	})
	t.Run("a base that is not there", func(t *testing.T) {
		d, err := New("ollama", Config{Upstream: serveFake(t, newFakeOllama("llama3.2:1b")) + "/v1", BaseModel: "llama3.3:70b"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Load(ctx, "v1", writeAdapter(t, 8, []string{"q_proj"}, 1)); !errors.Is(err, ErrConfig) || !contains(err, "ollama pull llama3.3:70b") {
			t.Fatalf("Load onto a missing base: %v", err)
		}
	})
}

// TestOllamaBlobs: a version goes up as one llama.cpp LoRA GGUF, for the
// base's architecture; the same version loaded again (the node restarted)
// uploads nothing; Unload deletes the version's model and never the
// user's.
func TestOllamaBlobs(t *testing.T) {
	ctx := ctxT(t)
	for _, arch := range []string{"llama", "qwen3"} {
		t.Run(arch, func(t *testing.T) {
			f := newFakeOllama("llama3.2:1b")
			f.arch = arch
			cfg := Config{Upstream: serveFake(t, f) + "/v1"}
			d, err := New("ollama", cfg)
			if err != nil {
				t.Fatal(err)
			}
			dir := writeAdapter(t, 8, []string{"q_proj", "v_proj"}, 1)
			v1, err := d.Load(ctx, "v1", dir)
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			ad, posts, g := f.created["clawmesh-v1:latest"], f.blobPosts, f.adapters["clawmesh-v1:latest"]
			f.mu.Unlock()
			if len(ad) != 1 || ad["adapter.gguf"] == "" || posts != 1 {
				t.Fatalf("created with adapters %v after %d uploads", ad, posts)
			}
			if a, _ := g.String("general.architecture"); a != arch {
				t.Fatalf("the adapter GGUF is for %q, the base is %q", a, arch)
			}
			if at, _ := g.String("adapter.type"); at != "lora" {
				t.Fatalf("adapter.type %q", at)
			}
			for _, n := range []string{"blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b", "blk.0.attn_v.weight.lora_a", "blk.0.attn_v.weight.lora_b"} {
				if _, ok := g.Tensor(n); !ok {
					t.Fatalf("the adapter GGUF has no %s", n)
				}
			}
			if err := d.Warm(ctx, v1); err != nil {
				t.Fatal(err)
			}
			// The same version again (the node retries it): the driver
			// knows its blob and exports nothing; a node that restarted
			// exports it again, to the same bytes, and uploads nothing.
			w := filepath.Join(dir, weightsFile)
			good, _ := os.ReadFile(w)
			os.WriteFile(w, []byte("not safetensors any more"), 0o600)
			if _, err := d.Load(ctx, "v1", dir); err != nil {
				t.Fatalf("loading v1 again exported it again: %v", err)
			}
			d3, err := New("ollama", cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d3.Load(ctx, "v1", dir); !errors.Is(err, ErrAdapter) {
				t.Fatalf("a new driver loaded v1 from a broken directory: %v", err)
			}
			os.WriteFile(w, good, 0o600)
			d2, _ := New("ollama", cfg)
			if _, err := d2.Load(ctx, "v1", dir); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			posts = f.blobPosts
			f.mu.Unlock()
			if posts != 1 {
				t.Fatalf("%d uploads after loading the same version twice", posts)
			}
			v2, err := d.Load(ctx, "v2", writeAdapter(t, 8, []string{"q_proj", "v_proj"}, 2))
			if err != nil {
				t.Fatal(err)
			}
			// Unload deletes the version's model, and never one of the user's.
			if err := d.Unload(ctx, v1); err != nil || f.has("clawmesh-v1") {
				t.Fatalf("Unload(v1): %v; still there: %v", err, f.has("clawmesh-v1"))
			}
			if err := d.Unload(ctx, Target{Version: "v?", Model: "llama3.2:1b"}); err != nil || !f.has("llama3.2:1b") {
				t.Fatalf("Unload of the user's model: %v; still there: %v", err, f.has("llama3.2:1b"))
			}
			if err := d.Warm(ctx, v2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A clawmesh driver pointed at another server says so.
func TestClawmeshKindMismatch(t *testing.T) {
	ctx := ctxT(t)
	d, err := New("clawmesh", Config{Upstream: serveFake(t, newFakeVLLM()) + "/v1", BaseModel: "Qwen/Qwen3-0.6B"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load(ctx, "v1", writeAdapter(t, 8, []string{"q_proj"}, 1)); !errors.Is(err, ErrUnsupported) || !contains(err, "is it `clawmesh serve`?") {
		t.Fatalf("Load: %v", err)
	}
	if _, err := d.Base(ctx); !errors.Is(err, ErrUnsupported) || !contains(err, "is it `clawmesh serve`?") {
		t.Fatalf("Base: %v", err)
	}
	if err := d.Warm(ctx, Target{Version: BaseVersion}); !errors.Is(err, ErrWarm) || !contains(err, "names no version") {
		t.Fatalf("Warm: %v", err)
	}
}

// Server replies are read whatever their shape: no panic, and a message
// for every one.
func FuzzReplyMessage(f *testing.F) {
	for _, s := range []string{`{"error": {"message": "x"}}`, `{"error": "x"}`, `{"detail": [1]}`, `{"error_message": "x"}`, `null`, `[]`, "\xff"} {
		f.Add(400, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		if m := (&reply{status: status, body: body}).message(); m == "" && http.StatusText(status) != "" {
			t.Fatalf("no message for %d %q", status, body)
		}
	})
}

// TestOllamaBaseIdentity: the Ollama driver tells the base its server
// serves from /api/show, by the Ollama name and the GGUF's shape.
func TestOllamaBaseIdentity(t *testing.T) {
	ctx := ctxT(t)
	f := newFakeOllama("llama3.2:1b")
	f.arch = "qwen3"
	d, err := New("ollama", Config{Upstream: serveFake(t, f) + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	bi, ok := d.(BaseIdentifier)
	if !ok {
		t.Fatal("the Ollama driver cannot tell its base")
	}
	id, err := bi.BaseIdentity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id.Arch != "qwen3" || id.Layers != 1 || id.Hidden != 8 || id.Quant != "Q4_K_M" || id.Name() != "llama3.2:1b" {
		t.Fatalf("base identity %+v", id)
	}
	d, _ = New("ollama", Config{Upstream: serveFake(t, newFakeOllama("llama3.2:1b")) + "/v1", BaseModel: "llama3.3:70b"})
	if _, err := d.(BaseIdentifier).BaseIdentity(ctx); !errors.Is(err, ErrConfig) || !contains(err, "ollama pull llama3.3:70b") {
		t.Fatalf("the identity of a base Ollama does not have: %v", err)
	}
}
