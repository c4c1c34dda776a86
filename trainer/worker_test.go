package trainer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/internal/synthetic"
)

func TestWorkerTrainsADelta(t *testing.T) {
	ctx := context.Background()
	w := &worker{}
	defer w.close()
	cfg := group.Config{LocalSteps: 2}.WithDefaults()
	dir := filepath.Join(t.TempDir(), "v0")
	if _, err := w.genesis(ctx, cfg, dir); err != nil {
		t.Fatal(err)
	}
	p, err := synthetic.Batch(1, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.train(ctx, cfg, dir, 0, 0, b.Steps, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report %+v", res.report)
	if res.samples == 0 || res.delta.Norm() == 0 {
		t.Fatalf("trained %d samples, delta norm %v", res.samples, res.delta.Norm())
	}
}

// TestCheckEngine: what a trainer refuses before it starts, and how it
// says that PyTorch is missing.
func TestCheckEngine(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		engine, device string
		gpus           int
	}{{"tensorflow", "", 0}, {"", "tpu", 0}, {EngineNative, DeviceCUDA, 0}, {EngineNative, DeviceCPU, 2}, {EngineTorch, DeviceCPU, 2}} {
		if _, err := checkEngine(ctx, c.engine, c.device, c.gpus); !errors.Is(err, ErrEngine) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if py, err := checkEngine(ctx, EngineNative, DeviceCPU, 1); err != nil || py != "" {
		t.Errorf("native on the CPU: %q %v", py, err)
	}
	t.Setenv("CLAWMESH_PYTHON", filepath.Join(t.TempDir(), "python3"))
	_, err := checkEngine(ctx, EngineTorch, DeviceCPU, 1)
	if !errors.Is(err, ErrEngine) || !strings.Contains(err.Error(), "apt-get install python3-torch") ||
		!strings.Contains(err.Error(), "--engine native needs no PyTorch") {
		t.Fatalf("without PyTorch: %v", err)
	}
	t.Logf("without PyTorch: %v", err)
}

// TestWorkerTorchEngine trains the same share on the native engine and on
// the torch engine, without and with gradient checkpointing (the
// trainer's --grad-checkpoint): all start from the same version 0 tensors
// and make the same delta.
func TestWorkerTorchEngine(t *testing.T) {
	ctx := context.Background()
	python, err := checkEngine(ctx, EngineTorch, DeviceCPU, 0)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the torch engine may not be skipped: %v", err)
		}
		t.Skipf("python3 with torch not found (Debian: apt-get install python3-torch libopenblas0-pthread): %v", err)
	}
	cfg := group.Config{LocalSteps: 2}.WithDefaults()
	p, err := synthetic.Batch(1, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := batch.Decode(p, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var deltas []*adapter.Delta
	var geneses []*adapter.Bundle
	for _, w := range []*worker{{}, {engineID: EngineTorch, device: DeviceCPU, python: python},
		{engineID: EngineTorch, device: DeviceCPU, python: python, gradCheckpoint: true}} {
		if w.torchOptions(cfg, "").GradCheckpoint != w.gradCheckpoint {
			t.Fatalf("the torch engine's options lose gradient checkpointing")
		}
		dir := filepath.Join(t.TempDir(), "v0")
		if _, err := w.genesis(ctx, cfg, dir); err != nil {
			t.Fatal(err)
		}
		g, err := adapter.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		geneses = append(geneses, g)
		res, err := w.train(ctx, cfg, dir, 0, 0, b.Steps, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.close(); err != nil {
			t.Fatal(err)
		}
		if res.samples == 0 || res.delta.Norm() == 0 {
			t.Fatalf("trained %d samples, delta norm %v", res.samples, res.delta.Norm())
		}
		deltas = append(deltas, res.delta)
	}
	for i, name := range []string{"torch", "torch with gradient checkpointing"} {
		if !reflect.DeepEqual(geneses[0].Tensors, geneses[i+1].Tensors) {
			t.Fatalf("%s: the engines' version 0 tensors differ", name)
		}
		diff, err := adapter.Diff(&adapter.Bundle{Config: geneses[0].Config, Tensors: deltas[i+1].Tensors},
			&adapter.Bundle{Config: geneses[0].Config, Tensors: deltas[0].Tensors})
		if err != nil {
			t.Fatal(err)
		}
		if rel := diff.Norm() / deltas[0].Norm(); !(rel < 1e-3) {
			t.Fatalf("%s: delta differs from native by %.3g of its norm", name, rel)
		} else {
			t.Logf("delta norm %.4g; %s − native %.3g of it", deltas[0].Norm(), name, rel)
		}
	}
}
