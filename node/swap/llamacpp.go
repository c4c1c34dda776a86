package swap

import (
	"context"
	"fmt"
)

// llamacppDriver drives llama.cpp's llama-server, which applies only the
// adapters named by --lora when it starts (GGUF files; POST /lora-adapters
// changes their scales, it loads nothing new). So Load always fails with
// ErrUnsupported, saying how to serve the version by a restart; the base
// model is what the server serves, whatever the request's model.
//
// API (tools/server/README.md): POST /v1/chat/completions, OpenAI's shape.
// A version becomes a llama.cpp LoRA GGUF with `clawmesh weights export`
// (model/gguf, as convert_lora_to_gguf.py writes one), and is served by a
// restart:
//
//	clawmesh weights export vN --format gguf --out OUT.gguf
//	llama-server -m BASE.gguf --lora OUT.gguf
type llamacppDriver struct{ *client }

// Load implements Driver: llama-server cannot load an adapter while it
// runs.
func (d *llamacppDriver) Load(_ context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, _, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	gguf := d.name(version) + ".gguf"
	return Target{}, fmt.Errorf("%w: llama-server applies only the adapters it was started with. To serve version %s (%s): "+
		"export it as GGUF with `clawmesh weights export %s --format gguf --out %s`, "+
		"restart llama-server with --lora %s, and run `clawmesh weights use %s` to pin the node to that version; "+
		"or have the node run llama-server itself (`clawmesh node --serve llama-server --model BASE.gguf`), and it swaps each version in",
		ErrUnsupported, version, abs, version, gguf, gguf, version)
}

// Base implements Driver: llama-server serves its model whatever a
// request names, so the Target keeps the client's model.
func (d *llamacppDriver) Base(context.Context) (Target, error) {
	return Target{Version: BaseVersion}, nil
}

// Warm implements Driver: llama-server serves one model, so an answer is
// an answer by it.
func (d *llamacppDriver) Warm(ctx context.Context, t Target) error {
	model := t.Model
	if model == "" {
		model = d.cfg.BaseModel
	}
	if _, _, err := d.chat(ctx, t, model); err != nil {
		return err
	}
	d.log.Debug("warm", "target", t)
	return nil
}

// Unload implements Driver: there is nothing to free.
func (d *llamacppDriver) Unload(context.Context, Target) error { return nil }
