package rewards

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func handle(t *testing.T, f Func, input string) Result {
	t.Helper()
	Register(f)
	defer Register(nil)
	var r Result
	if err := json.Unmarshal(Handle([]byte(input)), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

const in = `{"context":[{"role":"user","content":"hi"}],"action":{"role":"assistant","content":"hello"},"next_state":[{"role":"tool","content":"ok"},{"role":"user","content":"thanks"}],"meta":{"turn":"main","config":{"k":"v"}}}`

func TestHandle(t *testing.T) {
	r := handle(t, func(in *Input) Result {
		if in.LastUser() != "hi" || in.NextUser() != "thanks" || len(in.ToolResults()) != 1 || in.Meta.Config["k"] != "v" {
			return Abstain("bad input")
		}
		return Score(0.5).WithHint("h").WithLabels("a", "b")
	}, in)
	if r.Score == nil || *r.Score != 0.5 || r.Hint != "h" || len(r.Labels) != 2 {
		t.Fatalf("%+v", r)
	}
	if r := handle(t, func(*Input) Result { panic("boom") }, in); r.Score != nil || !strings.Contains(r.Reason, "panicked: boom") {
		t.Fatalf("panic: %+v", r)
	}
	if r := handle(t, func(*Input) Result { x := 3.0; return Result{Score: &x} }, in); r.Score != nil || !strings.Contains(r.Reason, "outside") {
		t.Fatalf("out of range: %+v", r)
	}
	if r := handle(t, func(*Input) Result { return Score(7) }, in); r.Score == nil || *r.Score != 1 {
		t.Fatalf("clamp: %+v", r)
	}
	if r := handle(t, func(*Input) Result { return Score(1) }, `{"context":`); r.Score != nil || !strings.Contains(r.Reason, "decode input") {
		t.Fatalf("bad json: %+v", r)
	}
	Register(nil)
	var r2 Result
	json.Unmarshal(Handle([]byte(in)), &r2)
	if r2.Score != nil || !strings.Contains(r2.Reason, "no reward function") {
		t.Fatalf("unregistered: %+v", r2)
	}
	if got := Trim("  héllo world  ", 2); got != "h…" {
		t.Fatalf("Trim: %q", got)
	}
}

// FuzzHandle: whatever input the host passes, Handle answers with a valid
// result and never panics.
func FuzzHandle(f *testing.F) {
	f.Add([]byte(in))
	f.Add([]byte(`{"next_state":null}`))
	Register(func(in *Input) Result { return Score(float64(len(in.NextUser())) / 10) })
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Result
		if err := json.Unmarshal(Handle(b), &r); err != nil {
			t.Fatal(err)
		}
		if r.Score != nil && (*r.Score < -1 || *r.Score > 1) {
			t.Fatal(*r.Score)
		}
	})
}

// readFlatResult decodes a flat result (ABI.md, version 2) for tests.
func readFlatResult(t *testing.T, b []byte) Result {
	t.Helper()
	le := binary.LittleEndian
	if len(b) < 40 || le.Uint32(b) != 2 {
		t.Fatalf("not a flat result: %q", b)
	}
	str := func(at int) string {
		off, n := le.Uint32(b[at:]), le.Uint32(b[at+4:])
		if uint64(off)+uint64(n) > uint64(len(b)) {
			t.Fatalf("string at %d out of bounds", at)
		}
		return string(b[off : off+n])
	}
	var r Result
	if le.Uint32(b[4:])&1 != 0 {
		v := math.Float64frombits(le.Uint64(b[8:]))
		r.Score = &v
	}
	r.Hint, r.Reason = str(16), str(24)
	off, n := int(le.Uint32(b[32:])), int(le.Uint32(b[36:]))
	if off+8*n > len(b) {
		t.Fatal("labels out of bounds")
	}
	for i := 0; i < n; i++ {
		r.Labels = append(r.Labels, str(off+8*i))
	}
	return r
}

// flatInput lays out a small input by hand, as the host does.
func flatInput(next string) []byte {
	le := binary.LittleEndian
	b := make([]byte, 144+2*56)
	le.PutUint32(b, 2)
	le.PutUint32(b[4:], 1)
	str := func(at int, s string) {
		le.PutUint32(b[at:], uint32(len(b)))
		le.PutUint32(b[at+4:], uint32(len(s)))
		b = append(b, s...)
	}
	le.PutUint32(b[8:], 144) // context: one message
	le.PutUint32(b[12:], 1)
	str(144, "user")
	str(144+8, "hi")
	le.PutUint32(b[16:], 144+56) // next state: one message
	le.PutUint32(b[20:], 1)
	str(144+56, "user")
	str(144+56+8, next)
	str(32, "assistant")
	str(32+8, "hello")
	str(88, "main")
	le.PutUint64(b[120:], 850)
	return b
}

func TestHandleFlat(t *testing.T) {
	Register(func(in *Input) Result {
		if in.LastUser() != "hi" || in.Action.Content != "hello" || in.Meta.Turn != "main" || in.Meta.LatencyMS != 850 {
			return Abstain("bad input")
		}
		return Score(0.5).WithHint("h: "+in.NextUser()).WithLabels("a", "b").WithReason("r")
	})
	defer Register(nil)
	r := readFlatResult(t, HandleFlat(flatInput("thanks")))
	if r.Score == nil || *r.Score != 0.5 || r.Hint != "h: thanks" || r.Reason != "r" || len(r.Labels) != 2 || r.Labels[1] != "b" {
		t.Fatalf("%+v", r)
	}
	if r := readFlatResult(t, HandleFlat(flatInput("x")[:100])); r.Score != nil || !strings.Contains(r.Reason, "shorter than the header") {
		t.Fatalf("short input: %+v", r)
	}
	bad := flatInput("x")
	binary.LittleEndian.PutUint32(bad[12:], 1<<30) // a context too long for the buffer
	if r := readFlatResult(t, HandleFlat(bad)); r.Score != nil || !strings.Contains(r.Reason, "out of bounds") {
		t.Fatalf("bad array: %+v", r)
	}
}

// FuzzHandleFlat: whatever bytes the host passes, HandleFlat answers with a
// readable result and never panics.
func FuzzHandleFlat(f *testing.F) {
	f.Add(flatInput("thanks"))
	f.Add(flatInput("")[:144])
	Register(func(in *Input) Result {
		n := len(in.NextUser()) + len(in.Context) + len(in.Meta.Config) + len(in.Feedback)
		for _, m := range in.Context {
			n += len(m.ToolCalls)
		}
		return Score(float64(n) / 10).WithLabels(in.Meta.ToolNames...)
	})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := readFlatResult(t, HandleFlat(b))
		if r.Score != nil && (*r.Score < -1 || *r.Score > 1) {
			t.Fatal(*r.Score)
		}
	})
}

// FuzzDecodeFlatReuse: decoding into an Input and scratch that earlier
// inputs filled gives the same Input as decoding into fresh ones, so nothing
// of one call leaks into the next. The seeds in testdata are steps the node
// encoded (tool calls, feedback, tools, configuration).
func FuzzDecodeFlatReuse(f *testing.F) {
	f.Add(flatInput("thanks"))
	var dirty Input
	var scratch flatScratch
	f.Fuzz(func(t *testing.T, b []byte) {
		fresh := new(Input)
		errFresh := decodeFlat(b, fresh, nil)
		errDirty := decodeFlat(b, &dirty, &scratch)
		if (errFresh == nil) != (errDirty == nil) {
			t.Fatalf("fresh: %v, reused: %v", errFresh, errDirty)
		}
		if errFresh == nil && !reflect.DeepEqual(*fresh, dirty) {
			t.Fatalf("reused decode differs:\nfresh  %+v\nreused %+v", *fresh, dirty)
		}
	})
}

// TestDecodeFlatSharedToolCalls: messages that all name one tool-call array
// would decode it once per message (work and memory quadratic in the input's
// size); more tool calls than the buffer holds records for is refused.
func TestDecodeFlatSharedToolCalls(t *testing.T) {
	le := binary.LittleEndian
	const msgs, calls = 40, 40
	b := make([]byte, 144+msgs*56+calls*32)
	le.PutUint32(b, 2)
	le.PutUint32(b[8:], 144) // context: msgs messages
	le.PutUint32(b[12:], msgs)
	for i := 0; i < msgs; i++ {
		at := 144 + i*56
		le.PutUint32(b[at+40:], uint32(144+msgs*56)) // every one: the same calls
		le.PutUint32(b[at+44:], calls)
	}
	if _, err := DecodeFlat(b); err == nil || !strings.Contains(err.Error(), "tool calls") {
		t.Fatalf("shared tool calls: %v", err)
	}
	// One message naming them is fine.
	le.PutUint32(b[12:], 1)
	in, err := DecodeFlat(b)
	if err != nil || len(in.Context) != 1 || len(in.Context[0].ToolCalls) != calls {
		t.Fatalf("one message: %v", err)
	}
}
