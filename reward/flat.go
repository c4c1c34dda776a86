package reward

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
)

// The flat layout of ABI version 2 (wasm-rewards/ABI.md). The offsets here
// and in the kit (wasm-rewards/flat.go) are the same numbers; the test
// TestFlatMatchesJSON decodes what this file encodes with the kit's decoder.

const (
	flatLayout      = 2
	flatInputHeader = 144
	// flatTaskHeader is the input header with the task section (flag bit
	// 1): three more strs at 144.
	flatTaskHeader = 168
	flatMessage    = 56
	flatToolCall   = 32
	flatFeedback   = 24
	flatStr        = 8
	flatResult     = 40

	// input header
	fiFlags     = 4
	fiContext   = 8
	fiNext      = 16
	fiFeedback  = 24
	fiAction    = 32
	fiTurn      = 88
	fiAPI       = 96
	fiModel     = 104
	fiPlugin    = 112
	fiLatency   = 120
	fiToolNames = 128
	fiConfig    = 136
	fiTaskID    = 144
	fiAnswer    = 152
	fiTaskMeta  = 160

	flagNext = 1
	flagTask = 2

	// message record
	fmContent    = 8
	fmReasoning  = 16
	fmName       = 24
	fmToolCallID = 32
	fmToolCalls  = 40
	fmFlags      = 48

	// result header
	frFlags  = 4
	frScore  = 8
	frHint   = 16
	frReason = 24
	frLabels = 32
)

var le = binary.LittleEndian

// flatWriter builds a flat buffer: records are reserved first, strings are
// appended after whatever is there, and every offset is from the buffer's
// first byte.
type flatWriter struct{ b []byte }

// reserve appends n zero bytes and returns their offset.
func (w *flatWriter) reserve(n int) uint32 {
	off := len(w.b)
	w.b = append(w.b, make([]byte, n)...)
	return uint32(off)
}

func (w *flatWriter) pair(at, a, b uint32) {
	le.PutUint32(w.b[at:], a)
	le.PutUint32(w.b[at+4:], b)
}

// str appends s (made valid UTF-8, as the JSON layout's encoder does) and
// writes its (offset, length) at at.
func (w *flatWriter) str(at uint32, s string) {
	if s == "" {
		return
	}
	if !utf8.ValidString(s) {
		s = validUTF8(s)
	}
	off := len(w.b)
	w.b = append(w.b, s...)
	w.pair(at, uint32(off), uint32(len(s)))
}

func (w *flatWriter) message(at uint32, m *core.Message) {
	w.str(at, m.Role)
	w.str(at+fmContent, m.Content)
	w.str(at+fmReasoning, m.Reasoning)
	w.str(at+fmName, m.Name)
	w.str(at+fmToolCallID, m.ToolCallID)
	if m.IsError {
		le.PutUint32(w.b[at+fmFlags:], 1)
	}
	if n := len(m.ToolCalls); n > 0 {
		off := w.reserve(n * flatToolCall)
		w.pair(at+fmToolCalls, off, uint32(n))
		for i := range m.ToolCalls {
			tc, c := &m.ToolCalls[i], off+uint32(i*flatToolCall)
			w.str(c, tc.ID)
			w.str(c+8, tc.Type)
			w.str(c+16, tc.Name)
			w.str(c+24, tc.Arguments)
		}
	}
}

func (w *flatWriter) messages(at uint32, ms []core.Message) {
	if len(ms) == 0 {
		return
	}
	off := w.reserve(len(ms) * flatMessage)
	w.pair(at, off, uint32(len(ms)))
	for i := range ms {
		w.message(off+uint32(i*flatMessage), &ms[i])
	}
}

// validUTF8 replaces each byte of s that is not part of valid UTF-8 with
// U+FFFD, as encoding/json does (strings.ToValidUTF8 replaces runs).
func validUTF8(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// messagesSize is the size of ms in the flat layout, for valid UTF-8.
func messagesSize(ms []core.Message) int {
	n := 0
	for i := range ms {
		m := &ms[i]
		n += flatMessage + len(m.Role) + len(m.Content) + len(m.Reasoning) + len(m.Name) + len(m.ToolCallID)
		for _, tc := range m.ToolCalls {
			n += flatToolCall + len(tc.ID) + len(tc.Type) + len(tc.Name) + len(tc.Arguments)
		}
	}
	return n
}

// encodeFlatParts encodes every part of the flat input but the plugin's name
// and configuration.
func (in *input) encodeFlatParts() {
	s := in.step
	size := flatInputHeader + flatMessage + messagesSize(s.Request.Messages) + messagesSize([]core.Message{in.actionMessage()})
	if s.NextState != nil {
		size += messagesSize(s.NextState.Messages)
	}
	for _, f := range s.Feedback {
		size += flatFeedback + len(f.Text)
	}
	for _, t := range in.meta.ToolNames {
		size += flatStr + len(t)
	}
	size += len(in.meta.Turn) + len(in.meta.API) + len(in.meta.Model)
	header, flags := flatInputHeader, uint32(0)
	var task Task
	if in.task != nil {
		task = in.task.wire()
		header, flags = flatTaskHeader, flagTask
		size += flatTaskHeader - flatInputHeader + len(task.ID) + len(task.Answer) + len(task.Meta)
	}
	w := &flatWriter{b: make([]byte, header, size)}
	le.PutUint32(w.b, flatLayout)
	w.messages(fiContext, s.Request.Messages)
	if s.NextState != nil {
		flags |= flagNext
		w.messages(fiNext, s.NextState.Messages)
	}
	le.PutUint32(w.b[fiFlags:], flags)
	if in.task != nil {
		w.str(fiTaskID, task.ID)
		w.str(fiAnswer, string(task.Answer))
		w.str(fiTaskMeta, string(task.Meta))
	}
	if n := len(s.Feedback); n > 0 {
		off := w.reserve(n * flatFeedback)
		w.pair(fiFeedback, off, uint32(n))
		for i, f := range s.Feedback {
			at := off + uint32(i*flatFeedback)
			if f.Score != nil {
				le.PutUint32(w.b[at:], 1)
				le.PutUint64(w.b[at+8:], math.Float64bits(*f.Score))
			}
			w.str(at+16, f.Text)
		}
	}
	act := in.actionMessage()
	w.message(fiAction, &act)
	m := &in.meta
	w.str(fiTurn, m.Turn)
	w.str(fiAPI, m.API)
	w.str(fiModel, m.Model)
	le.PutUint64(w.b[fiLatency:], uint64(m.LatencyMS))
	if n := len(m.ToolNames); n > 0 {
		off := w.reserve(n * flatStr)
		w.pair(fiToolNames, off, uint32(n))
		for i, t := range m.ToolNames {
			w.str(off+uint32(i*flatStr), t)
		}
	}
	in.flat = w.b
}

// encodeFlat renders the flat input (version 2) for one plugin.
func (in *input) encodeFlat(c PluginConfig) []byte {
	if in.flat == nil {
		in.encodeFlatParts()
	}
	size := len(in.flat) + len(c.Name) + len(c.Config)*2*flatStr
	for k, v := range c.Config {
		size += len(k) + len(v)
	}
	w := &flatWriter{b: append(make([]byte, 0, size), in.flat...)}
	w.str(fiPlugin, c.Name)
	if n := len(c.Config); n > 0 {
		off := w.reserve(n * 2 * flatStr)
		w.pair(fiConfig, off, uint32(n))
		i := 0
		for k, v := range c.Config {
			at := off + uint32(i*2*flatStr)
			w.str(at, k)
			w.str(at+flatStr, v)
			i++
		}
	}
	return w.b
}

// DecodeFlatResult parses and checks a plugin's result in the flat layout of
// ABI version 2, with the same checks and bounds as DecodeResult.
func DecodeFlatResult(b []byte) (Result, error) {
	if len(b) > maxOutput {
		return Result{}, fmt.Errorf("%w: %d bytes", ErrResult, len(b))
	}
	if len(b) < flatResult {
		return Result{}, fmt.Errorf("%w: %d bytes, shorter than the flat header", ErrResult, len(b))
	}
	if tag := le.Uint32(b); tag != flatLayout {
		return Result{}, fmt.Errorf("%w: layout %d, want %d", ErrResult, tag, flatLayout)
	}
	str := func(at uint32) (string, error) {
		off, n := le.Uint32(b[at:]), le.Uint32(b[at+4:])
		if uint64(off)+uint64(n) > uint64(len(b)) {
			return "", fmt.Errorf("%w: string [%d, +%d) out of bounds", ErrResult, off, n)
		}
		return string(b[off : off+n]), nil
	}
	var score *float64
	if le.Uint32(b[frFlags:])&1 != 0 {
		v := math.Float64frombits(le.Uint64(b[frScore:]))
		score = &v
	}
	hint, err := str(frHint)
	if err != nil {
		return Result{}, err
	}
	reason, err := str(frReason)
	if err != nil {
		return Result{}, err
	}
	off, n := le.Uint32(b[frLabels:]), le.Uint32(b[frLabels+4:])
	if uint64(off)+uint64(n)*flatStr > uint64(len(b)) {
		return Result{}, fmt.Errorf("%w: labels out of bounds", ErrResult)
	}
	labels := make([]string, 0, n)
	for i := uint32(0); i < n; i++ {
		l, err := str(off + i*flatStr)
		if err != nil {
			return Result{}, err
		}
		labels = append(labels, l)
	}
	return checkResult(score, hint, reason, labels)
}
