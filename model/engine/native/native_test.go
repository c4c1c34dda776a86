package native

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/safetensors"
)

var ctx = context.Background()

func TestKVCacheMatchesFullForward(t *testing.T) {
	e := testModel(t, 40, 3)
	run := e.runner(false)
	toks := []int{5, 9, 33, 2, 17, 17, 30, 4, 11}
	// Feed the prefix in pieces of 3, 1, 2, 1, ... and compare the last
	// logits with the full forward's at the same position.
	sa := run.forward(toks, false)
	c := e.w.cfg
	full := make([]float32, len(toks)*c.VocabSize)
	gemmNT(full, sa.f, e.w.lmHead, len(toks), c.VocabSize, c.Hidden, 1, false)
	kc := newKVCache(c, len(toks))
	logits := make([]float32, c.VocabSize)
	for pos, step := 0, 3; pos < len(toks); step = step%2 + 1 {
		n := min(step, len(toks)-pos)
		run.step(toks[pos:pos+n], kc, logits)
		pos += n
		want := full[(pos-1)*c.VocabSize : pos*c.VocabSize]
		for j := range logits {
			if math.Abs(float64(logits[j]-want[j])) > 1e-4*(1+math.Abs(float64(want[j]))) {
				t.Fatalf("position %d logit %d: cached %v, full %v", pos-1, j, logits[j], want[j])
			}
		}
	}
}

func TestGenerate(t *testing.T) {
	e := testModel(t, 40, 4)
	prompt := []int{1, 2, 3, 4}
	var seen []int
	toks, lps, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 12, OnToken: func(id int, _ float32) error {
		seen = append(seen, id)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) == 0 || len(toks) != len(lps) || !slices.Equal(toks, seen) {
		t.Fatalf("toks %v lps %v seen %v", toks, lps, seen)
	}
	// Greedy log-probs equal a full forward over prompt + output.
	full, err := e.Logprobs(ctx, [][]int{append(slices.Clone(prompt), toks...)}, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, lp := range lps {
		if d := math.Abs(float64(lp - full[0][len(prompt)+i])); d > 1e-4 {
			t.Fatalf("token %d: generate logprob %v, forward %v", i, lp, full[0][len(prompt)+i])
		}
	}
	// Greedy picks the arg max: no token is likelier.
	for _, lp := range lps {
		if lp > 0 {
			t.Fatalf("log-prob %v > 0", lp)
		}
	}
	// Sampling is reproducible from the seed, and the stop set ends it.
	o := engine.GenOptions{MaxTokens: 20, Temperature: 1, TopP: 0.9, Seed: 5}
	a, _, _ := e.Generate(ctx, prompt, o)
	b, _, _ := e.Generate(ctx, prompt, o)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different samples: %v vs %v", a, b)
	}
	o.Stop = []int{a[2]}
	c, _, _ := e.Generate(ctx, prompt, o)
	if i := slices.Index(c, a[2]); i != len(c)-1 {
		t.Fatalf("stop token %d: got %v", a[2], c)
	}
	stopErr := errors.New("enough")
	if _, _, err := e.Generate(ctx, prompt, engine.GenOptions{OnToken: func(int, float32) error { return stopErr }}); !errors.Is(err, stopErr) {
		t.Fatalf("OnToken error: %v", err)
	}
}

func TestHFDirectoryRoundTrip(t *testing.T) {
	cfg := TinyConfig(96)
	cfg.TiedEmbeddings = false
	cfg.EOS = []int{94, 95}
	dir := t.TempDir()
	if err := CreateTiny(dir, cfg, 21); err != nil {
		t.Fatal(err)
	}
	loaded, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := NewTiny(cfg, 21, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := loaded.Info(); got.VocabSize != 96 || got.Layers != 2 || got.TiedEmbeddings || !slices.Equal(got.EOS, []int{94, 95}) || got.KVHeads != 2 {
		t.Fatalf("info %+v", got)
	}
	seqs := [][]int{{1, 5, 7, 90, 3}, {4, 4}}
	a, _ := loaded.Logprobs(ctx, seqs, false)
	b, _ := mem.Logprobs(ctx, seqs, false)
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("loaded model differs: %v vs %v", a[i], b[i])
		}
	}
	// HF tensor names are what transformers expects.
	f, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
		"model.layers.1.self_attn.q_norm.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.o_proj.weight"} {
		if _, ok := f.Tensors[n]; !ok {
			t.Errorf("missing %s", n)
		}
	}
	if ti := f.Tensors["model.layers.0.self_attn.k_proj.weight"]; !slices.Equal(ti.Shape, []int{2 * 16, 64}) {
		t.Errorf("k_proj shape %v", ti.Shape)
	}
	// A config.json as HF writes it (eos as an int, no head_dim).
	cb, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	var m map[string]any
	if err := json.Unmarshal(cb, &m); err != nil {
		t.Fatal(err)
	}
	if m["model_type"] != "qwen3" || m["num_key_value_heads"] != 2.0 || m["rope_theta"] != 10000.0 {
		t.Fatalf("config.json %s", cb)
	}
	if _, err := parseConfig([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"type":"yarn"}}`)); !errors.Is(err, ErrConfig) {
		t.Fatalf("rope scaling accepted: %v", err)
	}
	// Keys left out mean what transformers' Qwen3Config makes of them:
	// head_dim 128, rope_theta 10000, 32 KV heads (too many here).
	c2, err := parseConfig([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"eos_token_id":7}`))
	if err != nil || c2.HeadDim != 128 || c2.KVHeads != 1 || c2.RopeTheta != 10000 || !slices.Equal(c2.EOS, []int{7}) {
		t.Fatalf("parseConfig: %+v %v", c2, err)
	}
	if _, err := parseConfig([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2}`)); !errors.Is(err, ErrConfig) {
		t.Fatalf("2 heads with the default 32 KV heads accepted: %v", err)
	}
	// RoPE settings where newer transformers write them.
	c3, err := parseConfig([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"head_dim":4,"rope_parameters":{"rope_type":"default","rope_theta":1000000}}`))
	if err != nil || c3.RopeTheta != 1e6 || c3.HeadDim != 4 {
		t.Fatalf("rope_parameters: %+v %v", c3, err)
	}
	if _, err := parseConfig([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"rope_parameters":{"rope_type":"yarn","rope_theta":1000000,"factor":4}}`)); !errors.Is(err, ErrConfig) {
		t.Fatalf("yarn rope_parameters accepted: %v", err)
	}
}

// TestLoadSharded splits a model over two shards with an index, as large
// HF checkpoints are stored.
func TestLoadSharded(t *testing.T) {
	cfg := TinyConfig(40)
	dir := t.TempDir()
	if err := CreateTiny(dir, cfg, 2); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string][]safetensors.Tensor{}
	index := map[string]string{}
	for i, n := range f.Names() {
		ti, raw, _ := f.Raw(n)
		shard := []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[i%2]
		shards[shard] = append(shards[shard], safetensors.Tensor{Name: n, DType: ti.DType, Shape: ti.Shape, Data: raw})
		index[n] = shard
	}
	for name, ts := range shards {
		if err := safetensors.WriteFile(filepath.Join(dir, name), ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	ib, _ := json.Marshal(map[string]any{"weight_map": index})
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	e, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := NewTiny(cfg, 2, Options{})
	seq := [][]int{{1, 2, 3, 4, 5}}
	a, _ := e.Logprobs(ctx, seq, false)
	b, _ := mem.Logprobs(ctx, seq, false)
	if !slices.Equal(a[0], b[0]) {
		t.Fatalf("sharded load differs")
	}
}

func TestLoadHalfPrecision(t *testing.T) {
	cfg := TinyConfig(64)
	ref := randomWeights(cfg, 5)
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		dir := t.TempDir()
		if err := ref.save(dir, dt); err != nil {
			t.Fatal(err)
		}
		e, err := Open(ctx, dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		// Every weight is the rounded original.
		for i, v := range ref.layers[1].proj[modUp] {
			b, _ := safetensors.Encode(dt, []float32{v})
			var want [1]float32
			if err := safetensors.Decode(want[:], dt, b); err != nil {
				t.Fatal(err)
			}
			if got := e.w.layers[1].proj[modUp][i]; got != want[0] {
				t.Fatalf("%s weight %d = %v, want %v", dt, i, got, want[0])
			}
		}
		full, _ := NewTiny(cfg, 5, Options{})
		seq := [][]int{{1, 2, 3, 4, 5, 6}}
		a, _ := e.Logprobs(ctx, seq, false)
		b, _ := full.Logprobs(ctx, seq, false)
		for i := range a[0] {
			if math.Abs(float64(a[0][i]-b[0][i])) > 0.1 {
				t.Fatalf("%s logprob %d: %v vs f32 %v", dt, i, a[0][i], b[0][i])
			}
		}
	}
}

func TestAdapterExportLoad(t *testing.T) {
	e := testModel(t, 48, 8)
	dir := t.TempDir()
	if err := e.ExportAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	seqs := [][]int{{3, 1, 4, 1, 5, 9, 2, 6}}
	want, _ := e.Logprobs(ctx, seqs, false)
	base, _ := e.Logprobs(ctx, seqs, true)
	// A second engine on the same base loads it and agrees bit for bit.
	other, err := NewTiny(TinyConfig(48), 8, Options{LoRA: LoRAConfig{Rank: 2, Targets: []string{"q_proj"}}})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := other.Logprobs(ctx, seqs, false)
	if !slices.Equal(before[0], base[0]) {
		t.Fatalf("fresh adapter changes the model")
	}
	if err := other.LoadAdapter(ctx, dir); err != nil {
		t.Fatal(err)
	}
	got, _ := other.Logprobs(ctx, seqs, false)
	if !slices.Equal(got[0], want[0]) {
		t.Fatalf("after load %v, want %v", got[0], want[0])
	}
	if slices.Equal(got[0], base[0]) {
		t.Fatalf("adapter has no effect")
	}
	if info := other.Info(); info.LoRARank != 4 || info.LoRAParams != e.Info().LoRAParams {
		t.Fatalf("info after load %+v", info)
	}
	// PEFT names and shapes, and the config peft reads.
	f, err := safetensors.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 2*7*2 {
		t.Fatalf("%d tensors", len(f.Tensors))
	}
	if ti := f.Tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]; !slices.Equal(ti.Shape, []int{4, 128}) {
		t.Fatalf("down lora_A shape %v", ti.Shape)
	}
	if ti := f.Tensors["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]; !slices.Equal(ti.Shape, []int{32, 4}) {
		t.Fatalf("k lora_B shape %v", ti.Shape)
	}
	var pc map[string]any
	cb, _ := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err := json.Unmarshal(cb, &pc); err != nil || pc["peft_type"] != "LORA" || pc["r"] != 4.0 || pc["lora_alpha"] != 8.0 || len(pc["target_modules"].([]any)) != 7 {
		t.Fatalf("adapter_config %s (%v)", cb, err)
	}
	// Reset returns to the base model; a broken adapter is refused and
	// leaves the current one in place.
	if err := other.ResetAdapter(); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.Logprobs(ctx, seqs, false); !slices.Equal(got[0], base[0]) {
		t.Fatalf("reset adapter is not the base model")
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"peft_type":"LORA","r":4,"lora_alpha":8,"target_modules":["q_proj"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := other.LoadAdapter(ctx, dir); !errors.Is(err, engine.ErrAdapter) {
		t.Fatalf("mismatched adapter: %v", err)
	}
	if err := other.LoadAdapter(ctx, t.TempDir()); !errors.Is(err, engine.ErrAdapter) {
		t.Fatalf("missing adapter: %v", err)
	}
	// Per-module overrides the engine cannot apply are refused, not ignored.
	full, _ := json.Marshal(pc)
	for _, extra := range []string{`"alpha_pattern":{"q_proj":32}`, `"rank_pattern":{"v_proj":8}`, `"use_dora":true`} {
		cfg := append(full[:len(full)-1:len(full)-1], ","+extra+"}"...)
		if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := other.LoadAdapter(ctx, dir); !errors.Is(err, engine.ErrAdapter) {
			t.Errorf("adapter with %s: %v", extra, err)
		}
	}
}

func TestAdamWQuadratic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	target := randSlice(r, 50, 1)
	p := make([]float32, 50)
	var a adamState
	rc := engine.Recipe{LR: 0.05}.WithDefaults()
	loss := func() float64 {
		var s float64
		for i := range p {
			d := float64(p[i] - target[i])
			s += d * d
		}
		return s
	}
	start := loss()
	for range 1000 {
		g := make([]float32, len(p))
		for i := range p {
			g[i] = 2 * (p[i] - target[i])
		}
		a.step(p, g, rc)
	}
	if end := loss(); end > 1e-3*start {
		t.Fatalf("loss %v → %v", start, end)
	}
	// Decoupled weight decay alone shrinks parameters by lr·wd per step.
	q := []float32{1, -2}
	var b adamState
	b.step(q, []float32{0, 0}, engine.Recipe{LR: 0.1, WeightDecay: 0.5}.WithDefaults())
	if math.Abs(float64(q[0])-0.95) > 1e-6 || math.Abs(float64(q[1])+1.9) > 1e-6 {
		t.Fatalf("weight decay: %v", q)
	}
}

// TestTrainStepLearns trains one continuation up and another down.
func TestTrainStepLearns(t *testing.T) {
	e, err := NewTiny(TinyConfig(64), 1, Options{Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int{10, 11, 12, 13}
	good := append(slices.Clone(prompt), 20, 21, 22)
	bad := append(slices.Clone(prompt), 30, 31, 32)
	sample := func(toks []int, adv float32) engine.TrainSample {
		s := engine.TrainSample{Tokens: toks, LossMask: make([]bool, len(toks)), Advantages: make([]float32, len(toks))}
		for i := len(prompt); i < len(toks); i++ {
			s.LossMask[i], s.Advantages[i] = true, adv
		}
		return s
	}
	sum := func(lp []float32) float64 {
		var s float64
		for _, v := range lp[len(prompt):] {
			s += float64(v)
		}
		return s
	}
	before, _ := e.Logprobs(ctx, [][]int{good, bad}, false)
	batch := []engine.TrainSample{sample(good, 1), sample(bad, -1)}
	rc := engine.Recipe{} // the defaults must learn
	var st engine.StepStats
	for range 5 {
		if st, err = e.TrainStep(ctx, batch, rc); err != nil {
			t.Fatal(err)
		}
	}
	if st.Tokens != 6 || !(st.GradNorm > 0) {
		t.Fatalf("stats %+v", st)
	}
	after, _ := e.Logprobs(ctx, [][]int{good, bad}, false)
	if !(sum(after[0]) > sum(before[0])) || !(sum(after[1]) < sum(before[1])) {
		t.Fatalf("good %v → %v, bad %v → %v", sum(before[0]), sum(after[0]), sum(before[1]), sum(after[1]))
	}
	// The base model did not move.
	base, _ := e.Logprobs(ctx, [][]int{good}, true)
	if !slices.Equal(base[0], before[0]) {
		t.Fatalf("base model changed")
	}
}

// TestTrainStepMicroBatches checks that splitting a batch into micro-batches
// gives the same update as one pass.
func TestTrainStepMicroBatches(t *testing.T) {
	batch := []engine.TrainSample{}
	r := rand.New(rand.NewPCG(4, 4))
	for i := range 3 {
		toks := []int{1, 2 + i, 3, 4 + i, 5}
		s := engine.TrainSample{Tokens: toks, LossMask: []bool{false, false, true, true, true}, Advantages: make([]float32, 5),
			OldLogprobs: []float32{0, -3, -3.5, -4, -3}, RefLogprobs: []float32{0, -3, -3, -3, -3}}
		for j := range s.Advantages {
			s.Advantages[j] = float32(r.NormFloat64())
		}
		batch = append(batch, s)
	}
	var params [2][]float32
	var stats [2]engine.StepStats
	for i, mb := range []int{8, 1} {
		e, err := NewTiny(TinyConfig(32), 9, Options{Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		rc := engine.Recipe{MicroBatch: mb}
		rc.Loss.KLCoef, rc.Loss.EntropyCoef = 0.1, 0.01
		if stats[i], err = e.TrainStep(ctx, batch, rc); err != nil {
			t.Fatal(err)
		}
		params[i] = e.ad.params
	}
	// Equal up to the order of floating-point sums.
	if math.Abs(stats[0].Loss-stats[1].Loss) > 1e-9 || math.Abs(stats[0].GradNorm-stats[1].GradNorm) > 1e-5*stats[0].GradNorm {
		t.Fatalf("micro-batching changed the step: %+v vs %+v", stats[0], stats[1])
	}
	for i := range params[0] {
		if d := math.Abs(float64(params[0][i] - params[1][i])); d > 1e-6 {
			t.Fatalf("param %d: %v vs %v", i, params[0][i], params[1][i])
		}
	}
	// Only masked-in positions were scored: the loss equals the surrogate of
	// log-probs and entropies computed at every position.
	fresh, _ := NewTiny(TinyConfig(32), 9, Options{Seed: 9})
	run := fresh.runner(false)
	var seqs []loss.Seq
	for _, s := range batch {
		lp, ent := make([]float64, len(s.Tokens)), make([]float64, len(s.Tokens))
		run.logprobs(run.forward(s.Tokens, false), lp, ent, nil)
		seqs = append(seqs, loss.Seq{NewLogp: lp, OldLogp: widen(s.OldLogprobs), Adv: widen(s.Advantages),
			Mask: s.LossMask, RefLogp: widen(s.RefLogprobs), Entropy: ent})
	}
	want := loss.Surrogate(seqs, loss.Config{KLCoef: 0.1, EntropyCoef: 0.01})
	if math.Abs(want.Loss-stats[0].Loss) > 1e-9 || want.Tokens != stats[0].Tokens {
		t.Fatalf("loss %v (%d tokens), recomputed %v (%d)", stats[0].Loss, stats[0].Tokens, want.Loss, want.Tokens)
	}
	if stats[0].KL == 0 || stats[0].Entropy == 0 {
		t.Fatalf("KL and entropy not reported: %+v", stats[0])
	}
}

func TestErrorsAndFork(t *testing.T) {
	e := testModel(t, 32, 6)
	if _, err := e.Logprobs(ctx, [][]int{{1, 32}}, false); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("token outside vocab: %v", err)
	}
	bad := engine.TrainSample{Tokens: []int{1, 2, 3}, LossMask: []bool{true}, Advantages: []float32{0, 0, 0}}
	if _, err := e.TrainStep(ctx, []engine.TrainSample{bad}, engine.Recipe{}); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("short mask: %v", err)
	}
	if _, err := e.TrainStep(ctx, nil, engine.Recipe{LR: -1}); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("negative lr: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Logprobs(cctx, [][]int{{1, 2}}, false); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	// A fork shares the base, copies the adapter, and trains on its own.
	fe, err := e.Fork()
	if err != nil {
		t.Fatal(err)
	}
	seq := [][]int{{1, 2, 3, 4}}
	a, _ := e.Logprobs(ctx, seq, false)
	b, _ := fe.Logprobs(ctx, seq, false)
	if !slices.Equal(a[0], b[0]) {
		t.Fatal("fork differs")
	}
	s := engine.TrainSample{Tokens: []int{1, 2, 3, 4}, LossMask: []bool{false, true, true, true}, Advantages: []float32{0, 1, 1, 1}}
	if _, err := fe.TrainStep(ctx, []engine.TrainSample{s}, engine.Recipe{}); err != nil {
		t.Fatal(err)
	}
	a2, _ := e.Logprobs(ctx, seq, false)
	b2, _ := fe.Logprobs(ctx, seq, false)
	if !slices.Equal(a[0], a2[0]) || slices.Equal(b[0], b2[0]) {
		t.Fatal("training the fork should change it and only it")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Logprobs(ctx, seq, false); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
	if _, _, err := e.Generate(ctx, []int{1}, engine.GenOptions{}); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("closed generate: %v", err)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":[7,8]}`))
	f.Add([]byte(`{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfig(b)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error not ErrConfig: %v", err)
			}
			return
		}
		if c.Validate() != nil || c.Heads%c.KVHeads != 0 || c.HeadDim%2 != 0 {
			t.Fatalf("accepted invalid config %+v", c)
		}
	})
}

// TestTrainStepDeterministic: the same batch on the same engine state gives
// bit-identical adapters, whatever the goroutine scheduling.
func TestTrainStepDeterministic(t *testing.T) {
	var out [2][]float32
	for k := range out {
		e, err := NewTiny(TinyConfig(32), 3, Options{Seed: 3, Threads: 4})
		if err != nil {
			t.Fatal(err)
		}
		var batch []engine.TrainSample
		for i := range 5 {
			batch = append(batch, engine.TrainSample{Tokens: []int{1, i + 2, 3, 4, i}, LossMask: []bool{false, true, true, true, true},
				Advantages: []float32{0, 1, -1, float32(i), 1}})
		}
		for range 2 {
			if _, err := e.TrainStep(ctx, batch, engine.Recipe{}); err != nil {
				t.Fatal(err)
			}
		}
		out[k] = e.ad.params
	}
	if !slices.Equal(out[0], out[1]) {
		t.Fatal("training is not deterministic")
	}
}

// TestGradClipping: with MaxGradNorm the gradient is scaled to that norm
// before AdamW sees it. Adam divides by the gradient's own scale, so the
// clip shows where the scaled gradient meets Adam's epsilon: a norm far
// below it leaves the weights almost where they were, while the same step
// unclipped moves them by about the learning rate.
func TestGradClipping(t *testing.T) {
	var batch []engine.TrainSample
	for i := range 4 {
		batch = append(batch, engine.TrainSample{Tokens: []int{1, i + 2, 3, 4, i}, LossMask: []bool{false, true, true, true, true},
			Advantages: []float32{0, 1, -1, float32(i), 1}})
	}
	moved := func(rc engine.Recipe) (float64, engine.StepStats) {
		e, err := NewTiny(TinyConfig(32), 3, Options{Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		perturb(e, 3)
		before := slices.Clone(e.ad.params)
		st, err := e.TrainStep(ctx, batch, rc)
		if err != nil {
			t.Fatal(err)
		}
		var d float64
		for i, v := range e.ad.params {
			d += math.Abs(float64(v - before[i]))
		}
		return d, st
	}
	free, fs := moved(engine.Recipe{LR: 1e-3, MaxGradNorm: -1})
	clipped, cs := moved(engine.Recipe{LR: 1e-3, MaxGradNorm: 1e-12})
	if fs.GradNorm != cs.GradNorm || !(fs.GradNorm > 1e-6) {
		t.Fatalf("reported norms %v and %v: want the same, unclipped norm", fs.GradNorm, cs.GradNorm)
	}
	if !(clipped < 1e-3*free) {
		t.Fatalf("weights moved %.3g clipped to norm 1e-12, %.3g unclipped", clipped, free)
	}
	t.Logf("gradient norm %.3g; weights moved %.3g unclipped, %.3g clipped", fs.GradNorm, free, clipped)
}

// TestTopLogprobs: the alternatives Generate reports at each position are
// the most likely tokens there, in order, with the log-probs Logprobs gives
// them, and greedy decoding picks the first.
func TestTopLogprobs(t *testing.T) {
	e := testModel(t, 64, 5)
	prompt := []int{3, 9, 27}
	var tops [][]int
	var topLps [][]float32
	toks, _, err := e.Generate(ctx, prompt, engine.GenOptions{MaxTokens: 4, TopLogprobs: 5,
		OnTop: func(ids []int, lps []float32) error {
			tops, topLps = append(tops, slices.Clone(ids)), append(topLps, slices.Clone(lps))
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(tops) != len(toks) {
		t.Fatalf("%d top lists for %d tokens", len(tops), len(toks))
	}
	for i, ids := range tops {
		if len(ids) != 5 || ids[0] != toks[i] {
			t.Fatalf("position %d: tops %v, greedy chose %d", i, ids, toks[i])
		}
		ctxToks := append(slices.Clone(prompt), toks[:i]...)
		// Every token's log-prob at this position, from Logprobs.
		all := make([]float32, 64)
		seqs := make([][]int, 64)
		for v := range seqs {
			seqs[v] = append(slices.Clone(ctxToks), v)
		}
		lp, err := e.Logprobs(ctx, seqs, false)
		if err != nil {
			t.Fatal(err)
		}
		for v := range all {
			all[v] = lp[v][len(ctxToks)]
		}
		order := make([]int, 64)
		for v := range order {
			order[v] = v
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(all[b], all[a]) })
		for j, id := range ids {
			if math.Abs(float64(topLps[i][j]-all[id])) > 1e-4 || math.Abs(float64(all[order[j]]-all[id])) > 1e-4 {
				t.Fatalf("position %d, rank %d: token %d lp %v; Logprobs gives it %v, and rank %d is %d with %v",
					i, j, id, topLps[i][j], all[id], j, order[j], all[order[j]])
			}
		}
	}
	if _, _, err := e.Generate(ctx, prompt, engine.GenOptions{TopLogprobs: 21}); !errors.Is(err, engine.ErrBadInput) {
		t.Errorf("TopLogprobs 21: %v", err)
	}
}

// TestExportPeftTypes checks adapter_config.json against the types PEFT's
// LoraConfig gives its fields: PEFT keeps a null as None, and injecting an
// adapter calls rank_pattern.keys() and alpha_pattern.keys(), so those must
// be objects; base_model_name_or_path must name what transformers loads.
func TestExportPeftTypes(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model")
	if err := CreateTiny(model, TinyConfig(40), 3); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, model)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Open(ctx, rel, Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "adapter")
	if err := e.ExportAdapter(ctx, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, adapterConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	var pc map[string]any
	if err := json.Unmarshal(b, &pc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"rank_pattern", "alpha_pattern"} {
		if m, ok := pc[k].(map[string]any); !ok || len(m) != 0 {
			t.Errorf("%s = %#v, want an empty object", k, pc[k])
		}
	}
	for k, want := range map[string]any{"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none",
		"use_rslora": false, "use_dora": false, "fan_in_fan_out": false, "inference_mode": true} {
		if pc[k] != want {
			t.Errorf("%s = %#v, want %#v", k, pc[k], want)
		}
	}
	if r, ok := pc["r"].(float64); !ok || r != 8 {
		t.Errorf("r = %#v", pc["r"])
	}
	if name := pc["base_model_name_or_path"]; name != model {
		t.Errorf("base_model_name_or_path = %#v, want the model directory's absolute path %s", name, model)
	}
	// An adapter the engine wrote loads back.
	if err := e.LoadAdapter(ctx, out); err != nil {
		t.Fatal(err)
	}
	// A name given in Options is written as it is (a Hugging Face id).
	e2, err := Open(ctx, model, Options{Name: "Qwen/Qwen3-0.6B"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.ExportAdapter(ctx, out); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(out, adapterConfigFile))
	if !bytes.Contains(b, []byte(`"base_model_name_or_path": "Qwen/Qwen3-0.6B"`)) {
		t.Errorf("named base not written: %s", b)
	}
}

// TestFreshAdapterAndGradient checks what other engines are built on: the
// fresh adapter WriteFreshAdapter writes is the one an engine starts with
// and resets to, and Gradient is what TrainStep applies.
func TestFreshAdapterAndGradient(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model")
	cfg := TinyConfig(40)
	if err := CreateTiny(model, cfg, 3); err != nil {
		t.Fatal(err)
	}
	lc := LoRAConfig{Rank: 3, Targets: []string{"q_proj", "up_proj"}}
	e, err := Open(ctx, model, Options{Name: "m", Seed: 11, LoRA: lc})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := ReadConfig(model)
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, seed uint64) {
		t.Helper()
		a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
		if err := e.ExportAdapter(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := WriteFreshAdapter(b, rc, lc, seed, "m"); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{adapterConfigFile, adapterWeightsFile} {
			x, _ := os.ReadFile(filepath.Join(a, f))
			y, _ := os.ReadFile(filepath.Join(b, f))
			if len(x) == 0 || !bytes.Equal(x, y) {
				t.Errorf("%s: %s differs from the fresh adapter", what, f)
			}
		}
	}
	same("open", ResetSeed(11, 0))
	for i := uint64(1); i <= 2; i++ {
		if err := e.ResetAdapter(); err != nil {
			t.Fatal(err)
		}
		same(fmt.Sprintf("reset %d", i), ResetSeed(11, i))
	}

	batch := []engine.TrainSample{{Tokens: []int{1, 2, 3, 4, 5}, LossMask: []bool{false, false, true, true, true},
		Advantages: []float32{0, 0, 1, -1, 1}}}
	perturb(e, 4)
	g, st, err := e.Gradient(ctx, batch, engine.Recipe{})
	if err != nil {
		t.Fatal(err)
	}
	var ss float64
	for name, v := range g {
		if !strings.Contains(name, "q_proj") && !strings.Contains(name, "up_proj") {
			t.Errorf("gradient for untrained %s", name)
		}
		for _, x := range v {
			ss += float64(x) * float64(x)
		}
	}
	if len(g) != 2*2*cfg.Layers || !(st.GradNorm > 0) || math.Abs(math.Sqrt(ss)-st.GradNorm) > 1e-6*st.GradNorm {
		t.Fatalf("%d tensors, norm %v, stats %+v", len(g), math.Sqrt(ss), st)
	}
	st2, err := e.TrainStep(ctx, batch, engine.Recipe{})
	if err != nil {
		t.Fatal(err)
	}
	if st2 != st {
		t.Fatalf("TrainStep stats %+v, Gradient's %+v", st2, st)
	}
}
