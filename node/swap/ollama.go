package swap

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/gguf"
)

// ollamaDriver drives Ollama, where an adapter becomes a model of its own:
// the base model with the adapter on top, created from a blob the driver
// uploads (so Ollama may run on another machine), addressed by its name.
//
// API (docs/api.md: "Show Model Information", "Create a Blob", "Push a
// Blob", "Create a Model", "Delete a Model"), at the upstream without /v1:
//
//	POST /api/show {"model": BASE} -> 200 {"model_info": {KEY: VALUE}}: the
//	     base's GGUF metadata (general.architecture, ARCH.block_count, ...);
//	     404 {"error"} if there is no such model
//	HEAD /api/blobs/sha256:HEX -> 200 if Ollama has the blob, 404 if not
//	POST /api/blobs/sha256:HEX (the file's bytes) -> 201; 400 if the bytes
//	     do not hash to HEX
//	POST /api/create {"model": NAME, "from": BASE, "adapters": {FILE:
//	     "sha256:HEX"}, "stream": false} -> 200 {"status": "success"},
//	     or {"error": MSG} with a 4xx or 5xx status
//	DELETE /api/delete {"model": NAME} -> 200; 404 if there is no such model
//
// The adapter goes up as one llama.cpp LoRA GGUF, exported from the PEFT
// directory with model/gguf for the base's architecture as Ollama reports
// it: Ollama takes a GGUF adapter for any architecture llama.cpp runs
// (server/create.go: a file named *.gguf, one adapter), where its own
// safetensors converter knew only Llama and Gemma 2. The export is written
// to a temporary directory and removed once uploaded. Before it, the
// adapter's base (the shapes of its tensors, base_model_name_or_path) is
// checked against the model Ollama serves (model/baseid): an adapter
// trained on another base is refused, not loaded.
//
// Ollama v0.34.1 removed the creation of adapter models
// (ollama/ollama#14969). The driver does not guess from the version: where
// the server refuses ("LoRA adapters are no longer supported"), Load fails
// with ErrUnsupported and points to `clawmesh setup ollama`, which serves
// the same GGUF with llama-server.
type ollamaDriver struct {
	*client

	mu sync.Mutex
	// exported remembers the GGUF blob each version was uploaded as (by
	// its directory, version and the architecture it was exported for),
	// so that loading it again, as the node retries a version the server
	// refused, exports nothing while Ollama holds the blob.
	exported map[string]string
}

// ollamaAdapterFile is the adapter's file name in /api/create: Ollama
// tells a GGUF by the name's suffix (server/create.go
// detectModelTypeFromFiles).
const ollamaAdapterFile = "adapter.gguf"

// ollamaAlternatives is what to tell a user whose Ollama will not load an
// adapter.
func ollamaAlternatives(base string) string {
	return fmt.Sprintf("serve the same model with llama-server, which the node runs itself and which loads adapters: `clawmesh setup ollama --model %s` finds the GGUF Ollama already has (nothing is downloaded again); or serve it with vLLM, SGLang or `clawmesh serve`", base)
}

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
	info, err := d.show(ctx, base)
	if err != nil {
		return Target{}, err
	}
	if err := checkBase(abs, base, info); err != nil {
		return Target{}, err
	}
	digest, err := d.upload(ctx, abs, version, base, info)
	if err != nil {
		return Target{}, err
	}
	name := d.name(version)
	req := map[string]any{"model": name, "from": base, "adapters": map[string]string{ollamaAdapterFile: digest}, "stream": false}
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
		return Target{}, fmt.Errorf("%w: this Ollama release does not load LoRA adapters (%s): %s", ErrUnsupported, msg, ollamaAlternatives(base))
	case strings.Contains(msg, "not found") && strings.Contains(msg, base):
		return Target{}, fmt.Errorf("%w: Ollama has no base model %s (%s): pull it (`ollama pull %s`) or name the model it serves", ErrConfig, base, msg, base)
	default:
		return Target{}, d.failure(fmt.Sprintf("creating model %s from %s with version %s", name, base, version), r)
	}
	t := Target{Version: version, Model: name}
	d.log.Info("adapter loaded", "target", t, "dir", abs)
	return t, nil
}

// upload exports the adapter in dir as a llama.cpp LoRA GGUF for the base
// Ollama describes in info, and makes sure Ollama holds it as a blob,
// returning its digest. A version uploaded before, whose blob Ollama still
// holds, is not exported again.
func (d *ollamaDriver) upload(ctx context.Context, dir, version, base string, info map[string]any) (string, error) {
	arch, _ := info["general.architecture"].(string)
	key := dir + "\x00" + version + "\x00" + arch
	d.mu.Lock()
	digest := d.exported[key]
	d.mu.Unlock()
	if digest != "" {
		if ok, err := d.hasBlob(ctx, digest); err != nil {
			return "", err
		} else if ok {
			return digest, nil
		}
	}
	tmp, err := os.MkdirTemp("", "clawmesh-ollama-")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrConfig, err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, ollamaAdapterFile)
	// The GGUF is named by the version, so that the same version exports
	// to the same bytes, which Ollama already holds after a restart.
	opts := gguf.LoRAOptions{Arch: arch, Name: version}
	if arch == gguf.ArchLlama {
		// Llama's q and k are permuted by head in a GGUF: the export needs
		// the head counts, which Ollama reports.
		heads, kv := metaInt(info[arch+".attention.head_count"]), metaInt(info[arch+".attention.head_count_kv"])
		cfg, _ := json.Marshal(map[string]any{"model_type": "llama", "num_attention_heads": heads, "num_key_value_heads": kv})
		if err := os.WriteFile(filepath.Join(tmp, "config.json"), cfg, 0o600); err != nil {
			return "", fmt.Errorf("%w: %v", ErrConfig, err)
		}
		opts.BaseDir = tmp
	}
	if err := gguf.ExportLoRA(dir, out, opts); errors.Is(err, gguf.ErrUnsupported) {
		return "", fmt.Errorf("%w: version %s cannot be exported as a llama.cpp adapter for Ollama's %s (%s): %v", ErrUnsupported, version, base, cmp.Or(arch, "architecture unknown"), err)
	} else if err != nil {
		return "", fmt.Errorf("%w: exporting %s as GGUF: %v", ErrAdapter, dir, err)
	}
	if digest, err = d.pushBlob(ctx, out); err != nil {
		return "", err
	}
	d.mu.Lock()
	if d.exported == nil {
		d.exported = map[string]string{}
	}
	d.exported[key] = digest
	d.mu.Unlock()
	return digest, nil
}

// show returns the base model's GGUF metadata as Ollama reports it
// (POST /api/show, model_info), numbers as json.Number.
func (d *ollamaDriver) show(ctx context.Context, base string) (map[string]any, error) {
	r, err := d.do(ctx, http.MethodPost, d.root+"/api/show", map[string]string{"model": base}, 0)
	if err != nil {
		return nil, err
	}
	switch {
	case r.status == http.StatusNotFound:
		return nil, fmt.Errorf("%w: Ollama has no base model %s (%s): pull it (`ollama pull %s`) or name the model it serves", ErrConfig, base, r.message(), base)
	case r.status != http.StatusOK:
		return nil, d.failure("describing base model "+base, r)
	}
	var sr struct {
		ModelInfo map[string]any `json:"model_info"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	if err := dec.Decode(&sr); err != nil {
		return nil, fmt.Errorf("%w: POST %s/api/show: not a model description: %v", ErrUpstream, d.root, err)
	}
	if sr.ModelInfo == nil {
		sr.ModelInfo = map[string]any{}
	}
	return sr.ModelInfo, nil
}

// BaseIdentity implements BaseIdentifier: the identity of the base model
// as Ollama's /api/show describes its GGUF, with the model's Ollama name.
func (d *ollamaDriver) BaseIdentity(ctx context.Context) (baseid.ID, error) {
	base, err := d.baseModel(ctx)
	if err != nil {
		return baseid.ID{}, err
	}
	info, err := d.show(ctx, base)
	if err != nil {
		return baseid.ID{}, err
	}
	return ollamaIdentity(base, info)
}

// ollamaIdentity reads a base's identity from /api/show's model_info.
func ollamaIdentity(base string, info map[string]any) (baseid.ID, error) {
	id, err := baseid.FromGGUFMetadata(func(k string) (any, bool) {
		v, ok := info[k]
		if n, isNum := v.(json.Number); isNum {
			i, err := n.Int64()
			return i, ok && err == nil
		}
		return v, ok
	})
	if err != nil {
		return id, err
	}
	id.Names = append([]string{base}, id.Names...)
	return id, nil
}

// checkBase refuses an adapter trained on another base than the model
// Ollama serves, by their identities (model/baseid). What cannot be told
// (a base with no metadata, an adapter whose shapes say nothing) passes:
// Ollama or llama.cpp has the last word.
func checkBase(dir, base string, info map[string]any) error {
	want, err := ollamaIdentity(base, info)
	if err != nil {
		return nil
	}
	got, err := baseid.FromAdapter(dir)
	if err != nil {
		return nil
	}
	if err := baseid.Same(got, want); err != nil {
		return fmt.Errorf("%w: the adapter was trained on another base model than Ollama's %s, so it is not loaded: %w", ErrUnsupported, base, err)
	}
	return nil
}

// metaInt reads an integer of Ollama's model_info (0 if it is none).
func metaInt(v any) int {
	if n, ok := v.(json.Number); ok {
		i, _ := n.Int64()
		return int(i)
	}
	return 0
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
	if ok, err := d.hasBlob(ctx, digest); err != nil || ok {
		return digest, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrAdapter, path, err)
	}
	// Only the file's first n bytes: they are what was hashed.
	r, err := d.do(ctx, http.MethodPost, d.root+"/api/blobs/"+digest, io.LimitReader(f, n), n)
	if err != nil {
		return "", err
	}
	if r.status != http.StatusCreated && r.status != http.StatusOK {
		return "", fmt.Errorf("%w: uploading %s as blob %s: %d %s", ErrUpstream, filepath.Base(path), digest, r.status, r.message())
	}
	d.log.Debug("blob pushed", "file", path, "digest", digest, "bytes", n)
	return digest, nil
}

// hasBlob says whether Ollama holds the blob digest.
func (d *ollamaDriver) hasBlob(ctx context.Context, digest string) (bool, error) {
	r, err := d.do(ctx, http.MethodHead, d.root+"/api/blobs/"+digest, nil, 0)
	switch {
	case err != nil:
		return false, err
	case r.status == http.StatusOK:
		return true, nil
	case r.status == http.StatusNotFound:
		return false, nil
	}
	return false, d.failure("looking up blob "+digest, r)
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
