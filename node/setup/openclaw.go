package setup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// Errors of the OpenClaw wiring; the messages say what to do.
var (
	// ErrNoModel: OpenClaw's config names no default model.
	ErrNoModel = errors.New("setup: no default model")
	// ErrNoProvider: the default model's provider has no entry (or no
	// baseUrl) under models.providers.
	ErrNoProvider = errors.New("setup: no provider")
	// ErrAPI: the provider speaks an API the gateway does not serve.
	ErrAPI = errors.New("setup: api not served")
	// ErrChanged: the provider is no longer as setup left it.
	ErrChanged = errors.New("setup: provider changed")
)

// GatewayAPIs are OpenClaw's provider APIs the gateway serves.
var GatewayAPIs = []string{"openai-completions", "openai-responses", "anthropic-messages"}

// OpenClawConfigPath is the file OpenClaw reads its config from, by its own
// precedence: $OPENCLAW_CONFIG_PATH, then $OPENCLAW_STATE_DIR/openclaw.json,
// then ~/.openclaw/openclaw.json.
func OpenClawConfigPath(getenv func(string) string, home string) string {
	expand := func(p string) string {
		if p == "~" || strings.HasPrefix(p, "~/") {
			return filepath.Join(home, strings.TrimPrefix(p, "~"))
		}
		return p
	}
	if p := getenv("OPENCLAW_CONFIG_PATH"); p != "" {
		return expand(p)
	}
	if d := getenv("OPENCLAW_STATE_DIR"); d != "" {
		return filepath.Join(expand(d), "openclaw.json")
	}
	return filepath.Join(home, ".openclaw", "openclaw.json")
}

// Provider is the OpenClaw provider the default agent's model uses.
type Provider struct {
	// Name is its key under models.providers; Model the default model
	// reference ("ollama/qwen3:8b").
	Name, Model string
	BaseURL     string
	// API is the provider's api ("openai-completions" where none is set).
	API string
	// APIKey is its key where the file holds it as a plain string ("" for
	// none, a secret reference or an ${ENV} substitution).
	APIKey string
}

// DefaultProvider finds the provider the default agent's model uses: the
// model of the agent marked default in agents.list, else
// agents.defaults.model (a "provider/model" string, or its primary).
func DefaultProvider(root *Value) (Provider, error) {
	ref := ""
	for _, a := range root.Path("agents", "list").elems() {
		if d := a.Field("default"); d != nil && d.Kind == Bool && d.Bool {
			ref = modelRef(a.Field("model"))
		}
	}
	if ref == "" {
		ref = modelRef(root.Path("agents", "defaults", "model"))
	}
	if ref == "" {
		return Provider{}, fmt.Errorf("%w: OpenClaw's config sets no default model (agents.defaults.model.primary, such as \"ollama/qwen3:8b\")", ErrNoModel)
	}
	name, _, ok := strings.Cut(ref, "/")
	if !ok || name == "" {
		return Provider{}, fmt.Errorf("%w: the default model %q names no provider (want \"provider/model\")", ErrNoModel, ref)
	}
	p := Provider{Name: name, Model: ref}
	pv := root.Path("models", "providers", name)
	if pv == nil || pv.Kind != Object {
		return p, fmt.Errorf("%w: the default model %q uses provider %q, which has no entry under models.providers; add one with its baseUrl and api (see the README)", ErrNoProvider, ref, name)
	}
	if b := pv.Field("baseUrl"); b != nil && b.Kind == String {
		p.BaseURL = b.Str
	}
	if p.BaseURL == "" {
		return p, fmt.Errorf("%w: provider %q has no baseUrl", ErrNoProvider, name)
	}
	if strings.Contains(p.BaseURL, "${") {
		return p, fmt.Errorf("%w: provider %q's baseUrl %q comes from the environment: route it by hand (see the README)", ErrNoProvider, name, p.BaseURL)
	}
	if a := pv.Field("api"); a != nil && a.Kind == String {
		p.API = a.Str
	}
	if p.API == "" {
		// Else the model's own, where it sets one.
		_, id, _ := strings.Cut(ref, "/")
		for _, m := range pv.Field("models").elems() {
			if i := m.Field("id"); i != nil && i.Kind == String && i.Str == id {
				if a := m.Field("api"); a != nil && a.Kind == String {
					p.API = a.Str
				}
			}
		}
	}
	if p.API == "" {
		p.API = "openai-completions"
	}
	if k := pv.Field("apiKey"); k != nil && k.Kind == String && !strings.Contains(k.Str, "${") {
		p.APIKey = k.Str
	}
	served := false
	for _, a := range GatewayAPIs {
		served = served || a == p.API
	}
	if !served {
		return p, fmt.Errorf("%w: provider %q speaks %q; the gateway serves %s", ErrAPI, name, p.API, strings.Join(GatewayAPIs, ", "))
	}
	return p, nil
}

func (v *Value) elems() []*Value {
	if v == nil || v.Kind != Array {
		return nil
	}
	return v.Elems
}

func modelRef(m *Value) string {
	switch {
	case m == nil:
		return ""
	case m.Kind == String:
		return strings.TrimSpace(m.Str)
	case m.Kind == Object:
		if p := m.Field("primary"); p != nil && p.Kind == String {
			return strings.TrimSpace(p.Str)
		}
	}
	return ""
}

// GatewayURL is the base URL an agent on this device reaches a gateway
// listening on listen by: a wildcard address becomes loopback.
func GatewayURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %v", listen, err)
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// Route is where setup sends the provider: the node's gateway, and the
// token its clients must send ("" for none).
type Route struct {
	Gateway   string // http://127.0.0.1:8400
	NodeToken string
}

// BaseURL is what an OpenClaw provider speaking api sets as its baseUrl to
// reach the gateway: the gateway's /v1 for the OpenAI APIs, its root for
// the Anthropic one (whose clients add /v1 themselves).
func (r Route) BaseURL(api string) string {
	if api == "anthropic-messages" {
		return r.Gateway
	}
	return r.Gateway + "/v1"
}

// Change is one field of the provider as setup finds it and as it leaves
// it.
type Change struct {
	Field string `json:"field"`
	// Old is the field's JSON5 text in the file before ("" when absent);
	// OldValue the same decoded.
	Old      string `json:"old,omitempty"`
	OldValue any    `json:"old_value,omitempty"`
	New      string `json:"new"`
}

// Plan is what setup does: the node's upstream settings and the changes to
// the provider. No changes means the provider already goes through the
// gateway.
type Plan struct {
	Provider      Provider
	Upstream      string
	UpstreamKind  string
	UpstreamToken string
	Changes       []Change
}

// PlanOpenClaw works out how to route OpenClaw's default provider through
// the gateway: the provider's base URL (and key) become the node's
// upstream, and its baseUrl (and, where the node demands a token, apiKey)
// the gateway's; the key then goes to the node as its upstream token. src is the config file's text, root its parse.
func PlanOpenClaw(src []byte, root *Value, r Route) (Plan, error) {
	p, err := DefaultProvider(root)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Provider: p}
	want := r.BaseURL(p.API)
	if sameEndpoint(p.BaseURL, want) {
		return plan, nil
	}
	plan.Upstream = strings.TrimSuffix(p.BaseURL, "/")
	if p.API == "anthropic-messages" && !strings.HasSuffix(plan.Upstream, "/v1") {
		plan.Upstream += "/v1"
	}
	plan.UpstreamKind = KindOf(plan.Upstream)
	pv := root.Path("models", "providers", p.Name)
	plan.Changes = append(plan.Changes, change(src, pv, "baseUrl", want))
	if r.NodeToken != "" {
		// The gateway wants its own token from the agent: the provider's
		// key goes to the node, which sends it upstream. Without one, the
		// agent's key passes through the gateway as it is.
		plan.UpstreamToken = p.APIKey
		plan.Changes = append(plan.Changes, change(src, pv, "apiKey", r.NodeToken))
	}
	return plan, nil
}

func change(src []byte, obj *Value, field, to string) Change {
	c := Change{Field: field, New: to}
	if v := obj.Field(field); v != nil {
		c.Old = string(src[v.Start:v.End])
		c.OldValue = v.Interface()
	}
	return c
}

// sameEndpoint says whether two base URLs name the same place.
func sameEndpoint(a, b string) bool {
	ua, err1 := url.Parse(strings.TrimSuffix(a, "/"))
	ub, err2 := url.Parse(strings.TrimSuffix(b, "/"))
	if err1 != nil || err2 != nil {
		return false
	}
	norm := func(u *url.URL) string {
		h := u.Hostname()
		if h == "localhost" || h == "::1" {
			h = "127.0.0.1"
		}
		return u.Scheme + "://" + net.JoinHostPort(h, u.Port()) + u.Path
	}
	return norm(ua) == norm(ub)
}

// KindOf guesses the node's upstream kind from the port of a loopback
// upstream: the usual local servers' defaults (Ollama, vLLM, llama.cpp,
// SGLang); "" (the OpenAI default) for anything else.
func KindOf(upstream string) string {
	u, err := url.Parse(upstream)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return ""
	}
	for _, s := range LocalServers {
		if u.Port() == s.Port {
			return s.Kind
		}
	}
	return ""
}

// LocalServer is a model server's usual place on a device.
type LocalServer struct {
	Name, Port, Kind string
}

// LocalServers are the model servers a node looks for when it is given no
// upstream, in the order it prefers them.
var LocalServers = []LocalServer{
	{"Ollama", "11434", "ollama"},
	{"LM Studio", "1234", "openai"},
	{"vLLM", "8000", "vllm"},
	{"llama.cpp", "8080", "llamacpp"},
	{"SGLang", "30000", "sglang"},
}

// ApplyJSON5 returns the config text with the provider's fields set as the
// changes say (undo false) or put back as they were (undo true), nothing
// else touched. It refuses (ErrChanged) where a field is not what the other
// side of the change left.
func ApplyJSON5(src []byte, provider string, changes []Change, undo bool) ([]byte, error) {
	for _, c := range changes {
		root, err := ParseJSON5(src)
		if err != nil {
			return nil, err
		}
		pv := root.Path("models", "providers", provider)
		if pv == nil || pv.Kind != Object {
			return nil, fmt.Errorf("%w: provider %q is no longer in the config", ErrChanged, provider)
		}
		cur := pv.Field(c.Field)
		if undo {
			if cur == nil || cur.Kind != String || cur.Str != c.New {
				return nil, fmt.Errorf("%w: provider %q's %s is %s, no longer %q as setup left it", ErrChanged, provider, c.Field, text(src, cur), c.New)
			}
			if c.Old == "" {
				src = removeMember(src, pv, c.Field)
			} else {
				src = setMember(src, pv, c.Field, c.Old)
			}
			continue
		}
		if c.Old == "" && cur != nil || c.Old != "" && (cur == nil || !sameValue(cur.Interface(), c.OldValue)) {
			return nil, fmt.Errorf("%w: provider %q's %s is %s, not what setup read", ErrChanged, provider, c.Field, text(src, cur))
		}
		src = setMember(src, pv, c.Field, quoteLike(c.New, src, cur))
	}
	return src, nil
}

func text(src []byte, v *Value) string {
	if v == nil {
		return "absent"
	}
	return string(src[v.Start:v.End])
}

func sameValue(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// Record is what setup keeps in the node's data directory to undo its
// change: the config file, the provider, each field before and after, and
// the backup made.
type Record struct {
	Config   string    `json:"config"`
	Provider string    `json:"provider"`
	Changes  []Change  `json:"changes"`
	Backup   string    `json:"backup"`
	Via      string    `json:"via"` // "openclaw" (its config set) or "file"
	At       time.Time `json:"at"`
}

// RecordFile is the record's name in the node's data directory.
const RecordFile = "openclaw-setup.json"

// BackupName is the name of the copy of config kept before a change made at
// t: beside it, stamped with the time.
func BackupName(config string, t time.Time) string {
	return config + ".clawmesh-" + t.UTC().Format("20060102T150405Z") + ".bak"
}
