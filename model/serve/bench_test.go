package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"testing"

	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
)

// BenchmarkServeGenerate compares decoding speed through the HTTP server
// (non-streaming and streaming, greedy, one request at a time) with
// engine.Generate called directly, on the same engine in the same run.
func BenchmarkServeGenerate(b *testing.B) {
	tok := testTokenizer(b)
	shapes := map[string]func(native.Config) native.Config{
		"tiny": func(c native.Config) native.Config { return c },
		"wide": func(c native.Config) native.Config {
			c.Hidden, c.Intermediate, c.Heads, c.KVHeads, c.HeadDim, c.Layers = 256, 768, 8, 2, 32, 4
			return c
		},
	}
	const maxTokens = 64
	for _, shape := range []string{"tiny", "wide"} {
		cfg := shapes[shape](tinyConfig(b, tok))
		cfg.EOS = nil // never stop early: every run decodes maxTokens
		e, err := native.NewTiny(cfg, 1, native.Options{})
		if err != nil {
			b.Fatal(err)
		}
		_, base := startServer(b, Config{Model: e, Tokenizer: tok, StopTokens: []int{}})
		msgs := `[{"role":"user","content":"Write a poem about the sea."}]`
		text := "<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n"
		prompt := tok.Encode(text)
		report := func(b *testing.B, tokens int) {
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(0, "ns/op")
		}
		b.Run(shape+"/engine", func(b *testing.B) {
			n := 0
			for b.Loop() {
				toks, _, err := e.Generate(context.Background(), prompt, engine.GenOptions{MaxTokens: maxTokens})
				if err != nil {
					b.Fatal(err)
				}
				n += len(toks)
			}
			report(b, n)
		})
		for _, stream := range []bool{false, true} {
			name := shape + "/http"
			if stream {
				name += "-stream"
			}
			body := fmt.Sprintf(`{"messages":%s,"max_tokens":%d,"temperature":0,"stream":%v,"stream_options":{"include_usage":%v}}`,
				msgs, maxTokens, stream, stream)
			if !stream {
				body = fmt.Sprintf(`{"messages":%s,"max_tokens":%d,"temperature":0}`, msgs, maxTokens)
			}
			b.Run(name, func(b *testing.B) {
				n := 0
				for b.Loop() {
					resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
					if err != nil {
						b.Fatal(err)
					}
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("%d %s", resp.StatusCode, raw)
					}
					if i := bytes.LastIndex(raw, []byte(`"usage":`)); i >= 0 {
						var u struct {
							CompletionTokens int `json:"completion_tokens"`
						}
						json.NewDecoder(bytes.NewReader(raw[i+8:])).Decode(&u)
						n += u.CompletionTokens
					}
				}
				report(b, n)
			})
		}
	}
}

// BenchmarkLoadAdapter measures one hot swap on a forking engine (fork,
// read the PEFT files, swap) and the memory a version costs.
func BenchmarkLoadAdapter(b *testing.B) {
	e, tok := newTinyEngine(b, 1)
	dir := trainAdapter(b, e, tok.Encode("hello world, hello sea"), 1)
	s, err := New(Config{Model: e, Tokenizer: tok})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	i := 0
	for b.Loop() {
		i++
		if err := s.LoadAdapter(context.Background(), dir, fmt.Sprint("v", i)); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(e.Info().LoRAParams*4), "adapter-bytes")
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)), "retained-bytes")
	b.ReportAllocs()
}
