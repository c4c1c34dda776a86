package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/clawmesh/clawmesh/internal/core"
)

var testMeta = Meta{Created: testHour, Policy: "policy-1"}

func TestRoundTrip(t *testing.T) {
	steps := richSteps()
	meta := Meta{Created: testHour.In(time.FixedZone("CEST", 2*3600)), Policy: "policy-1"}
	b := mustEncode(t, meta, steps)
	got, err := Decode(b, Limits{})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if g, w := stepsJSON(t, got.Steps), stepsJSON(t, steps); g != w {
		t.Errorf("steps differ after the round trip:\n got %s\nwant %s", g, w)
	}
	h := got.Header
	if !h.Created.Equal(testHour) || h.Created.Location() != time.UTC {
		t.Errorf("created = %v, want %v in UTC", h.Created, testHour)
	}
	if h.Schema != Schema || h.StepSchema != core.SchemaVersion || h.Policy != "policy-1" {
		t.Errorf("header = %+v", h)
	}
	hb, err := DecodeHeader(b, Limits{})
	if err != nil {
		t.Fatalf("DecodeHeader: %v", err)
	}
	if !reflect.DeepEqual(hb, h) {
		t.Errorf("DecodeHeader = %+v, Decode's header = %+v", hb, h)
	}
	// The body is the JSONL `pool export` writes: one ExportedStep a line.
	_, frame := split(t, b)
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	body, err := dec.DecodeAll(frame, nil)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	if len(lines) != len(steps) || !strings.HasPrefix(lines[0], `{"schema":"clawmesh.step/v1","id":"a1",`) {
		t.Errorf("body has %d lines, first %.60s", len(lines), lines[0])
	}
	if !strings.Contains(lines[0], "You are <helpful> & brief.") {
		t.Error("body lines must not be HTML-escaped")
	}
	if int64(len(body)) != h.BodyBytes {
		t.Errorf("body is %d bytes, header says %d", len(body), h.BodyBytes)
	}
	var zh zstd.Header
	if err := zh.Decode(frame); err != nil || !zh.HasFCS || !zh.SingleSegment || zh.FrameContentSize != uint64(len(body)) {
		t.Errorf("frame header %+v (%v): want single segment with content size %d", zh, err, len(body))
	}
}

func TestHeaderSummary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []*core.Step
		want  Header // only the summary fields and Steps
	}{
		{
			name:  "rich",
			steps: richSteps(),
			want: Header{Steps: 5, Sessions: 3,
				Rewards:  RewardSummary{Scored: 3, Positive: 2, Negative: 1, Mean: 0.5 / 3, Hints: 1},
				Plugins:  []string{hashA, hashB},
				Adapters: []string{"lora-a", "lora-b"}},
		},
		{
			name:  "one bare step",
			steps: []*core.Step{step("x", "s")},
			want:  Header{Steps: 1, Sessions: 1},
		},
		{
			name: "zero reward is scored, neither sign; hint without value",
			steps: []*core.Step{
				step("x", "s", reward(fptr(0), "")),
				step("y", "s", reward(nil, "try again", core.Score{Plugin: "p", Hash: ""})),
				step("z", "t", reward(fptr(-0.25), "", core.Score{Plugin: "p", Hash: hashB}), adapter("a")),
			},
			want: Header{Steps: 3, Sessions: 2,
				Rewards:  RewardSummary{Scored: 2, Negative: 1, Mean: -0.125, Hints: 1},
				Plugins:  []string{hashB},
				Adapters: []string{"a"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustEncode(t, testMeta, tc.steps)
			h, err := DecodeHeader(b, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			got := Header{Steps: h.Steps, Sessions: h.Sessions, Rewards: h.Rewards, Plugins: h.Plugins, Adapters: h.Adapters}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("summary:\n got %+v\nwant %+v", got, tc.want)
			}
			if _, err := Decode(b, Limits{}); err != nil {
				t.Errorf("Decode: %v", err)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	b1 := mustEncode(t, testMeta, richSteps())
	b2 := mustEncode(t, testMeta, richSteps())
	if !bytes.Equal(b1, b2) {
		t.Fatal("two encodes of the same input differ")
	}
	// Concurrent encodes share the encoder and still agree.
	var wg sync.WaitGroup
	out := make([][]byte, 8)
	for i := range out {
		wg.Go(func() { out[i], _ = Encode(testMeta, richSteps()) })
	}
	wg.Wait()
	for i, b := range out {
		if !bytes.Equal(b, b1) {
			t.Errorf("concurrent encode %d differs", i)
		}
	}
	sum := sha256.Sum256(b1)
	if id := ID(b1); string(id) != hex.EncodeToString(sum[:]) || id != ID(b2) {
		t.Errorf("ID = %s, want the hex sha256 %x", id, sum)
	}
	if ID(b1) == ID(mustEncode(t, Meta{Created: testHour, Policy: "policy-2"}, richSteps())) {
		t.Error("another policy must give another id")
	}
}

func TestVerify(t *testing.T) {
	b := mustEncode(t, testMeta, richSteps())
	if _, err := Verify(b, ID(b), Limits{}); err != nil {
		t.Fatalf("Verify with the right id: %v", err)
	}
	other := ID(append(bytes.Clone(b), 0))
	_, err := Verify(b, other, Limits{})
	if got := sentinelsOf(err); len(got) != 1 || got[0] != ErrHashMismatch || !strings.Contains(err.Error(), string(other)) {
		t.Errorf("Verify with a wrong id: %v", err)
	}
	if _, err := Verify(b, core.BatchID(strings.ToUpper(string(ID(b)))), Limits{}); !isOnly(err, ErrHashMismatch) {
		t.Errorf("Verify with an upper-case id: %v", err)
	}
}

func isOnly(err, sentinel error) bool {
	s := sentinelsOf(err)
	return len(s) == 1 && s[0] == sentinel
}

func TestEncodeRefuses(t *testing.T) {
	bad := step("b", "s", func(s *core.Step) { s.Turn = "middle" })
	nan := step("n", "s", reward(fptr(math.NaN()), ""))
	many := make([]*core.Step, defaultMaxSteps+1)
	for i := range many {
		many[i] = step(string(rune('a'+i%26))+strings.Repeat("x", i/26), "s")
	}
	for _, tc := range []struct {
		name  string
		steps []*core.Step
		want  error
		says  string
	}{
		{"no steps", nil, ErrMalformed, "no steps"},
		{"nil step", []*core.Step{step("a", "s"), nil}, ErrMalformed, "step 1 is nil"},
		{"invalid step", []*core.Step{step("a", "s"), bad}, ErrMalformed, "turn"},
		{"duplicate id", []*core.Step{step("a", "s"), step("a", "t")}, ErrMalformed, `duplicate step id "a"`},
		{"NaN reward", []*core.Step{nan}, ErrMalformed, "NaN"},
		{"too many steps", many, ErrTooLarge, "4097 steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(testMeta, tc.steps)
			if !isOnly(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Encode = %d bytes, %v; want %v saying %q", len(b), err, tc.want, tc.says)
			}
		})
	}
}

func TestTruncated(t *testing.T) {
	b := mustEncode(t, testMeta, []*core.Step{step("a", "s", reward(fptr(1), "hint"))})
	for i := range len(b) {
		_, err := Decode(b[:i], Limits{})
		if !isOnly(err, ErrTruncated) {
			t.Fatalf("Decode of the first %d of %d bytes: %v, want only ErrTruncated", i, len(b), err)
		}
		if _, err := DecodeHeader(b[:i], Limits{}); !isOnly(err, ErrTruncated) {
			t.Fatalf("DecodeHeader of the first %d of %d bytes: %v", i, len(b), err)
		}
	}
	if _, err := Decode(b, Limits{}); err != nil {
		t.Fatalf("the whole batch: %v", err)
	}
}

// refusal is an input Decode must refuse with want, saying says.
type refusal struct {
	name string
	b    []byte
	lim  Limits
	want error
	says string
}

// refusals builds one input for every way Decode refuses; the fuzz target
// is seeded with them.
func refusals(t testing.TB) []refusal {
	steps := richSteps()
	good := mustEncode(t, testMeta, steps)
	hj, frame := split(t, good)
	body := bodyOf(t, steps)
	h := honestHeader(steps, body)
	if !bytes.Equal(assemble(headerJSON(t, h), frame), good) {
		t.Fatal("the hand-made batch differs from Encode's")
	}

	// lie builds the valid body under a header changed by mut.
	lie := func(mut func(*Header)) []byte {
		h := honestHeader(steps, body)
		mut(&h)
		return assemble(headerJSON(t, h), frame)
	}
	// withBody builds an honest header and frame around a body made of
	// steps (unchecked) and changed by mut.
	withBody := func(steps []*core.Step, mut func([]byte) []byte) []byte {
		body := bodyOf(t, steps)
		if mut != nil {
			body = mut(body)
		}
		return assemble(headerJSON(t, honestHeader(steps, body)), zframe(t, body))
	}
	replace := func(old, new string) func([]byte) []byte {
		return func(b []byte) []byte {
			if !bytes.Contains(b, []byte(old)) {
				t.Fatalf("body has no %q", old)
			}
			return bytes.Replace(b, []byte(old), []byte(new), 1)
		}
	}
	withVersion := bytes.Clone(good)
	withVersion[len(magic)] = 7
	badMagic := bytes.Clone(good)
	badMagic[0] = 'X'
	nonMinimal := append([]byte(magic), formatVersion)
	nonMinimal = append(nonMinimal, byte(len(hj))|0x80, byte(len(hj)>>7)|0x80, 0) // padded uvarint
	nonMinimal = append(append(nonMinimal, hj...), frame...)
	if len(hj) >= 1<<14 {
		t.Fatal("header too long for the padded uvarint")
	}

	// A frame whose content size differs from the header's.
	var zh zstd.Header
	if err := zh.Decode(frame); err != nil {
		t.Fatal(err)
	}
	otherFCS := func(fcs uint32) []byte {
		// Single segment, 4-byte content size, no checksum, no dictionary.
		f := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0}, binary.LittleEndian.AppendUint32(nil, fcs)...)
		return append(f, frame[zh.HeaderSize:]...)
	}
	noFCS := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58}, frame[zh.HeaderSize:]...) // window 8 MiB, no content size
	skippable := append([]byte{0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0}, "abcd"...)

	dup := []*core.Step{step("a", "s"), step("b", "s"), step("a", "t")}
	invalid := []*core.Step{step("a", "s"), step("b", "s", func(s *core.Step) { s.API = "soap" })}

	return []refusal{
		{name: "empty", b: nil, want: ErrTruncated, says: "0 bytes"},
		{name: "bad magic", b: badMagic, want: ErrMalformed, says: "bad magic"},
		{name: "not a batch", b: []byte("hello, world"), want: ErrMalformed, says: "bad magic"},
		{name: "unknown version", b: withVersion, want: ErrVersion, says: "format version 7"},
		{name: "oversize input", b: good, lim: Limits{MaxBytes: int64(len(good) - 1)}, want: ErrTooLarge, says: "limit"},
		{name: "header too long", b: good, lim: Limits{MaxHeader: len(hj) - 1}, want: ErrTooLarge, says: "header JSON is"},
		{name: "header length not minimal", b: nonMinimal, want: ErrMalformed, says: "minimally"},
		{name: "header length overflows", b: append([]byte(magic+"\x01"), bytes.Repeat([]byte{0xff}, 11)...), want: ErrMalformed, says: "overflows"},
		{name: "header not JSON", b: assemble([]byte("{nope"), frame), want: ErrMalformed, says: "header JSON"},
		{name: "unknown header field", b: assemble(append(bytes.TrimSuffix(bytes.Clone(hj), []byte("}")), `,"extra":1}`...), frame), want: ErrMalformed, says: `unknown field "extra"`},
		{name: "header not canonical", b: assemble(append([]byte(" "), hj...), frame), want: ErrMalformed, says: "canonical"},
		{name: "header created not UTC", b: assemble(bytes.Replace(hj, []byte(`14:00:00Z`), []byte(`16:00:00+02:00`), 1), frame), want: ErrMalformed, says: "not in UTC"},
		{name: "header created +00:00", b: assemble(bytes.Replace(hj, []byte(`14:00:00Z`), []byte(`14:00:00+00:00`), 1), frame), want: ErrMalformed, says: "canonical"},
		{name: "wrong schema", b: lie(func(h *Header) { h.Schema = "clawmesh.batch/v2" }), want: ErrVersion, says: `"clawmesh.batch/v2"`},
		{name: "wrong step schema", b: lie(func(h *Header) { h.StepSchema = "clawmesh.step/v0" }), want: ErrVersion, says: "step_schema"},
		{name: "no steps", b: lie(func(h *Header) { h.Steps = 0 }), want: ErrMalformed, says: "steps = 0"},
		{name: "too many steps", b: good, lim: Limits{MaxSteps: 4}, want: ErrTooLarge, says: "steps = 5, limit 4"},
		{name: "step count over lines", b: lie(func(h *Header) { h.Steps++ }), want: ErrMalformed, says: "header says 6 steps, body has 5 lines"},
		{name: "step count under lines", b: lie(func(h *Header) { h.Steps-- }), want: ErrMalformed, says: "body has more lines"},
		{name: "body hash mismatch", b: lie(func(h *Header) { h.BodySHA256 = hexSum("other") }), want: ErrMalformed, says: "sha256"},
		{name: "body hash not hex", b: lie(func(h *Header) { h.BodySHA256 = "xyz" }), want: ErrMalformed, says: "body_sha256"},
		{name: "body size mismatch", b: lie(func(h *Header) { h.BodyBytes-- }), want: ErrMalformed, says: "declares"},
		{name: "sessions lie", b: lie(func(h *Header) { h.Sessions = 2 }), want: ErrMalformed, says: "sessions = 2, steps have 3"},
		{name: "sessions impossible", b: lie(func(h *Header) { h.Sessions = 0 }), want: ErrMalformed, says: "sessions = 0"},
		{name: "positive lie", b: lie(func(h *Header) { h.Rewards.Positive, h.Rewards.Negative = 1, 2 }), want: ErrMalformed, says: "rewards ="},
		{name: "mean lie", b: lie(func(h *Header) { h.Rewards.Mean = 0.2 }), want: ErrMalformed, says: "rewards ="},
		{name: "mean impossible", b: lie(func(h *Header) { h.Rewards.Mean = 3 }), want: ErrMalformed, says: "mean"},
		{name: "scored impossible", b: lie(func(h *Header) { h.Rewards.Scored = 9 }), want: ErrMalformed, says: "scored"},
		{name: "hints lie", b: lie(func(h *Header) { h.Rewards.Hints = 0 }), want: ErrMalformed, says: "rewards ="},
		{name: "plugins lie", b: lie(func(h *Header) { h.Plugins = h.Plugins[:1] }), want: ErrMalformed, says: "plugins"},
		{name: "plugins unsorted", b: lie(func(h *Header) { h.Plugins[0], h.Plugins[1] = h.Plugins[1], h.Plugins[0] }), want: ErrMalformed, says: "not sorted"},
		{name: "adapters lie", b: lie(func(h *Header) { h.Adapters = append(h.Adapters, "lora-c") }), want: ErrMalformed, says: "adapters"},
		{name: "adapters empty entry", b: lie(func(h *Header) { h.Adapters = []string{""} }), want: ErrMalformed, says: "adapters[0] is empty"},
		{name: "frame content size too large", b: assemble(hj, otherFCS(1<<30)), want: ErrTooLarge, says: "frame declares"},
		{name: "frame content size differs", b: assemble(hj, otherFCS(uint32(h.BodyBytes+1))), want: ErrMalformed, says: "header body_bytes"},
		{name: "frame without content size", b: assemble(hj, noFCS), want: ErrMalformed, says: "content size"},
		{name: "skippable frame", b: assemble(hj, skippable), want: ErrMalformed, says: "skippable"},
		{name: "trailing garbage", b: append(bytes.Clone(good), "junk"...), want: ErrMalformed, says: "4 trailing bytes"},
		{name: "trailing frame", b: append(bytes.Clone(good), zframe(t, []byte("x"))...), want: ErrMalformed, says: "trailing"},
		{name: "trailing skippable frame", b: append(bytes.Clone(good), skippable...), want: ErrMalformed, says: "trailing"},
		{name: "body size over limit", b: good, lim: Limits{MaxBody: h.BodyBytes - 1}, want: ErrTooLarge, says: "body_bytes"},
		{name: "duplicate step id", b: withBody(dup, nil), want: ErrMalformed, says: `step line 3: duplicate step id "a" (first on line 1)`},
		{name: "invalid step", b: withBody(invalid, nil), want: ErrMalformed, says: `step line 2: core: step b: unknown api "soap"`},
		{name: "wrong step schema tag", b: withBody(steps[:2], replace(`"schema":"clawmesh.step/v1"`, `"schema":"clawmesh.step/v9"`)), want: ErrVersion, says: `step line 1: schema "clawmesh.step/v9"`},
		{name: "step not JSON", b: withBody(steps[:2], replace(`{"schema"`, `{"schema`)), want: ErrMalformed, says: "step line 1"},
		{name: "step unknown field", b: withBody(steps[:1], replace(`"id":"a1"`, `"id":"a1","secret":"x"`)), want: ErrMalformed, says: `unknown field "secret"`},
		{name: "step not canonical", b: withBody(steps[:1], replace(`"id":"a1"`, `"id": "a1"`)), want: ErrMalformed, says: "canonical"},
		{name: "step HTML-escaped", b: withBody(steps[:1], replace(`<helpful>`, `\u003chelpful>`)), want: ErrMalformed, says: "canonical"},
		{name: "empty line", b: withBody(steps[:2], func(b []byte) []byte { return append([]byte("\n"), b...) }), want: ErrMalformed, says: "step line 1"},
		{name: "no final newline", b: withBody(steps[:1], func(b []byte) []byte { return bytes.TrimSuffix(b, []byte("\n")) }), want: ErrMalformed, says: "newline"},
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range refusals(t) {
		t.Run(tc.name, func(t *testing.T) {
			bt, err := Decode(tc.b, tc.lim)
			if bt != nil || !isOnly(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Decode = %v, %v\nwant only %v, saying %q", bt != nil, err, tc.want, tc.says)
			}
			// What DecodeHeader refuses, it refuses as Decode does.
			if _, herr := DecodeHeader(tc.b, tc.lim); herr != nil && herr.Error() != err.Error() {
				t.Errorf("DecodeHeader: %v\n        Decode: %v", herr, err)
			}
		})
	}
}

// TestZipBomb: bodies that would decompress far past MaxBody fail fast with
// ErrTooLarge and allocate about nothing.
func TestZipBomb(t *testing.T) {
	const maxBody = 1 << 20
	lim := Limits{MaxBody: maxBody}

	// An honest batch whose body is over the limit.
	big := step("big", "s", func(s *core.Step) {
		s.Request.Messages[1].Content = strings.Repeat("all work and no play ", 3*maxBody/20)
	})
	honest := mustEncode(t, testMeta, []*core.Step{big})

	// A header and frame that declare 100,000 bytes over 10,000 RLE blocks
	// of 128 KiB each: 40 KB that would make 1.3 GB.
	steps := []*core.Step{step("a", "s")}
	h := honestHeader(steps, bodyOf(t, steps))
	h.BodyBytes = 100_000
	rle := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0}, binary.LittleEndian.AppendUint32(nil, 100_000)...)
	for i := range 10_000 {
		last := uint32(0)
		if i == 9_999 {
			last = 1
		}
		bh := uint32(maxBlockSize)<<3 | 1<<1 | last
		rle = append(rle, byte(bh), byte(bh>>8), byte(bh>>16), 'A')
	}
	rleBomb := assemble(headerJSON(t, h), rle)

	// A real zstd frame of 64 MiB of zeros (a few KB) that declares
	// 300,000 bytes: only decompressing finds out.
	zeros := zframe(t, make([]byte, 64<<20))
	var zh zstd.Header
	if err := zh.Decode(zeros); err != nil || len(zeros) > 64<<10 {
		t.Fatalf("zeros frame: %d bytes, %v", len(zeros), err)
	}
	h.BodyBytes = 300_000
	lying := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0}, binary.LittleEndian.AppendUint32(nil, 300_000)...)
	lying = append(lying, zeros[zh.HeaderSize:]...)
	zeroBomb := assemble(headerJSON(t, h), lying)

	for _, tc := range []struct {
		name string
		b    []byte
		says string
	}{
		{"honest body over MaxBody", honest, "body_bytes"},
		{"RLE blocks past the declared size", rleBomb, "make more than"},
		{"compressed blocks past the declared size", zeroBomb, "decompresses past"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := Decode(tc.b, lim)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if !isOnly(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Decode: %v, want ErrTooLarge saying %q", err, tc.says)
			}
			t.Log(err)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
				t.Errorf("refusing allocated %d bytes", alloc)
			}
			if took > time.Second {
				t.Errorf("refusing took %v", took)
			}
		})
	}
}

// TestLargeMaxBody: a MaxBody above the default gets its own decoder.
func TestLargeMaxBody(t *testing.T) {
	b := mustEncode(t, testMeta, richSteps())
	if _, err := Decode(b, Limits{MaxBody: defaultMaxBody + 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b, Limits{MaxBody: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b, Limits{MaxBody: -1}); err != nil {
		t.Fatalf("a negative limit means the default: %v", err)
	}
}
