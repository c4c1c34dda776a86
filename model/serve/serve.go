// Package serve owns clawmesh's model server: an OpenAI-compatible HTTP
// endpoint (/v1/chat/completions, /v1/models) on top of an engine.Engine, a
// tokenizer and a chat template, with hot adapter loading that never drops
// or stalls a request on a forking engine. It speaks what the gateway asks
// of an upstream of kind "clawmesh": log-probs per token, vLLM's
// return_token_ids, streaming with usage, Qwen's <think> reasoning and
// <tool_call> tool calls. Each response names the adapter version that
// served it in the X-Clawmesh-Adapter header; model/serveapi is that
// contract. See RATIONALE.md.
package serve

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/httpguard"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/serveapi"
)

// Sentinel errors.
var (
	ErrConfig     = errors.New("serve: bad config")
	ErrClosed     = errors.New("serve: closed")
	ErrBadRequest = errors.New("serve: bad request")
	ErrAdapter    = errors.New("serve: adapter not loaded")
)

// Tokenizer is what the server needs of a tokenizer
// (*tokenizer.Tokenizer implements it).
type Tokenizer interface {
	Encode(text string) []int
	// Decode returns the bytes of ids; decoding consecutive slices and
	// concatenating gives the whole text.
	Decode(ids []int) string
	IsSpecial(id int) bool
	TokenID(s string) (int, bool)
}

// Config configures a Server. Model, Tokenizer are required; the zero
// value of every other field means its default.
type Config struct {
	// Model is the engine that generates. The server does not close it.
	// If it implements engine.Forker, each adapter version runs on its own
	// fork (shared base weights) and swaps never wait; otherwise a swap
	// waits for the requests in flight and new ones wait for the swap.
	Model engine.Engine
	// Tokenizer maps text to the model's token ids.
	Tokenizer Tokenizer
	// Renderer is the chat template (default chat.Qwen3()).
	Renderer chat.Renderer
	// ModelName is the model id reported by /v1/models and in responses
	// (default: the engine's Info().Name). Requests may name any model.
	ModelName string
	// Adapter names the adapter the Model holds at start (default "base").
	Adapter string
	// MaxTokens bounds a completion when the request sets no limit
	// (default 1024); every completion is also bounded by the context.
	MaxTokens int
	// MaxConcurrent bounds the completions generating at once (each choice
	// of a request counts; default GOMAXPROCS). Others wait their turn.
	MaxConcurrent int
	// StopTokens are token ids that end a completion besides the engine's
	// EOS ids (nil: <|im_end|> and <|endoftext|> where the tokenizer has
	// them; empty: none). They are reported in token_ids and logprobs, not
	// in text.
	StopTokens []int
	// MaxBodyBytes bounds a request body (default 32 MiB).
	MaxBodyBytes int64
	// Token, if set, is required as "Authorization: Bearer <Token>".
	Token string
	// AllowedHosts are host names, beyond localhost, *.localhost and IP
	// literals, that clients may reach the server by (the Host header) when
	// it has no Token; other names get 403, so that a DNS-rebound web page
	// cannot use it. With a Token every name is accepted. Browsers'
	// cross-origin requests are refused either way (internal/httpguard).
	AllowedHosts []string
	// ShutdownTimeout is how long Run lets requests in flight finish after
	// its context ends (default 30s).
	ShutdownTimeout time.Duration
	// Seed seeds the server's random source: response and tool call ids,
	// and the sampling seed of requests that set none (default: from Now).
	Seed uint64
	// Logger receives the server's logs (nil: discard).
	Logger *slog.Logger
	// Now reads the clock (default time.Now).
	Now func() time.Time
}

// Defaults.
const (
	DefaultMaxTokens       = 1024
	DefaultMaxBodyBytes    = 32 << 20
	DefaultShutdownTimeout = 30 * time.Second
	DefaultAdapter         = serveapi.BaseVersion
)

func (c Config) withDefaults() Config {
	if c.Renderer == nil {
		c.Renderer = chat.Qwen3()
	}
	if c.ModelName == "" && c.Model != nil {
		c.ModelName = c.Model.Info().Name
	}
	if c.ModelName == "" {
		c.ModelName = "clawmesh"
	}
	if c.Adapter == "" {
		c.Adapter = DefaultAdapter
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = runtime.GOMAXPROCS(0)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case d.Model == nil:
		return fmt.Errorf("%w: no model", ErrConfig)
	case d.Tokenizer == nil:
		return fmt.Errorf("%w: no tokenizer", ErrConfig)
	case d.MaxTokens < 1:
		return fmt.Errorf("%w: max tokens %d", ErrConfig, d.MaxTokens)
	case d.MaxConcurrent < 1:
		return fmt.Errorf("%w: max concurrent %d", ErrConfig, d.MaxConcurrent)
	case d.MaxBodyBytes < 1:
		return fmt.Errorf("%w: max body bytes %d", ErrConfig, d.MaxBodyBytes)
	case d.ShutdownTimeout < 0:
		return fmt.Errorf("%w: shutdown timeout %v", ErrConfig, d.ShutdownTimeout)
	}
	return nil
}

// Server serves one model over HTTP. It implements http.Handler; Run
// serves it on a listener. Methods are safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	info   engine.ModelInfo
	forker engine.Forker // nil: swaps lock out requests
	mux    *http.ServeMux
	sem    chan struct{}
	stops  map[int]bool // ids that end a completion

	loadMu sync.Mutex   // serializes LoadAdapter
	swapMu sync.RWMutex // non-forking engines: requests read, swaps write
	cur    atomic.Pointer[version]
	closed atomic.Bool

	rmu sync.Mutex
	rng *rand.Rand
}

// version is one adapter version and the engine that serves it. Requests
// hold a reference while they run; a retired fork is closed once idle.
type version struct {
	name   string
	eng    engine.Engine
	owned  bool // a fork made by the server: closed when retired and idle
	mu     sync.Mutex
	refs   int
	retire bool
}

func (v *version) release() {
	v.mu.Lock()
	v.refs--
	done := v.retire && v.refs == 0
	v.mu.Unlock()
	if done && v.owned {
		v.eng.Close()
	}
}

func (v *version) retired() {
	v.mu.Lock()
	v.retire = true
	done := v.refs == 0
	v.mu.Unlock()
	if done && v.owned {
		v.eng.Close()
	}
}

// New makes a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:  cfg,
		log:  cfg.Logger.With("component", "serve"),
		info: cfg.Model.Info(),
		sem:  make(chan struct{}, cfg.MaxConcurrent),
	}
	s.forker, _ = cfg.Model.(engine.Forker)
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(cfg.Now().UnixNano())
	}
	s.rng = rand.New(rand.NewPCG(seed, 0x636c61776d657368))
	s.stops = map[int]bool{}
	for _, id := range s.info.EOS {
		s.stops[id] = true
	}
	stopTokens := cfg.StopTokens
	if stopTokens == nil {
		for _, t := range []string{"<|im_end|>", "<|endoftext|>"} {
			if id, ok := cfg.Tokenizer.TokenID(t); ok {
				stopTokens = append(stopTokens, id)
			}
		}
	}
	for _, id := range stopTokens {
		s.stops[id] = true
	}
	s.cur.Store(&version{name: cfg.Adapter, eng: cfg.Model})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/v1/chat/completions", s.handleChat)
	s.mux.HandleFunc("/v1/models", s.handleModels)
	s.mux.HandleFunc(serveapi.AdapterPath, s.handleAdapter)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found_error", "", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return s, nil
}

// Adapter returns the adapter version new requests are served with.
func (s *Server) Adapter() string { return s.cur.Load().name }

// acquire pins the current adapter version for one request.
func (s *Server) acquire() (*version, func(), error) {
	if s.forker == nil {
		s.swapMu.RLock()
	}
	for {
		if s.closed.Load() {
			if s.forker == nil {
				s.swapMu.RUnlock()
			}
			return nil, nil, ErrClosed
		}
		v := s.cur.Load()
		v.mu.Lock()
		if v.retire {
			// A swap retired it between the load and the lock: take the
			// new one.
			v.mu.Unlock()
			continue
		}
		v.refs++
		v.mu.Unlock()
		return v, func() {
			v.release()
			if s.forker == nil {
				s.swapMu.RUnlock()
			}
		}, nil
	}
}

// LoadAdapter loads the PEFT adapter in dir as version and makes it serve
// new requests; requests in flight finish on the version they started with.
// With a forking engine the new version runs on a fork sharing the base
// weights and no request waits; otherwise the swap waits for requests in
// flight and new requests wait for the swap.
func (s *Server) LoadAdapter(ctx context.Context, dir, name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty version name", ErrAdapter)
	}
	if dir == "" {
		return fmt.Errorf("%w: empty adapter path", ErrAdapter)
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	start := s.cfg.Now()
	if s.forker != nil {
		e, err := s.forker.Fork()
		if err != nil {
			return fmt.Errorf("%w: fork: %w", ErrAdapter, err)
		}
		if err := e.LoadAdapter(ctx, dir); err != nil {
			e.Close()
			return fmt.Errorf("%w: %s: %w", ErrAdapter, dir, err)
		}
		old := s.cur.Swap(&version{name: name, eng: e, owned: true})
		old.retired()
		s.log.Info("adapter loaded", "version", name, "previous", old.name, "dir", dir, "took", s.cfg.Now().Sub(start))
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	if err := s.cfg.Model.LoadAdapter(ctx, dir); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrAdapter, dir, err)
	}
	old := s.cur.Swap(&version{name: name, eng: s.cfg.Model})
	old.retired()
	s.log.Info("adapter loaded", "version", name, "previous", old.name, "dir", dir, "took", s.cfg.Now().Sub(start))
	return nil
}

// Close stops serving: later requests get 503. It closes the engines the
// server forked (once their requests finish), not Config.Model.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.cur.Load().retired()
	return nil
}

// Run serves on ln until ctx ends, then shuts down gracefully: requests in
// flight get ShutdownTimeout to finish. It closes ln and the Server.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("serving", "addr", ln.Addr().String(), "model", s.cfg.ModelName, "adapter", s.Adapter())
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
		if serr := hs.Shutdown(sctx); serr != nil {
			hs.Close()
		}
		cancel()
		err = <-errc
	}
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := httpguard.Guard{AllowedHosts: s.cfg.AllowedHosts, AnyHost: s.cfg.Token != ""}
	if err := g.Check(r); err != nil {
		msg := "cross-origin requests are refused"
		if errors.Is(err, httpguard.ErrHost) {
			msg = "the server answers to loopback names and IP addresses only; name this host with --allow-host, or set a --token"
		}
		writeError(w, http.StatusForbidden, "permission_error", "forbidden", msg)
		return
	}
	if s.cfg.Token != "" && !tokenOK(r.Header.Get("Authorization"), s.cfg.Token) {
		writeError(w, http.StatusUnauthorized, "authentication_error", "", "missing or wrong bearer token")
		return
	}
	if s.closed.Load() {
		writeError(w, http.StatusServiceUnavailable, "server_error", "", "server is shutting down")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// tokenOK compares an Authorization header with "Bearer " + token in
// constant time, so that response times do not reveal the token.
func tokenOK(header, token string) bool {
	got, ok := strings.CutPrefix(header, "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "use GET")
		return
	}
	v := s.Adapter()
	w.Header().Set(serveapi.AdapterHeader, v)
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.cfg.ModelName, "object": "model", "created": s.cfg.Now().Unix(),
			"owned_by": "clawmesh", "adapter": v, "max_model_len": s.info.MaxPosition,
		}},
	})
}

func (s *Server) handleAdapter(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		v := s.Adapter()
		w.Header().Set(serveapi.AdapterHeader, v)
		writeJSON(w, http.StatusOK, serveapi.AdapterReply{Version: v})
	case http.MethodPost:
		var ar serveapi.AdapterRequest
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err == nil {
			err = json.Unmarshal(body, &ar)
		}
		if err != nil || ar.Path == "" || ar.Version == "" {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", `want {"path": DIR, "version": NAME}`)
			return
		}
		prev := s.Adapter()
		if err := s.LoadAdapter(r.Context(), ar.Path, ar.Version); err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, ErrClosed) {
				status = http.StatusServiceUnavailable
			}
			writeError(w, status, "invalid_request_error", "path", err.Error())
			return
		}
		w.Header().Set(serveapi.AdapterHeader, ar.Version)
		writeJSON(w, http.StatusOK, serveapi.AdapterReply{Version: ar.Version, Previous: prev})
	default:
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "use GET or POST")
	}
}

// newID returns prefix followed by 24 random hex digits.
func (s *Server) newID(prefix string) string {
	var b [12]byte
	s.rmu.Lock()
	for i := range b {
		b[i] = byte(s.rng.Uint32())
	}
	s.rmu.Unlock()
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) newSeed() uint64 {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.rng.Uint64()
}

// --- errors on the wire ---

type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func errorBody(typ, code, msg string, param string) map[string]any {
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	return map[string]any{"error": e}
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeJSON(w, status, errorBody(typ, code, msg, ""))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"server_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// requestError is a client error with the parameter it concerns.
type requestError struct {
	param, code, msg string
}

func (e *requestError) Error() string {
	if e.param != "" {
		return fmt.Sprintf("%s: %s", e.param, e.msg)
	}
	return e.msg
}

func (e *requestError) Unwrap() error { return ErrBadRequest }

func badRequest(param, format string, a ...any) error {
	return &requestError{param: param, msg: fmt.Sprintf(format, a...)}
}

// writeRequestError answers err: a requestError as 400, others as 500.
func writeRequestError(w http.ResponseWriter, err error) {
	var re *requestError
	if errors.As(err, &re) {
		writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error", re.code, re.msg, re.param))
		return
	}
	if errors.Is(err, engine.ErrBadInput) {
		writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error", "", err.Error(), ""))
		return
	}
	if errors.Is(err, ErrClosed) || errors.Is(err, engine.ErrClosed) {
		writeError(w, http.StatusServiceUnavailable, "server_error", "", err.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, "server_error", "", strings.TrimPrefix(err.Error(), "serve: "))
}
