package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/clawmesh/clawmesh/model/gguf"
)

// fakeOllamaStore writes an Ollama models directory as Ollama lays it out
// (manifests/HOST/NAMESPACE/MODEL/TAG, blobs/sha256-HEX), holding models
// whose weights are each a real GGUF, points OLLAMA_MODELS at it, and
// returns it with the first model's blob.
func fakeOllamaStore(t *testing.T, models ...string) (dir, first string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "models")
	t.Setenv("OLLAMA_MODELS", dir)
	for i, m := range models {
		g := filepath.Join(t.TempDir(), "m.gguf")
		kv := []gguf.KV{
			{Key: "general.architecture", Value: "qwen3"}, {Key: "general.type", Value: "model"}, {Key: "general.name", Value: m},
			{Key: "qwen3.block_count", Value: uint32(2)}, {Key: "qwen3.embedding_length", Value: uint32(8)},
			{Key: "qwen3.attention.head_count", Value: uint32(2)}, {Key: "general.file_type", Value: uint32(15)},
		}
		if err := gguf.WriteFile(g, kv, []gguf.Tensor{{Info: gguf.TensorInfo{Name: "output_norm.weight", Shape: []uint64{8}, Type: gguf.TypeF32}, Data: make([]byte, 32)}}); err != nil {
			t.Fatal(err)
		}
		blob := putOllamaModel(t, dir, m, g)
		if i == 0 {
			first = blob
		}
	}
	return dir, first
}

// putOllamaModel stores the GGUF file g in the Ollama store dir as model
// name ("qwen3:4b"), as `ollama pull` leaves it, and returns its blob.
func putOllamaModel(t *testing.T, dir, name, g string) string {
	t.Helper()
	put := func(b []byte) string {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		os.MkdirAll(filepath.Join(dir, "blobs"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256-"+h), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + h
	}
	b, err := os.ReadFile(g)
	if err != nil {
		t.Fatal(err)
	}
	digest := put(b)
	tmpl := []byte("{{ .Prompt }}")
	model, tag, _ := strings.Cut(name, ":")
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
		"config": map[string]any{"mediaType": "application/vnd.docker.container.image.v1+json", "digest": put([]byte("{}")), "size": 2},
		"layers": []any{
			map[string]any{"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": len(b)},
			map[string]any{"mediaType": "application/vnd.ollama.image.template", "digest": put(tmpl), "size": len(tmpl)},
		},
	})
	p := filepath.Join(dir, "manifests", "registry.ollama.ai", "library", model, tag)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, man, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "blobs", strings.Replace(digest, ":", "-", 1))
}

const userNodeConfig = `# my node
listen = "127.0.0.1:8400"
upstream = "http://127.0.0.1:11434/v1"
upstream_kind = "ollama"

[retention]
max_age = "48h"
`

// TestSetupOllama: the model is found in Ollama's store by its manifest;
// the dry run shows the change to the node's config and makes none; setup
// sets serve and model there, comments out the upstream the node forwarded
// to (Ollama's), and says that llama-server is missing and how to install
// it; a second run changes nothing; --undo gives the
// config back byte for byte.
func TestSetupOllama(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG", "CLAWMESH_MODEL", "CLAWMESH_SERVE", "CLAWMESH_SERVE_BIN"} {
		t.Setenv(v, "")
	}
	t.Setenv("PATH", t.TempDir()) // no llama-server
	_, blob := fakeOllamaStore(t, "qwen3:4b", "llama3.2:1b")
	data := t.TempDir()
	cfg := filepath.Join(data, "config.toml")
	if err := os.WriteFile(cfg, []byte(userNodeConfig), 0o600); err != nil {
		t.Fatal(err)
	}

	out := cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data, "--dry-run")
	for _, want := range []string{blob, "qwen3", "Q4_K_M", `+serve = "llama-server"`, `+model = "` + blob + `"`,
		`-upstream = "http://127.0.0.1:11434/v1"`, `+# upstream = "http://127.0.0.1:11434/v1"  # clawmesh setup ollama`, `+# upstream_kind = "ollama"`,
		"Nothing was changed", "llama-server is not on PATH"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run does not say %q:\n%s", want, out)
		}
	}
	if b, _ := os.ReadFile(cfg); string(b) != userNodeConfig {
		t.Fatal("the dry run changed the node's config")
	}

	out = cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data)
	hint := "releases"
	if runtime.GOOS == "darwin" {
		hint = "brew install llama.cpp"
	}
	if !strings.Contains(out, "llama-server is not on PATH") || !strings.Contains(out, hint) {
		t.Errorf("setup does not say how to install llama-server:\n%s", out)
	}
	var fc fileConfig
	if _, err := toml.DecodeFile(cfg, &fc); err != nil {
		t.Fatal(err)
	}
	// The node's upstream is the server it runs: Ollama's is commented out.
	if fc.Serve != "llama-server" || fc.Model != blob || fc.Upstream != "" || fc.UpstreamKind != "" || fc.Retention.MaxAge != "48h" {
		t.Fatalf("config after setup: %+v", fc)
	}
	b, _ := os.ReadFile(cfg)
	if !strings.HasPrefix(string(b), "# my node\n") {
		t.Fatalf("the config lost its comment:\n%s", b)
	}
	if out := cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data); !strings.Contains(out, "nothing to change") {
		t.Fatalf("a second run: %s", out)
	}

	// Another model: --undo still goes back to before the first setup.
	cli(t, "setup", "ollama", "--model", "llama3.2:1b", "--data", data)
	out = cli(t, "setup", "ollama", "--undo", "--data", data)
	if !strings.Contains(out, "llama3.2:1b") {
		t.Errorf("undo: %s", out)
	}
	if b, _ := os.ReadFile(cfg); string(b) != userNodeConfig {
		t.Fatalf("after undo:\n%s\nwant\n%s", b, userNodeConfig)
	}
	if _, err := os.Stat(filepath.Join(data, "ollama-setup.json")); !os.IsNotExist(err) {
		t.Fatalf("the record stays after undo: %v", err)
	}
	_, errs, code := runCLI(t, "setup", "ollama", "--undo", "--data", data)
	if code == 0 || !strings.Contains(errs, "nothing to undo") {
		t.Fatalf("a second undo: %d %s", code, errs)
	}
}

// TestSetupOllamaNewConfig: with no config file, setup makes one, and
// --undo removes it; with llama-server on PATH, setup names it; where the
// node holds a version trained on another base than the model's, setup
// warns that it will not load there, naming both.
func TestSetupOllamaNewConfig(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG", "CLAWMESH_SERVE_BIN"} {
		t.Setenv(v, "")
	}
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "llama-server"), []byte("#!/bin/sh\n"), 0o755)
	t.Setenv("PATH", bin)
	fakeOllamaStore(t, "qwen3:4b")
	data := t.TempDir()
	d1, _ := tinyAdapter(t, 1)
	keepVersion(t, data, d1, 1, true)
	out := cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data)
	if !strings.Contains(out, "llama-server: "+filepath.Join(bin, "llama-server")) || strings.Contains(out, "not on PATH") {
		t.Errorf("setup with llama-server installed:\n%s", out)
	}
	for _, want := range []string{"WARNING: the mesh's v1 was trained on another base model than qwen3:4b", "tiny", "2 layers, hidden 64", "hidden 8"} {
		if !strings.Contains(out, want) {
			t.Errorf("setup onto another base does not say %q:\n%s", want, out)
		}
	}
	cli(t, "setup", "ollama", "--undo", "--data", data)
	if _, err := os.Stat(filepath.Join(data, "config.toml")); !os.IsNotExist(err) {
		t.Fatalf("the config setup made stays after undo: %v", err)
	}
}

// TestSetupOllamaRefusals: a model Ollama does not have is named with
// those it has; no store, a bad name and a bad manifest are refused, and
// nothing is written.
func TestSetupOllamaRefusals(t *testing.T) {
	for _, v := range []string{"CLAWMESH_DATA", "CLAWMESH_CONFIG"} {
		t.Setenv(v, "")
	}
	dir, _ := fakeOllamaStore(t, "qwen3:4b", "llama3.2:1b")
	data := t.TempDir()
	fail := func(says []string, args ...string) {
		t.Helper()
		out, errs, code := runCLI(t, append([]string{"setup", "ollama", "--data", data}, args...)...)
		if code == 0 {
			t.Fatalf("%v succeeded: %s", args, out)
		}
		for _, s := range says {
			if !strings.Contains(errs, s) {
				t.Errorf("%v: %q does not say %q", args, errs, s)
			}
		}
		if _, err := os.Stat(filepath.Join(data, "config.toml")); !os.IsNotExist(err) {
			t.Fatalf("%v wrote the config", args)
		}
	}
	fail([]string{"qwen3:8b is not in", "llama3.2:1b, qwen3:4b", "ollama pull qwen3:8b"}, "--model", "qwen3:8b")
	fail([]string{"--model"}, "--model", "../../etc:x")
	fail([]string{"say which model"})
	p := filepath.Join(dir, "manifests", "registry.ollama.ai", "library", "broken", "latest")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:nothex"}]}`), 0o644)
	fail([]string{"not sha256:HEX"}, "--model", "broken")
	// Set up with one config, then asked with another: the first is
	// undone there first, not forgotten.
	other := filepath.Join(t.TempDir(), "node.toml")
	os.WriteFile(other, []byte("# mine\n"), 0o600)
	cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data, "--config", other)
	_, errs, code := runCLI(t, "setup", "ollama", "--model", "llama3.2:1b", "--data", data)
	if code == 0 || !strings.Contains(errs, "changed "+other+" before") || !strings.Contains(errs, "--undo --config "+other) {
		t.Fatalf("setup with another config: %d %s", code, errs)
	}
	cli(t, "setup", "ollama", "--undo", "--data", data, "--config", other)
	t.Setenv("OLLAMA_MODELS", filepath.Join(t.TempDir(), "none"))
	fail([]string{"no Ollama model store", "OLLAMA_MODELS"}, "--model", "qwen3:4b")
}

// TestSetupOllamaThenOpenClaw follows the README's Ollama path: setup
// ollama has the node run llama-server on Ollama's file, then setup
// openclaw points OpenClaw at the gateway and leaves the node's config
// alone, as the node's upstream is the server it runs (an upstream beside
// serve would keep the node from starting). Its undo puts OpenClaw back.
func TestSetupOllamaThenOpenClaw(t *testing.T) {
	path := openClawHome(t, userOpenClaw)
	for _, v := range []string{"CLAWMESH_MODEL", "CLAWMESH_SERVE", "CLAWMESH_SERVE_BIN"} {
		t.Setenv(v, "")
	}
	t.Setenv("PATH", t.TempDir()+string(os.PathListSeparator)+os.Getenv("PATH"))
	_, blob := fakeOllamaStore(t, "qwen3:4b")
	data := t.TempDir()
	cfg := filepath.Join(data, "config.toml")
	cli(t, "setup", "ollama", "--model", "qwen3:4b", "--data", data)
	before, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}

	out := cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none", "--dry-run")
	if !strings.Contains(out, "The node runs llama-server on "+blob+" itself") || strings.Contains(out, "+upstream") {
		t.Errorf("dry run:\n%s", out)
	}
	out = cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none")
	if !strings.Contains(out, `provider "ollama" now goes through the node at http://127.0.0.1:8400/v1`) || !strings.Contains(out, "the node runs llama-server on "+blob) {
		t.Errorf("setup said:\n%s", out)
	}
	if after, _ := os.ReadFile(cfg); string(after) != string(before) {
		t.Errorf("setup openclaw changed the node's config:\n%s\nwas\n%s", after, before)
	}
	var fc fileConfig
	if _, err := toml.DecodeFile(cfg, &fc); err != nil || fc.Serve != "llama-server" || fc.Model != blob || fc.Upstream != "" {
		t.Errorf("node config: %+v (%v)", fc, err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "'http://127.0.0.1:8400/v1'") {
		t.Errorf("OpenClaw's config:\n%s", b)
	}
	cli(t, "setup", "openclaw", "--data", data, "--openclaw", "none", "--undo")
	if b, _ := os.ReadFile(path); string(b) != userOpenClaw {
		t.Errorf("after undo:\n%s", b)
	}
}
