package tokenizer

import (
	"strings"
	"testing"
)

func benchText(tb testing.TB) string {
	return strings.Join(corpus(tb), "\n")
}

func benchEncode(b *testing.B, tok *Tokenizer, cold bool) {
	text := benchText(b)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	tokens := 0
	for b.Loop() {
		if cold {
			tok.cache.mu.Lock()
			clear(tok.cache.m)
			tok.cache.mu.Unlock()
		}
		tokens += len(tok.Encode(text))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncode encodes the test corpus (code, prose in many scripts,
// emoji, whitespace) with Qwen3's tokenizer; warm reuses the piece cache,
// cold clears it every round.
func BenchmarkEncode(b *testing.B) {
	tok := qwen3(b)
	b.Run("warm", func(b *testing.B) { benchEncode(b, tok, false) })
	b.Run("cold", func(b *testing.B) { benchEncode(b, tok, true) })
}

func BenchmarkEncodeTiny(b *testing.B) { benchEncode(b, tiny(b), false) }

// BenchmarkSplit compares the hand-written pre-tokenizer with regexp2.
func BenchmarkSplit(b *testing.B) {
	text := benchText(b)
	rs, _ := newRegexSplitter(QwenPattern)
	for _, c := range []struct {
		name string
		s    splitter
	}{{"scanner", qwenScanner{}}, {"regexp2", rs}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				n := 0
				c.s.split(text, func(string) { n++ })
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	qwen3(b)
	for b.Loop() {
		if _, err := Load(qwenJSON); err != nil {
			b.Fatal(err)
		}
	}
}
