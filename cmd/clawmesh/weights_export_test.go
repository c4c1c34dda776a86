package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/safetensors"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/trainer/adapter"
)

// tinyAdapter writes a PEFT adapter of rank 4 on the tiny base (q_proj and
// v_proj of both layers), with values that differ by seed, and returns its
// directory and A of layer 0's q_proj.
func tinyAdapter(t *testing.T, seed float32) (string, []float32) {
	t.Helper()
	_, c, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	const r = 4
	cfg, _ := json.Marshal(map[string]any{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 8,
		"target_modules": []string{"q_proj", "v_proj"}, "base_model_name_or_path": "tiny", "bias": "none"})
	b := adapter.Bundle{Config: cfg}
	var a0 []float32
	for l := range c.Layers {
		for _, m := range []struct {
			name string
			out  int
		}{{"q_proj", c.Heads * c.HeadDim}, {"v_proj", c.KVHeads * c.HeadDim}} {
			pre := fmt.Sprintf("base_model.model.model.layers.%d.self_attn.%s", l, m.name)
			a, bb := make([]float32, r*c.Hidden), make([]float32, m.out*r)
			for i := range a {
				a[i] = seed + float32(i%17)/50
			}
			for i := range bb {
				bb[i] = seed - float32(i%13)/40
			}
			if l == 0 && m.name == "q_proj" {
				a0 = a
			}
			b.Tensors = append(b.Tensors,
				adapter.Tensor{Name: pre + ".lora_A.weight", Shape: []int{r, c.Hidden}, Data: a},
				adapter.Tensor{Name: pre + ".lora_B.weight", Shape: []int{m.out, r}, Data: bb})
		}
	}
	slices.SortFunc(b.Tensors, func(x, y adapter.Tensor) int { return strings.Compare(x.Name, y.Name) })
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir, a0
}

// heldWeights is the weights service as a follower sees it: bundles held
// in a directory, nothing fetched.
type heldWeights struct{ dir *weights.Dir }

func (h heldWeights) Latest() *chunks.Manifest { return nil }
func (h heldWeights) Dir() *weights.Dir        { return h.dir }
func (h heldWeights) Fetch(context.Context, *chunks.Manifest, func(weights.Progress)) error {
	return fmt.Errorf("not held")
}
func (h heldWeights) Sources(*chunks.Manifest) []weights.Source { return nil }

// keepVersion keeps the adapter in dir as version v of the tiny base in
// DATA/weights, as a fetch leaves it, and installs it where install says,
// as the node's follower does.
func keepVersion(t *testing.T, data, dir string, v uint64, install bool) {
	t.Helper()
	keepVersionOf(t, data, dir, v, "tiny", install)
}

// keepVersionOf is keepVersion of a version of base.
func keepVersionOf(t *testing.T, data, dir string, v uint64, base string, install bool) {
	t.Helper()
	wd, err := weights.OpenDir(filepath.Join(data, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := weights.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.Version, m.Base, m.Term, m.Index = v, base, 1, 10*v
	// Signed by a trainer, as every manifest a node keeps is (export does
	// not check it: the weights service did, when it fetched).
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	sk, _ := ic.UnmarshalEd25519PrivateKey(key)
	id, _ := peer.IDFromPrivateKey(sk)
	cert, err := member.IssueCertificate(admin, nil, member.CertSpec{Subject: id.String(), SubjectKey: pub, Role: member.RoleTrainer}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sign(key, cert, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := wd.Add(m, b); err != nil {
		t.Fatal(err)
	}
	if !install {
		return
	}
	f, err := adapters.New(adapters.Config{Dir: filepath.Join(data, "adapters"), Weights: heldWeights{wd}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Get(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// TestWeightsExport exports a version the node installed, and one it only
// holds, in each format, and reads each back as its own reader does: the
// PEFT files as they were, the GGUF adapter (llama.cpp's layout: lora_a
// {in, r} holding A), the mlx-lm directory (lora_a = Aᵀ); and the tiny
// base as a GGUF model that is the same base as the adapters'.
func TestWeightsExport(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG"} {
		t.Setenv(v, "")
	}
	data := t.TempDir()
	d1, a1 := tinyAdapter(t, 0.5)
	d2, a2 := tinyAdapter(t, -0.25)
	keepVersion(t, data, d1, 1, true)
	keepVersion(t, data, d2, 2, false)
	if _, err := os.Stat(filepath.Join(data, "adapters", "v1", "adapter_config.json")); err != nil {
		t.Fatalf("v1 is not installed: %v", err)
	}
	out := t.TempDir()

	// peft: the files as the mesh shipped them.
	p := filepath.Join(out, "v1-peft")
	cli(t, "weights", "export", "v1", "--format", "peft", "--out", p, "--data", data)
	for _, n := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		got, _ := os.ReadFile(filepath.Join(p, n))
		want, _ := os.ReadFile(filepath.Join(d1, n))
		if len(got) == 0 || !bytes.Equal(got, want) {
			t.Fatalf("%s differs from the version's", n)
		}
	}
	if st, err := safetensors.ReadFile(filepath.Join(p, "adapter_model.safetensors")); err != nil || len(st.Tensors) != 8 {
		t.Fatalf("the PEFT weights read back: %v", err)
	}
	pb, err := adapter.Read(p)
	if err != nil {
		t.Fatalf("the PEFT adapter reads back: %v", err)
	}
	if i := slices.IndexFunc(pb.Tensors, func(x adapter.Tensor) bool {
		return x.Name == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
	}); i < 0 || !slices.Equal(pb.Tensors[i].Data, a1) {
		t.Fatal("the PEFT adapter read back lacks layer 0's q_proj A, or holds other values")
	}

	// gguf: a llama.cpp LoRA adapter for the tiny base's architecture.
	g := filepath.Join(out, "v1.gguf")
	if s := cli(t, "weights", "export", "v1", "--format", "gguf", "--out", g, "--data", data); !strings.Contains(s, "llama-server --lora") {
		t.Errorf("export says %q", s)
	}
	gf, err := gguf.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	typ, _ := gf.String("general.type")
	arch, _ := gf.String("general.architecture")
	alpha, _ := gf.Float32("adapter.lora.alpha")
	if typ != "adapter" || arch != "qwen3" || alpha != 8 || len(gf.Tensors) != 8 {
		t.Fatalf("GGUF: type %q, architecture %q, alpha %v, %d tensors", typ, arch, alpha, len(gf.Tensors))
	}
	va, ti, err := gf.TensorFloat32("blk.0.attn_q.weight.lora_a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ti.Shape, []uint64{64, 4}) || !slices.Equal(va, a1) {
		t.Fatalf("lora_a of layer 0's q: shape %v, values differ from A: %v", ti.Shape, !slices.Equal(va, a1))
	}
	gf.Close()

	// mlx, of the newest version, which the node holds but never
	// installed: lora_a is Aᵀ.
	m := filepath.Join(out, "latest-mlx")
	cli(t, "weights", "export", "latest", "--format", "mlx", "--out", m, "--data", data)
	ad, err := mlx.Read(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(ad.Modules) != 4 || ad.Modules[0].Scale != 2 {
		t.Fatalf("mlx-lm adapter: %d modules, scale %v", len(ad.Modules), ad.Modules[0].Scale)
	}
	q0 := ad.Modules[slices.IndexFunc(ad.Modules, func(m mlx.Module) bool { return m.Layer == 0 && m.Key == "self_attn.q_proj" })]
	for i := range q0.In {
		for k := range q0.Rank {
			if q0.A[i*q0.Rank+k] != a2[k*q0.In+i] {
				t.Fatalf("lora_a[%d][%d] = %v, A[%d][%d] of v2 = %v", i, k, q0.A[i*q0.Rank+k], k, i, a2[k*q0.In+i])
			}
		}
	}

	// What is there stays, unless --force.
	_, errs, code := runCLI(t, "weights", "export", "v2", "--format", "gguf", "--out", g, "--data", data)
	if code == 0 || !strings.Contains(errs, "already exists") || !strings.Contains(errs, "--force") {
		t.Fatalf("export over a file: %d %s", code, errs)
	}
	cli(t, "weights", "export", "v2", "--format", "gguf", "--out", g, "--data", data, "--force", "--type", "f16")
	if gf, err := gguf.Open(g); err != nil || gf.Tensors[0].Type != gguf.TypeF16 {
		t.Fatalf("export --force --type f16: %v", err)
	} else {
		gf.Close()
	}

	// The base: the tiny model built as the trainers build it, as GGUF,
	// the same base as the adapters'.
	b := filepath.Join(out, "tiny.gguf")
	cli(t, "weights", "export", "base", "--format", "gguf", "--out", b, "--data", data)
	bid, err := baseid.FromGGUF(b)
	if err != nil {
		t.Fatal(err)
	}
	aid, err := baseid.FromAdapter(filepath.Join(data, "adapters", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := baseid.Same(aid, bid); err != nil || bid.Arch != "qwen3" || bid.Quant != "F16" {
		t.Fatalf("the base exported (%s) and v1's base: %v", bid, err)
	}
	// An installed version whose bundle and manifest were pruned: its
	// adapter says its base.
	if err := os.RemoveAll(filepath.Join(data, "weights")); err != nil {
		t.Fatal(err)
	}
	cli(t, "weights", "export", "v1", "--format", "gguf", "--out", filepath.Join(out, "v1-again.gguf"), "--data", data)
	bm := filepath.Join(out, "tiny-mlx")
	cli(t, "weights", "export", "base", "--format", "mlx", "--out", bm, "--data", data)
	if id, err := baseid.FromModelDir(bm); err != nil || baseid.Same(id, bid) != nil {
		t.Fatalf("the base as a model directory: %v %v", id, err)
	}
}

// TestWeightsExportRefusals: bad input and what the node does not have are
// refused, saying what to do.
func TestWeightsExportRefusals(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG"} {
		t.Setenv(v, "")
	}
	data := t.TempDir()
	out := filepath.Join(t.TempDir(), "x")
	fail := func(says []string, args ...string) {
		t.Helper()
		o, errs, code := runCLI(t, append([]string{"weights", "export"}, append(args, "--data", data)...)...)
		if code == 0 {
			t.Fatalf("%v succeeded: %s", args, o)
		}
		for _, s := range says {
			if !strings.Contains(errs, s) {
				t.Errorf("%v: %q does not say %q", args, errs, s)
			}
		}
	}
	fail([]string{"holds no adapter version"}, "latest", "--format", "gguf", "--out", out)
	fail([]string{"does not know the mesh's base", "--base-dir"}, "base", "--format", "gguf", "--out", out)
	d1, _ := tinyAdapter(t, 1)
	d3, _ := tinyAdapter(t, 3)
	keepVersion(t, data, d1, 1, true)
	keepVersion(t, data, d3, 3, false)
	fail([]string{"does not hold v2", "v1, v3", "weights get v2"}, "v2", "--format", "gguf", "--out", out)
	fail([]string{"--format"}, "v1", "--out", out)
	fail([]string{"want peft, gguf or mlx"}, "v1", "--format", "onnx", "--out", out)
	fail([]string{"--out"}, "v1", "--format", "gguf")
	fail([]string{"--type is for --format gguf"}, "v1", "--format", "mlx", "--type", "f16", "--out", out)
	fail([]string{"no adapter"}, "base", "--format", "peft", "--out", out)
	fail([]string{"vN"}, "3", "--format", "gguf", "--out", out)
	// --force replaces an export, never a directory of the user's.
	mine := t.TempDir()
	os.WriteFile(filepath.Join(mine, "notes.md"), []byte("mine"), 0o600)
	fail([]string{"holds notes.md, which no export writes"}, "v1", "--format", "peft", "--out", mine, "--force")
	fail([]string{"is not a file"}, "v1", "--format", "gguf", "--out", mine, "--force")
	if b, err := os.ReadFile(filepath.Join(mine, "notes.md")); err != nil || string(b) != "mine" {
		t.Fatalf("--force touched a directory of the user's: %v", err)
	}
	// An installed version that no longer matches its manifest.
	w := filepath.Join(data, "adapters", "v1", "adapter_model.safetensors")
	b, _ := os.ReadFile(w)
	b[len(b)-1] ^= 1
	os.WriteFile(w, b, 0o600)
	fail([]string{"differs from the version the mesh certified"}, "v1", "--format", "peft", "--out", out)
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused export wrote %s", out)
	}
}

// TestWeightsExportBaseDir: a mesh whose base is not the tiny one needs
// the base's directory, and refuses one of another model.
func TestWeightsExportBaseDir(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG"} {
		t.Setenv(v, "")
	}
	data := t.TempDir()
	d1, _ := tinyAdapter(t, 1)
	keepVersionOf(t, data, d1, 1, "Qwen3-4B", false)
	out := filepath.Join(t.TempDir(), "base.gguf")
	_, errs, code := runCLI(t, "weights", "export", "base", "--format", "gguf", "--out", out, "--data", data)
	if code == 0 || !strings.Contains(errs, "the mesh trains base Qwen3-4B") || !strings.Contains(errs, "--base-dir") {
		t.Fatalf("no --base-dir: %d %s", code, errs)
	}
	// A directory of another model is refused; the mesh's is exported.
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Llama-3.2-1B", "Qwen3-4B"} {
		dir := filepath.Join(t.TempDir(), name)
		if err := native.CreateTiny(dir, cfg, 1); err != nil {
			t.Fatal(err)
		}
		if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
			t.Fatal(err)
		}
		o, errs, code := runCLI(t, "weights", "export", "base", "--format", "gguf", "--out", out, "--data", data, "--base-dir", dir)
		if name == "Llama-3.2-1B" {
			if code == 0 || !strings.Contains(errs, "the mesh trains base Qwen3-4B; "+dir+" is Llama-3.2-1B") {
				t.Fatalf("another model's directory: %d %s%s", code, o, errs)
			}
			continue
		}
		if code != 0 {
			t.Fatalf("the mesh's base: %s", errs)
		}
		if _, err := baseid.FromGGUF(out); err != nil {
			t.Fatal(err)
		}
	}
}
