// Package swap owns the hot-swap drivers: one per kind of model server a
// node can stand in front of ("clawmesh", "vllm", "sglang", "ollama",
// "llamacpp", "mlx"). A Driver knows how its server loads a LoRA adapter (a
// PEFT directory: adapter_config.json + adapter_model.safetensors) under a
// new name while it keeps serving, how a request is routed to that adapter
// (the Target's model name, or body fields: mlx_lm.server's "adapters"),
// how to check with one small request that the adapter answers, and how to
// free it once nothing routes to it.
//
// The drivers speak each server's documented HTTP API and nothing else;
// each request shape is cited beside the code that sends it. Where a server
// cannot load adapters at run time, or refuses one, the error wraps
// ErrUnsupported or ErrRefused and tells the user what to change (a flag, an
// environment variable, a restart), from the server's own answer.
//
// The package keeps no state beyond what a driver has learnt of its server
// (the base model's name; for Ollama, the blob each version went up as)
// and does no I/O but HTTP to Config.Upstream, reading the adapter
// directories it is handed, writing, for mlx_lm.server, each version's
// mlx-lm copy beside its directory (model/mlx), and, for Ollama, a
// version's GGUF export to a temporary directory while it uploads it.
// Drivers are safe for concurrent use.
// Composing drivers into a swap (load, warm, flip the gateway's route,
// unload the old version) is the node's. RATIONALE.md explains the
// choices.
package swap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/model/baseid"
)

// Sentinel errors. Every error a Driver returns wraps one of them, or is
// the context's error.
var (
	// ErrConfig: the Config, or a version name, is not usable.
	ErrConfig = errors.New("swap: bad config")
	// ErrAdapter: the directory handed to Load is not a PEFT adapter.
	ErrAdapter = errors.New("swap: not an adapter directory")
	// ErrUnsupported: the server cannot load adapters at run time as it
	// runs (llama.cpp never; vLLM without runtime LoRA updating, ...). The
	// message says what to change; until then the node serves the base
	// model.
	ErrUnsupported = errors.New("swap: the model server cannot load adapters at run time")
	// ErrRefused: the server refused this adapter (a rank above its limit,
	// a path it cannot read, ...). Other versions may load.
	ErrRefused = errors.New("swap: the model server refused the adapter")
	// ErrWarm: the warm-up request was not answered by the Target.
	ErrWarm = errors.New("swap: warm-up failed")
	// ErrUpstream: the server could not be reached, or answered in a way
	// its API does not document (a 5xx, a body that is not JSON). Worth
	// retrying.
	ErrUpstream = errors.New("swap: model server error")
)

// Target is where requests go to be served by one adapter version.
type Target struct {
	Version string // the version's name, e.g. "v3", or "base"
	Model   string // the model name requests are rewritten to; "" keeps the client's
	// Upstream, if set, is the server (a base URL with /v1) that serves
	// the version, in place of Config.Upstream: a node that swaps a model
	// server for another serves each version from its own.
	Upstream string
	// Fields, if set, is a JSON object whose members are set in each
	// request's body (mlx_lm.server's "adapters", the version's adapter
	// directory). A string keeps Target comparable.
	Fields string
}

// LogValue implements slog.LogValuer.
func (t Target) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("version", t.Version), slog.String("model", t.Model)}
	if t.Upstream != "" {
		attrs = append(attrs, slog.String("upstream", t.Upstream))
	}
	if t.Fields != "" {
		attrs = append(attrs, slog.String("fields", t.Fields))
	}
	return slog.GroupValue(attrs...)
}

// BaseVersion is the version name of the Target that serves the base model.
const BaseVersion = "base"

// Driver loads adapter versions into one kind of model server.
type Driver interface {
	Kind() string // the upstream kind: "clawmesh", "vllm", "sglang", "ollama", "llamacpp", "mlx"
	// Load makes the adapter in dir servable as version and returns its Target.
	Load(ctx context.Context, version, dir string) (Target, error)
	// Base returns the Target that serves the base model, no adapter.
	Base(ctx context.Context) (Target, error)
	// Warm sends one small request to t and checks that it is answered by it.
	Warm(ctx context.Context, t Target) error
	// Unload frees a version no longer routed to (best effort; a no-op where the server has nothing to free).
	Unload(ctx context.Context, t Target) error
}

// BaseIdentifier is a Driver that can tell which base model its server
// serves (an optional capability, found by type assertion): the node then
// refuses a version whose adapter was trained on another base instead of
// loading it (node/adapters). Ollama's driver reads the identity from
// /api/show; WithBaseFile gives one to a driver of a server the node runs
// on a model file it knows.
type BaseIdentifier interface {
	BaseIdentity(ctx context.Context) (baseid.ID, error)
}

// WithBaseFile returns d with a BaseIdentity read from path, the model
// file or directory its server serves (a GGUF for llama-server, an MLX or
// Hugging Face directory): baseid.Read, once, on first use.
func WithBaseFile(d Driver, path string) Driver {
	return &fileBase{Driver: d, read: sync.OnceValues(func() (baseid.ID, error) { return baseid.Read(path) })}
}

type fileBase struct {
	Driver
	read func() (baseid.ID, error)
}

// BaseIdentity implements BaseIdentifier.
func (f *fileBase) BaseIdentity(context.Context) (baseid.ID, error) { return f.read() }

// Config configures a Driver. Upstream is required; the zero value of
// every other field means its default.
type Config struct {
	// Upstream is the model server's base URL including /v1, as the node's
	// --upstream (e.g. http://127.0.0.1:8000/v1). Servers whose adapter API
	// sits outside /v1 (SGLang, Ollama, clawmesh serve) are reached at the
	// URL without its /v1.
	Upstream string
	// Token is the bearer token the server wants, if any.
	Token string
	// BaseModel is the base model's name on the server: the model of
	// warm-ups and of Base's Target, Ollama's FROM, SGLang's "base:adapter"
	// prefix. Empty: the one model the server lists at /v1/models that is
	// not an adapter.
	BaseModel string
	// Prefix starts the name each adapter version is loaded under on the
	// server: Prefix + version (default "clawmesh-"). Unload frees only
	// models so named, so that it never deletes one of the user's own.
	Prefix string
	// Client sends the requests (default: a client that gives up on a
	// connection after 10s and on a request after 10 minutes, as loading a
	// large adapter can take minutes). Contexts bound each call further.
	Client *http.Client
	// Logger receives the drivers' logs (nil: discard).
	Logger *slog.Logger
}

// DefaultPrefix is the default Config.Prefix.
const DefaultPrefix = "clawmesh-"

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Client == nil {
		c.Client = defaultClient()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func defaultClient() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{
		Timeout: 10 * time.Minute,
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         d.DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}

// Validate checks c.
func (c Config) Validate() error {
	if c.Upstream == "" {
		return fmt.Errorf("%w: no upstream (the model server's URL with /v1, e.g. http://127.0.0.1:8000/v1)", ErrConfig)
	}
	u, err := url.Parse(c.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: upstream %q is not an http(s) URL", ErrConfig, c.Upstream)
	}
	if c.Prefix != "" && !nameRE.MatchString(c.Prefix) {
		return fmt.Errorf("%w: prefix %q: use letters, digits, '.', '_' and '-'", ErrConfig, c.Prefix)
	}
	return nil
}

// kinds are the upstream kinds New has a driver for.
var kinds = []string{"clawmesh", "vllm", "sglang", "ollama", "llamacpp", "mlx"}

// Kinds returns the upstream kinds New has a driver for.
func Kinds() []string { return slices.Clone(kinds) }

// New returns the driver for an upstream kind. Kinds "openai" (a hosted
// API) and "none" have none: the error wraps ErrUnsupported and says that
// the node keeps serving the base model.
func New(kind string, cfg Config) (Driver, error) {
	k := strings.ToLower(strings.TrimSpace(kind))
	switch k {
	case "", "openai", "none":
		if k == "" {
			k = "openai"
		}
		return nil, fmt.Errorf("%w: the node cannot hot-swap adapters into an upstream of kind %q, so it keeps serving the base model (use --upstream-kind clawmesh, vllm, sglang, ollama or mlx for a server that loads adapters)", ErrUnsupported, k)
	case "llama.cpp":
		k = "llamacpp"
	}
	if !slices.Contains(kinds, k) {
		return nil, fmt.Errorf("%w: unknown upstream kind %q (want %s, or openai or none, which cannot load adapters)", ErrConfig, kind, strings.Join(kinds, ", "))
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := newClient(k, cfg.withDefaults())
	switch k {
	case "clawmesh":
		return &clawmeshDriver{c}, nil
	case "vllm":
		return &vllmDriver{c}, nil
	case "sglang":
		return &sglangDriver{c}, nil
	case "ollama":
		return &ollamaDriver{client: c}, nil
	case "mlx":
		return &mlxDriver{client: c}, nil
	default:
		return &llamacppDriver{c}, nil
	}
}

// nameRE is what a version name, and a Prefix, may look like: every server
// accepts it as (part of) a model name, and it cannot escape a URL path.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// checkVersion checks a version name handed to Load.
// CheckVersion reports a version name a driver refuses: one that is not
// up to 128 letters, digits, '.', '_' and '-', starting with a letter or
// digit (stacked names, v12-p3, are such names).
func CheckVersion(v string) error { return checkVersion(v) }

func checkVersion(v string) error {
	if !nameRE.MatchString(v) {
		return fmt.Errorf("%w: version name %q: use up to 128 letters, digits, '.', '_' and '-', starting with a letter or digit", ErrConfig, v)
	}
	return nil
}

// Adapter directory file names, as PEFT writes them (trainer/adapter names
// the same; a node does not import the trainer).
const (
	configFile  = "adapter_config.json"
	weightsFile = "adapter_model.safetensors"
)

// adapterInfo is what the drivers read of adapter_config.json: enough to
// say which server flag a refused adapter needs.
type adapterInfo struct {
	Rank          int      // the largest rank of any module (r, or above it in rank_pattern)
	TargetModules []string // the modules it adapts, when listed
}

// readAdapter checks that dir holds a PEFT adapter and reads its config.
// The returned dir is absolute: a server resolves a relative path against
// its own working directory, not ours.
func readAdapter(dir string) (string, adapterInfo, error) {
	var info adapterInfo
	if dir == "" {
		return "", info, fmt.Errorf("%w: empty path", ErrAdapter)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", info, fmt.Errorf("%w: %s: %v", ErrAdapter, dir, err)
	}
	for _, f := range []string{configFile, weightsFile} {
		st, err := os.Stat(filepath.Join(abs, f))
		if err != nil || !st.Mode().IsRegular() {
			return "", info, fmt.Errorf("%w: %s has no %s", ErrAdapter, abs, f)
		}
	}
	b, err := readLimited(filepath.Join(abs, configFile), 1<<20)
	if err != nil {
		return "", info, fmt.Errorf("%w: %s: %v", ErrAdapter, configFile, err)
	}
	var pc struct {
		R             int             `json:"r"`
		RankPattern   map[string]int  `json:"rank_pattern"`
		TargetModules json.RawMessage `json:"target_modules"`
	}
	if err := json.Unmarshal(b, &pc); err != nil {
		return "", info, fmt.Errorf("%w: %s: %v", ErrAdapter, configFile, err)
	}
	info.Rank = pc.R
	for _, r := range pc.RankPattern {
		info.Rank = max(info.Rank, r)
	}
	// PEFT writes target_modules as a list, or as one regular expression.
	var mods []string
	if json.Unmarshal(pc.TargetModules, &mods) == nil {
		info.TargetModules = mods
	} else {
		var re string
		if json.Unmarshal(pc.TargetModules, &re) == nil && re != "" {
			info.TargetModules = []string{re}
		}
	}
	return abs, info, nil
}

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("larger than %d bytes", n)
	}
	return b, nil
}

// --- HTTP to the server ---

// client is what every driver shares: the server's URLs, the HTTP client
// and the base model's name once known.
type client struct {
	kind string
	cfg  Config
	api  string // the upstream without a trailing slash: ends in /v1
	root string // the upstream without /v1
	log  *slog.Logger

	mu   sync.Mutex
	base string // the base model's name, once known
}

func newClient(kind string, cfg Config) *client {
	api := strings.TrimRight(cfg.Upstream, "/")
	root, ok := strings.CutSuffix(api, "/v1")
	if !ok {
		// An upstream given without /v1: its API is under /v1.
		root, api = api, api+"/v1"
	}
	return &client{
		kind: kind, cfg: cfg, api: api, root: root, base: cfg.BaseModel,
		log: cfg.Logger.With("component", "swap", "kind", kind),
	}
}

// Kind implements Driver.
func (c *client) Kind() string { return c.kind }

// name is the model name version is loaded under on the server.
func (c *client) name(version string) string { return c.cfg.Prefix + version }

// ours reports whether model is a name this package loads adapters under.
func (c *client) ours(model string) bool {
	return strings.HasPrefix(model, c.cfg.Prefix) && len(model) > len(c.cfg.Prefix)
}

// maxReply bounds a reply body read from the server.
const maxReply = 1 << 20

// reply is a server's answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends method url with body (nil: none; []byte or io.Reader: as is;
// otherwise JSON) and reads the reply. A transport failure wraps
// ErrUpstream.
func (c *client) do(ctx context.Context, method, url string, body any, size int64) (*reply, error) {
	var r io.Reader
	ctype := ""
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r, ctype = b, "application/octet-stream"
		if size == 0 {
			r = http.NoBody
		}
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		r, ctype, size = bytes.NewReader(j), "application/json", int64(len(j))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if r != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Accept", "application/json")
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s %s: %v", ErrUpstream, method, url, unwrapURL(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: reading the reply: %v", ErrUpstream, method, url, err)
	}
	return &reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// unwrapURL drops the *url.Error wrapper, whose text repeats the method and
// URL the caller already names.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// message is the error message of a reply, whichever shape the server
// gives it: OpenAI's {"error": {"message"}} (vLLM, clawmesh serve,
// llama-server), {"error": "..."} (Ollama), vLLM's older top-level
// {"message"}, FastAPI's {"detail"}, SGLang's {"error_message"}; else the
// body's text.
func (r *reply) message() string {
	var m struct {
		Error        json.RawMessage `json:"error"`
		Message      string          `json:"message"`
		Detail       json.RawMessage `json:"detail"`
		ErrorMessage string          `json:"error_message"`
	}
	if json.Unmarshal(r.body, &m) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case len(m.Error) > 0 && json.Unmarshal(m.Error, &inner) == nil && inner.Message != "":
			return inner.Message
		case len(m.Error) > 0 && json.Unmarshal(m.Error, &s) == nil && s != "":
			return s
		case m.ErrorMessage != "":
			return m.ErrorMessage
		case m.Message != "":
			return m.Message
		case len(m.Detail) > 0 && json.Unmarshal(m.Detail, &s) == nil && s != "":
			return s
		case len(m.Detail) > 0:
			return string(m.Detail)
		}
	}
	s := strings.TrimSpace(string(r.body))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	if s == "" {
		s = http.StatusText(r.status)
	}
	return s
}

// failure is the error for a reply the driver has no better reading of:
// a refusal of this adapter for a 4xx, a server error otherwise.
func (c *client) failure(what string, r *reply) error {
	switch {
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		return fmt.Errorf("%w: %s: %d %s (does the upstream token match the server's?)", ErrUpstream, what, r.status, r.message())
	case r.status >= 400 && r.status < 500:
		return fmt.Errorf("%w: %s: %d %s", ErrRefused, what, r.status, r.message())
	}
	return fmt.Errorf("%w: %s: %d %s", ErrUpstream, what, r.status, r.message())
}

// --- the base model ---

// baseModel returns the base model's name: Config.BaseModel, or the one
// model the server lists at GET /v1/models that is not an adapter (no
// "parent", as vLLM marks its LoRA cards, and not a name this package
// loads adapters under).
func (c *client) baseModel(ctx context.Context) (string, error) {
	c.mu.Lock()
	b := c.base
	c.mu.Unlock()
	if b != "" {
		return b, nil
	}
	r, err := c.do(ctx, http.MethodGet, c.api+"/models", nil, 0)
	if err != nil {
		return "", err
	}
	if r.status != http.StatusOK {
		return "", c.failure("listing the models", r)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		return "", fmt.Errorf("%w: GET %s/models: not a model list: %v", ErrUpstream, c.api, err)
	}
	var ids []string
	for _, m := range list.Data {
		if m.ID == "" || (m.Parent != nil && *m.Parent != "") || c.ours(m.ID) {
			continue
		}
		ids = append(ids, m.ID)
	}
	switch len(ids) {
	case 1:
	case 0:
		return "", fmt.Errorf("%w: the model server lists no base model at %s/models: name it in the node's config", ErrConfig, c.api)
	default:
		return "", fmt.Errorf("%w: the model server lists several models (%s): name the base model in the node's config", ErrConfig, strings.Join(ids, ", "))
	}
	c.mu.Lock()
	c.base = ids[0]
	c.mu.Unlock()
	return ids[0], nil
}

// --- warm-ups ---

// warmPrompt is the warm-up's one user message.
const warmPrompt = "Hi"

// chatReply is the part of a chat completion a warm-up checks.
type chatReply struct {
	Model   string            `json:"model"`
	Choices []json.RawMessage `json:"choices"`
}

// chat sends a one-token chat completion for model ("" leaves the field
// out), with t's Fields set as the gateway sets them, and checks that it
// was answered: 200 with at least one choice. The request is the OpenAI
// chat completions shape every server here accepts: POST
// /v1/chat/completions {"model", "messages", "max_tokens", "temperature",
// "stream": false}.
func (c *client) chat(ctx context.Context, t Target, model string) (*reply, chatReply, error) {
	req := map[string]any{
		"messages":    []map[string]string{{"role": "user", "content": warmPrompt}},
		"max_tokens":  1,
		"temperature": 0,
		"stream":      false,
	}
	if t.Fields != "" {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(t.Fields), &fields); err != nil {
			return nil, chatReply{}, fmt.Errorf("%w: version %s: fields %s: %v", ErrConfig, t.Version, t.Fields, err)
		}
		for k, v := range fields {
			req[k] = v
		}
	}
	if model != "" {
		req["model"] = model
	}
	var cr chatReply
	r, err := c.do(ctx, http.MethodPost, c.api+"/chat/completions", req, 0)
	if err != nil {
		return nil, cr, err
	}
	if r.status != http.StatusOK {
		if r.status >= 500 {
			return r, cr, fmt.Errorf("%w: version %s (model %q): %d %s", ErrUpstream, t.Version, model, r.status, r.message())
		}
		return r, cr, fmt.Errorf("%w: version %s (model %q): %d %s", ErrWarm, t.Version, model, r.status, r.message())
	}
	if err := json.Unmarshal(r.body, &cr); err != nil {
		return r, cr, fmt.Errorf("%w: version %s: the reply is not a chat completion: %v", ErrUpstream, t.Version, err)
	}
	if len(cr.Choices) == 0 {
		return r, cr, fmt.Errorf("%w: version %s: the reply has no choices", ErrWarm, t.Version)
	}
	return r, cr, nil
}

// warmModel warms t on a server that routes by model name: the reply must
// name t's model (the base model's for an empty one).
func (c *client) warmModel(ctx context.Context, t Target, same func(got, want string) bool) error {
	model := t.Model
	if model == "" {
		var err error
		if model, err = c.baseModel(ctx); err != nil {
			return err
		}
	}
	_, cr, err := c.chat(ctx, t, model)
	if err != nil {
		return err
	}
	if !same(cr.Model, model) {
		return fmt.Errorf("%w: version %s: asked for model %q, answered by %q", ErrWarm, t.Version, model, cr.Model)
	}
	c.log.Debug("warm", "target", t)
	return nil
}

func sameName(got, want string) bool { return got == want }
