// Package modeldir gives what serving or training a model needs beside its
// engine: its tokenizer and its chat template, read from a model directory
// (tokenizer.json and, when present, tokenizer_config.json's template), or
// those of the tiny model built in, with the tiny model's shape. Every
// place that opens a model (the model server, the trainers' workers, the
// demo, tests) reads them the same way through it.
package modeldir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/tokenizer"
)

// Files of a model directory that this package reads.
const (
	TokenizerFile       = "tokenizer.json"
	TokenizerConfigFile = "tokenizer_config.json"
)

// Text is a model's tokenizer and chat template.
type Text struct {
	Tokenizer *tokenizer.Tokenizer
	// Renderer is the directory's chat template, or Qwen3's when the
	// directory has none or its template cannot be used.
	Renderer chat.Renderer
	// TemplateErr says why the directory's chat template was not used
	// (Qwen3's is, instead); nil when it was, or when there is none.
	TemplateErr error
}

// Load reads the tokenizer and chat template of the model directory dir.
// A template that cannot be used is no error: Qwen3's stands in, and
// TemplateErr says why.
func Load(dir string) (Text, error) {
	tok, err := tokenizer.Load(filepath.Join(dir, TokenizerFile))
	if err != nil {
		return Text{}, err
	}
	t := Text{Tokenizer: tok, Renderer: chat.Qwen3()}
	tc := filepath.Join(dir, TokenizerConfigFile)
	if _, err := os.Stat(tc); errors.Is(err, fs.ErrNotExist) {
		return t, nil
	} else if err != nil {
		return Text{}, err
	}
	if r, err := chat.FromTokenizerConfig(tc); err != nil {
		t.TemplateErr = err
	} else {
		t.Renderer = r
	}
	return t, nil
}

// tinyTok learns the tiny tokenizer once: it is immutable and shared.
var tinyTok = sync.OnceValues(func() (*tokenizer.Tokenizer, error) {
	return tokenizer.Tiny(tokenizer.TinyOptions{})
})

// Tiny returns the tiny model's tokenizer with Qwen3's template, and the
// tiny model's shape (native.TinyConfig) for that tokenizer, its end of
// turn <|im_end|> as the model's end of sequence.
func Tiny() (Text, native.Config, error) {
	tok, err := tinyTok()
	if err != nil {
		return Text{}, native.Config{}, err
	}
	cfg := native.TinyConfig(tok.VocabSize())
	id, ok := tok.TokenID("<|im_end|>")
	if !ok {
		return Text{}, native.Config{}, errors.New("modeldir: the tiny tokenizer has no <|im_end|>")
	}
	cfg.EOS = []int{id}
	return Text{Tokenizer: tok, Renderer: chat.Qwen3()}, cfg, nil
}
