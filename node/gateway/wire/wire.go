// Package wire owns the gateway's knowledge of the LLM wire formats: OpenAI
// chat completions, OpenAI Responses and Anthropic Messages. It parses a
// client's request into core.Request, patches the body sent upstream to ask
// for what learning needs (log-probs, token ids, usage), accumulates a
// streamed or whole response into core.Response, and removes from what the
// client receives exactly what the gateway added and the client did not ask
// for.
//
// Everything here is pure: no I/O, no goroutines, no clock. The HTTP server
// in package gateway calls it.
//
// Bytes are forwarded verbatim wherever possible. When something must be
// added to a request or stripped from a response, the JSON is edited in
// place (see jsonedit.go) so that every other byte, field order and number
// spelling survive.
//
// Stripping follows what the servers themselves send when a field was not
// asked for: a chat "logprobs" value becomes null (OpenAI and vLLM send
// "logprobs":null), vLLM token ids are removed from stream chunks (vLLM omits
// unset fields there) and set to null in whole responses (where vLLM writes
// them as null), and the "usage":null that OpenAI adds to every chunk when
// usage is requested is removed along with the final usage-only chunk. In
// the Responses API the log-probs of output_text.delta and output_text.done
// events become [] (both OpenAI and vLLM send "logprobs":[] there), and those
// of an output_text content part become [] as OpenAI writes them, or null as
// vLLM does (see responsesStrip).
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Caps says what the upstream accepts beyond the plain API.
type Caps struct {
	// Logprobs: the upstream gives OpenAI log-probs when asked, on chat
	// completions ("logprobs": true) and in the Responses API ("include":
	// ["message.output_text.logprobs"]). The two go together: OpenAI and
	// vLLM, which serve both APIs, take both asks; a Responses call whose
	// include the upstream refuses is sent again without it (Refused).
	Logprobs bool
	// TokenIDs: the upstream accepts vLLM's "return_token_ids": true (chat
	// completions). It also marks a vLLM-like server, whose Responses output
	// parts carry "logprobs":null when log-probs were not asked for.
	TokenIDs bool
}

// Request is a parsed client request.
type Request struct {
	API          core.APIKind // core.APIChat, core.APIResponses, core.APIMessages
	Stream       bool
	Model        string
	N            int // choices asked for (chat n), default 1
	Normalized   core.Request
	IncludeUsage bool // the client asked stream_options.include_usage
	WantLogprobs bool // the client itself asked for logprobs (Responses: include has message.output_text.logprobs)
	WantTokenIDs bool // the client itself asked for return_token_ids
	// Session hints from the body, in precedence order.
	MetadataUserID, PromptCacheKey, User string
	// PreviousResponseID is a Responses call's previous_response_id: the
	// upstream holds the conversation so far, and Normalized.Messages has
	// only what this call adds to it.
	PreviousResponseID string
	// includeOdd: a Responses call's "include" is neither absent, null nor
	// an array, so nothing can be added to it (the upstream will refuse the
	// call anyway).
	includeOdd bool
}

// Errors. ParseRequest errors wrap ErrBadRequest; ParseResponse and
// Stream.Event errors wrap ErrBadResponse.
var (
	ErrBadRequest  = errors.New("wire: bad request")
	ErrBadResponse = errors.New("wire: bad upstream response")
)

// badRequest is a client's error. An error among args is said as the
// client reads it (ClientText): the JSON member and the type it wants, not
// the Go types that decoding it met.
func badRequest(format string, args ...any) error {
	for i, a := range args {
		if err, ok := a.(error); ok {
			args[i] = ClientText(err)
		}
	}
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// ClientText is err as a client reads it: a JSON value of the wrong type is
// "messages: want an array, got a string" rather than encoding/json's
// "cannot unmarshal string into Go struct field chatRequest.messages of
// type []wire.chatMessage".
func ClientText(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		msg := "want " + jsonKind(te.Type) + ", got " + jsonValue(te.Value)
		// encoding/json names an embedded struct in the path; the
		// client's JSON has no such member.
		if f := strings.TrimPrefix(te.Field, "hints."); f != "" {
			msg = f + ": " + msg
		}
		return msg
	case errors.As(err, &se):
		return "not valid JSON"
	}
	return strings.TrimPrefix(err.Error(), ErrBadRequest.Error()+": ")
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a string"
		}
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another value"
}

// jsonValue names the JSON value encoding/json met ("string", "number
// 1.5", "array").
func jsonValue(v string) string {
	kind, rest, _ := strings.Cut(v, " ")
	switch kind {
	case "string", "number", "bool":
		if kind == "bool" {
			kind = "boolean"
		}
		if rest != "" {
			return "the " + kind + " " + rest
		}
		return "a " + kind
	case "array", "object":
		return "an " + kind
	}
	return v
}

func badResponse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadResponse, fmt.Sprintf(format, args...))
}

// added says what the gateway adds to a request's upstream body, given the
// request and the upstream's capabilities. UpstreamBody, Stream and
// ParseResponse all derive it the same way, so what is added is exactly
// what is stripped.
type added struct {
	logprobs, tokenIDs, usage bool
	// partsNull (Responses): an output_text part's log-probs, stripped,
	// become null rather than [].
	partsNull bool
}

func addedFor(req *Request, caps Caps) added {
	if req == nil {
		return added{}
	}
	switch req.API {
	case core.APIChat:
		return added{
			logprobs: caps.Logprobs && !req.WantLogprobs,
			tokenIDs: caps.TokenIDs && !req.WantTokenIDs,
			usage:    req.Stream && !req.IncludeUsage,
		}
	case core.APIResponses:
		// No token ids: vLLM's return_token_ids is a chat (and completions)
		// field, not one of its Responses API's.
		return added{
			logprobs:  caps.Logprobs && !req.WantLogprobs && !req.includeOdd,
			partsNull: caps.TokenIDs,
		}
	}
	return added{}
}

// Refused reports whether an upstream's answer of status to a call sent
// with UpstreamBody(req, body, caps) may be the upstream refusing what the
// gateway added, so that the call is worth sending again as the client sent
// it, under Caps{}. That is a 400 or 422 to a Responses call to which the
// gateway added the log-probs include: vLLM refuses it with 400 for gpt-oss
// models ("logprobs are not supported with gpt-oss models", checked before
// anything is generated), and servers that validate include against the
// values they know answer 400 or 422. A call refused for another reason is
// refused again, and the client gets that answer.
func Refused(req *Request, caps Caps, status int) bool {
	if status != 400 && status != 422 || req == nil || req.API != core.APIResponses {
		return false
	}
	return addedFor(req, caps).logprobs
}

func (a added) any() bool { return a.logprobs || a.tokenIDs || a.usage }

// ErrorBody builds an OpenAI-style error JSON
// {"error":{"message":..,"type":..,"code":..}}; code is null when empty.
func ErrorBody(typ, code, msg string) []byte {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = msg, typ
	if code != "" {
		e.Error.Code = &code
	}
	b, _ := json.Marshal(e) // cannot fail: strings only
	return b
}

// errorJSON returns raw as the error to record when it is JSON, else raw as
// a JSON string.
func errorJSON(raw []byte) json.RawMessage {
	t := strings.TrimSpace(string(raw))
	if t != "" && json.Valid([]byte(t)) {
		return json.RawMessage(t)
	}
	b, _ := json.Marshal(string(raw))
	return b
}

// textOf returns the text of a JSON value that is either a string or an
// array of content parts. Text parts (any part with a "text" string and a
// type among textTypes, or no type) are concatenated without separator, as
// chat templates do; other parts are returned verbatim.
func textOf(raw json.RawMessage, textTypes ...string) (string, []core.Part, error) {
	raw = trimJSON(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	switch raw[0] {
	case '"':
		if s, ok := unquote(raw); ok {
			return s, nil, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, err
		}
		return s, nil, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return "", nil, err
		}
		var sb strings.Builder
		var parts []core.Part
		for _, it := range items {
			var p struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(it, &p); err != nil {
				return "", nil, err
			}
			if p.Text != nil && (p.Type == "" || contains(textTypes, p.Type)) {
				sb.WriteString(*p.Text)
				continue
			}
			parts = append(parts, core.Part{Type: p.Type, Raw: append(json.RawMessage(nil), trimJSON(it)...)})
		}
		return sb.String(), parts, nil
	}
	return "", nil, fmt.Errorf("content must be a string or an array, got %.20s", raw)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func trimJSON(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isSpace(b[i]) {
		i++
	}
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

// rawOrNil returns a copy of raw, or nil when it is absent or null.
func rawOrNil(raw json.RawMessage) json.RawMessage {
	raw = trimJSON(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return append(json.RawMessage(nil), raw...)
}
