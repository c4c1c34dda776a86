package swap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// ollamaDriver drives Ollama, where an adapter becomes a model of its own:
// the base model with the adapter on top, created from blobs the driver
// uploads (so Ollama may run on another machine), addressed by its name.
//
// API (docs/api.md: "Create a Blob", "Push a Blob", "Create a Model",
// "Delete a Model"), at the upstream without /v1:
//
//	HEAD /api/blobs/sha256:HEX -> 200 if Ollama has the blob, 404 if not
//	POST /api/blobs/sha256:HEX (the file's bytes) -> 201; 400 if the bytes
//	     do not hash to HEX
//	POST /api/create {"model": NAME, "from": BASE, "adapters": {FILE:
//	     "sha256:HEX", ...}, "stream": false} -> 200 {"status": "success"},
//	     or {"error": MSG} with a 4xx or 5xx status
//	DELETE /api/delete {"model": NAME} -> 200; 404 if there is no such model
//
// Ollama converts a safetensors adapter with its adapter_config.json (it
// reads the rank and alpha there: convert.ConvertAdapter), so both files
// go up. Its converter knows few architectures (Llama, Gemma 2: else
// "unsupported architecture"), and recent releases refuse adapters
// altogether ("LoRA adapters are no longer supported").
type ollamaDriver struct{ *client }

// ollamaAlternatives is what to tell a user whose Ollama will not load an
// adapter.
const ollamaAlternatives = "serve the model with vLLM, SGLang or `clawmesh serve` to have it learn, or convert each version to GGUF with llama.cpp's convert_lora_to_gguf.py and restart llama-server with --lora"

// Load implements Driver.
func (d *ollamaDriver) Load(ctx context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, _, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	base, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	adapters := map[string]string{}
	for _, f := range []string{configFile, weightsFile} {
		digest, err := d.pushBlob(ctx, filepath.Join(abs, f))
		if err != nil {
			return Target{}, err
		}
		adapters[f] = digest
	}
	name := d.name(version)
	req := map[string]any{"model": name, "from": base, "adapters": adapters, "stream": false}
	r, err := d.do(ctx, http.MethodPost, d.root+"/api/create", req, 0)
	if err != nil {
		return Target{}, err
	}
	msg := r.message()
	switch {
	case r.status == http.StatusOK:
		var st struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(r.body, &st) != nil || st.Status != "success" {
			return Target{}, fmt.Errorf("%w: creating %s: no success in %q", ErrUpstream, name, r.body)
		}
	case strings.Contains(msg, "no longer supported"):
		return Target{}, fmt.Errorf("%w: this Ollama release does not load LoRA adapters (%s): %s", ErrUnsupported, msg, ollamaAlternatives)
	case strings.Contains(msg, "not found") && strings.Contains(msg, base):
		return Target{}, fmt.Errorf("%w: Ollama has no base model %s (%s): pull it (`ollama pull %s`) or name the model it serves", ErrConfig, base, msg, base)
	case strings.Contains(msg, "unsupported architecture"):
		return Target{}, fmt.Errorf("%w: Ollama cannot convert adapters for base model %s (%s): %s", ErrUnsupported, base, msg, ollamaAlternatives)
	default:
		return Target{}, d.failure(fmt.Sprintf("creating model %s from %s with version %s", name, base, version), r)
	}
	t := Target{Version: version, Model: name}
	d.log.Info("adapter loaded", "target", t, "dir", abs)
	return t, nil
}

// pushBlob makes sure Ollama holds the file at path as a blob and returns
// its digest ("sha256:HEX").
func (d *ollamaDriver) pushBlob(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrAdapter, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrAdapter, path, err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	url := d.root + "/api/blobs/" + digest
	r, err := d.do(ctx, http.MethodHead, url, nil, 0)
	if err != nil {
		return "", err
	}
	if r.status == http.StatusOK {
		return digest, nil
	}
	if r.status != http.StatusNotFound {
		return "", d.failure("looking up blob "+digest, r)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrAdapter, path, err)
	}
	// Only the file's first n bytes: they are what was hashed.
	r, err = d.do(ctx, http.MethodPost, url, io.LimitReader(f, n), n)
	if err != nil {
		return "", err
	}
	if r.status != http.StatusCreated && r.status != http.StatusOK {
		return "", fmt.Errorf("%w: uploading %s as blob %s: %d %s", ErrUpstream, filepath.Base(path), digest, r.status, r.message())
	}
	d.log.Debug("blob pushed", "file", path, "digest", digest, "bytes", n)
	return digest, nil
}

// Base implements Driver: the base model by its name.
func (d *ollamaDriver) Base(ctx context.Context) (Target, error) {
	b, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	return Target{Version: BaseVersion, Model: b}, nil
}

// Warm implements Driver, through Ollama's OpenAI-compatible
// /v1/chat/completions, which names the model in the reply (with the
// ":latest" tag Ollama gives a name without one, in some releases).
func (d *ollamaDriver) Warm(ctx context.Context, t Target) error {
	return d.warmModel(ctx, t, func(got, want string) bool {
		return got == want || strings.TrimSuffix(got, ":latest") == strings.TrimSuffix(want, ":latest")
	})
}

// Unload implements Driver: it deletes the model made for t (never one
// whose name this package did not make). The blobs the base model shares
// stay; Ollama prunes the rest.
func (d *ollamaDriver) Unload(ctx context.Context, t Target) error {
	if !d.ours(t.Model) {
		return nil
	}
	r, err := d.do(ctx, http.MethodDelete, d.root+"/api/delete", map[string]string{"model": t.Model}, 0)
	if err != nil {
		return err
	}
	switch r.status {
	case http.StatusOK:
		d.log.Info("adapter unloaded", "target", t)
		return nil
	case http.StatusNotFound:
		return nil
	}
	return d.failure("deleting model "+t.Model, r)
}
