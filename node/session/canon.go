package session

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"hash/maphash"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// hasher turns messages into the 64-bit keys of the prefix tree. A message's
// key covers only what a client echoes back faithfully:
//
//   - the role and the text content (surrounding white space trimmed: clients
//     trim assistant text they send back);
//   - non-text parts (type and raw bytes);
//   - tool calls by name and arguments, the arguments re-encoded as canonical
//     JSON when they parse (key order and spacing are not the model's, once a
//     client has parsed and re-serialised them); empty arguments equal "{}".
//
// It leaves out the reasoning (clients drop it), the author name, tool-call
// ids and the tool-result's call id (clients rewrite ids: "call_fake1" comes
// back as "callfake1"), and the is_error flag.
//
// The hash is maphash with a seed chosen per Tracker. Its value is never
// visible outside the Tracker, so the seed changes nothing observable; two
// distinct messages collide with probability 2^-64 per pair.
type hasher struct {
	h   maphash.Hash
	num [8]byte
	buf bytes.Buffer
}

func newHasher() *hasher {
	hs := &hasher{}
	hs.h.SetSeed(maphash.MakeSeed())
	return hs
}

// field writes a length-prefixed string so that field boundaries cannot be
// confused ("ab"+"c" differs from "a"+"bc").
func (hs *hasher) field(tag byte, s string) {
	hs.h.WriteByte(tag)
	binary.LittleEndian.PutUint64(hs.num[:], uint64(len(s)))
	hs.h.Write(hs.num[:])
	hs.h.WriteString(s)
}

func (hs *hasher) fieldBytes(tag byte, b []byte) {
	hs.h.WriteByte(tag)
	binary.LittleEndian.PutUint64(hs.num[:], uint64(len(b)))
	hs.h.Write(hs.num[:])
	hs.h.Write(b)
}

// sum returns the canonical key of m.
func (hs *hasher) sum(m *core.Message) uint64 {
	hs.h.Reset()
	hs.field('r', m.Role)
	hs.field('c', strings.TrimSpace(m.Content))
	for i := range m.Parts {
		hs.field('p', m.Parts[i].Type)
		hs.fieldBytes('P', m.Parts[i].Raw)
	}
	for i := range m.ToolCalls {
		hs.field('t', m.ToolCalls[i].Name)
		hs.fieldBytes('a', hs.args(m.ToolCalls[i].Arguments))
	}
	return hs.h.Sum64()
}

// args returns the canonical form of tool-call arguments. The result is only
// valid until the next call.
func (hs *hasher) args(a string) []byte {
	a = strings.TrimSpace(a)
	if a == "" {
		return []byte("{}")
	}
	var v any
	d := json.NewDecoder(strings.NewReader(a))
	d.UseNumber()
	if d.Decode(&v) != nil || d.More() {
		return []byte(a)
	}
	hs.buf.Reset()
	e := json.NewEncoder(&hs.buf)
	e.SetEscapeHTML(false)
	if e.Encode(v) != nil {
		return []byte(a)
	}
	return bytes.TrimSuffix(hs.buf.Bytes(), []byte("\n"))
}

// emptyAction reports whether an assistant reply carries nothing a client
// would echo back (clients often drop such a message from the history).
func emptyAction(m *core.Message) bool {
	return strings.TrimSpace(m.Content) == "" && len(m.Parts) == 0 && len(m.ToolCalls) == 0
}

// volatile reports whether m is a per-call context message that is not part
// of the conversation's history: a user message containing a marker.
func volatile(m *core.Message, markers []string) bool {
	if m.Role != core.RoleUser {
		return false
	}
	for _, mk := range markers {
		if strings.Contains(m.Content, mk) {
			return true
		}
	}
	return false
}
