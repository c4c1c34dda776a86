package swap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// sglangDriver drives SGLang's server, which serves many LoRA adapters
// beside the base model. Its OpenAI-compatible routes pick an adapter by
// the "model" field written "base-model:adapter-name", so that is the
// Target's model.
//
// API (docs.sglang.io, advanced_features/lora, "Dynamic LoRA loading" and
// "OpenAI-compatible API usage"; python/sglang/srt/entrypoints/http_server.py):
//
//	POST /load_lora_adapter {"lora_name": NAME, "lora_path": DIR}
//	  200 {"success": true, "error_message": null, "loaded_adapters": {...}}
//	  400 {"success": false, "error_message": MSG}, MSG one of
//	      "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.",
//	      "LoRA adapter NAME with rank R is incompatible with the current
//	      LoRA memory pool configuration. Please ensure that the LoRA
//	      adapter's rank is within the configured `--max-lora-rank` and that
//	      the target modules are included in `--lora-target-modules`.",
//	      "Failed to load LoRA adapter NAME because it is already loaded"
//	POST /unload_lora_adapter {"lora_name": NAME}: the same reply shape
//	POST /v1/chat/completions {"model": "BASE:NAME", ...}
//
// The server must run with --enable-lora, and for adapters loaded after
// start with --max-lora-rank and --lora-target-modules at least as large as
// theirs (else they are inferred from --lora-paths).
type sglangDriver struct{ *client }

// sglangSetup is what an SGLang server needs to load these adapters.
func sglangSetup(info adapterInfo) string {
	s := "start SGLang with --enable-lora"
	if info.Rank > 0 {
		s += fmt.Sprintf(" --max-lora-rank %d", info.Rank)
	}
	if len(info.TargetModules) > 0 {
		s += " --lora-target-modules " + strings.Join(info.TargetModules, " ")
	} else {
		s += " --lora-target-modules all"
	}
	return s
}

// sglangReply is the reply of /load_lora_adapter and /unload_lora_adapter.
type sglangReply struct {
	Success      bool   `json:"success"`
	ErrorMessage string `json:"error_message"`
}

// Load implements Driver.
func (d *sglangDriver) Load(ctx context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, info, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	base, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	name := d.name(version)
	r, err := d.do(ctx, http.MethodPost, d.root+"/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": abs}, 0)
	if err != nil {
		return Target{}, err
	}
	var sr sglangReply
	jsonErr := json.Unmarshal(r.body, &sr)
	msg := r.message()
	switch {
	case r.status == http.StatusOK && jsonErr == nil && sr.Success:
	case r.status == http.StatusOK:
		return Target{}, fmt.Errorf("%w: loading version %s: a 200 reply without success: %q", ErrUpstream, version, r.body)
	case r.status == http.StatusNotFound:
		return Target{}, fmt.Errorf("%w: SGLang has no /load_lora_adapter (%s): use a release that loads adapters at run time, and %s", ErrUnsupported, msg, sglangSetup(info))
	case strings.Contains(msg, "LoRA is not enabled"):
		return Target{}, fmt.Errorf("%w: SGLang runs without LoRA (%s): %s", ErrUnsupported, msg, sglangSetup(info))
	case strings.Contains(msg, "already loaded"):
		// Loaded by an earlier Load (the node restarted): a version's name
		// always means the same adapter.
		d.log.Info("adapter already loaded", "version", version, "model", name)
	case strings.Contains(msg, "incompatible with the current LoRA memory pool"):
		return Target{}, fmt.Errorf("%w: version %s (rank %d, modules %s) does not fit SGLang's LoRA memory pool: restart SGLang with --max-lora-rank of at least %d and --lora-target-modules covering its modules (%s)",
			ErrRefused, version, info.Rank, strings.Join(info.TargetModules, ", "), info.Rank, msg)
	default:
		return Target{}, d.failure("loading version "+version, r)
	}
	t := Target{Version: version, Model: base + ":" + name}
	d.log.Info("adapter loaded", "target", t, "dir", abs)
	return t, nil
}

// Base implements Driver: the base model by its name.
func (d *sglangDriver) Base(ctx context.Context) (Target, error) {
	b, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	return Target{Version: BaseVersion, Model: b}, nil
}

// Warm implements Driver: SGLang answers an adapter it has not loaded with
// an error, and names the model it was asked for in the reply
// (serving_chat.py, _build_chat_response: model=request.model).
func (d *sglangDriver) Warm(ctx context.Context, t Target) error {
	return d.warmModel(ctx, t, sameName)
}

// Unload implements Driver.
func (d *sglangDriver) Unload(ctx context.Context, t Target) error {
	_, name, ok := strings.Cut(t.Model, ":")
	if !ok || !d.ours(name) {
		return nil
	}
	r, err := d.do(ctx, http.MethodPost, d.root+"/unload_lora_adapter", map[string]string{"lora_name": name}, 0)
	if err != nil {
		return err
	}
	var sr sglangReply
	if r.status == http.StatusOK && json.Unmarshal(r.body, &sr) == nil && sr.Success {
		d.log.Info("adapter unloaded", "target", t)
		return nil
	}
	msg := strings.ToLower(r.message())
	if r.status == http.StatusNotFound || (strings.Contains(msg, "not") && (strings.Contains(msg, "loaded") || strings.Contains(msg, "found"))) {
		return nil // nothing to free
	}
	return d.failure("unloading version "+t.Version, r)
}
