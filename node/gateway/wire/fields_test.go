package wire

import (
	"encoding/json"
	"testing"
)

// TestWithFields checks that fields are added when missing and replaced
// when present, that the rest of the body is kept byte for byte, and that
// a value that is not JSON is refused.
func TestWithFields(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"model":"m","messages":[]}`, `{"model":"m","messages":[],"adapters":"/a/v2"}`},
		{`{"adapters":"/a/v1", "model":"m"}`, `{"adapters":"/a/v2", "model":"m"}`},
		{`{}`, `{"adapters":"/a/v2"}`},
		{` { "x" : {"adapters":1} } `, ` { "x" : {"adapters":1},"adapters":"/a/v2" } `},
	} {
		got, err := WithFields([]byte(c.in), map[string]json.RawMessage{"adapters": json.RawMessage(`"/a/v2"`)})
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if string(got) != c.want {
			t.Errorf("WithFields(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if _, err := WithFields([]byte(`{}`), map[string]json.RawMessage{"a": json.RawMessage(`{`)}); err == nil {
		t.Error("a value that is not JSON was set")
	}
	if _, err := WithFields([]byte(`[1]`), map[string]json.RawMessage{"a": json.RawMessage(`1`)}); err == nil {
		t.Error("a body that is not an object took a field")
	}
}
