package wire

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// unquote decodes one JSON string token exactly as encoding/json decodes it
// into a string (invalid UTF-8 and unpaired surrogates become U+FFFD). It
// reports false for anything that is not a valid string token, for the
// caller to ask encoding/json for the error.
//
// It exists for speed: message contents are by far the largest strings in a
// request (an agent's system prompt is tens of thousands of characters), and
// json.Unmarshal into a string validates the token again before unquoting
// it, which took about a third of parsing such a request. FuzzUnquote checks
// it against encoding/json.
func unquote(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	i := plainRun(s, 0)
	if i == len(s) {
		return string(s), true
	}
	b := append(make([]byte, 0, len(s)+2*utf8.UTFMax), s[:i]...)
	for i < len(s) {
		if j := plainRun(s, i); j > i {
			b = append(b, s[i:j]...)
			if i = j; i == len(s) {
				break
			}
		}
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) {
				return "", false
			}
			switch s[i+1] {
			case '"', '\\', '/':
				b = append(b, s[i+1])
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r := getu4(s[i:])
				if r < 0 {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if dec := utf16.DecodeRune(r, getu4(s[i:])); dec != unicode.ReplacementChar {
						i += 6
						b = utf8.AppendRune(b, dec)
						continue
					}
					r = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, r)
				continue
			default:
				return "", false
			}
			i += 2
		case c == '"' || c < ' ':
			return "", false
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = utf8.AppendRune(b, unicode.ReplacementChar)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
		}
	}
	return string(b), true
}

// plainRun returns the end of the run of bytes from i that stand for
// themselves: ASCII other than a backslash, a quote or a control character.
func plainRun(s []byte, i int) int {
	for i < len(s) {
		c := s[i]
		if c == '\\' || c == '"' || c < ' ' || c >= utf8.RuneSelf {
			return i
		}
		i++
	}
	return i
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
