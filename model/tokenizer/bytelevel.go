package tokenizer

// byteLevel is GPT-2's reversible byte ↔ character table: printable bytes map
// to themselves, the others (controls, space, 0x7f–0xa0, 0xad) to U+0100 and
// up, so every byte sequence has a visible, whitespace-free spelling.
type byteLevel struct {
	enc [256]string   // byte → its character, UTF-8 encoded
	dec map[rune]byte // character → byte
}

func newByteLevel() *byteLevel {
	bl := &byteLevel{dec: make(map[rune]byte, 256)}
	n := 0
	for b := 0; b < 256; b++ {
		var r rune
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			r = rune(b)
		} else {
			r = rune(256 + n)
			n++
		}
		bl.enc[b] = string(r)
		bl.dec[r] = byte(b)
	}
	return bl
}

// encode spells bytes in byte-level characters.
func (bl *byteLevel) encode(p []byte) string {
	out := make([]byte, 0, 2*len(p))
	for _, b := range p {
		out = append(out, bl.enc[b]...)
	}
	return string(out)
}

// decode turns a byte-level spelling back into bytes. It reports false if s
// holds a character outside the table.
func (bl *byteLevel) decode(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := bl.dec[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
