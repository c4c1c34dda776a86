package swap

import (
	"errors"
	"testing"
)

// conformer is one driver under the conformance suite, with what its
// server makes of a swap.
type conformer struct {
	kind string
	// start serves the server and returns the driver's Config and two
	// adapter directories it can load.
	start func(t *testing.T) (Config, [2]string)
	// loads: Load works at all (llama.cpp: never).
	loads bool
	// byModel: every loaded version stays servable, by its model name,
	// until Unload (vLLM, SGLang, Ollama); otherwise the server holds one
	// version and a load replaces it (clawmesh serve).
	byModel bool
	// byFields: every version is served by the base model's name with the
	// version's body fields, loaded by the request that names them, and
	// stays servable after Unload (mlx_lm.server).
	byFields bool
}

func conformers() []conformer {
	fakeDirs := func(t *testing.T) [2]string {
		return [2]string{writeAdapter(t, 8, []string{"q_proj", "v_proj"}, 1), writeAdapter(t, 8, []string{"q_proj", "v_proj"}, 2)}
	}
	return []conformer{
		{kind: "clawmesh", loads: true, start: func(t *testing.T) (Config, [2]string) {
			s := startTinyServe(t, "")
			return Config{Upstream: s.URL}, [2]string{s.adapter(t), s.adapter(t)}
		}},
		{kind: "vllm", loads: true, byModel: true, start: func(t *testing.T) (Config, [2]string) {
			return Config{Upstream: serveFake(t, newFakeVLLM()) + "/v1"}, fakeDirs(t)
		}},
		{kind: "sglang", loads: true, byModel: true, start: func(t *testing.T) (Config, [2]string) {
			return Config{Upstream: serveFake(t, newFakeSGLang()) + "/v1"}, fakeDirs(t)
		}},
		{kind: "ollama", loads: true, byModel: true, start: func(t *testing.T) (Config, [2]string) {
			return Config{Upstream: serveFake(t, newFakeOllama("llama3.2:1b")) + "/v1"}, fakeDirs(t)
		}},
		{kind: "mlx", loads: true, byFields: true, start: func(t *testing.T) (Config, [2]string) {
			m := startTinyMLX(t)
			return Config{Upstream: m.url}, [2]string{m.adapter(t, "a1", 1), m.adapter(t, "a2", 2)}
		}},
		{kind: "llamacpp", start: func(t *testing.T) (Config, [2]string) {
			return Config{Upstream: serveFake(t, fakeLlama{}) + "/v1"}, fakeDirs(t)
		}},
	}
}

// TestConformance runs one suite against every driver: the real
// `clawmesh serve`, and fakes of the other servers' documented APIs.
func TestConformance(t *testing.T) {
	for _, c := range conformers() {
		t.Run(c.kind, func(t *testing.T) {
			ctx := ctxT(t)
			cfg, dirs := c.start(t)
			d, err := New(c.kind, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Kind() != c.kind {
				t.Fatalf("Kind %q, want %q", d.Kind(), c.kind)
			}

			// The base model serves before any adapter.
			base, err := d.Base(ctx)
			if err != nil {
				t.Fatalf("Base: %v", err)
			}
			if base.Version != BaseVersion {
				t.Fatalf("Base: version %q", base.Version)
			}
			if err := d.Warm(ctx, base); err != nil {
				t.Fatalf("Warm(base): %v", err)
			}

			// Bad input is refused before the server hears of it.
			if _, err := d.Load(ctx, "../v1", dirs[0]); !errors.Is(err, ErrConfig) {
				t.Fatalf("Load with a bad version name: %v, want ErrConfig", err)
			}
			if _, err := d.Load(ctx, "v1", t.TempDir()); !errors.Is(err, ErrAdapter) || !contains(err, "adapter_config.json") {
				t.Fatalf("Load of an empty directory: %v, want ErrAdapter", err)
			}

			v1, err := d.Load(ctx, "v1", dirs[0])
			if !c.loads {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("Load: %v, want ErrUnsupported", err)
				}
				if err := d.Warm(ctx, base); err != nil {
					t.Fatalf("the base model after a refused load: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load(v1): %v", err)
			}
			if v1.Version != "v1" {
				t.Fatalf("Load(v1): %+v", v1)
			}
			if err := d.Warm(ctx, v1); err != nil {
				t.Fatalf("Warm(v1): %v", err)
			}
			// A version the server does not serve fails its warm-up.
			ghost := Target{Version: "v9"}
			if c.byModel {
				ghost.Model = v1.Model[:len(v1.Model)-len("v1")] + "v9"
			}
			if c.byFields {
				ghost.Model, ghost.Fields = v1.Model, `{"adapters":"/nonexistent/v9"}`
			}
			if err := d.Warm(ctx, ghost); !errors.Is(err, ErrWarm) {
				t.Fatalf("Warm of a version never loaded: %v, want ErrWarm", err)
			}

			v2, err := d.Load(ctx, "v2", dirs[1])
			if err != nil {
				t.Fatalf("Load(v2): %v", err)
			}
			if err := d.Warm(ctx, v2); err != nil {
				t.Fatalf("Warm(v2): %v", err)
			}
			if c.byModel || c.byFields {
				if c.byModel && (v1.Model == v2.Model || v1.Model == base.Model) {
					t.Fatalf("versions share a model name: base %q, v1 %q, v2 %q", base.Model, v1.Model, v2.Model)
				}
				if c.byFields && (v1.Fields == v2.Fields || base.Fields != "" || v1.Model != base.Model) {
					t.Fatalf("versions not told apart by their fields: base %+v, v1 %+v, v2 %+v", base, v1, v2)
				}
				// Requests routed to v1 before the flip still find it.
				if err := d.Warm(ctx, v1); err != nil {
					t.Fatalf("Warm(v1) with v2 loaded: %v", err)
				}
			} else if err := d.Warm(ctx, v1); !errors.Is(err, ErrWarm) {
				t.Fatalf("Warm(v1) after v2 replaced it: %v, want ErrWarm", err)
			}

			if err := d.Unload(ctx, v1); err != nil {
				t.Fatalf("Unload(v1): %v", err)
			}
			if c.byModel {
				if err := d.Warm(ctx, v1); !errors.Is(err, ErrWarm) {
					t.Fatalf("Warm(v1) after Unload: %v, want ErrWarm", err)
				}
			} else if c.byFields {
				if err := d.Warm(ctx, v1); err != nil {
					t.Fatalf("Warm(v1) after Unload: %v (a request queued before the flip may still name it)", err)
				}
			}
			if err := d.Unload(ctx, v1); err != nil {
				t.Fatalf("Unload(v1) again: %v", err)
			}
			if err := d.Warm(ctx, v2); err != nil {
				t.Fatalf("Warm(v2) after unloading v1: %v", err)
			}
			// Unload never frees the base model.
			if err := d.Unload(ctx, base); err != nil {
				t.Fatalf("Unload(base): %v", err)
			}
			if c.byModel || c.byFields {
				if err := d.Warm(ctx, base); err != nil {
					t.Fatalf("Warm(base) after Unload(base): %v", err)
				}
			}
		})
	}
}
