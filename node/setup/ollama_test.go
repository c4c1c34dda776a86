package setup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/model/gguf"
)

func TestParseOllamaName(t *testing.T) {
	for _, c := range []struct {
		in   string
		want OllamaName
		show string
	}{
		{"qwen3", OllamaName{"registry.ollama.ai", "library", "qwen3", "latest"}, "qwen3:latest"},
		{"qwen3:4b", OllamaName{"registry.ollama.ai", "library", "qwen3", "4b"}, "qwen3:4b"},
		{"llama3.2:1b-instruct-q4_K_M", OllamaName{"registry.ollama.ai", "library", "llama3.2", "1b-instruct-q4_K_M"}, "llama3.2:1b-instruct-q4_K_M"},
		{"ann/tiny:v2", OllamaName{"registry.ollama.ai", "ann", "tiny", "v2"}, "ann/tiny:v2"},
		{"hf.co/unsloth/Qwen3-4B-GGUF:Q4_K_M", OllamaName{"hf.co", "unsloth", "Qwen3-4B-GGUF", "Q4_K_M"}, "hf.co/unsloth/Qwen3-4B-GGUF:Q4_K_M"},
		{"localhost:5000/ann/tiny", OllamaName{"localhost:5000", "ann", "tiny", "latest"}, "localhost:5000/ann/tiny:latest"},
	} {
		n, err := ParseOllamaName(c.in)
		if err != nil || n != c.want || n.String() != c.show {
			t.Errorf("ParseOllamaName(%q) = %+v (%q), %v; want %+v (%q)", c.in, n, n.String(), err, c.want, c.show)
		}
	}
	for _, bad := range []string{"", "qwen3:", "../qwen3", "qwen3:../../x", "a/b/c/d", "ann.lee/tiny", "-x", "qwen 3"} {
		if n, err := ParseOllamaName(bad); !errors.Is(err, ErrOllamaName) {
			t.Errorf("ParseOllamaName(%q) = %+v, %v; want ErrOllamaName", bad, n, err)
		}
	}
}

func TestOllamaModelsDirs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		env  map[string]string
		goos string
		want []string
	}{
		{nil, "darwin", []string{"/home/ann/.ollama/models"}},
		{nil, "linux", []string{"/home/ann/.ollama/models", "/usr/share/ollama/.ollama/models"}},
		{map[string]string{"OLLAMA_MODELS": "/srv/models"}, "linux", []string{"/srv/models"}},
		{map[string]string{"OLLAMA_MODELS": "~/m"}, "darwin", []string{"/home/ann/m"}},
	} {
		if got := OllamaModelsDirs(env(c.env), "/home/ann", c.goos); strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%v on %s: %q, want %q", c.env, c.goos, got, c.want)
		}
	}
}

// ollamaStore is an Ollama models directory on disk, laid out as Ollama
// lays it out.
type ollamaStore struct {
	t   *testing.T
	dir string
}

func newOllamaStore(t *testing.T) *ollamaStore {
	return &ollamaStore{t: t, dir: filepath.Join(t.TempDir(), "models")}
}

// blob stores b as a blob and returns its digest.
func (s *ollamaStore) blob(b []byte) string {
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	os.MkdirAll(filepath.Join(s.dir, "blobs"), 0o755)
	if err := os.WriteFile(filepath.Join(s.dir, "blobs", "sha256-"+h), b, 0o644); err != nil {
		s.t.Fatal(err)
	}
	return "sha256:" + h
}

// smallGGUF is a real GGUF model file of a small qwen3.
func smallGGUF(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.gguf")
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "qwen3"}, {Key: "general.name", Value: "Qwen3 4B"},
		{Key: "qwen3.block_count", Value: uint32(2)}, {Key: "qwen3.embedding_length", Value: uint32(8)},
		{Key: "qwen3.attention.head_count", Value: uint32(2)}, {Key: "general.file_type", Value: uint32(15)},
	}
	if err := gguf.WriteFile(p, kv, []gguf.Tensor{{Info: gguf.TensorInfo{Name: "output_norm.weight", Shape: []uint64{8}, Type: gguf.TypeF32}, Data: make([]byte, 32)}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// model writes the manifest of name, as Ollama writes one: a config and
// the layers given (media type → bytes, "" bytes for a layer whose blob
// is missing).
func (s *ollamaStore) model(name string, layers ...[2]string) string {
	n, err := ParseOllamaName(name)
	if err != nil {
		s.t.Fatal(err)
	}
	type layer struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	man := struct {
		SchemaVersion int     `json:"schemaVersion"`
		MediaType     string  `json:"mediaType"`
		Config        layer   `json:"config"`
		Layers        []layer `json:"layers"`
	}{SchemaVersion: 2, MediaType: "application/vnd.docker.distribution.manifest.v2+json"}
	cfg := []byte(`{"model_format":"gguf","model_family":"qwen3","file_type":"Q4_K_M"}`)
	man.Config = layer{"application/vnd.docker.container.image.v1+json", s.blob(cfg), int64(len(cfg))}
	for _, l := range layers {
		man.Layers = append(man.Layers, layer{l[0], s.blob([]byte(l[1])), int64(len(l[1]))})
	}
	b, _ := json.Marshal(man)
	return s.manifest(n, b)
}

func (s *ollamaStore) manifest(n OllamaName, b []byte) string {
	p := n.manifestPath(s.dir)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		s.t.Fatal(err)
	}
	return p
}

const (
	modelMedia    = "application/vnd.ollama.image.model"
	templateMedia = "application/vnd.ollama.image.template"
)

func TestFindOllamaModel(t *testing.T) {
	s := newOllamaStore(t)
	g := string(smallGGUF(t))
	s.model("qwen3:4b", [2]string{modelMedia, g}, [2]string{templateMedia, "{{ .Prompt }}"}, [2]string{"application/vnd.ollama.image.license", "Apache 2.0"})
	s.model("ann/tiny:v2", [2]string{modelMedia, g})

	n, _ := ParseOllamaName("qwen3:4b")
	m, err := FindOllamaModel(s.dir, n)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(g))
	if want := filepath.Join(s.dir, "blobs", "sha256-"+hex.EncodeToString(sum[:])); m.Blob != want || m.Size != int64(len(g)) || m.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("found %+v, want blob %s", m, want)
	}

	// A model that is not there: the error lists those that are.
	n, _ = ParseOllamaName("llama3.2")
	if _, err := FindOllamaModel(s.dir, n); !errors.Is(err, ErrOllamaModel) || !strings.Contains(err.Error(), "llama3.2:latest is not in") || !strings.Contains(err.Error(), "ann/tiny:v2, qwen3:4b") {
		t.Fatalf("a missing model: %v", err)
	}

	bad := func(name string, manifest []byte, says string) {
		t.Helper()
		n, _ := ParseOllamaName(name)
		s.manifest(n, manifest)
		if _, err := FindOllamaModel(s.dir, n); !errors.Is(err, ErrOllamaManifest) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrOllamaManifest saying %q", name, err, says)
		}
	}
	okDigest := m.Digest
	bad("notjson", []byte("{"), "not JSON")
	bad("nomodel", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+templateMedia+`","digest":"`+okDigest+`","size":1}]}`), "no layer of media type")
	bad("twomodels", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+modelMedia+`","digest":"`+okDigest+`"},{"mediaType":"`+modelMedia+`","digest":"`+okDigest+`"}]}`), "2 model layers")
	bad("baddigest", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+modelMedia+`","digest":"sha256:../../../etc/passwd"}]}`), "is not sha256:HEX")
	bad("noblob", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+modelMedia+`","digest":"sha256:`+strings.Repeat("0", 64)+`"}]}`), "which is not there")
	bad("wrongsize", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+modelMedia+`","digest":"`+okDigest+`","size":7}]}`), "the manifest says 7")
	notGGUF := s.blob([]byte("PK\x03\x04 safetensors, zipped"))
	bad("notgguf", []byte(`{"schemaVersion":2,"layers":[{"mediaType":"`+modelMedia+`","digest":"`+notGGUF+`"}]}`), "is not a GGUF file")
	n, _ = ParseOllamaName("huge")
	s.manifest(n, make([]byte, maxManifest+1))
	if _, err := FindOllamaModel(s.dir, n); !errors.Is(err, ErrOllamaManifest) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a huge manifest: %v", err)
	}
}

// TestUndoTOMLKeys: keys set by SetTOMLKeys go back to their old lines,
// and added keys go, byte for byte; a key changed since is refused.
func TestUndoTOMLKeys(t *testing.T) {
	src := "# my node\nlisten = \"127.0.0.1:8400\"\nmodel = '/old/model.gguf'   # by hand\n\n[retention]\nmax_age = \"48h\"\n"
	keys := []string{"serve", "model"}
	vals := map[string]string{"serve": "llama-server", "model": "/x/blobs/sha256-ab"}
	var ch []KeyChange
	for _, k := range keys {
		ch = append(ch, KeyChange{Key: k, Old: TOMLKeyLine(src, k), New: vals[k]})
	}
	if ch[0].Old != "" || ch[1].Old != "model = '/old/model.gguf'   # by hand" {
		t.Fatalf("old lines %+v", ch)
	}
	after := SetTOMLKeys(src, keys, vals)
	if !strings.Contains(after, "serve = \"llama-server\"\n") || !strings.Contains(after, "model = \"/x/blobs/sha256-ab\"\n") {
		t.Fatalf("set:\n%s", after)
	}
	back, err := UndoTOMLKeys(after, ch)
	if err != nil || back != src {
		t.Fatalf("undo: %v\n%q\nwant\n%q", err, back, src)
	}
	// A key commented out in place comes back in place.
	withUp := "listen = \"127.0.0.1:8400\"\nupstream = \"http://127.0.0.1:11434/v1\" # Ollama\nmodel = \"x\"\n"
	commented, line, ok := CommentTOMLKey(withUp, "upstream", "the node runs llama-server")
	if !ok || line != "# upstream = \"http://127.0.0.1:11434/v1\" # Ollama  # the node runs llama-server" || !strings.Contains(commented, "\n"+line+"\n") {
		t.Fatalf("commented:\n%s", commented)
	}
	if TOMLKeyLine(commented, "upstream") != "" {
		t.Fatal("a commented-out key is still read")
	}
	back, err = UndoTOMLKeys(commented, []KeyChange{{Key: "upstream", Old: TOMLKeyLine(withUp, "upstream"), Comment: line}})
	if err != nil || back != withUp {
		t.Fatalf("undo of a comment: %v\n%q", err, back)
	}
	if _, _, ok := CommentTOMLKey(withUp, "upstream_kind", "x"); ok {
		t.Fatal("an absent key commented out")
	}
	edited := strings.Replace(after, "/x/blobs/sha256-ab", "/elsewhere.gguf", 1)
	if _, err := UndoTOMLKeys(edited, ch); !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "/elsewhere.gguf") {
		t.Fatalf("undo of a key changed since: %v", err)
	}
}

// FuzzParseOllamaName: a name is taken from the command line and becomes a
// path: whatever is accepted names a file four levels under manifests/,
// never outside it, and shows as a name that parses back the same.
func FuzzParseOllamaName(f *testing.F) {
	for _, s := range []string{"qwen3:4b", "ann/tiny:v2", "hf.co/unsloth/Qwen3-4B-GGUF:Q4_K_M", "../x", "a/../../b:c", "x:..", ".:.", "a//b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseOllamaName(s)
		if err != nil {
			return
		}
		root := filepath.Join("/models", "manifests")
		p := n.manifestPath("/models")
		rel, err := filepath.Rel(root, p)
		if err != nil || strings.HasPrefix(rel, "..") || len(strings.Split(rel, string(filepath.Separator))) != 4 {
			t.Fatalf("%q: manifest path %s is not four levels under %s", s, p, root)
		}
		if back, err := ParseOllamaName(n.String()); err != nil || back != n {
			t.Fatalf("%q shows as %q, which parses as %+v, %v", s, n.String(), back, err)
		}
	})
}
