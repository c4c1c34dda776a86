package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// pyJSON re-serializes JSON text the way Hugging Face's chat template
// environment writes `tojson` (Python's json.dumps with ensure_ascii=False):
// ", " and ": " separators, object keys in their original order, non-ASCII
// characters literal. Numbers are kept as written.
func pyJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := pyValue(&b, dec); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", fmt.Errorf("%w: trailing data after JSON value", ErrBadJSON)
	}
	return b.String(), nil
}

func pyValue(b *strings.Builder, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			b.WriteByte('{')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				k, err := dec.Token()
				if err != nil {
					return fmt.Errorf("%w: %v", ErrBadJSON, err)
				}
				pyString(b, k.(string))
				b.WriteString(": ")
				if err := pyValue(b, dec); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return fmt.Errorf("%w: %v", ErrBadJSON, err)
			}
			b.WriteByte('}')
		case '[':
			b.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := pyValue(b, dec); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return fmt.Errorf("%w: %v", ErrBadJSON, err)
			}
			b.WriteByte(']')
		default:
			return fmt.Errorf("%w: unexpected %v", ErrBadJSON, v)
		}
	case string:
		pyString(b, v)
	case json.Number:
		b.WriteString(v.String())
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	}
	return nil
}

// pyString writes s as a JSON string literal escaped like Python's
// json.dumps(ensure_ascii=False).
func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			default:
				if c < 0x20 {
					fmt.Fprintf(b, `\u%04x`, c)
				} else {
					b.WriteByte(c)
				}
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString(`\ufffd`)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	b.WriteByte('"')
}

// toolJSON is a tool as chat templates receive it, in OpenAI's shape:
// {"type": "function", "function": {"name", "description", "parameters"}}.
func toolJSON(name, description string, parameters json.RawMessage) (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteString(`{"type":"function","function":{"name":`)
	writeGoString(&b, name)
	if description != "" {
		b.WriteString(`,"description":`)
		writeGoString(&b, description)
	}
	if len(bytes.TrimSpace(parameters)) > 0 {
		if !json.Valid(parameters) {
			return nil, fmt.Errorf("%w: parameters of tool %q", ErrBadJSON, name)
		}
		b.WriteString(`,"parameters":`)
		b.Write(parameters)
	}
	b.WriteString(`}}`)
	return b.Bytes(), nil
}

func writeGoString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s)
	b.Write(enc)
}
