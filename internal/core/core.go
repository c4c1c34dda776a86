// Package core is clawmesh's shared vocabulary: ids, the recorded Step with
// its request, response, next state and scores, and the JSONL schema those
// steps travel in. It is a leaf: it imports nothing of ours, holds no state
// and does no I/O, so every layer (gateway, pool, rewards, trainer, mesh) can
// speak of the same things.
package core

import (
	"encoding/json"
	"fmt"
	"time"
)

// SchemaVersion names the JSONL step schema written by `clawmesh pool export`
// and read by `clawmesh pool import`. Every exported line carries it in the
// "schema" field; see docs/step-schema.md.
const SchemaVersion = "clawmesh.step/v1"

// StepID identifies one recorded LLM call. IDs are opaque strings; the node
// makes them time-sortable, imports keep the id they came with.
type StepID string

// SessionID identifies an agent session (a conversation).
type SessionID string

// ChainID identifies one chain of steps inside a session: the calls that
// continue each other (a prefix-matched path through the conversation tree).
type ChainID string

// BatchID identifies an outbox batch: steps taken together to leave the
// device. The pool makes it from the batch's content (sha256, hex).
type BatchID string

// TurnType says whether a step is part of the conversation proper ("main") or
// housekeeping such as heartbeats and memory flushes ("side"). Side turns are
// recorded but never supply another step's next state.
type TurnType string

const (
	TurnMain TurnType = "main"
	TurnSide TurnType = "side"
)

// APIKind is the wire API a step arrived on.
type APIKind string

const (
	APIChat      APIKind = "chat.completions" // OpenAI /v1/chat/completions
	APIResponses APIKind = "responses"        // OpenAI /v1/responses
	APIMessages  APIKind = "messages"         // Anthropic /v1/messages
)

// State is a step's place in its life cycle:
// open → closed → scored → batched → shipped, or scored → held (the sharing
// policy keeps it on the device), or dropped by retention. A call that
// failed (the upstream refused it, could not be reached, or cut its reply)
// is failed from the start: kept for the record, never scored, batched or
// shipped.
type State uint8

const (
	StateUnknown State = iota
	StateOpen          // recorded; next state not yet known
	StateClosed        // next state known, or the chain ended
	StateScored        // reward plugins have run
	StateBatched       // placed in an outbox batch
	StateShipped       // the batch left the device
	StateDropped       // removed by retention policy (tombstone)
	// StateHeld: scored, but the sharing policy keeps it on the device (it
	// carries no signal, or nothing may leave). Its value sorts after
	// dropped only because stored records hold states by number.
	StateHeld
	// StateFailed: the upstream refused the call (4xx, 5xx), could not be
	// reached, or cut its reply; the step keeps what arrived but is not
	// training data. Like held it is a dead end, and its value is last for
	// the same reason.
	StateFailed
)

var stateNames = [...]string{"unknown", "open", "closed", "scored", "batched", "shipped", "dropped", "held", "failed"}

// States lists the states a step can be in, in life-cycle order (failed,
// which no other state leads to, after open).
var States = []State{StateOpen, StateFailed, StateClosed, StateScored, StateHeld, StateBatched, StateShipped, StateDropped}

// MaxState is the highest valid State.
const MaxState = StateFailed

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState is the inverse of State.String.
func ParseState(s string) (State, error) {
	for i, n := range stateNames {
		if n == s && i != 0 {
			return State(i), nil
		}
	}
	return StateUnknown, fmt.Errorf("core: unknown state %q", s)
}

func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes, the unset state ("unknown",
// or empty) included, so any State survives a JSON round trip; Validate is
// what rejects an unset state.
func (s *State) UnmarshalText(b []byte) error {
	if len(b) == 0 || string(b) == stateNames[StateUnknown] {
		*s = StateUnknown
		return nil
	}
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Role of a message author. "developer" is folded into "system".
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one message in canonical form, whichever API it came from.
// Text content is flattened into Content; non-text parts (images, files) are
// kept in Parts so nothing is lost.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	Parts      []Part     `json:"parts,omitempty"`
	Reasoning  string     `json:"reasoning,omitempty"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// IsError marks a tool result the API flagged as an error (Anthropic's
	// tool_result.is_error).
	IsError bool `json:"is_error,omitempty"`
}

// Part is a non-text content part, kept verbatim.
type Part struct {
	Type string          `json:"type"`
	Raw  json.RawMessage `json:"raw,omitempty"`
}

// ToolCall is a call the assistant made. Arguments is the JSON text exactly as
// the model produced it.
type ToolCall struct {
	ID        string `json:"id,omitempty"`
	Type      string `json:"type,omitempty"` // "function"
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a tool offered to the model.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Request is a normalized request: the context the model saw.
type Request struct {
	Model    string    `json:"model,omitempty"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// Params holds sampling and other parameters (temperature, max tokens,
	// tool_choice, ...) as the client sent them, minus messages and tools.
	Params json.RawMessage `json:"params,omitempty"`
}

// TokenLogprob is one sampled token with its log-probability under the
// policy that served it.
type TokenLogprob struct {
	Token   string  `json:"token,omitempty"`
	ID      int     `json:"id"` // -1 when the upstream gave no id
	Logprob float64 `json:"logprob"`
}

// Fidelity says how faithfully a step's token ids and log-probs reflect the
// rollout that produced the action.
type Fidelity string

const (
	FidelityNone    Fidelity = ""        // nothing recorded: recompute
	FidelityExact   Fidelity = "exact"   // ids and logprobs from the serving engine
	FidelityLogprob Fidelity = "logprob" // logprobs per token text, ids absent
	FidelityPartial Fidelity = "partial" // incomplete (e.g. cut-off stream)
	// FidelityScrubbed marks a reply that scrubbing changed before it left
	// the device: its recorded tokens no longer match its text and were
	// dropped; re-render it and recompute what depends on them.
	FidelityScrubbed Fidelity = "scrubbed"
)

// Choice is one completion the model produced. Most steps have exactly one;
// a request with n>1 yields several that share a prompt (a GRPO group).
type Choice struct {
	Index        int            `json:"index"`
	Message      Message        `json:"message"` // role "assistant"
	FinishReason string         `json:"finish_reason,omitempty"`
	Tokens       []TokenLogprob `json:"tokens,omitempty"`
	Fidelity     Fidelity       `json:"fidelity,omitempty"`
}

// Usage is token accounting as the upstream reported it.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens,omitempty"`
	CompletionTokens int `json:"completion_tokens,omitempty"`
	TotalTokens      int `json:"total_tokens,omitempty"`
}

// Response is a normalized response.
type Response struct {
	ID      string   `json:"id,omitempty"`
	Model   string   `json:"model,omitempty"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
	// PromptTokenIDs are the prompt's token ids when the upstream returned
	// them (vLLM return_token_ids).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	// Error is the upstream error object, verbatim, if the call failed (also
	// one that arrived mid-stream).
	Error json.RawMessage `json:"error,omitempty"`
	// Status is the upstream HTTP status.
	Status int `json:"status,omitempty"`
}

// NextState is what followed the step: the messages a continuation added
// after the step's assistant reply (tool results, a new user message).
type NextState struct {
	Messages []Message `json:"messages"`
	// StepID is the step whose request supplied it ("" for imports).
	StepID StepID `json:"step_id,omitempty"`
}

// Feedback is explicit feedback the user gave for a step.
type Feedback struct {
	Score *float64  `json:"score,omitempty"` // in [-1, 1]
	Text  string    `json:"text,omitempty"`
	At    time.Time `json:"at"`
}

// Score is one reward plugin's verdict on a step.
type Score struct {
	Plugin string   `json:"plugin"`           // plugin name
	Hash   string   `json:"hash"`             // content hash of the .wasm (sha256 hex)
	Value  *float64 `json:"value"`            // nil = abstain
	Weight float64  `json:"weight,omitempty"` // weight used when combining
	Hint   string   `json:"hint,omitempty"`   // OPD hint
	Labels []string `json:"labels,omitempty"`
	Reason string   `json:"reason,omitempty"` // why it abstained, or its own note
}

// Reward is the combined verdict of all plugins on a step.
type Reward struct {
	Value  *float64  `json:"value"` // weighted sum of non-abstaining scores; nil if all abstained
	Hint   string    `json:"hint,omitempty"`
	Scores []Score   `json:"scores"`
	At     time.Time `json:"at"`
}

// Timings of the upstream call as the gateway saw it.
type Timings struct {
	Start time.Time     `json:"start"`
	TTFT  time.Duration `json:"ttft_ns,omitempty"`  // time to the first token of the reply (see docs/step-schema.md)
	Total time.Duration `json:"total_ns,omitempty"` // until the response completed
}

// Step is one recorded LLM call with everything learning needs from it.
type Step struct {
	ID        StepID    `json:"id"`
	SessionID SessionID `json:"session_id"`
	ChainID   ChainID   `json:"chain_id,omitempty"`
	ParentID  StepID    `json:"parent_id,omitempty"`
	Turn      TurnType  `json:"turn"`
	API       APIKind   `json:"api"`
	State     State     `json:"state"`

	Request  Request  `json:"request"`
	Response Response `json:"response"`

	Upstream string `json:"upstream,omitempty"` // upstream base URL
	Model    string `json:"model,omitempty"`    // model that answered
	Adapter  string `json:"adapter,omitempty"`  // adapter version that served it

	Timings            Timings `json:"timings"`
	ClientDisconnected bool    `json:"client_disconnected,omitempty"`
	// TraceID is the W3C traceparent trace id, when the client sent one.
	TraceID string `json:"trace_id,omitempty"`

	NextState *NextState `json:"next_state,omitempty"`
	Feedback  []Feedback `json:"feedback,omitempty"`
	Reward    *Reward    `json:"reward,omitempty"`

	// Source says where the step came from: "gateway" or "import".
	Source string `json:"source,omitempty"`
}

// Action returns the step's primary assistant message (choice 0), or a zero
// Message if the response has no choices.
func (s *Step) Action() Message {
	if len(s.Response.Choices) == 0 {
		return Message{Role: RoleAssistant}
	}
	return s.Response.Choices[0].Message
}

// Validate reports the first thing that makes s unusable as a step.
func (s *Step) Validate() error {
	switch {
	case s.ID == "":
		return fmt.Errorf("core: step has no id")
	case s.SessionID == "":
		return fmt.Errorf("core: step %s has no session_id", s.ID)
	case s.Turn != TurnMain && s.Turn != TurnSide:
		return fmt.Errorf("core: step %s: turn must be %q or %q, got %q", s.ID, TurnMain, TurnSide, s.Turn)
	case s.API != APIChat && s.API != APIResponses && s.API != APIMessages:
		return fmt.Errorf("core: step %s: unknown api %q", s.ID, s.API)
	case s.State == StateUnknown || s.State > MaxState:
		return fmt.Errorf("core: step %s: invalid state %d", s.ID, s.State)
	case len(s.Request.Messages) == 0:
		return fmt.Errorf("core: step %s: request has no messages", s.ID)
	}
	for i, m := range s.Request.Messages {
		if err := validRole(m.Role); err != nil {
			return fmt.Errorf("core: step %s: request message %d: %w", s.ID, i, err)
		}
	}
	if s.NextState != nil {
		for i, m := range s.NextState.Messages {
			if err := validRole(m.Role); err != nil {
				return fmt.Errorf("core: step %s: next_state message %d: %w", s.ID, i, err)
			}
		}
	}
	if s.Reward != nil && s.Reward.Value != nil && (*s.Reward.Value < -1 || *s.Reward.Value > 1) {
		return fmt.Errorf("core: step %s: reward %v outside [-1, 1]", s.ID, *s.Reward.Value)
	}
	return nil
}

func validRole(r string) error {
	switch r {
	case RoleSystem, RoleUser, RoleAssistant, RoleTool:
		return nil
	}
	return fmt.Errorf("unknown role %q", r)
}

// ExportedStep is one line of the JSONL schema: a Step plus the schema tag.
type ExportedStep struct {
	Schema string `json:"schema"`
	Step
}
