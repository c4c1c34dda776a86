// Package wire is the encoding the weights protocol's messages share: the
// manifest (package chunks), the gossip offer and the stream frames
// (package weights) are fields appended one after another, integers as
// uvarints, byte strings and text after their length. It does no I/O.
package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// AppendString appends s after its length.
func AppendString(b []byte, s string) []byte { return AppendBytes(b, []byte(s)) }

// AppendBytes appends v after its length.
func AppendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// Decoder reads what the append functions wrote; the first error sticks.
type Decoder struct {
	b   []byte
	err error
	bad error
}

// NewDecoder reads b; its errors wrap bad.
func NewDecoder(b []byte, bad error) *Decoder { return &Decoder{b: b, bad: bad} }

// Err is the first error met (nil: none).
func (d *Decoder) Err() error { return d.err }

// Len is how many bytes are left to read.
func (d *Decoder) Len() int { return len(d.b) }

// Fail records an error, unless one is already recorded.
func (d *Decoder) Fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", d.bad, fmt.Sprintf(format, args...))
	}
}

// Take reads n bytes (aliasing the input).
func (d *Decoder) Take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.Fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// Uvarint reads an integer.
func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.Fail("bad varint")
		return 0
	}
	if n > 1 && d.b[n-1] == 0 {
		// A trailing zero group makes a second encoding of the same
		// number; only the shortest one is accepted, so that what decodes
		// re-encodes to the bytes that were signed.
		d.Fail("varint not in its shortest form")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Bytes reads a byte string of at most max bytes (a copy).
func (d *Decoder) Bytes(max int) []byte {
	n := d.Uvarint()
	if d.err == nil && n > uint64(max) {
		d.Fail("a field of %d bytes", n)
		return nil
	}
	return bytes.Clone(d.Take(int(n)))
}

// String reads a text of at most max bytes.
func (d *Decoder) String(max int) string { return string(d.Bytes(max)) }
