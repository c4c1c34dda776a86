package swap

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/trainer/adapter"
)

func p50(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkClawmeshSwap measures a swap on a real `clawmesh serve` of the
// tiny model, Load then Warm of a new version, against its baseline in the
// same run: the warm-up alone (one one-token completion). The ratio says
// what a swap costs over the request that proves it.
func BenchmarkClawmeshSwap(b *testing.B) {
	ctx := ctxT(b)
	s := startTinyServe(b, "")
	d, err := New("clawmesh", Config{Upstream: s.URL})
	if err != nil {
		b.Fatal(err)
	}
	dir := s.adapter(b)
	t0, err := d.Load(ctx, "v0", dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Warm(ctx, t0); err != nil {
		b.Fatal(err)
	}
	cur := t0
	var warm, swap []time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := d.Warm(ctx, cur); err != nil {
			b.Fatal(err)
		}
		warm = append(warm, time.Since(start))

		start = time.Now()
		t, err := d.Load(ctx, fmt.Sprintf("v%d", i+1), dir)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Warm(ctx, t); err != nil {
			b.Fatal(err)
		}
		swap = append(swap, time.Since(start))
		cur = t
	}
	b.StopTimer()
	w, sw := p50(warm), p50(swap)
	b.ReportMetric(float64(w.Microseconds()), "warm-p50-µs")
	b.ReportMetric(float64(sw.Microseconds()), "swap-p50-µs")
	b.ReportMetric(float64(sw)/float64(w), "swap/warm")
}

// BenchmarkOllamaLoad measures what Load costs the node for Ollama: the
// base described (/api/show), the adapter checked against it, exported to
// GGUF, hashed, uploaded and created, against a stand-in Ollama on
// loopback (Ollama's own time to create the model is not in it). The
// adapter is rank 16 on q, k, v and o of 8 layers of width 1024 (about
// 4 MiB of F32 weights); bytes/s is the adapter's safetensors per second.
func BenchmarkOllamaLoad(b *testing.B) {
	ctx := ctxT(b)
	const layers, hidden, r = 8, 1024, 16
	cfg, _ := json.Marshal(map[string]any{"peft_type": "LORA", "r": r, "lora_alpha": 2 * r,
		"target_modules": []string{"q_proj", "k_proj", "v_proj", "o_proj"}, "base_model_name_or_path": "llama3.2:1b"})
	bundle := adapter.Bundle{Config: cfg}
	for l := range layers {
		for _, m := range []string{"q_proj", "k_proj", "v_proj", "o_proj"} {
			pre := fmt.Sprintf("base_model.model.model.layers.%d.self_attn.%s", l, m)
			a, bb := make([]float32, r*hidden), make([]float32, hidden*r)
			for i := range a {
				a[i], bb[i] = float32(i%7)/100, float32(i%5)/100
			}
			bundle.Tensors = append(bundle.Tensors,
				adapter.Tensor{Name: pre + ".lora_A.weight", Shape: []int{r, hidden}, Data: a},
				adapter.Tensor{Name: pre + ".lora_B.weight", Shape: []int{hidden, r}, Data: bb})
		}
	}
	slices.SortFunc(bundle.Tensors, func(x, y adapter.Tensor) int { return strings.Compare(x.Name, y.Name) })
	dir := filepath.Join(b.TempDir(), "adapter")
	if err := bundle.Write(dir); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, weightsFile))
	if err != nil {
		b.Fatal(err)
	}
	f := newFakeOllama("llama3.2:1b")
	f.layers, f.hidden = layers, hidden
	d, err := New("ollama", Config{Upstream: serveFake(b, f) + "/v1"})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	b.ResetTimer()
	for i := range b.N {
		// A new version each time: a new GGUF, uploaded.
		if _, err := d.Load(ctx, fmt.Sprintf("v%d", i+1), dir); err != nil {
			b.Fatal(err)
		}
	}
}
