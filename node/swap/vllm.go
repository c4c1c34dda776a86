package swap

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// vllmDriver drives vLLM's OpenAI-compatible server, which serves many
// LoRA adapters beside the base model, each chosen per request by its name
// in the "model" field.
//
// API (docs.vllm.ai, features/lora.md, "Dynamically serving LoRA
// Adapters"; vllm/entrypoints/openai/serving_models.py):
//
//	POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR}
//	  200 "Success: LoRA adapter 'NAME' added successfully."
//	  400 {"error": {"message", "type": "BadRequestError", "code": 400}}
//	      (older releases: the same fields at the top level) when the
//	      engine refuses it: "LoRA rank R is greater than max_lora_rank M.",
//	      "LoRA is not enabled. Use --enable-lora to enable LoRA.", or
//	      "The lora adapter 'NAME' has already been loaded."
//	  404 "No adapter found for DIR" when the path does not hold one
//	POST /v1/unload_lora_adapter {"lora_name": NAME}
//	  200; 404 "The lora adapter 'NAME' cannot be found."
//	GET  /v1/models: the base model, and each adapter with "parent" set
//
// Both routes exist only when the server runs with the environment variable
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; otherwise they are 404 with
// {"detail": "Not Found"} (or, in newer releases, an error whose message is
// "Not Found"). Adapters load only with --enable-lora, and only up to
// --max-lora-rank (default 16; one of vllmRanks). With --max-loras 2 or
// more, requests still on the old version and those on the new one share
// a batch during a swap (the default, 1, serves them in turns).
type vllmDriver struct{ *client }

// vllmRanks are the values vLLM's --max-lora-rank accepts
// (vllm/config/lora.py, MaxLoRARanks).
var vllmRanks = []int{1, 8, 16, 32, 64, 128, 256, 320, 512}

var vllmRankRE = regexp.MustCompile(`LoRA rank (\d+) is greater than max_lora_rank (\d+)`)

// vllmSetup is what a vLLM server needs to load adapters at run time.
func vllmSetup(rank int) string {
	s := "start vLLM with --enable-lora and the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
	if rank > 16 {
		s += fmt.Sprintf(", and --max-lora-rank %d (the adapters' rank is %d)", vllmRank(rank), rank)
	}
	return s
}

// vllmRank is the smallest --max-lora-rank vLLM accepts that holds rank
// (0 if none does).
func vllmRank(rank int) int {
	for _, r := range vllmRanks {
		if r >= rank {
			return r
		}
	}
	return 0
}

// Load implements Driver.
func (d *vllmDriver) Load(ctx context.Context, version, dir string) (Target, error) {
	if err := checkVersion(version); err != nil {
		return Target{}, err
	}
	abs, info, err := readAdapter(dir)
	if err != nil {
		return Target{}, err
	}
	name := d.name(version)
	r, err := d.do(ctx, http.MethodPost, d.api+"/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": abs}, 0)
	if err != nil {
		return Target{}, err
	}
	msg := r.message()
	switch {
	case r.status == http.StatusOK:
	case r.status == http.StatusNotFound && !strings.Contains(msg, "adapter"):
		return Target{}, fmt.Errorf("%w: vLLM has no /v1/load_lora_adapter (%s): %s", ErrUnsupported, msg, vllmSetup(info.Rank))
	case strings.Contains(msg, "LoRA is not enabled") || strings.Contains(msg, "--enable-lora"):
		return Target{}, fmt.Errorf("%w: vLLM runs without LoRA (%s): %s", ErrUnsupported, msg, vllmSetup(info.Rank))
	case r.status == http.StatusBadRequest && strings.Contains(msg, "has already been loaded"):
		// Loaded by an earlier Load (the node restarted): a version's name
		// always means the same adapter, so it is there to use.
		d.log.Info("adapter already loaded", "version", version, "model", name)
	case vllmRankRE.MatchString(msg):
		m := vllmRankRE.FindStringSubmatch(msg)
		rank, _ := strconv.Atoi(m[1])
		rank = max(rank, info.Rank)
		need := vllmRank(rank)
		if need == 0 {
			return Target{}, fmt.Errorf("%w: version %s has rank %d, above anything vLLM's --max-lora-rank accepts (at most %d): %s", ErrRefused, version, rank, vllmRanks[len(vllmRanks)-1], msg)
		}
		return Target{}, fmt.Errorf("%w: version %s has rank %d and vLLM runs with --max-lora-rank %s: restart vLLM with --max-lora-rank %d (%s)", ErrRefused, version, rank, m[2], need, msg)
	case r.status == http.StatusNotFound:
		return Target{}, fmt.Errorf("%w: version %s: vLLM finds no adapter at %s (%s); the server must see the node's files at the same path", ErrRefused, version, abs, msg)
	default:
		return Target{}, d.failure("loading version "+version, r)
	}
	t := Target{Version: version, Model: name}
	d.log.Info("adapter loaded", "target", t, "dir", abs)
	return t, nil
}

// Base implements Driver: the base model by its name.
func (d *vllmDriver) Base(ctx context.Context) (Target, error) {
	b, err := d.baseModel(ctx)
	if err != nil {
		return Target{}, err
	}
	return Target{Version: BaseVersion, Model: b}, nil
}

// Warm implements Driver: vLLM names the adapter that answered in the
// reply's "model" (serving_models.py, model_name).
func (d *vllmDriver) Warm(ctx context.Context, t Target) error {
	return d.warmModel(ctx, t, sameName)
}

// Unload implements Driver.
func (d *vllmDriver) Unload(ctx context.Context, t Target) error {
	if !d.ours(t.Model) {
		return nil
	}
	r, err := d.do(ctx, http.MethodPost, d.api+"/unload_lora_adapter", map[string]string{"lora_name": t.Model}, 0)
	if err != nil {
		return err
	}
	switch {
	case r.status == http.StatusOK:
		d.log.Info("adapter unloaded", "target", t)
		return nil
	case r.status == http.StatusNotFound:
		// Not loaded (any more), or no runtime loading at all: nothing
		// to free.
		return nil
	}
	return d.failure("unloading version "+t.Version, r)
}
