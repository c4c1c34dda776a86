package swap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/clawmesh/clawmesh/model/gguf"
)

// The fakes below follow each server's documented API (cited on each
// driver) for the routes a driver uses, refusals included. They read the
// adapter directories they are sent, as the real servers do on one machine.

// fakeVLLM is vLLM's OpenAI-compatible server (vllm serve).
type fakeVLLM struct {
	base        string
	runtime     bool // VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: the load routes exist
	lora        bool // --enable-lora
	maxRank     int  // --max-lora-rank
	oldErrors   bool // releases before 0.10 put error fields at the top level
	newNotFound bool // newer releases answer unknown routes in the error shape
	blind       bool // the server does not see the node's files
	echoBase    bool // a broken server answering every model with the base
	token       string

	mu     sync.Mutex
	loaded map[string]string // lora_name -> lora_path
}

func newFakeVLLM() *fakeVLLM {
	return &fakeVLLM{base: "Qwen/Qwen3-0.6B", runtime: true, lora: true, maxRank: 16, loaded: map[string]string{}}
}

func (f *fakeVLLM) fail(w http.ResponseWriter, status int, typ, msg string) {
	if f.oldErrors {
		writeJSON(w, status, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": status})
		return
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

func (f *fakeVLLM) notFound(w http.ResponseWriter) {
	if f.newNotFound {
		f.fail(w, http.StatusNotFound, "NotFoundError", "Not Found")
		return
	}
	writeJSON(w, http.StatusNotFound, map[string]any{"detail": "Not Found"})
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "Unauthorized"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		data := []any{map[string]any{"id": f.base, "object": "model", "root": "/models/" + f.base, "parent": nil}}
		for n, p := range f.loaded {
			data = append(data, map[string]any{"id": n, "object": "model", "root": p, "parent": f.base})
		}
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/load_lora_adapter" && f.runtime:
		var req struct {
			Name string `json:"lora_name"`
			Path string `json:"lora_path"`
		}
		if !decode(w, r, &req) {
			return
		}
		if req.Name == "" || req.Path == "" {
			f.fail(w, http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
			return
		}
		if _, ok := f.loaded[req.Name]; ok {
			f.fail(w, http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.Name))
			return
		}
		if !f.lora {
			f.fail(w, http.StatusBadRequest, "BadRequestError", "LoRA is not enabled. Use --enable-lora to enable LoRA.")
			return
		}
		rank, _, ok := readRank(req.Path)
		if !ok || f.blind {
			f.fail(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("Loading lora %s failed: No adapter found for %s", req.Name, req.Path))
			return
		}
		if rank > f.maxRank {
			f.fail(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("LoRA rank %d is greater than max_lora_rank %d.", rank, f.maxRank))
			return
		}
		f.loaded[req.Name] = req.Path
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/unload_lora_adapter" && f.runtime:
		var req struct {
			Name string `json:"lora_name"`
		}
		if !decode(w, r, &req) {
			return
		}
		if _, ok := f.loaded[req.Name]; !ok {
			f.fail(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name))
			return
		}
		delete(f.loaded, req.Name)
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		var req warmRequest
		if !decode(w, r, &req) || !checkWarm(w, req) {
			return
		}
		if _, ok := f.loaded[req.Model]; !ok && req.Model != f.base {
			f.fail(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
			return
		}
		model := req.Model
		if f.echoBase {
			model = f.base
		}
		writeJSON(w, http.StatusOK, completion(model))
	default:
		f.notFound(w)
	}
}

// fakeSGLang is SGLang's server (python -m sglang.launch_server).
type fakeSGLang struct {
	base    string
	lora    bool     // --enable-lora
	maxRank int      // --max-lora-rank
	modules []string // --lora-target-modules
	noRoute bool     // a release without dynamic loading

	mu     sync.Mutex
	loaded map[string]string
}

func newFakeSGLang() *fakeSGLang {
	return &fakeSGLang{base: "qwen/qwen3-0.6b", lora: true, maxRank: 16, modules: []string{"q_proj", "k_proj", "v_proj", "o_proj"}, loaded: map[string]string{}}
}

func (f *fakeSGLang) update(w http.ResponseWriter, status int, errMsg string) {
	var em any
	if errMsg != "" {
		em = errMsg
	}
	loaded := map[string]string{}
	for k, v := range f.loaded {
		loaded[k] = v
	}
	writeJSON(w, status, map[string]any{"success": errMsg == "", "error_message": em, "loaded_adapters": loaded})
}

func (f *fakeSGLang) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{"id": f.base, "object": "model", "owned_by": "sglang", "root": f.base}}})
	case r.Method == http.MethodPost && r.URL.Path == "/load_lora_adapter" && !f.noRoute:
		var req struct {
			Name string `json:"lora_name"`
			Path string `json:"lora_path"`
		}
		if !decode(w, r, &req) {
			return
		}
		if !f.lora {
			f.update(w, http.StatusBadRequest, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
			return
		}
		if _, ok := f.loaded[req.Name]; ok {
			f.update(w, http.StatusBadRequest, fmt.Sprintf("Failed to load LoRA adapter %s because it is already loaded", req.Name))
			return
		}
		rank, mods, ok := readRank(req.Path)
		if !ok {
			f.update(w, http.StatusBadRequest, fmt.Sprintf("Failed to load LoRA adapter %s: Can't find 'adapter_config.json' at '%s'", req.Name, req.Path))
			return
		}
		fits := rank <= f.maxRank
		for _, m := range mods {
			fits = fits && strings.Contains(" "+strings.Join(f.modules, " ")+" ", " "+m+" ")
		}
		if !fits {
			f.update(w, http.StatusBadRequest, fmt.Sprintf("LoRA adapter %s with rank %d is incompatible with the current LoRA memory pool configuration. "+
				"Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` and that the target modules are included in `--lora-target-modules`.", req.Name, rank))
			return
		}
		f.loaded[req.Name] = req.Path
		f.update(w, http.StatusOK, "")
	case r.Method == http.MethodPost && r.URL.Path == "/unload_lora_adapter" && !f.noRoute:
		var req struct {
			Name string `json:"lora_name"`
		}
		if !decode(w, r, &req) {
			return
		}
		if _, ok := f.loaded[req.Name]; !ok {
			f.update(w, http.StatusBadRequest, fmt.Sprintf("LoRA adapter %s is not loaded", req.Name))
			return
		}
		delete(f.loaded, req.Name)
		f.update(w, http.StatusOK, "")
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		var req warmRequest
		if !decode(w, r, &req) || !checkWarm(w, req) {
			return
		}
		// "base-model:adapter-name" (serving_base.py, _parse_model_parameter).
		base, name, hasAdapter := strings.Cut(req.Model, ":")
		if base != f.base {
			writeJSON(w, http.StatusBadRequest, map[string]any{"object": "error", "message": fmt.Sprintf("The model %s does not exist", base), "type": "BadRequestError", "param": nil, "code": 400})
			return
		}
		if _, ok := f.loaded[name]; hasAdapter && !ok {
			writeJSON(w, http.StatusBadRequest, map[string]any{"object": "error", "message": fmt.Sprintf("LoRA adapter %s was not loaded", name), "type": "BadRequestError", "param": nil, "code": 400})
			return
		}
		writeJSON(w, http.StatusOK, completion(req.Model))
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"detail": "Not Found"})
	}
}

// fakeOllama is Ollama (ollama serve).
type fakeOllama struct {
	arch       string // the base models' architecture (general.architecture)
	hidden     int    // their embedding_length (8, the test adapters')
	layers     int    // their block_count (1)
	noAdapters bool   // a release that refuses adapters (v0.34.1 and later)

	mu        sync.Mutex
	blobs     map[string][]byte
	models    map[string]bool // "name:tag"
	blobPosts int
	created   map[string]map[string]string // model -> its adapters
	adapters  map[string]*gguf.File        // model -> its adapter, read
}

func newFakeOllama(models ...string) *fakeOllama {
	f := &fakeOllama{arch: "llama", hidden: 8, layers: 1, blobs: map[string][]byte{}, models: map[string]bool{},
		created: map[string]map[string]string{}, adapters: map[string]*gguf.File{}}
	for _, m := range models {
		f.models[ollamaTag(m)] = true
	}
	return f
}

func ollamaTag(m string) string {
	if !strings.Contains(m, ":") {
		m += ":latest"
	}
	return m
}

func (f *fakeOllama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.HasPrefix(r.URL.Path, "/api/blobs/"):
		digest := strings.TrimPrefix(r.URL.Path, "/api/blobs/")
		switch r.Method {
		case http.MethodHead:
			if _, ok := f.blobs[digest]; ok {
				w.WriteHeader(http.StatusOK)
			} else {
				w.WriteHeader(http.StatusNotFound)
			}
		case http.MethodPost:
			b, err := io.ReadAll(r.Body)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
				return
			}
			sum := sha256.Sum256(b)
			if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("digest mismatch, expected %q, got %q", digest, got)})
				return
			}
			f.blobPosts++
			f.blobs[digest] = b
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	case r.Method == http.MethodPost && r.URL.Path == "/api/show":
		var req struct {
			Model string `json:"model"`
		}
		if !decode(w, r, &req) {
			return
		}
		if !f.models[ollamaTag(req.Model)] {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("model '%s' not found", req.Model)})
			return
		}
		// The base's GGUF metadata; arrays of more than five values are
		// emptied unless verbose (server/routes.go getModelData).
		a := f.arch
		writeJSON(w, http.StatusOK, map[string]any{
			"details": map[string]any{"format": "gguf", "family": a, "quantization_level": "Q4_K_M"},
			"model_info": map[string]any{
				"general.architecture": a, "general.file_type": 15, "general.basename": strings.Split(req.Model, ":")[0],
				a + ".block_count": f.layers, a + ".embedding_length": f.hidden, a + ".attention.head_count": 2,
				a + ".attention.head_count_kv": 2, "tokenizer.ggml.tokens": []any{},
			},
		})
	case r.Method == http.MethodPost && r.URL.Path == "/api/create":
		var req struct {
			Model    string            `json:"model"`
			From     string            `json:"from"`
			Adapters map[string]string `json:"adapters"`
			Stream   *bool             `json:"stream"`
		}
		if !decode(w, r, &req) {
			return
		}
		if req.Stream == nil || *req.Stream {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "this fake answers only stream: false"})
			return
		}
		if f.noAdapters && len(req.Adapters) > 0 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "LoRA adapters are no longer supported"})
			return
		}
		if !f.models[ollamaTag(req.From)] {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("model '%s' not found", req.From)})
			return
		}
		for name, digest := range req.Adapters {
			if _, ok := f.blobs[digest]; !ok {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("blob not found for %s (digest %s)", name, digest)})
				return
			}
		}
		// server/create.go: files named *.gguf are GGUF; an adapter is one
		// file, a GGUF whose general.type is "adapter".
		var ad *gguf.File
		for name, digest := range req.Adapters {
			if !strings.HasSuffix(name, ".gguf") {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": "this fake takes GGUF adapters only"})
				return
			}
			if len(req.Adapters) > 1 {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": "only one adapter is currently supported"})
				return
			}
			b := f.blobs[digest]
			g, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": "unsupported content type: " + err.Error()})
				return
			}
			if t, _ := g.String("general.type"); t != "adapter" {
				writeJSON(w, http.StatusBadRequest, map[string]any{"error": "not an adapter: general.type " + t})
				return
			}
			ad = g
		}
		f.models[ollamaTag(req.Model)] = true
		f.created[ollamaTag(req.Model)] = req.Adapters
		f.adapters[ollamaTag(req.Model)] = ad
		writeJSON(w, http.StatusOK, map[string]any{"status": "success"})
	case r.Method == http.MethodDelete && r.URL.Path == "/api/delete":
		var req struct {
			Model string `json:"model"`
		}
		if !decode(w, r, &req) {
			return
		}
		if !f.models[ollamaTag(req.Model)] {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("model '%s' not found", req.Model)})
			return
		}
		delete(f.models, ollamaTag(req.Model))
		w.WriteHeader(http.StatusOK)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		var data []any
		for m := range f.models {
			data = append(data, map[string]any{"id": m, "object": "model", "created": 1, "owned_by": "library"})
		}
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		var req warmRequest
		if !decode(w, r, &req) || !checkWarm(w, req) {
			return
		}
		if !f.models[ollamaTag(req.Model)] {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"message": fmt.Sprintf("model %q not found, try pulling it first", req.Model), "type": "api_error", "param": nil, "code": nil}})
			return
		}
		// llama.cpp loads the adapter with the model, and refuses one of
		// another architecture (src/llama-adapter.cpp).
		if ad := f.adapters[ollamaTag(req.Model)]; ad != nil {
			if a, _ := ad.String("general.architecture"); a != f.arch {
				writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": "llama runner process has terminated: model arch and LoRA arch mismatch", "type": "api_error"}})
				return
			}
		}
		writeJSON(w, http.StatusOK, completion(req.Model))
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "404 page not found")
	}
}

func (f *fakeOllama) has(model string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.models[ollamaTag(model)]
}

// fakeLlama is llama.cpp's llama-server: one model, whatever a request
// names.
type fakeLlama struct{}

func (fakeLlama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{"id": "qwen3-0.6b-q8_0.gguf", "object": "model", "owned_by": "llamacpp"}}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		var req warmRequest
		if !decode(w, r, &req) || !checkWarm(w, req) {
			return
		}
		writeJSON(w, http.StatusOK, completion("gpt-3.5-turbo"))
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"code": 404, "message": "File Not Found", "type": "not_found_error"}})
	}
}
