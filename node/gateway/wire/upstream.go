package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/clawmesh/clawmesh/internal/core"
)

// UpstreamBody returns the body to send upstream: the client's body with,
// where caps allow and the client did not already ask, "logprobs": true
// (chat), "return_token_ids": true (vLLM), and for streaming chat
// "stream_options": {"include_usage": true} so usage is recorded; for a
// Responses call, "message.output_text.logprobs" in "include". Every other
// byte of the client's JSON is preserved: the object is patched, not
// re-marshalled. The body is returned unchanged (the same slice) when
// nothing is added. A member the client set to false or null is replaced.
func UpstreamBody(req *Request, body []byte, caps Caps) ([]byte, error) {
	add := addedFor(req, caps)
	if !add.any() {
		return body, nil
	}
	if req.API == core.APIResponses {
		return addInclude(body)
	}
	start := skipSpace(body, 0)
	var edits []edit
	var logprobs, tokenIDs, streamOpts member
	var haveLogprobs, haveTokenIDs, haveStreamOpts bool
	closing, err := eachMember(body, start, func(m member) bool {
		switch string(m.key) {
		case "logprobs":
			logprobs, haveLogprobs = m, true
		case "return_token_ids":
			tokenIDs, haveTokenIDs = m, true
		case "stream_options":
			streamOpts, haveStreamOpts = m, true
		}
		return true
	})
	if err != nil {
		return nil, badRequest("%v", err)
	}
	var inserts []string
	setTrue := func(m member, have bool, key string) {
		if have {
			edits = append(edits, edit{start: m.valStart, end: m.valEnd, repl: []byte("true")})
		} else {
			inserts = append(inserts, `"`+key+`":true`)
		}
	}
	if add.logprobs {
		setTrue(logprobs, haveLogprobs, "logprobs")
	}
	if add.tokenIDs {
		setTrue(tokenIDs, haveTokenIDs, "return_token_ids")
	}
	if add.usage {
		switch {
		case !haveStreamOpts || body[streamOpts.valStart] != '{':
			if haveStreamOpts {
				edits = append(edits, edit{start: streamOpts.valStart, end: streamOpts.valEnd, repl: []byte(`{"include_usage":true}`)})
			} else {
				inserts = append(inserts, `"stream_options":{"include_usage":true}`)
			}
		default:
			iu, inner, ok, err := findMember(body, streamOpts.valStart, "include_usage")
			if err != nil {
				return nil, badRequest("%v", err)
			}
			if ok {
				edits = append(edits, edit{start: iu.valStart, end: iu.valEnd, repl: []byte("true")})
			} else {
				edits = append(edits, insertMembers(body, inner, `"include_usage":true`))
			}
		}
	}
	if len(inserts) > 0 {
		edits = append(edits, insertMembers(body, closing, inserts...))
	}
	return apply(body, edits), nil
}

// addInclude adds includeLogprobs to a Responses body's "include": the
// member is created (or a null one replaced), or the value appended to the
// client's array after its last element, the array's other bytes kept.
// The last "include" member counts, as for encoding/json.
func addInclude(body []byte) ([]byte, error) {
	var inc member
	have := false
	closing, err := eachMember(body, skipSpace(body, 0), func(m member) bool {
		if string(m.key) == "include" {
			inc, have = m, true
		}
		return true
	})
	if err != nil {
		return nil, badRequest("%v", err)
	}
	const value = `"` + includeLogprobs + `"`
	var e edit
	switch {
	case !have:
		e = insertMembers(body, closing, `"include":[`+value+`]`)
	case isNull(body, inc.valStart, inc.valEnd):
		e = edit{start: inc.valStart, end: inc.valEnd, repl: []byte(`[` + value + `]`)}
	case body[inc.valStart] == '[':
		// The array's closing bracket ends its span.
		e = insertMembers(body, inc.valEnd-1, value)
	default:
		return body, nil // not an array: addedFor added nothing
	}
	return apply(body, []edit{e}), nil
}

// WithModel returns body with its top-level "model" set to model (added
// if missing): how a request reaches an adapter its server loaded under
// a name of its own.
func WithModel(body []byte, model string) ([]byte, error) {
	q, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	m, closing, ok, err := findMember(body, skipSpace(body, 0), "model")
	if err != nil {
		return nil, badRequest("%v", err)
	}
	if ok {
		return apply(body, []edit{{start: m.valStart, end: m.valEnd, repl: q}}), nil
	}
	return apply(body, []edit{insertMembers(body, closing, `"model":`+string(q))}), nil
}

// WithFields returns body with each top-level member of fields set to its
// value (added if missing, replaced if present), in key order. Each value
// must be valid JSON.
func WithFields(body []byte, fields map[string]json.RawMessage) ([]byte, error) {
	keys := make([]string, 0, len(fields))
	for k, v := range fields {
		if !json.Valid(v) {
			return nil, fmt.Errorf("wire: field %q: not JSON", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, fields[k]); err != nil {
			return nil, err
		}
		m, closing, ok, err := findMember(body, skipSpace(body, 0), k)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		if ok {
			body = apply(body, []edit{{start: m.valStart, end: m.valEnd, repl: compact.Bytes()}})
		} else {
			body = apply(body, []edit{insertMembers(body, closing, string(q)+":"+compact.String())})
		}
	}
	return body, nil
}
