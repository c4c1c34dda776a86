package swap

import (
	"errors"
	"net/http"
	"testing"
)

// refusal is one server set-up that will not load an adapter, and what the
// driver must make of the server's answer.
type refusal struct {
	name    string
	handler func() http.Handler // the fake server, set up
	rank    int                 // of the adapter loaded
	modules []string            // of the adapter loaded (default q_proj, v_proj)
	want    error
	says    []string // the error must say each
}

func runRefusals(t *testing.T, kind string, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			url := serveFake(t, c.handler())
			d, err := New(kind, Config{Upstream: url + "/v1"})
			if err != nil {
				t.Fatal(err)
			}
			mods := c.modules
			if mods == nil {
				mods = []string{"q_proj", "v_proj"}
			}
			_, err = d.Load(ctx, "v7", writeAdapter(t, c.rank, mods, 1))
			if !errors.Is(err, c.want) || !contains(err, c.says...) {
				t.Fatalf("Load: %v\nwant %v saying %q", err, c.want, c.says)
			}
			t.Logf("%v", err)
		})
	}
}

func TestVLLMRefusals(t *testing.T) {
	vllm := func(set func(*fakeVLLM)) func() http.Handler {
		return func() http.Handler { f := newFakeVLLM(); set(f); return f }
	}
	runRefusals(t, "vllm", []refusal{
		{name: "no runtime updating", rank: 8, handler: vllm(func(f *fakeVLLM) { f.runtime = false }),
			want: ErrUnsupported, says: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", "--enable-lora"}},
		{name: "no runtime updating, newer release", rank: 8, handler: vllm(func(f *fakeVLLM) { f.runtime, f.newNotFound = false, true }),
			want: ErrUnsupported, says: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}},
		{name: "no runtime updating, rank above the default", rank: 64, handler: vllm(func(f *fakeVLLM) { f.runtime = false }),
			want: ErrUnsupported, says: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", "--max-lora-rank 64"}},
		{name: "no --enable-lora", rank: 8, handler: vllm(func(f *fakeVLLM) { f.lora = false }),
			want: ErrUnsupported, says: []string{"--enable-lora", "LoRA is not enabled"}},
		{name: "rank above --max-lora-rank", rank: 64, handler: vllm(func(f *fakeVLLM) {}),
			want: ErrRefused, says: []string{"rank 64", "--max-lora-rank 16", "restart vLLM with --max-lora-rank 64"}},
		{name: "rank between the accepted values", rank: 20, handler: vllm(func(f *fakeVLLM) {}),
			want: ErrRefused, says: []string{"rank 20", "--max-lora-rank 32"}},
		{name: "rank above anything vLLM takes", rank: 600, handler: vllm(func(f *fakeVLLM) { f.maxRank = 512 }),
			want: ErrRefused, says: []string{"rank 600", "at most 512"}},
		{name: "rank, older error shape", rank: 32, handler: vllm(func(f *fakeVLLM) { f.oldErrors = true }),
			want: ErrRefused, says: []string{"--max-lora-rank 32"}},
		{name: "server cannot see the files", rank: 8, handler: vllm(func(f *fakeVLLM) { f.blind = true }),
			want: ErrRefused, says: []string{"finds no adapter", "same path"}},
		{name: "wrong token", rank: 8, handler: vllm(func(f *fakeVLLM) { f.token = "other" }),
			want: ErrUpstream, says: []string{"401", "token"}},
	})
}

func TestSGLangRefusals(t *testing.T) {
	sgl := func(set func(*fakeSGLang)) func() http.Handler {
		return func() http.Handler { f := newFakeSGLang(); set(f); return f }
	}
	runRefusals(t, "sglang", []refusal{
		{name: "no --enable-lora", rank: 8, handler: sgl(func(f *fakeSGLang) { f.lora = false }),
			want: ErrUnsupported, says: []string{"--enable-lora --max-lora-rank 8 --lora-target-modules q_proj v_proj"}},
		{name: "no dynamic loading", rank: 8, handler: sgl(func(f *fakeSGLang) { f.noRoute = true }),
			want: ErrUnsupported, says: []string{"/load_lora_adapter", "--enable-lora"}},
		{name: "rank above --max-lora-rank", rank: 64, handler: sgl(func(f *fakeSGLang) {}),
			want: ErrRefused, says: []string{"rank 64", "--max-lora-rank of at least 64"}},
		{name: "a module outside --lora-target-modules", rank: 8, modules: []string{"q_proj", "gate_proj"}, handler: sgl(func(f *fakeSGLang) {}),
			want: ErrRefused, says: []string{"--lora-target-modules", "gate_proj"}},
	})
}

func TestOllamaRefusals(t *testing.T) {
	oll := func(set func(*fakeOllama)) func() http.Handler {
		return func() http.Handler { f := newFakeOllama("llama3.2:1b"); set(f); return f }
	}
	runRefusals(t, "ollama", []refusal{
		{name: "a release without adapters", rank: 8, handler: oll(func(f *fakeOllama) { f.noAdapters = true }),
			want: ErrUnsupported, says: []string{"no longer supported", "clawmesh setup ollama --model llama3.2:1b", "llama-server"}},
		{name: "an architecture adapters are not exported for", rank: 8, handler: oll(func(f *fakeOllama) { f.arch = "gemma3" }),
			want: ErrUnsupported, says: []string{"gemma3", "llama3.2:1b", "cannot be exported"}},
		{name: "an adapter of another base", rank: 8, handler: oll(func(f *fakeOllama) { f.hidden = 16 }),
			want: ErrUnsupported, says: []string{"another base model than Ollama's llama3.2:1b", "hidden size 8, not 16", "not loaded"}},
	})
}

func TestLlamaCppLoad(t *testing.T) {
	runRefusals(t, "llamacpp", []refusal{
		{name: "always", rank: 8, handler: func() http.Handler { return fakeLlama{} },
			want: ErrUnsupported, says: []string{"clawmesh weights export v7 --format gguf --out clawmesh-v7.gguf", "--lora clawmesh-v7.gguf", "clawmesh weights use v7", "restart llama-server", "--serve llama-server"}},
	})
}
