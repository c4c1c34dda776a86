package setup

import (
	"encoding/json"
	"strings"
	"unicode"
)

// splice returns src with src[start:end] replaced by text.
func splice(src []byte, start, end int, text string) []byte {
	out := make([]byte, 0, len(src)-(end-start)+len(text))
	out = append(out, src[:start]...)
	out = append(out, text...)
	return append(out, src[end:]...)
}

// quoteLike writes s as a JSON5 string in the quotes the value it replaces
// used (double quotes when there was none).
func quoteLike(s string, src []byte, old *Value) string {
	if old != nil && old.Kind == String && src[old.Start] == '\'' {
		var sb strings.Builder
		sb.WriteByte('\'')
		for _, r := range s {
			switch {
			case r == '\'' || r == '\\':
				sb.WriteByte('\\')
				sb.WriteRune(r)
			case r < 0x20:
				b, _ := json.Marshal(string(r))
				sb.Write(b[1 : len(b)-1])
			default:
				sb.WriteRune(r)
			}
		}
		sb.WriteByte('\'')
		return sb.String()
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// isIdent says whether k can be an unquoted key.
func isIdent(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		if r == '$' || r == '_' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r)) {
			continue
		}
		return false
	}
	return true
}

// setMember returns src with obj's member key set to the JSON5 text val:
// the value replaced where the key is there, else a member added as the
// object's first, in the style (indentation, quoted keys) of the others.
func setMember(src []byte, obj *Value, key, val string) []byte {
	for i := len(obj.Members) - 1; i >= 0; i-- {
		if m := obj.Members[i]; m.Key == key {
			return splice(src, m.Value.Start, m.Value.End, val)
		}
	}
	k := key
	if len(obj.Members) > 0 && src[obj.Members[0].KeyStart] == '"' || !isIdent(key) {
		b, _ := json.Marshal(key)
		k = string(b)
	}
	if len(obj.Members) == 0 {
		return splice(src, obj.Start+1, obj.closing, k+": "+val)
	}
	first := obj.Members[0].KeyStart
	ls := lineStart(src, first)
	if ls <= obj.Start {
		// The first member is on the brace's line: `{ a: 1 }`.
		return splice(src, first, first, k+": "+val+", ")
	}
	indent := string(src[ls:first])
	return splice(src, ls, ls, indent+k+": "+val+",\n")
}

// removeMember returns src without obj's member key (with its comma, and
// its line where it had one to itself).
func removeMember(src []byte, obj *Value, key string) []byte {
	for i := len(obj.Members) - 1; i >= 0; i-- {
		m := obj.Members[i]
		if m.Key != key {
			continue
		}
		start, end := m.KeyStart, m.Value.End
		// Its comma, if any, goes with it.
		j := end
		for j < len(src) && (src[j] == ' ' || src[j] == '\t') {
			j++
		}
		if j < len(src) && src[j] == ',' {
			end = j + 1
		}
		// A line of its own goes whole.
		ls := lineStart(src, start)
		if strings.TrimSpace(string(src[ls:start])) == "" {
			k := end
			for k < len(src) && (src[k] == ' ' || src[k] == '\t') {
				k++
			}
			if k < len(src) && src[k] == '\n' {
				return splice(src, ls, k+1, "")
			}
			if k < len(src) && src[k] == '\r' && k+1 < len(src) && src[k+1] == '\n' {
				return splice(src, ls, k+2, "")
			}
		}
		for end < len(src) && src[end] == ' ' {
			end++
		}
		return splice(src, start, end, "")
	}
	return src
}

func lineStart(src []byte, i int) int {
	for i > 0 && src[i-1] != '\n' {
		i--
	}
	return i
}
