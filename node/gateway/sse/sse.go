// Package sse reads server-sent event streams (the text/event-stream format
// of the WHATWG HTML standard) for a proxy: every event comes back with its
// exact bytes, so it can be forwarded unchanged, alongside its parsed fields.
//
// The reader does no I/O of its own beyond reading from the io.Reader it is
// given, holds no goroutines and never blocks except in that Read.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxEventBytes is the event size limit used when NewReader is given
// a limit of zero or less.
const DefaultMaxEventBytes = 8 << 20

// ErrTooLarge is returned by Next when an event exceeds the reader's limit.
// The reader is unusable afterwards.
var ErrTooLarge = errors.New("sse: event too large")

// Event is one server-sent event.
//
// Every byte of the stream belongs to exactly one event: Raw holds the
// event's exact bytes, including the blank line that ends it, so a proxy can
// forward it unchanged, and concatenating the Raw of all events returned
// gives back the stream. An event made only of comment lines (keep-alives
// such as ": ping") has no Data and must still be forwarded; so must an
// event that is just a stray blank line (Raw "\n").
//
// The event owns its slices: they stay valid after later calls to Next.
type Event struct {
	Raw  []byte
	Name string // "event:" field, "" if none
	Data []byte // data lines joined by "\n"; nil if the event had none
	ID   string // "id:" field, "" if none

	// dataAt is Data's offset in Raw plus one when Data is a single data
	// line inside Raw (0 when unknown), so WithData can splice in place.
	dataAt int
}

// WithData returns the event's bytes with its data replaced by data: Raw
// with the data line's value spliced when the event has one data line and
// data has no line break (every other byte kept), else the event rebuilt
// with "\n" line ends from its name, id and data. Comments of a rebuilt
// event are dropped.
func (e *Event) WithData(data []byte) []byte {
	if e.dataAt > 0 && e.dataAt-1+len(e.Data) <= len(e.Raw) && bytes.IndexAny(data, "\r\n") < 0 {
		at := e.dataAt - 1
		out := make([]byte, 0, len(e.Raw)-len(e.Data)+len(data))
		out = append(out, e.Raw[:at]...)
		out = append(out, data...)
		return append(out, e.Raw[at+len(e.Data):]...)
	}
	var out []byte
	if e.Name != "" {
		out = append(append(append(out, "event: "...), e.Name...), '\n')
	}
	if e.ID != "" {
		out = append(append(append(out, "id: "...), e.ID...), '\n')
	}
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			out = append(append(append(out, "data: "...), data...), '\n')
			break
		}
		out = append(append(append(out, "data: "...), data[:i]...), '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	return append(out, '\n')
}

// Comment reports whether the event carries no field at all (comments,
// keep-alives or blank lines only).
func (e *Event) Comment() bool { return e.Data == nil && e.Name == "" && e.ID == "" }

// Reader splits a stream into events. Lines may end in "\n", "\r\n" or "\r".
// A last event not followed by a blank line is returned at EOF as it is.
type Reader struct {
	r     io.Reader
	max   int
	buf   []byte // unread bytes are buf[off:]
	off   int
	err   error // sticky read error, returned once buf is drained
	spans []span
}

type span struct {
	start, end int
	colon      bool // the line had a colon: a value can be spliced at start
}

// NewReader returns a reader of events from r. maxEventBytes bounds one
// event's Raw; zero or less means DefaultMaxEventBytes.
func NewReader(r io.Reader, maxEventBytes int) *Reader {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	return &Reader{r: r, max: maxEventBytes}
}

// Next returns the next event. It returns io.EOF at a clean end of the
// stream (after the last event has been returned), ErrTooLarge when an event
// exceeds the limit, and any other error of the underlying reader.
func (r *Reader) Next() (Event, error) {
	pos := 0  // start of the current line, relative to off
	scan := 0 // bytes of the current line known to hold no line end
	r.spans = r.spans[:0]
	var ev Event
	hasData := false
	for {
		avail := r.buf[r.off:]
		j := bytes.IndexAny(avail[scan:], "\r\n")
		if j < 0 || (avail[scan+j] == '\r' && scan+j+1 == len(avail) && r.err == nil) {
			// No complete line yet (or a "\r" that may be followed by "\n").
			if j < 0 {
				scan = len(avail)
			} else {
				scan += j
			}
			if r.err != nil {
				if len(avail) == 0 {
					return Event{}, r.err
				}
				// A last line without a terminator.
				if len(avail) > r.max {
					r.err = ErrTooLarge
					r.buf, r.off = nil, 0
					return Event{}, ErrTooLarge
				}
				if pos < len(avail) {
					r.field(&ev, avail, pos, len(avail), &hasData)
				}
				return r.finish(ev, len(avail), hasData), nil
			}
			if len(avail) > r.max {
				r.err = ErrTooLarge
				r.buf, r.off = nil, 0
				return Event{}, ErrTooLarge
			}
			r.fill()
			continue
		}
		i := scan + j - pos
		rest := avail[pos:]
		lineEnd := pos + i
		next := lineEnd + 1
		if rest[i] == '\r' && i+1 < len(rest) && rest[i+1] == '\n' {
			next++
		}
		if next > r.max {
			r.err = ErrTooLarge
			r.buf, r.off = nil, 0
			return Event{}, ErrTooLarge
		}
		if lineEnd == pos {
			// A blank line ends the event.
			return r.finish(ev, next, hasData), nil
		}
		r.field(&ev, avail, pos, lineEnd, &hasData)
		pos, scan = next, next
	}
}

// field interprets one non-blank line avail[start:end] of the current event.
func (r *Reader) field(ev *Event, avail []byte, start, end int, hasData *bool) {
	line := avail[start:end]
	if line[0] == ':' {
		return // comment
	}
	name, value := line, []byte(nil)
	vstart := end
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		name = line[:c]
		vstart = start + c + 1
		if vstart < end && avail[vstart] == ' ' {
			vstart++
		}
		value = avail[vstart:end]
	}
	switch string(name) {
	case "data":
		*hasData = true
		r.spans = append(r.spans, span{vstart, end, value != nil})
	case "event":
		ev.Name = string(value)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			ev.ID = string(value)
		}
	}
}

// finish cuts the current event, n bytes long, off the buffer.
func (r *Reader) finish(ev Event, n int, hasData bool) Event {
	ev.Raw = make([]byte, n)
	copy(ev.Raw, r.buf[r.off:r.off+n])
	r.off += n
	if r.off == len(r.buf) {
		r.buf, r.off = r.buf[:0], 0
	}
	if !hasData {
		return ev
	}
	if len(r.spans) == 1 {
		s := r.spans[0]
		ev.Data = ev.Raw[s.start:s.end:s.end]
		if s.colon {
			ev.dataAt = s.start + 1
		}
		return ev
	}
	size := len(r.spans) - 1
	for _, s := range r.spans {
		size += s.end - s.start
	}
	ev.Data = make([]byte, 0, size)
	for i, s := range r.spans {
		if i > 0 {
			ev.Data = append(ev.Data, '\n')
		}
		ev.Data = append(ev.Data, ev.Raw[s.start:s.end]...)
	}
	return ev
}

// fill reads more bytes into the buffer, compacting or growing it first.
func (r *Reader) fill() {
	if r.off > 0 {
		n := copy(r.buf, r.buf[r.off:])
		r.buf, r.off = r.buf[:n], 0
	}
	if cap(r.buf)-len(r.buf) < 512 {
		nb := make([]byte, len(r.buf), 2*cap(r.buf)+4096)
		copy(nb, r.buf)
		r.buf = nb
	}
	for tries := 0; tries < 100; tries++ {
		n, err := r.r.Read(r.buf[len(r.buf):cap(r.buf)])
		if n < 0 || n > cap(r.buf)-len(r.buf) {
			r.err = fmt.Errorf("sse: invalid read count %d", n)
			return
		}
		r.buf = r.buf[:len(r.buf)+n]
		if err != nil {
			r.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.err = io.ErrNoProgress
}
