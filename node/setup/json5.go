package setup

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A JSON5 reader written here rather than taken from a library: the JSON5
// decoders for Go decode into values and forget where each value was, and
// setup must change one field of a user's file and leave every other byte
// (comments, quoting, order, trailing commas) as it was. So the parser keeps
// each value's byte span, and edits are splices of the source.

// Kind is the type of a JSON5 value.
type Kind uint8

// The kinds of JSON5 values.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// Value is a parsed JSON5 value with its place in the source: src[Start:End]
// is its text.
type Value struct {
	Kind       Kind
	Start, End int
	Str        string  // String: the decoded string
	Bool       bool    // Bool
	Num        float64 // Number
	Members    []Member
	Elems      []*Value
	// closing is the offset of an object's or array's closing bracket.
	closing int
}

// Member is one key of an object, with the span of its key.
type Member struct {
	Key              string
	KeyStart, KeyEnd int
	Value            *Value
}

// ErrSyntax reports text that is not JSON5.
var ErrSyntax = errors.New("setup: not JSON5")

// Field returns the member named key of an object, nil if there is none or
// v is not an object. Where a key repeats, the last one counts, as in
// JavaScript.
func (v *Value) Field(key string) *Value {
	if v == nil || v.Kind != Object {
		return nil
	}
	for i := len(v.Members) - 1; i >= 0; i-- {
		if v.Members[i].Key == key {
			return v.Members[i].Value
		}
	}
	return nil
}

// Path follows keys from v; nil where one is missing.
func (v *Value) Path(keys ...string) *Value {
	for _, k := range keys {
		v = v.Field(k)
	}
	return v
}

// Interface returns v as encoding/json would decode it: map[string]any,
// []any, string, float64, bool or nil.
func (v *Value) Interface() any {
	if v == nil {
		return nil
	}
	switch v.Kind {
	case Bool:
		return v.Bool
	case Number:
		return v.Num
	case String:
		return v.Str
	case Array:
		a := make([]any, len(v.Elems))
		for i, e := range v.Elems {
			a[i] = e.Interface()
		}
		return a
	case Object:
		m := make(map[string]any, len(v.Members))
		for _, mb := range v.Members {
			m[mb.Key] = mb.Value.Interface()
		}
		return m
	}
	return nil
}

// ParseJSON5 parses src, one JSON5 value with optional comments and white
// space around it.
func ParseJSON5(src []byte) (*Value, error) {
	p := &parser{src: src}
	p.skip()
	if p.err != nil {
		return nil, p.err
	}
	v := p.value(0)
	if p.err != nil {
		return nil, p.err
	}
	p.skip()
	if p.err == nil && p.pos < len(src) {
		p.fail("unexpected %q after the value", p.peekRune())
	}
	if p.err != nil {
		return nil, p.err
	}
	return v, nil
}

const maxDepth = 200

type parser struct {
	src []byte
	pos int
	err error
}

func (p *parser) fail(format string, a ...any) {
	if p.err != nil {
		return
	}
	line, col := 1, 1
	for _, c := range string(p.src[:min(p.pos, len(p.src))]) {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	p.err = fmt.Errorf("%w: line %d, column %d: %s", ErrSyntax, line, col, fmt.Sprintf(format, a...))
}

func (p *parser) peekRune() rune {
	if p.pos >= len(p.src) {
		return utf8.RuneError
	}
	r, _ := utf8.DecodeRune(p.src[p.pos:])
	return r
}

// skip passes white space (JSON5's, which includes Unicode spaces and line
// separators) and comments.
func (p *parser) skip() {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == '/' && p.pos+1 < len(p.src) && p.src[p.pos+1] == '/':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case c == '/' && p.pos+1 < len(p.src) && p.src[p.pos+1] == '*':
			end := strings.Index(string(p.src[p.pos+2:]), "*/")
			if end < 0 {
				p.fail("unterminated comment")
				p.pos = len(p.src)
				return
			}
			p.pos += 2 + end + 2
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f':
			p.pos++
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(p.src[p.pos:])
			if r == '\uFEFF' || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Zs, r) {
				p.pos += n
				continue
			}
			return
		default:
			return
		}
	}
}

func (p *parser) value(depth int) *Value {
	if depth > maxDepth {
		p.fail("nested too deeply")
		return nil
	}
	if p.pos >= len(p.src) {
		p.fail("unexpected end of input")
		return nil
	}
	start := p.pos
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"' || c == '\'':
		s := p.string()
		return &Value{Kind: String, Str: s, Start: start, End: p.pos}
	case c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		word := p.identifier()
		v := &Value{Start: start, End: p.pos}
		switch word {
		case "null":
			v.Kind = Null
		case "true", "false":
			v.Kind, v.Bool = Bool, word == "true"
		case "Infinity", "NaN":
			p.pos = start
			return p.number()
		default:
			p.pos = start
			p.fail("unexpected %q", p.peekRune())
			return nil
		}
		return v
	}
}

func (p *parser) object(depth int) *Value {
	v := &Value{Kind: Object, Start: p.pos}
	p.pos++ // {
	for {
		p.skip()
		if p.err != nil {
			return nil
		}
		if p.pos >= len(p.src) {
			p.fail("unterminated object")
			return nil
		}
		if p.src[p.pos] == '}' {
			break
		}
		var m Member
		m.KeyStart = p.pos
		if c := p.src[p.pos]; c == '"' || c == '\'' {
			m.Key = p.string()
		} else {
			m.Key = p.identifier()
			if m.Key == "" {
				p.fail("want a key, got %q", p.peekRune())
			}
		}
		m.KeyEnd = p.pos
		p.skip()
		if p.err != nil {
			return nil
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			p.fail("want ':' after key %q", m.Key)
			return nil
		}
		p.pos++
		p.skip()
		m.Value = p.value(depth + 1)
		if p.err != nil {
			return nil
		}
		v.Members = append(v.Members, m)
		p.skip()
		if p.pos < len(p.src) && p.src[p.pos] == ',' {
			p.pos++
			continue
		}
		p.skip()
		if p.pos >= len(p.src) || p.src[p.pos] != '}' {
			p.fail("want ',' or '}' in object")
			return nil
		}
		break
	}
	v.closing = p.pos
	p.pos++
	v.End = p.pos
	return v
}

func (p *parser) array(depth int) *Value {
	v := &Value{Kind: Array, Start: p.pos}
	p.pos++ // [
	for {
		p.skip()
		if p.err != nil {
			return nil
		}
		if p.pos >= len(p.src) {
			p.fail("unterminated array")
			return nil
		}
		if p.src[p.pos] == ']' {
			break
		}
		e := p.value(depth + 1)
		if p.err != nil {
			return nil
		}
		v.Elems = append(v.Elems, e)
		p.skip()
		if p.pos < len(p.src) && p.src[p.pos] == ',' {
			p.pos++
			continue
		}
		p.skip()
		if p.pos >= len(p.src) || p.src[p.pos] != ']' {
			p.fail("want ',' or ']' in array")
			return nil
		}
		break
	}
	v.closing = p.pos
	p.pos++
	v.End = p.pos
	return v
}

// identifier reads an ECMAScript identifier name (letters, digits, $, _,
// \uXXXX escapes), "" if there is none here.
func (p *parser) identifier() string {
	var sb strings.Builder
	for p.pos < len(p.src) {
		r, n := utf8.DecodeRune(p.src[p.pos:])
		if r == '\\' {
			if p.pos+6 <= len(p.src) && p.src[p.pos+1] == 'u' {
				u, err := strconv.ParseUint(string(p.src[p.pos+2:p.pos+6]), 16, 32)
				if err == nil {
					sb.WriteRune(rune(u))
					p.pos += 6
					continue
				}
			}
			p.fail("bad escape in a key")
			return ""
		}
		if r == '$' || r == '_' || unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) ||
			(sb.Len() > 0 && (unicode.IsDigit(r) || unicode.Is(unicode.Mn, r) || unicode.Is(unicode.Mc, r) || unicode.Is(unicode.Pc, r) || r == '\u200C' || r == '\u200D')) {
			sb.WriteRune(r)
			p.pos += n
			continue
		}
		break
	}
	return sb.String()
}

func (p *parser) string() string {
	q := p.src[p.pos]
	p.pos++
	var sb strings.Builder
	for {
		if p.pos >= len(p.src) {
			p.fail("unterminated string")
			return ""
		}
		c := p.src[p.pos]
		switch {
		case c == q:
			p.pos++
			return sb.String()
		case c == '\n' || c == '\r':
			p.fail("line break in a string")
			return ""
		case c == '\\':
			p.pos++
			if p.pos >= len(p.src) {
				p.fail("unterminated string")
				return ""
			}
			e := p.src[p.pos]
			p.pos++
			switch e {
			case 'b':
				sb.WriteByte('\b')
			case 'f':
				sb.WriteByte('\f')
			case 'n':
				sb.WriteByte('\n')
			case 'r':
				sb.WriteByte('\r')
			case 't':
				sb.WriteByte('\t')
			case 'v':
				sb.WriteByte('\v')
			case '0':
				if p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
					p.fail("octal escape in a string")
					return ""
				}
				sb.WriteByte(0)
			case 'x':
				if p.pos+2 > len(p.src) {
					p.fail("bad \\x escape")
					return ""
				}
				u, err := strconv.ParseUint(string(p.src[p.pos:p.pos+2]), 16, 8)
				if err != nil {
					p.fail("bad \\x escape")
					return ""
				}
				sb.WriteRune(rune(u))
				p.pos += 2
			case 'u':
				r := p.hex4()
				if utf16IsHigh(r) && p.pos+6 <= len(p.src) && p.src[p.pos] == '\\' && p.src[p.pos+1] == 'u' {
					save := p.pos
					p.pos += 2
					lo := p.hex4()
					if lo >= 0xDC00 && lo <= 0xDFFF {
						r = (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000
					} else {
						p.pos = save
					}
				}
				sb.WriteRune(r)
			case '\r':
				if p.pos < len(p.src) && p.src[p.pos] == '\n' {
					p.pos++
				}
			case '\n':
				// A line continuation.
			default:
				if e >= '1' && e <= '9' {
					p.fail("bad escape \\%c", e)
					return ""
				}
				p.pos--
				r, n := utf8.DecodeRune(p.src[p.pos:])
				p.pos += n
				if r != '\u2028' && r != '\u2029' {
					sb.WriteRune(r)
				}
			}
		default:
			r, n := utf8.DecodeRune(p.src[p.pos:])
			sb.WriteRune(r)
			p.pos += n
		}
	}
}

func utf16IsHigh(r rune) bool { return r >= 0xD800 && r <= 0xDBFF }

func (p *parser) hex4() rune {
	if p.pos+4 > len(p.src) {
		p.fail("bad \\u escape")
		return 0
	}
	u, err := strconv.ParseUint(string(p.src[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		p.fail("bad \\u escape")
		return 0
	}
	p.pos += 4
	return rune(u)
}

func (p *parser) number() *Value {
	start := p.pos
	neg := false
	if c := p.src[p.pos]; c == '+' || c == '-' {
		neg = c == '-'
		p.pos++
	}
	rest := string(p.src[p.pos:])
	v := &Value{Kind: Number, Start: start}
	switch {
	case strings.HasPrefix(rest, "Infinity"):
		p.pos += len("Infinity")
		v.Num = math.Inf(1)
		if neg {
			v.Num = math.Inf(-1)
		}
	case strings.HasPrefix(rest, "NaN"):
		p.pos += len("NaN")
		v.Num = math.NaN()
	case strings.HasPrefix(rest, "0x") || strings.HasPrefix(rest, "0X"):
		p.pos += 2
		d := p.pos
		for p.pos < len(p.src) && isHex(p.src[p.pos]) {
			p.pos++
		}
		u, err := strconv.ParseUint(string(p.src[d:p.pos]), 16, 64)
		if err != nil {
			p.fail("bad hexadecimal number")
			return nil
		}
		v.Num = float64(u)
		if neg {
			v.Num = -v.Num
		}
	default:
		d := p.pos
		for p.pos < len(p.src) {
			c := p.src[p.pos]
			if (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' ||
				((c == '+' || c == '-') && (p.src[p.pos-1] == 'e' || p.src[p.pos-1] == 'E')) {
				p.pos++
				continue
			}
			break
		}
		text := string(p.src[d:p.pos])
		if text == "" || text == "." || (len(text) > 1 && text[0] == '0' && text[1] >= '0' && text[1] <= '9') {
			p.fail("bad number")
			return nil
		}
		f, err := strconv.ParseFloat(text, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			p.fail("bad number %q", text)
			return nil
		}
		v.Num = f
		if neg {
			v.Num = -f
		}
	}
	v.End = p.pos
	return v
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}
