package wire

import (
	"encoding/json"
	"testing"
)

func TestDeletions(t *testing.T) {
	tests := []struct {
		in     string
		remove []string
		want   string
	}{
		{`{"a":1,"b":2,"c":3}`, []string{"a"}, `{"b":2,"c":3}`},
		{`{"a":1,"b":2,"c":3}`, []string{"b"}, `{"a":1,"c":3}`},
		{`{"a":1,"b":2,"c":3}`, []string{"c"}, `{"a":1,"b":2}`},
		{`{"a":1,"b":2,"c":3}`, []string{"a", "b"}, `{"c":3}`},
		{`{"a":1,"b":2,"c":3}`, []string{"b", "c"}, `{"a":1}`},
		{`{"a":1,"b":2,"c":3}`, []string{"a", "c"}, `{"b":2}`},
		{`{"a":1,"b":2,"c":3}`, []string{"a", "b", "c"}, `{}`},
		{`{ "a" : 1 , "b" : 2 }`, []string{"a"}, `{ "b" : 2 }`},
		{`{ "a" : 1 , "b" : 2 }`, []string{"b"}, `{ "a" : 1 }`},
		// Duplicate keys, each removed.
		{`{"u":null,"u":null,"":{}}`, []string{"u"}, `{"":{}}`},
		{`{"x":1,"u":1,"u":2}`, []string{"u"}, `{"x":1}`},
		{`{"u":1,"x":1,"u":2}`, []string{"u"}, `{"x":1}`},
		{`{"a":1}`, nil, `{"a":1}`},
	}
	for _, tt := range tests {
		b := []byte(tt.in)
		var d deletions
		if _, err := eachMember(b, 0, func(m member) bool {
			remove := false
			for _, k := range tt.remove {
				remove = remove || string(m.key) == k
			}
			d.add(m, remove)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		got := string(apply(b, d.edits(nil)))
		if got != tt.want {
			t.Errorf("%s without %v = %s, want %s", tt.in, tt.remove, got, tt.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s without %v = %s: not JSON", tt.in, tt.remove, got)
		}
	}
}

// TestStripChatChunkNeighbours removes two neighbouring members a chunk
// gained (usage and prompt token ids), in either order.
func TestStripChatChunkNeighbours(t *testing.T) {
	add := added{usage: true, tokenIDs: true}
	for in, want := range map[string]string{
		`{"usage":null,"prompt_token_ids":[1,2],"id":"x"}`:                       `{"id":"x"}`,
		`{"id":"x","prompt_token_ids":[1,2],"usage":null}`:                       `{"id":"x"}`,
		`{"usage":null,"prompt_token_ids":[1,2]}`:                                `{}`,
		`{"choices":[{"token_ids":[3],"index":0,"token_ids":[4]}],"usage":null}`: `{"choices":[{"index":0}]}`,
	} {
		got, err := stripChat([]byte(in), add, true)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("stripChat(%s) = %s, want %s", in, got, want)
		}
	}
}
