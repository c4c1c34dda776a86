// Package rewards is the kit for writing clawmesh reward plugins in Go.
//
// A reward plugin is a WebAssembly module that scores one closed step of an
// agent's conversation: it sees the context the model saw, the action it took
// (the assistant message, with its tool calls) and the next state (the tool
// results or the user's next message), and returns a score in [-1, 1] or
// abstains, optionally with a hint for on-policy distillation and labels.
// The node runs plugins under wazero with no filesystem, no network, a
// deterministic clock and deterministic randomness; see ABI.md for the
// contract a module in any language must meet.
//
// With this kit a plugin is a Go main package that registers one function:
//
//	package main
//
//	import rewards "github.com/clawmesh/clawmesh/wasm-rewards"
//
//	func init() {
//		rewards.Register(func(in *rewards.Input) rewards.Result {
//			if in.NextUser() == "thanks!" {
//				return rewards.Score(1)
//			}
//			return rewards.Abstain("no signal")
//		})
//	}
//
//	func main() {}
//
// built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o polite.wasm
//
// The kit owns the ABI's exports (clawmesh_alloc, clawmesh_score,
// clawmesh_abi) and wraps its imports (clawmesh.log, clawmesh.judge). Outside
// wasip1 the same package compiles, so a plugin's logic can be unit-tested
// natively through Handle.
package rewards

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// ABIVersion is the version of the plugin ABI this kit's WASM exports
// implement: 2, the flat layout (ABI.md). Handle serves version 1's JSON.
const ABIVersion = 2

// Roles of message authors.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// ErrNoHost is returned by Judge when no host provides the judge (a native
// build, or a plugin the node did not grant judge permission would not
// instantiate at all).
var ErrNoHost = errors.New("rewards: no judge host")

// ErrJudge is returned by Judge when the host could not get a reply.
var ErrJudge = errors.New("rewards: judge failed")

// Message is one message of the conversation, in the node's canonical form.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	Reasoning  string     `json:"reasoning,omitempty"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// IsError marks a tool result the API flagged as an error.
	IsError bool `json:"is_error,omitempty"`
}

// ToolCall is a call the assistant made; Arguments is the JSON text the
// model produced.
type ToolCall struct {
	ID        string `json:"id,omitempty"`
	Type      string `json:"type,omitempty"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Feedback is explicit feedback the user gave for the step (through the
// node's feedback endpoint).
type Feedback struct {
	Score *float64 `json:"score,omitempty"` // in [-1, 1]
	Text  string   `json:"text,omitempty"`
}

// Meta describes the step.
type Meta struct {
	Turn      string   `json:"turn"` // "main" or "side"
	API       string   `json:"api,omitempty"`
	ToolNames []string `json:"tool_names,omitempty"` // tools offered to the model
	LatencyMS int64    `json:"latency_ms,omitempty"`
	Model     string   `json:"model,omitempty"`
	// Plugin is the name the node gave this plugin.
	Plugin string `json:"plugin,omitempty"`
	// Config is the plugin's configuration from the node's config file.
	Config map[string]string `json:"config,omitempty"`
}

// Input is what a plugin is asked to score. In a WASM plugin its strings
// share the buffer the host wrote the input into, which the next call
// overwrites: a plugin that keeps one past its call (it should not need to)
// must copy it with strings.Clone.
type Input struct {
	Context []Message `json:"context"`
	Action  Message   `json:"action"`
	// NextState is nil when nothing followed the step (the chain ended).
	NextState []Message  `json:"next_state"`
	Feedback  []Feedback `json:"feedback,omitempty"`
	Meta      Meta       `json:"meta"`
	// Task is set when the step is a rollout of a task from a task set
	// (the trainers' white-box offline mode): a verifier compares the
	// action with Task.Answer. nil for a live step.
	Task *Task `json:"task,omitempty"`
}

// Task is the task a rollout answers, as its task set gives it.
type Task struct {
	ID string `json:"id"`
	// Answer and Meta are JSON values (nil when the task has none).
	Answer json.RawMessage `json:"answer,omitempty"`
	Meta   json.RawMessage `json:"meta,omitempty"`
}

// AnswerText is the answer as text: a JSON string's value, any other JSON
// value's text (a number "42", an object as written), "" when there is no
// task or no answer.
func (in *Input) AnswerText() string {
	if in.Task == nil || len(in.Task.Answer) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(in.Task.Answer, &s) == nil {
		return s
	}
	return string(in.Task.Answer)
}

// Result is a plugin's verdict.
type Result struct {
	// Score is in [-1, 1]; nil abstains.
	Score *float64 `json:"score"`
	// Hint is a directive for on-policy distillation: text that, added to
	// the context, would have led to a better action.
	Hint   string   `json:"hint,omitempty"`
	Labels []string `json:"labels,omitempty"`
	// Reason says why the plugin abstained, or explains its score.
	Reason string `json:"reason,omitempty"`
}

// Score returns a result with score x, clamped to [-1, 1]. NaN abstains.
func Score(x float64) Result {
	if math.IsNaN(x) {
		return Abstain("score is NaN")
	}
	x = math.Max(-1, math.Min(1, x))
	return Result{Score: &x}
}

// Abstain returns a result without a score.
func Abstain(reason string) Result { return Result{Reason: reason} }

// WithHint returns r with its hint set.
func (r Result) WithHint(h string) Result { r.Hint = h; return r }

// WithReason returns r with its reason set.
func (r Result) WithReason(s string) Result { r.Reason = s; return r }

// WithLabels returns r with labels added.
func (r Result) WithLabels(l ...string) Result {
	r.Labels = append(append([]string(nil), r.Labels...), l...)
	return r
}

// LastUser returns the content of the last user message of the context.
func (in *Input) LastUser() string {
	for i := len(in.Context) - 1; i >= 0; i-- {
		if in.Context[i].Role == RoleUser {
			return in.Context[i].Content
		}
	}
	return ""
}

// NextUser returns the content of the first user message of the next state,
// or "" if there is none.
func (in *Input) NextUser() string {
	for _, m := range in.NextState {
		if m.Role == RoleUser {
			return m.Content
		}
	}
	return ""
}

// ToolResults returns the tool messages of the next state.
func (in *Input) ToolResults() []Message {
	var out []Message
	for _, m := range in.NextState {
		if m.Role == RoleTool {
			out = append(out, m)
		}
	}
	return out
}

// Func is a reward function.
type Func func(in *Input) Result

var registered Func

// Register sets the plugin's reward function. Call it from init; a second
// call replaces the first.
func Register(f Func) { registered = f }

// Handle decodes a JSON input (ABI version 1), runs the registered function
// and encodes its result as JSON. A panic in the function or an undecodable
// input yields an abstaining result with the reason. Tests of a plugin can
// call it natively.
func Handle(input []byte) []byte {
	res := run(func(in *Input) error { return json.Unmarshal(input, in) })
	out, err := json.Marshal(res)
	if err != nil {
		out, _ = json.Marshal(Abstain("encode result: " + err.Error()))
	}
	return out
}

// HandleFlat is Handle for an input in the flat layout of ABI version 2,
// answering in the flat result layout. The kit's WASM export calls it.
func HandleFlat(input []byte) []byte { return handleFlat(nil, input, new(Input), nil) }

// handleFlat is HandleFlat appending the result to dst and decoding into in
// with s's slices.
func handleFlat(dst, input []byte, in *Input, s *flatScratch) []byte {
	return appendFlatResult(dst, runOn(in, func(in *Input) error { return decodeFlat(input, in, s) }))
}

func run(decode func(*Input) error) Result { return runOn(new(Input), decode) }

func runOn(in *Input, decode func(*Input) error) (res Result) {
	if registered == nil {
		return Abstain("no reward function registered")
	}
	if err := decode(in); err != nil {
		return Abstain("decode input: " + err.Error())
	}
	defer func() {
		if p := recover(); p != nil {
			res = Abstain(fmt.Sprintf("plugin panicked: %v", p))
		}
	}()
	res = registered(in)
	if res.Score != nil && (math.IsNaN(*res.Score) || *res.Score < -1 || *res.Score > 1) {
		return Abstain(fmt.Sprintf("score %v outside [-1, 1]", *res.Score))
	}
	return res
}

// Trim shortens s to at most n bytes on a rune boundary, trimming space and
// marking a cut with "…".
func Trim(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return strings.TrimSpace(s[:cut]) + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
