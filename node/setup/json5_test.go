package setup

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestParseJSON5(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want any
	}{
		{`{}`, map[string]any{}},
		{`// a comment
{ /* block */ a: 1, 'b': 'two', "c": [true, false, null,], }`, map[string]any{"a": 1.0, "b": "two", "c": []any{true, false, nil}}},
		{`{$x_1: 0x1F, y: -.5, z: +2., w: 1e3}`, map[string]any{"$x_1": 31.0, "y": -0.5, "z": 2.0, "w": 1000.0}},
		{`'it\'s \x41\u00e9 line\
 continued'`, "it's Aé line continued"},
		{`"\uD83D\uDE00"`, "😀"},
		{"\uFEFF {a:'x'}", map[string]any{"a": "x"}},
		{`{a: 1, a: 2}`, map[string]any{"a": 2.0}},
	} {
		v, err := ParseJSON5([]byte(tc.src))
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		if got := v.Interface(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q = %#v, want %#v", tc.src, got, tc.want)
		}
	}
	v, err := ParseJSON5([]byte(`[Infinity, -Infinity, NaN]`))
	if err != nil || !math.IsInf(v.Elems[0].Num, 1) || !math.IsInf(v.Elems[1].Num, -1) || !math.IsNaN(v.Elems[2].Num) {
		t.Errorf("Infinity, -Infinity, NaN: %v %+v", err, v)
	}
	for _, bad := range []string{``, `{`, `{a 1}`, `{a: 1,, }`, `[1 2]`, `"abc`, "'a\nb'", `{a: 1} x`, `/* open`, `01`, `{1: 2}`, `[,]`, `"\1"`, `tru`} {
		if _, err := ParseJSON5([]byte(bad)); !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: err %v, want ErrSyntax", bad, err)
		}
	}
}

func TestParseJSON5Spans(t *testing.T) {
	src := `{
  // comment
  models: { providers: { local: { baseUrl: 'http://x/v1', api: "openai-completions" } } },
}`
	v, err := ParseJSON5([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	b := v.Path("models", "providers", "local", "baseUrl")
	if b == nil || src[b.Start:b.End] != `'http://x/v1'` || b.Str != "http://x/v1" {
		t.Fatalf("baseUrl span %+v", b)
	}
}

// FuzzParseJSON5 checks that the parser never panics, that what JSON
// accepts it reads as encoding/json does, and that every value's span is
// inside the input.
func FuzzParseJSON5(f *testing.F) {
	for _, s := range []string{`{a: [1, 'x', {b: null}], "c": true}`, `// c
{}`, `"\u00e9"`, `[0x10, .5, +1]`, `{"a":{"b":[1,2,3]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		v, err := ParseJSON5(src)
		var want any
		if json.Valid(src) && json.Unmarshal(src, &want) == nil {
			if err != nil {
				t.Fatalf("valid JSON %q refused: %v", src, err)
			}
			if got := v.Interface(); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: got %#v, encoding/json %#v", src, got, want)
			}
		}
		if err != nil {
			return
		}
		var walk func(*Value)
		walk = func(x *Value) {
			if x.Start < 0 || x.End > len(src) || x.Start >= x.End {
				t.Fatalf("span %d..%d out of %d", x.Start, x.End, len(src))
			}
			for _, m := range x.Members {
				walk(m.Value)
			}
			for _, e := range x.Elems {
				walk(e)
			}
		}
		walk(v)
	})
}
