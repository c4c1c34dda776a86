package native

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
)

// FuzzLoadAdapter feeds arbitrary adapter_config.json and safetensors bytes
// (adapters arrive from peers) to the loader: it must refuse with
// ErrAdapter or produce an adapter that runs.
func FuzzLoadAdapter(f *testing.F) {
	e, err := NewTiny(TinyConfig(16), 1, Options{LoRA: LoRAConfig{Rank: 2, Targets: []string{"q_proj", "down_proj"}}})
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	if err := e.ExportAdapter(ctx, dir); err != nil {
		f.Fatal(err)
	}
	cfgb, _ := os.ReadFile(filepath.Join(dir, adapterConfigFile))
	wb, _ := os.ReadFile(filepath.Join(dir, adapterWeightsFile))
	f.Add(cfgb, wb)
	f.Add([]byte(`{"peft_type":"LORA","r":2,"lora_alpha":4,"target_modules":["q_proj"],"use_rslora":true}`), wb)
	f.Fuzz(func(t *testing.T, cb, wb []byte) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, adapterConfigFile), cb, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, adapterWeightsFile), wb, 0o644); err != nil {
			t.Fatal(err)
		}
		ad, err := loadAdapter(d, e.w.cfg)
		if err != nil {
			if !errors.Is(err, engine.ErrAdapter) {
				t.Fatalf("error not ErrAdapter: %v", err)
			}
			return
		}
		r := &runner{w: e.w, ad: ad, params: ad.params, par: 1}
		lp := make([]float64, 3)
		r.logprobs(r.forward([]int{1, 2, 3}, false), lp, nil, nil)
	})
}

// TestConcurrentUse runs readers beside a trainer (run with -race).
func TestConcurrentUse(t *testing.T) {
	e := testModel(t, 32, 12)
	s := engine.TrainSample{Tokens: []int{1, 2, 3, 4}, LossMask: []bool{false, true, true, true}, Advantages: []float32{0, 1, 1, 1}}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				if _, err := e.Logprobs(ctx, [][]int{{1, 2, 3, i}}, false); err != nil {
					errs <- err
				}
				if _, _, err := e.Generate(ctx, []int{1, 2}, engine.GenOptions{MaxTokens: 3}); err != nil {
					errs <- err
				}
			}
		}()
	}
	for range 3 {
		if _, err := e.TrainStep(ctx, []engine.TrainSample{s}, engine.Recipe{}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
