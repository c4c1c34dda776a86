package raftstore

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// A log entry is stored as a value of our own fixed layout rather than gob
// or msgpack (what raft-boltdb uses): raft.Log has seven fields that never
// change shape, so a few varints encode it with no reflection and no
// library, and a strict decoder over such a layout is short enough to read
// whole and to fuzz (FuzzDecodeLog).
//
// Layout, version 1:
//
//	byte     version (1)
//	uvarint  Index
//	uvarint  Term
//	byte     Type
//	uvarint  len(Data), Data
//	uvarint  len(Extensions), Extensions
//	byte     0: AppendedAt is the zero time (and nothing follows)
//	         1: varint Unix seconds, uvarint nanoseconds (< 1e9)
//
// The encoding is canonical: the decoder refuses overlong varints, the zero
// time written as a set one, and trailing bytes, so that every
// accepted value is exactly what appendLog writes for what it decodes to.
// AppendedAt comes back in UTC, without its monotonic reading; raft uses it
// only for metrics.
const logVersion = 1

// appendLog appends the encoding of l to dst.
func appendLog(dst []byte, l *raft.Log) []byte {
	dst = append(dst, logVersion)
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	if l.AppendedAt.IsZero() {
		return append(dst, 0)
	}
	dst = append(dst, 1)
	dst = binary.AppendVarint(dst, l.AppendedAt.Unix())
	return binary.AppendUvarint(dst, uint64(l.AppendedAt.Nanosecond()))
}

// encodedLen bounds the length of l's encoding from above (each varint at
// its longest), to size a buffer once.
func encodedLen(l *raft.Log) int {
	const fixed = 1 + 2*binary.MaxVarintLen64 + 1 + 2*binary.MaxVarintLen64 + 1 + 2*binary.MaxVarintLen64
	return fixed + len(l.Data) + len(l.Extensions)
}

// decodeLog decodes b into l. Data and Extensions are copied (into one new
// allocation), so b may be reused afterwards. Nil and empty Data or
// Extensions both decode as nil. Any input that appendLog could not have
// written is refused with an error wrapping ErrCorrupt.
func decodeLog(b []byte, l *raft.Log) error {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != logVersion {
		return fmt.Errorf("%w: unknown version %d", ErrCorrupt, v)
	}
	index := d.uvarint()
	term := d.uvarint()
	typ := raft.LogType(d.byte())
	data := d.bytes()
	ext := d.bytes()
	var at time.Time
	switch flag := d.byte(); {
	case d.err != nil:
	case flag == 0:
	case flag == 1:
		sec := d.varint()
		nsec := d.uvarint()
		if d.err != nil {
			break
		}
		if nsec >= 1e9 {
			d.fail("nanoseconds %d out of range", nsec)
			break
		}
		at = time.Unix(sec, int64(nsec)).UTC()
		// The zero time is written as flag 0, never like this.
		if at.IsZero() {
			d.fail("zero time written as set")
		}
	default:
		d.fail("bad time flag %d", flag)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return d.err
	}
	// One allocation holds both byte fields; the full slice expressions keep
	// an append to Data from running into Extensions.
	buf := make([]byte, len(data)+len(ext))
	copy(buf, data)
	copy(buf[len(data):], ext)
	*l = raft.Log{Index: index, Term: term, Type: typ, AppendedAt: at}
	if len(data) > 0 {
		l.Data = buf[:len(data):len(data)]
	}
	if len(ext) > 0 {
		l.Extensions = buf[len(data):]
	}
	return nil
}

// decoder reads fields off the front of b; after the first failure every
// read returns zero and err keeps the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// uvarint reads a minimally encoded uvarint.
func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.fail("truncated")
		return 0
	case n < 0:
		d.fail("varint overflows 64 bits")
		return 0
	case n > 1 && d.b[n-1] == 0:
		// A last byte of zero adds nothing: a shorter encoding exists.
		d.fail("overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint reads a minimally encoded zig-zag varint.
func (d *decoder) varint() int64 {
	u := d.uvarint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

// bytes reads a length-prefixed field, aliasing d's input.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("field of %d bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
