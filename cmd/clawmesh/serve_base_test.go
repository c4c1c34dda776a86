package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
)

// TestNodeRefusesAnotherBase: a node that runs its model server on a
// model it knows (`--serve clawmesh --model DIR`) refuses versions trained
// on another base, keeps serving what it served, and says why: one of
// another model of the same shape, which the server itself would load and
// serve, and one of a model of three layers, not the tiny model's two. A
// version of its own base it puts into service.
func TestNodeRefusesAnotherBase(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a node and its model server")
	}
	t.Setenv(asCLI, "1") // the node's `clawmesh serve` is this binary
	ctx := context.Background()
	model := tinyModelDir(t)
	_, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	deeper := cfg
	deeper.Layers = 3
	work := t.TempDir()
	other, deep, own := filepath.Join(work, "other"), filepath.Join(work, "deep"), filepath.Join(work, "own")
	if err := native.WriteFreshAdapter(other, cfg, native.LoRAConfig{}, 1, "Qwen/Qwen3-0.6B"); err != nil {
		t.Fatal(err)
	}
	if err := native.WriteFreshAdapter(deep, deeper, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	if err := native.WriteFreshAdapter(own, cfg, native.LoRAConfig{}, 1, "tiny"); err != nil {
		t.Fatal(err)
	}

	data := t.TempDir()
	cli(t, "mesh", "init", "--data", data)
	holdVersion(t, data, other, 1)
	holdVersion(t, data, own, 2)
	holdVersion(t, data, deep, 3)
	gw := freeAddr(t)
	gatewayData.Store(gw, data)
	var logs syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(data, "logs", "clawmesh.log"))
			t.Logf("node's log:\n%s\nserver's log:\n%s", logs.String(), b)
		}
	})
	nctx, stopNode := context.WithCancel(ctx)
	nodeDone := make(chan int, 1)
	go func() {
		nodeDone <- run(nctx, []string{"node", "--serve", "clawmesh", "--model", model, "--serve-args", "--threads 1",
			"--data", data, "--listen", gw, "--no-scoring", "--no-mdns", "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--weights", "127.0.0.1:0"}, &logs, &logs)
	}()
	t.Cleanup(func() { stopNode(); <-nodeDone })
	url := "http://" + gw + "/v1"
	waitLong(t, 2*time.Minute, "the node and its model server", func() bool { return streamChat(ctx, url).err == nil })

	nc := nodeClient(gw)
	for _, c := range []struct {
		version string
		says    []string
	}{
		{"v1", []string{"another base", "named qwen3-0.6b, not tiny"}},
		{"v3", []string{"another base", "3 layers, not 2"}},
	} {
		if _, err := nc.UseWeights(ctx, c.version); err != nil {
			t.Fatal(err)
		}
		failed := ""
		waitFor(t, c.version+" refused", func() bool {
			st, err := nc.Weights(ctx)
			if err != nil {
				return false
			}
			if st.Serving == c.version {
				t.Fatalf("the node serves %s, a version of another base", c.version)
			}
			for _, v := range st.Versions {
				if v.Version == c.version {
					failed = v.Failed
				}
			}
			return failed != ""
		})
		for _, want := range c.says {
			if !strings.Contains(failed, want) {
				t.Errorf("%s's refusal %q does not say %q", c.version, failed, want)
			}
		}
		if r := streamChat(ctx, url); r.err != nil || r.version != "base" {
			t.Fatalf("after %s's refusal: %+v", c.version, r)
		}
	}

	if _, err := nc.UseWeights(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "v2 serving", func() bool {
		st, err := nc.Weights(ctx)
		return err == nil && st.Serving == "v2"
	})
}
