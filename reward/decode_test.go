package reward

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecodeResult(t *testing.T) {
	cases := []struct {
		in     string
		ok     bool
		score  *float64
		labels int
	}{
		{`{"score":0.5}`, true, ptr(0.5), 0},
		{`{"score":null,"reason":"x"}`, true, nil, 0},
		{`{}`, true, nil, 0},
		{`{"score":-1,"labels":["a","","b"]}`, true, ptr(-1), 2},
		{`{"score":1.0000001}`, false, nil, 0},
		{`{"score":"1"}`, false, nil, 0},
		{`{"score":1e999}`, false, nil, 0},
		{`{"score":0.1} {"score":0.2}`, false, nil, 0},
		{`[1]`, false, nil, 0},
		{``, false, nil, 0},
	}
	for _, c := range cases {
		r, err := DecodeResult([]byte(c.in))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v", c.in, err)
			continue
		}
		if err != nil && !errors.Is(err, ErrResult) {
			t.Errorf("%s: %v is not ErrResult", c.in, err)
		}
		if c.ok && ((r.Score == nil) != (c.score == nil) || r.Score != nil && *r.Score != *c.score || len(r.Labels) != c.labels) {
			t.Errorf("%s: %+v", c.in, r)
		}
	}
	long := `{"hint":"` + strings.Repeat("é", maxHint) + `","labels":[` + strings.Repeat(`"l",`, 100) + `"l"]}`
	r, err := DecodeResult([]byte(long))
	if err != nil || len(r.Hint) > maxHint || !utf8.ValidString(r.Hint) || len(r.Labels) != maxLabels {
		t.Fatalf("caps: %v, hint %d bytes, %d labels", err, len(r.Hint), len(r.Labels))
	}
}

// FuzzDecodeResult: whatever a plugin returns, decoding never panics, and
// what it accepts is in range, bounded and valid UTF-8.
func FuzzDecodeResult(f *testing.F) {
	for _, s := range []string{`{"score":0.5,"hint":"h","labels":["a"],"reason":"r"}`, `{"score":null}`, `{"score":-1e-9}`, "\xff", `{"labels":[1]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeResult(b); err == nil {
			checkAccepted(t, r)
		}
	})
}

// checkAccepted fails unless r, a result a decoder accepted, is in range,
// bounded and valid UTF-8.
func checkAccepted(t *testing.T, r Result) {
	t.Helper()
	if r.Score != nil && (math.IsNaN(*r.Score) || *r.Score < -1 || *r.Score > 1) {
		t.Fatalf("accepted score %v", *r.Score)
	}
	if len(r.Hint) > maxHint || len(r.Reason) > maxReason || len(r.Labels) > maxLabels {
		t.Fatal("accepted oversized result")
	}
	for _, s := range append([]string{r.Hint, r.Reason}, r.Labels...) {
		if !utf8.ValidString(s) || len(s) > maxHint {
			t.Fatalf("accepted %q", s)
		}
	}
}

func TestReadSteps(t *testing.T) {
	steps := readTestSteps(t)
	if len(steps) != 12 {
		t.Fatalf("%d steps", len(steps))
	}
	for _, bad := range []string{
		`{"schema":"clawmesh.step/v9","id":"a","session_id":"s","turn":"main","api":"responses","request":{"messages":[{"role":"user"}]}}`,
		`{"id":"a"}`,
		`not json`,
	} {
		if _, err := ReadSteps(strings.NewReader("\n" + bad + "\n")); !errors.Is(err, ErrBadSteps) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// FuzzDecodeStep: a steps file given to `clawmesh reward test` may hold
// anything; decoding never panics, and a decoded step encodes as a plugin
// input.
func FuzzDecodeStep(f *testing.F) {
	b, err := os.ReadFile("testdata/steps.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range bytes.Split(b, []byte("\n"))[:3] {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeStep(b)
		if err != nil {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded an invalid step: %v", err)
		}
		in := newInput(&s)
		enc, err := in.encode(PluginConfig{Name: "x"})
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		if !json.Valid(enc) {
			t.Fatalf("encoded input is not JSON: %s", enc)
		}
	})
}
