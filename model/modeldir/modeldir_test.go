package modeldir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/model/chat"
)

func TestTiny(t *testing.T) {
	txt, cfg, err := Tiny()
	if err != nil {
		t.Fatal(err)
	}
	end, ok := txt.Tokenizer.TokenID("<|im_end|>")
	if !ok || len(cfg.EOS) != 1 || cfg.EOS[0] != end {
		t.Fatalf("EOS %v, want the id of <|im_end|> (%d)", cfg.EOS, end)
	}
	if cfg.VocabSize != txt.Tokenizer.VocabSize() {
		t.Fatalf("the model's vocabulary %d, the tokenizer's %d", cfg.VocabSize, txt.Tokenizer.VocabSize())
	}
	again, _, err := Tiny()
	if err != nil || again.Tokenizer != txt.Tokenizer {
		t.Fatalf("the tiny tokenizer was learnt twice (%v)", err)
	}
}

// TestLoad reads a model directory: with no template, a usable one, and one
// that cannot be used (Qwen3's stands in, and the reason is kept).
func TestLoad(t *testing.T) {
	tiny, _, err := Tiny()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Load(dir); err == nil {
		t.Fatal("a directory with no tokenizer.json loaded")
	}
	if err := tiny.Tokenizer.Save(filepath.Join(dir, TokenizerFile)); err != nil {
		t.Fatal(err)
	}
	txt, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if txt.Tokenizer.VocabSize() != tiny.Tokenizer.VocabSize() || txt.TemplateErr != nil {
		t.Fatalf("vocabulary %d (want %d), template error %v", txt.Tokenizer.VocabSize(), tiny.Tokenizer.VocabSize(), txt.TemplateErr)
	}
	if _, ok := txt.Renderer.(*chat.Template); ok {
		t.Fatal("no tokenizer_config.json, yet a template was read")
	}

	tc := filepath.Join(dir, TokenizerConfigFile)
	if err := os.WriteFile(tc, []byte(`{"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", "eos_token": "<|im_end|>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if txt, err = Load(dir); err != nil || txt.TemplateErr != nil {
		t.Fatalf("load: %v, template error %v", err, txt.TemplateErr)
	}
	if _, ok := txt.Renderer.(*chat.Template); !ok {
		t.Fatalf("the directory's template was not used: %T", txt.Renderer)
	}

	if err := os.WriteFile(tc, []byte(`{"chat_template": 7}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if txt, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(txt.TemplateErr, chat.ErrTemplate) {
		t.Fatalf("template error %v, want chat.ErrTemplate", txt.TemplateErr)
	}
	if _, ok := txt.Renderer.(*chat.Template); ok {
		t.Fatal("an unusable template was used")
	}

	if err := os.WriteFile(filepath.Join(dir, TokenizerFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("a broken tokenizer.json loaded")
	}
}
