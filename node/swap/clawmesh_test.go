package swap

import (
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/trainer/adapter"
)

// startTinyServe serves the tiny model until the test ends. token, if set,
// is required of clients.
func startTinyServe(t testing.TB, token string) *tinyServe {
	return &tinyServe{servetest.Start(t, token, 2)}
}

// tinyServe is a real `clawmesh serve` of the tiny native model.
type tinyServe struct{ *servetest.Tiny }

// adapter exports an adapter one optimizer step away from the fresh one.
func (s *tinyServe) adapter(t testing.TB) string { return s.Adapter(t, 1, 0.05) }

// The files the driver checks for are the ones a PEFT bundle holds.
func TestAdapterFilesMatchPEFT(t *testing.T) {
	if configFile != adapter.ConfigFile || weightsFile != adapter.WeightsFile {
		t.Fatalf("adapter files %q, %q; PEFT bundles hold %q, %q", configFile, weightsFile, adapter.ConfigFile, adapter.WeightsFile)
	}
}

// TestClawmeshServe drives a real `clawmesh serve`: what the conformance
// suite cannot say of a server that swaps one version atomically.
func TestClawmeshServe(t *testing.T) {
	ctx := ctxT(t)
	s := startTinyServe(t, "s3cret")
	d, err := New("clawmesh", Config{Upstream: s.URL, Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.adapter(t)

	t.Run("wrong token", func(t *testing.T) {
		bad, err := New("clawmesh", Config{Upstream: s.URL, Token: "nope"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.Load(ctx, "v1", dir); !errors.Is(err, ErrUpstream) || !contains(err, "401", "token") {
			t.Fatalf("Load with a wrong token: %v, want ErrUpstream naming the token", err)
		}
		if got := s.Srv.Adapter(); got != serveapi.BaseVersion {
			t.Fatalf("a refused request changed the adapter to %q", got)
		}
	})

	t.Run("refused adapter", func(t *testing.T) {
		// An adapter shaped for another model: the engine refuses it.
		other := writeAdapter(t, 4, []string{"q_proj"}, 1)
		if _, err := d.Load(ctx, "v0", other); !errors.Is(err, ErrRefused) || !contains(err, "v0") {
			t.Fatalf("Load of an adapter for another model: %v, want ErrRefused", err)
		}
		if got := s.Srv.Adapter(); got != serveapi.BaseVersion {
			t.Fatalf("after a refused load the server serves %q", got)
		}
	})

	base, err := d.Base(ctx)
	if err != nil || base != (Target{Version: BaseVersion}) {
		t.Fatalf("Base before any load: %+v, %v", base, err)
	}
	v1, err := d.Load(ctx, "v1", dir)
	if err != nil {
		t.Fatal(err)
	}
	if v1 != (Target{Version: "v1"}) {
		t.Fatalf("Load: %+v, want the version and no model rewrite", v1)
	}
	if got := s.Srv.Adapter(); got != "v1" {
		t.Fatalf("the server serves %q after Load", got)
	}
	if err := d.Warm(ctx, v1); err != nil {
		t.Fatal(err)
	}
	// The server swapped atomically: the base is gone, and cannot come
	// back while it runs.
	if err := d.Warm(ctx, base); !errors.Is(err, ErrWarm) || !contains(err, `"v1"`) {
		t.Fatalf("Warm(base) after the swap: %v, want ErrWarm naming v1", err)
	}
	if _, err := d.Base(ctx); !errors.Is(err, ErrUnsupported) || !contains(err, "restart", "v1") {
		t.Fatalf("Base after a load: %v, want ErrUnsupported saying to restart", err)
	}
	// Loading the same version again (a node restart) is harmless.
	if _, err := d.Load(ctx, "v1", dir); err != nil {
		t.Fatalf("Load again: %v", err)
	}
}
