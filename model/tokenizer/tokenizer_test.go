package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

func tiny(tb testing.TB) *Tokenizer {
	tb.Helper()
	tok, err := Tiny(TinyOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

func corpus(tb testing.TB) []string {
	tb.Helper()
	data, err := os.ReadFile(corpusPath)
	if err != nil {
		tb.Fatal(err)
	}
	var c []string
	if err := json.Unmarshal(data, &c); err != nil {
		tb.Fatal(err)
	}
	return c
}

// regexPieces splits s with regexp2 and QwenPattern, the reference the
// hand-written scanner must agree with.
func regexPieces(tb testing.TB, s string) []string {
	tb.Helper()
	rs, err := newRegexSplitter(QwenPattern)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	rs.split(s, func(p string) { out = append(out, p) })
	return out
}

func scanPieces(s string) []string {
	var out []string
	qwenScanner{}.split(s, func(p string) { out = append(out, p) })
	return out
}

func TestScannerMatchesRegexp2(t *testing.T) {
	cases := append(corpus(t),
		"", "a", "'", "''", "'s", "'S", "'ll", "'lL", "'l", "'re'", "x'VE", "a'", " '",
		" \n", "\n ", " \n\n ", "  x", "   ", " x", "\tx", "\t\t x", "\r\n\r\n  \r\n x",
		" !", "  !", "!\n\n", " !\r\n\n", "\u00a0x", "\u00a0\u00a0x", "\u3000\u3000", "x\u2028",
		"9 9", "12", "½x", " ½", "a1b2", " 1", "\n1", "\u0301", "x\u0301y", " \u0301",
	)
	for _, s := range cases {
		got, want := scanPieces(s), regexPieces(t, s)
		if !slices.Equal(got, want) {
			t.Errorf("%q:\n scanner %q\n regexp2 %q", s, got, want)
		}
	}
}

func TestBPEHeapMatchesScan(t *testing.T) {
	tok := tiny(t)
	words := []string{"hello", "assistant", strings.Repeat("ab", 40), strings.Repeat("a", 100),
		"Thearguments", strings.Repeat("the weather in Paris", 5)}
	for _, s := range corpus(t) {
		words = append(words, s)
	}
	for _, w := range words {
		ids := make([]int32, len(w))
		for i := 0; i < len(w); i++ {
			ids[i] = tok.byteID[w[i]]
		}
		if len(ids) > smallWord {
			// bpeSmall's buffer is fixed; compare on a heap-sized word via
			// the general quadratic form below.
			if got, want := tok.bpeHeap(nil, ids), quadratic(tok, ids); !slices.Equal(got, want) {
				t.Errorf("%q: heap %v, quadratic %v", w, got, want)
			}
			continue
		}
		if got, want := tok.bpeHeap(nil, ids), tok.bpeSmall(nil, ids); !slices.Equal(got, want) {
			t.Errorf("%q: heap %v, small %v", w, got, want)
		}
	}
}

// quadratic is the textbook BPE loop, without bpeSmall's length limit.
func quadratic(t *Tokenizer, word []int32) []int {
	w := append([]int32(nil), word...)
	for {
		best := -1
		var bm merge
		for i := 0; i+1 < len(w); i++ {
			if m, ok := t.merges[pairKey(w[i], w[i+1])]; ok && (best < 0 || m.rank < bm.rank) {
				best, bm = i, m
			}
		}
		if best < 0 {
			break
		}
		w[best] = bm.id
		w = append(w[:best+1], w[best+2:]...)
	}
	out := make([]int, len(w))
	for i, id := range w {
		out[i] = int(id)
	}
	return out
}

func TestTinyBasics(t *testing.T) {
	tok := tiny(t)
	if got := tok.VocabSize(); got != 256+320+len(ChatTokens) {
		t.Errorf("VocabSize = %d", got)
	}
	text := "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	ids := tok.Encode(text)
	if got := tok.Decode(ids); got != text {
		t.Errorf("Decode(Encode) = %q", got)
	}
	if len(ids) >= len(text)/2 {
		t.Errorf("%d ids for %d bytes: merges are not applied", len(ids), len(text))
	}
	for _, name := range []string{"<|im_start|>", "<|im_end|>", "<think>", "</think>"} {
		id, ok := tok.TokenID(name)
		if !ok || !slices.Contains(ids, id) {
			t.Errorf("%s (%d, %v) not recognised in %v", name, id, ok, ids)
		}
		if tok.Token(id) != name {
			t.Errorf("Token(%d) = %q", id, tok.Token(id))
		}
	}
	end, _ := tok.TokenID("<|im_end|>")
	think, _ := tok.TokenID("<think>")
	if !tok.IsSpecial(end) || tok.IsSpecial(think) || tok.IsSpecial(0) {
		t.Error("IsSpecial wrong")
	}
	// EncodeOrdinary spells added tokens out as text.
	ord := tok.EncodeOrdinary("<|im_end|>")
	if slices.Contains(ord, end) || tok.Decode(ord) != "<|im_end|>" {
		t.Errorf("EncodeOrdinary = %v", ord)
	}
	// Every byte token decodes to its byte.
	for b := range 256 {
		if got := tok.TokenBytes(int(tok.byteID[b])); len(got) != 1 || got[0] != byte(b) {
			t.Errorf("byte %d decodes to %v", b, got)
		}
	}
	if tok.Token(-1) != "" || tok.Token(1<<30) != "" || tok.TokenBytes(-5) != nil {
		t.Error("unknown ids should give empty results")
	}
}

func TestTinyDeterministic(t *testing.T) {
	a, b := tiny(t), tiny(t)
	ja, _ := a.MarshalJSON()
	jb, _ := b.MarshalJSON()
	if string(ja) != string(jb) {
		t.Error("Tiny is not deterministic")
	}
	if _, err := Tiny(TinyOptions{Merges: -1}); err == nil {
		t.Error("negative merges accepted")
	}
	small, err := Tiny(TinyOptions{Merges: 10, Corpus: "abab abab abab"})
	if err != nil {
		t.Fatal(err)
	}
	// "abab", " abab": a+b, then ab+ab, then " "+abab: 3 merges, no more
	// pairs seen twice.
	if got := small.VocabSize(); got != 256+3+len(ChatTokens) {
		t.Errorf("VocabSize = %d", got)
	}
	if got := small.EncodeOrdinary("abab abab"); len(got) != 2 {
		t.Errorf("EncodeOrdinary = %v", got)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	tok := tiny(t)
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := tok.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.VocabSize() != tok.VocabSize() {
		t.Fatalf("VocabSize %d, want %d", back.VocabSize(), tok.VocabSize())
	}
	for _, s := range corpus(t) {
		if a, b := tok.Encode(s), back.Encode(s); !slices.Equal(a, b) {
			t.Fatalf("%q: %v after round trip, %v before", s, b, a)
		}
	}
	// Merges as "a b" strings (the older format) load the same.
	var raw map[string]any
	data, _ := tok.MarshalJSON()
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	model := raw["model"].(map[string]any)
	var strs []string
	for _, m := range model["merges"].([]any) {
		p := m.([]any)
		strs = append(strs, p[0].(string)+" "+p[1].(string))
	}
	model["merges"] = strs
	data, _ = json.Marshal(raw)
	old, err := FromJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := tok.Encode("the weather in Paris"), old.Encode("the weather in Paris"); !slices.Equal(a, b) {
		t.Errorf("string merges: %v, want %v", b, a)
	}
}

// TestTinyAgainstReference encodes the corpus with the Tiny tokenizer.json
// in transformers.js, when node and the npm packages are present.
func TestTinyAgainstReference(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not on PATH")
	}
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules")); err != nil {
		t.Skipf("npm packages not installed in %s", npmDir)
	}
	tok := tiny(t)
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := tok.Save(path); err != nil {
		t.Fatal(err)
	}
	corpusAbs, _ := filepath.Abs(corpusPath)
	cmd := exec.Command(node, "encode.js", corpusAbs, path)
	cmd.Dir = npmDir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("encode.js: %v", err)
	}
	g := readGolden(t, out)
	for i, c := range g.Cases {
		if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
			t.Errorf("case %d %q:\n got  %v\n want %v", i, c.Text, got, c.IDs)
		}
	}
}

func TestFromJSONErrors(t *testing.T) {
	tok := tiny(t)
	good, _ := tok.MarshalJSON()
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"not json", []byte("{"), ErrInvalid},
		{"wordpiece", edit(func(m map[string]any) { model(m)["type"] = "WordPiece" }), ErrUnsupported},
		{"byte fallback", edit(func(m map[string]any) { model(m)["byte_fallback"] = true }), ErrUnsupported},
		{"nfkc", edit(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFKC"} }), ErrUnsupported},
		{"metaspace", edit(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }), ErrUnsupported},
		{"no pre-tokenizer", edit(func(m map[string]any) { m["pre_tokenizer"] = nil }), ErrUnsupported},
		{"bad merge", edit(func(m map[string]any) { model(m)["merges"] = []string{"Ġ"} }), ErrInvalid},
		{"merge of unknown", edit(func(m map[string]any) { model(m)["merges"] = []string{"zz qq"} }), ErrInvalid},
		{"missing byte", edit(func(m map[string]any) { delete(model(m)["vocab"].(map[string]any), "a") }), ErrUnsupported},
		{"bad regex", edit(func(m map[string]any) {
			m["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = map[string]any{"Regex": "("}
		}), ErrUnsupported},
	}
	for _, c := range cases {
		if _, err := FromJSON(c.data); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

// TestOtherPattern checks the regexp2 path: a tokenizer.json with GPT-2's
// ByteLevel(use_regex) pre-tokenizer splits with that pattern.
func TestOtherPattern(t *testing.T) {
	tok := tiny(t)
	data, _ := tok.MarshalJSON()
	var m map[string]any
	json.Unmarshal(data, &m)
	m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
	data, _ = json.Marshal(m)
	gpt, err := FromJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := gpt.split.(*regexSplitter); !ok {
		t.Fatalf("splitter %T", gpt.split)
	}
	// GPT-2 keeps digit runs together, Qwen splits every digit.
	var pieces []string
	gpt.split.split("year 2024", func(p string) { pieces = append(pieces, p) })
	if !slices.Equal(pieces, []string{"year", " 2024"}) {
		t.Errorf("pieces %q", pieces)
	}
	if s := "year 2024, ok"; gpt.Decode(gpt.Encode(s)) != s {
		t.Error("round trip")
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := tiny(t)
	texts := corpus(t)
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s)
	}
	fresh := tiny(t) // empty cache
	done := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range texts {
				j := (i + g*97) % len(texts)
				if !slices.Equal(fresh.Encode(texts[j]), want[j]) {
					done <- errors.New(texts[j])
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Errorf("concurrent Encode differs on %q", err)
		}
	}
}

func FuzzEncodeDecode(f *testing.F) {
	for _, s := range corpus(f)[:200] {
		f.Add(s)
	}
	toks := []*Tokenizer{tiny(f)}
	if _, err := os.Stat(qwenJSON); err == nil {
		toks = append(toks, qwen3(f))
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		want := norm.NFC.String(s)
		for _, tok := range toks {
			if got := tok.Decode(tok.EncodeOrdinary(s)); got != want {
				t.Fatalf("Decode(EncodeOrdinary(%q)) = %q", s, got)
			}
			if norm.NFC.IsNormalString(s) {
				if got := tok.Decode(tok.Encode(s)); got != s {
					t.Fatalf("Decode(Encode(%q)) = %q", s, got)
				}
			}
		}
	})
}

func FuzzScannerMatchesRegexp2(f *testing.F) {
	for _, s := range corpus(f)[:300] {
		f.Add(s)
	}
	re := regexp2.MustCompile(QwenPattern, regexp2.Unicode)
	rs := &regexSplitter{re: re}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		var want []string
		rs.split(s, func(p string) { want = append(want, p) })
		if got := scanPieces(s); !slices.Equal(got, want) {
			t.Fatalf("%q:\n scanner %q\n regexp2 %q", s, got, want)
		}
	})
}
