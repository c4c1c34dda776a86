package rewards

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unsafe"
)

// The flat layout of ABI version 2 (see ABI.md): the input and the result are
// fixed-size records whose strings are (offset, length) pairs into the same
// buffer. Decoding one is a few loads per field and per message, never a
// pass over the text: a JSON decoder's cost grows with every input byte, and
// a step's context runs to tens of kilobytes.

// Sizes of the flat records, in bytes.
const (
	FlatLayout      = 2   // the layout tag, first word of every input and result
	flatInputHeader = 144 // the input's header
	flatMessage     = 56
	flatToolCall    = 32
	flatFeedback    = 24
	flatStr         = 8
	flatResult      = 40 // the result's header
)

// Offsets of the input header's fields.
const (
	inLayout    = 0
	inFlags     = 4
	inContext   = 8
	inNext      = 16
	inFeedback  = 24
	inAction    = 32
	inTurn      = 88
	inAPI       = 96
	inModel     = 104
	inPlugin    = 112
	inLatency   = 120
	inToolNames = 128
	inConfig    = 136
	// The task section, present when flags has flagTask.
	inTaskID   = 144
	inAnswer   = 152
	inTaskMeta = 160
	taskHeader = 168
)

// Offsets of a message record's fields.
const (
	msgRole       = 0
	msgContent    = 8
	msgReasoning  = 16
	msgName       = 24
	msgToolCallID = 32
	msgToolCalls  = 40
	msgFlags      = 48
)

// Offsets of the result header's fields.
const (
	resLayout = 0
	resFlags  = 4
	resScore  = 8
	resHint   = 16
	resReason = 24
	resLabels = 32
)

// Flag bits.
const (
	flagNextState = 1 // input: next_state is present (else null)
	flagTask      = 2 // input: the task section follows the header
	flagIsError   = 1 // message: is_error
	flagScore     = 1 // feedback and result: the score is present
)

// ErrFlat is wrapped by every error decoding a flat input.
var ErrFlat = errors.New("rewards: malformed flat input")

// flatReader reads records out of one flat buffer. An out-of-bounds read
// returns a zero value and is remembered (bad, what, at) rather than
// reported through a call, so u32 stays small enough to inline and message
// reads its record without calls.
type flatReader struct {
	b    []byte
	s    *flatScratch
	bad  bool
	what string
	at   uint32
}

func (r *flatReader) err() error {
	if !r.bad {
		return nil
	}
	return errors.New(ErrFlat.Error() + ": " + r.what + " out of bounds at offset " + strconv.FormatUint(uint64(r.at), 10))
}

func (r *flatReader) u32(at uint32) uint32 {
	if uint64(at)+4 > uint64(len(r.b)) {
		r.bad, r.what, r.at = true, "word", at
		return 0
	}
	return binary.LittleEndian.Uint32(r.b[at:])
}

func (r *flatReader) u64(at uint32) uint64 {
	if uint64(at)+8 > uint64(len(r.b)) {
		r.bad, r.what, r.at = true, "word", at
		return 0
	}
	return binary.LittleEndian.Uint64(r.b[at:])
}

// str reads the (offset, length) pair at at and returns the string it names,
// sharing the buffer's bytes.
func (r *flatReader) str(at uint32) string {
	if uint64(at)+8 > uint64(len(r.b)) {
		r.bad, r.what, r.at = true, "word", at
		return ""
	}
	off, n := uint64(binary.LittleEndian.Uint32(r.b[at:])), uint64(binary.LittleEndian.Uint32(r.b[at+4:]))
	if off+n > uint64(len(r.b)) {
		r.bad, r.what, r.at = true, "string", at
		return ""
	}
	return unsafe.String(unsafe.SliceData(r.b[off:]), int(n))
}

// arr reads the (offset, count) pair at at, checks that count records of
// size bytes fit, and returns the offset and count.
func (r *flatReader) arr(at, size uint32) (uint32, int) {
	off, n := r.u32(at), r.u32(at+4)
	if n == 0 || uint64(off)+uint64(n)*uint64(size) > uint64(len(r.b)) {
		if n != 0 {
			r.bad, r.what, r.at = true, "array", at
		}
		return 0, 0
	}
	return off, int(n)
}

// flatScratch holds the slices and map one decode fills, for the next
// decode to reuse: the kit's export decodes every input into the same
// Input, so that decoding makes no garbage for the guest's collector.
type flatScratch struct {
	task          Task
	context, next []Message
	toolCalls     []ToolCall
	feedback      []Feedback
	toolNames     []string
	config        map[string]string
}

// resize returns s with length n, reusing its array when it is big enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (r *flatReader) message(at uint32, m *Message) {
	if uint64(at)+flatMessage > uint64(len(r.b)) {
		r.bad, r.what, r.at = true, "message", at
		return
	}
	// One record, read without calls: sub is inlined.
	// The five strings are read by straight-line code, without a call or
	// a loop.
	b, rec, le := r.b, r.b[at:at+flatMessage], binary.LittleEndian
	size := uint64(len(b))
	o0, n0 := uint64(le.Uint32(rec[msgRole:])), uint64(le.Uint32(rec[msgRole+4:]))
	o1, n1 := uint64(le.Uint32(rec[msgContent:])), uint64(le.Uint32(rec[msgContent+4:]))
	o2, n2 := uint64(le.Uint32(rec[msgReasoning:])), uint64(le.Uint32(rec[msgReasoning+4:]))
	o3, n3 := uint64(le.Uint32(rec[msgName:])), uint64(le.Uint32(rec[msgName+4:]))
	o4, n4 := uint64(le.Uint32(rec[msgToolCallID:])), uint64(le.Uint32(rec[msgToolCallID+4:]))
	if o0+n0 > size || o1+n1 > size || o2+n2 > size || o3+n3 > size || o4+n4 > size {
		r.bad, r.what, r.at = true, "string", at
		return
	}
	m.Role = unsafe.String(unsafe.SliceData(b[o0:]), int(n0))
	m.Content = unsafe.String(unsafe.SliceData(b[o1:]), int(n1))
	m.Reasoning = unsafe.String(unsafe.SliceData(b[o2:]), int(n2))
	m.Name = unsafe.String(unsafe.SliceData(b[o3:]), int(n3))
	m.ToolCallID = unsafe.String(unsafe.SliceData(b[o4:]), int(n4))
	m.IsError = le.Uint32(rec[msgFlags:])&flagIsError != 0
	m.ToolCalls = nil
	if le.Uint32(rec[msgToolCalls+4:]) == 0 {
		return
	}
	off, n := r.arr(at+msgToolCalls, flatToolCall)
	if n == 0 {
		return
	}
	// Tool calls of all messages share one array; each message's slice is
	// capped so that appending to it cannot reach its neighbour's.
	lo := len(r.s.toolCalls)
	if lo+n > len(r.b)/flatToolCall {
		// More tool calls than the buffer holds records for: messages
		// share them, which would decode the same bytes over and over.
		r.bad, r.what, r.at = true, "tool calls", at
		return
	}
	r.s.toolCalls = append(r.s.toolCalls, make([]ToolCall, n)...)
	m.ToolCalls = r.s.toolCalls[lo : lo+n : lo+n]
	for i := range m.ToolCalls {
		c, tc := off+uint32(i)*flatToolCall, &m.ToolCalls[i]
		tc.ID, tc.Type, tc.Name, tc.Arguments = r.str(c), r.str(c+8), r.str(c+16), r.str(c+24)
	}
}

// messages reads the message array at at into *buf's array (growing *buf if
// it is too small); present says whether to return an empty, non-nil slice
// for zero messages.
func (r *flatReader) messages(buf *[]Message, at uint32, present bool) []Message {
	off, n := r.arr(at, flatMessage)
	if n == 0 {
		if present {
			return []Message{}
		}
		return nil
	}
	*buf = resize(*buf, n)
	ms := *buf
	for i := range ms {
		r.message(off+uint32(i)*flatMessage, &ms[i])
	}
	return ms
}

// decodeFlat decodes a flat input into in, using s's slices (nil: new
// ones). The strings of in share b's bytes: the caller must not change b
// while in is in use.
func decodeFlat(b []byte, in *Input, s *flatScratch) error {
	if s == nil {
		s = new(flatScratch)
	}
	r := &flatReader{b: b, s: s}
	if len(b) < flatInputHeader {
		return errors.New(ErrFlat.Error() + ": " + strconv.Itoa(len(b)) + " bytes, shorter than the header")
	}
	if tag := r.u32(inLayout); tag != FlatLayout {
		return errors.New(ErrFlat.Error() + ": layout " + strconv.FormatUint(uint64(tag), 10) + ", want 2")
	}
	flags := r.u32(inFlags)
	s.toolCalls = s.toolCalls[:0]
	in.Context = r.messages(&s.context, inContext, true)
	in.NextState = r.messages(&s.next, inNext, flags&flagNextState != 0)
	r.message(inAction, &in.Action)
	in.Feedback = []Feedback{}
	if off, n := r.arr(inFeedback, flatFeedback); n > 0 {
		s.feedback = resize(s.feedback, n)
		in.Feedback = s.feedback
		for i := range in.Feedback {
			f, fb := off+uint32(i)*flatFeedback, &in.Feedback[i]
			fb.Score = nil
			if r.u32(f)&flagScore != 0 {
				v := math.Float64frombits(r.u64(f + 8))
				fb.Score = &v
			}
			fb.Text = r.str(f + 16)
		}
	}
	m := &in.Meta
	m.Turn, m.API, m.Model, m.Plugin = r.str(inTurn), r.str(inAPI), r.str(inModel), r.str(inPlugin)
	m.LatencyMS = int64(r.u64(inLatency))
	m.ToolNames, m.Config = nil, nil
	if off, n := r.arr(inToolNames, flatStr); n > 0 {
		s.toolNames = resize(s.toolNames, n)
		m.ToolNames = s.toolNames
		for i := range m.ToolNames {
			m.ToolNames[i] = r.str(off + uint32(i)*flatStr)
		}
	}
	if off, n := r.arr(inConfig, 2*flatStr); n > 0 {
		if s.config == nil {
			s.config = make(map[string]string, n)
		}
		clear(s.config)
		m.Config = s.config
		for i := 0; i < n; i++ {
			e := off + uint32(i)*2*flatStr
			m.Config[r.str(e)] = r.str(e + flatStr)
		}
	}
	in.Task = nil
	if flags&flagTask != 0 {
		if len(b) < taskHeader {
			return errors.New(ErrFlat.Error() + ": task section past the input's end")
		}
		s.task = Task{ID: r.str(inTaskID)}
		if a := r.str(inAnswer); a != "" {
			s.task.Answer = []byte(a)
		}
		if m := r.str(inTaskMeta); m != "" {
			s.task.Meta = []byte(m)
		}
		in.Task = &s.task
	}
	return r.err()
}

// DecodeFlat decodes an input in the flat layout of ABI version 2, as the
// kit's WASM exports do. The returned Input shares b's bytes.
func DecodeFlat(b []byte) (*Input, error) {
	in := new(Input)
	if err := decodeFlat(b, in, nil); err != nil {
		return nil, err
	}
	return in, nil
}

// appendFlatResult appends r in the flat result layout to dst. Offsets in the
// result are relative to its first byte, dst[len(dst)].
func appendFlatResult(dst []byte, r Result) []byte {
	base := len(dst)
	size := flatResult + len(r.Hint) + len(r.Reason) + len(r.Labels)*flatStr
	for _, l := range r.Labels {
		size += len(l)
	}
	dst = append(dst, make([]byte, size)...)
	out := dst[base:]
	le := binary.LittleEndian
	le.PutUint32(out[resLayout:], FlatLayout)
	if r.Score != nil {
		le.PutUint32(out[resFlags:], flagScore)
		le.PutUint64(out[resScore:], math.Float64bits(*r.Score))
	}
	next := uint32(flatResult + len(r.Labels)*flatStr)
	put := func(at uint32, s string) {
		le.PutUint32(out[at:], next)
		le.PutUint32(out[at+4:], uint32(len(s)))
		copy(out[next:], s)
		next += uint32(len(s))
	}
	put(resHint, r.Hint)
	put(resReason, r.Reason)
	le.PutUint32(out[resLabels:], flatResult)
	le.PutUint32(out[resLabels+4:], uint32(len(r.Labels)))
	for i, l := range r.Labels {
		put(uint32(flatResult+i*flatStr), l)
	}
	return dst
}
