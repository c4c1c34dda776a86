package wire

import (
	"encoding/json"
	"testing"
)

// FuzzUnquote: unquote agrees with encoding/json on every input: the same
// string where encoding/json decodes one, false where it refuses.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{
		`""`, `"plain"`, `"a\nb\t\"q\" \\ \/ \b\f\r"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`,
		`"\ude00\ud83d"`, `"\u12"`, `"\x"`, `"\'"`, "\"a\x01b\"", `"a"b"`, `"abc`, `"é中😀"`, "\"\xff\xfe\"", `"\`, `"\u00"`,
		"\"a\\u0000b\"", `x`, `"`, `"\ud800\u0041"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := unquote(raw)
		var want string
		err := json.Unmarshal(raw, &want)
		isString := len(raw) > 0 && raw[0] == '"' && raw[len(raw)-1] == '"'
		switch {
		case ok && (err != nil || got != want):
			t.Fatalf("unquote(%q) = %q, encoding/json: %q, %v", raw, got, want, err)
		case !ok && err == nil && isString:
			t.Fatalf("unquote(%q) refused what encoding/json decodes as %q", raw, want)
		}
	})
}
