package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
)

// This file holds a small scanner that finds the byte spans of a JSON
// object's members and array's elements, and edits that splice bytes at
// those spans. encoding/json decodes values but does not say where they sit
// in the input; the gateway must add or remove a member while leaving every
// other byte of the client's or upstream's JSON as it was (field order,
// spacing, number spelling), so it edits the bytes in place.
//
// The scanner assumes its input is valid JSON (callers check, or decode the
// same bytes with encoding/json); on invalid input it returns errSyntax and
// never reads out of bounds.

var errSyntax = errors.New("wire: malformed JSON")

// member is one member of an object: the key (raw, quotes included) and the
// value spans, as offsets into the scanned bytes.
type member struct {
	keyStart, valStart, valEnd int
	key                        []byte // unquoted key, aliasing the input when it has no escapes
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the offset just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errSyntax
}

// skipValue returns the offset just past the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errSyntax
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errSyntax
	default:
		j := i
		for j < len(b) {
			c := b[j]
			if c == ',' || c == '}' || c == ']' || isSpace(c) {
				break
			}
			j++
		}
		if j == i {
			return 0, errSyntax
		}
		return j, nil
	}
}

// eachMember calls fn for every member of the object in b[start:end]
// (b[start] must be '{' after optional spaces) until fn returns false. It
// returns the offset of the object's closing brace.
func eachMember(b []byte, start int, fn func(m member) bool) (closing int, err error) {
	i := skipSpace(b, start)
	if i >= len(b) || b[i] != '{' {
		return 0, errSyntax
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i, nil
	}
	stop := false
	for i < len(b) {
		if b[i] != '"' {
			return 0, errSyntax
		}
		ks := i
		ke, err := skipString(b, i)
		if err != nil {
			return 0, err
		}
		key := b[ks+1 : ke-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if json.Unmarshal(b[ks:ke], &s) != nil {
				return 0, errSyntax
			}
			key = []byte(s)
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return 0, errSyntax
		}
		vs := skipSpace(b, i+1)
		ve, err := skipValue(b, vs)
		if err != nil {
			return 0, err
		}
		if !stop && !fn(member{keyStart: ks, valStart: vs, valEnd: ve, key: key}) {
			stop = true
		}
		i = skipSpace(b, ve)
		if i >= len(b) {
			return 0, errSyntax
		}
		if b[i] == '}' {
			return i, nil
		}
		if b[i] != ',' {
			return 0, errSyntax
		}
		i = skipSpace(b, i+1)
	}
	return 0, errSyntax
}

// eachElement calls fn with the span of every element of the array starting
// at b[start] (after optional spaces).
func eachElement(b []byte, start int, fn func(vs, ve int)) error {
	i := skipSpace(b, start)
	if i >= len(b) || b[i] != '[' {
		return errSyntax
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for i < len(b) {
		ve, err := skipValue(b, i)
		if err != nil {
			return err
		}
		fn(i, ve)
		i = skipSpace(b, ve)
		if i >= len(b) {
			return errSyntax
		}
		if b[i] == ']' {
			return nil
		}
		if b[i] != ',' {
			return errSyntax
		}
		i = skipSpace(b, i+1)
	}
	return errSyntax
}

// findMember returns the member of the object at b[start] whose key is key.
func findMember(b []byte, start int, key string) (m member, closing int, ok bool, err error) {
	closing, err = eachMember(b, start, func(x member) bool {
		if string(x.key) == key {
			m, ok = x, true
			return false
		}
		return true
	})
	return m, closing, ok, err
}

// edit replaces b[start:end] with repl.
type edit struct {
	start, end int
	repl       []byte
}

// apply returns b with the edits applied. With no edits it returns b
// itself.
func apply(b []byte, edits []edit) []byte {
	if len(edits) == 0 {
		return b
	}
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	n := len(b)
	for _, e := range edits {
		n += len(e.repl)
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, e := range edits {
		if e.start < prev {
			// An edit overlapping an earlier one is dropped.
			continue
		}
		out = append(out, b[prev:e.start]...)
		out = append(out, e.repl...)
		prev = e.end
	}
	return append(out, b[prev:]...)
}

// deletions collects the members of one object, in order, with which of
// them to remove, and turns that into edits that leave valid JSON: each run
// of removed members goes together with one comma next to it. (Edits made
// member by member cannot: two neighbours each taking "their" comma would
// take the same one.)
type deletions struct {
	members []span
	first   [8]span // the members of a small object, without a further allocation
}

// span is where a member starts and ends, and whether it goes.
type span struct {
	keyStart, valEnd int
	remove           bool
}

// add records the object's next member, to be removed or kept.
func (d *deletions) add(m member, remove bool) {
	if d.members == nil {
		d.members = d.first[:0]
	}
	d.members = append(d.members, span{keyStart: m.keyStart, valEnd: m.valEnd, remove: remove})
}

// edits appends to dst the edits removing the members marked for removal.
func (d *deletions) edits(dst []edit) []edit {
	ms := d.members
	n := len(ms)
	for i := 0; i < n; {
		if !ms[i].remove {
			i++
			continue
		}
		j := i
		for j+1 < n && ms[j+1].remove {
			j++
		}
		switch {
		case j+1 < n:
			// A kept member follows: remove up to its key, the comma with it.
			dst = append(dst, edit{start: ms[i].keyStart, end: ms[j+1].keyStart})
		case i > 0:
			// The run ends the object: remove from the kept member before it.
			dst = append(dst, edit{start: ms[i-1].valEnd, end: ms[j].valEnd})
		default:
			// Every member goes.
			dst = append(dst, edit{start: ms[0].keyStart, end: ms[j].valEnd})
		}
		i = j + 1
	}
	return dst
}

// insertMembers returns the edit adding members (each `"key":value`) at the
// end of the object whose closing brace is at b[closing], or elements (each
// a value) at the end of the array whose closing bracket is there.
func insertMembers(b []byte, closing int, members ...string) edit {
	i := closing - 1
	for i >= 0 && isSpace(b[i]) {
		i--
	}
	var repl []byte
	for k, m := range members {
		// No comma right after the opening brace or bracket: no value can
		// end in either, so that is an empty object or array.
		if k > 0 || (i >= 0 && b[i] != '{' && b[i] != '[') {
			repl = append(repl, ',')
		}
		repl = append(repl, m...)
	}
	// Insert right after the last value, so the object's own trailing spaces
	// stay before the brace.
	return edit{start: i + 1, end: i + 1, repl: repl}
}

// isNull reports whether b[vs:ve] is the literal null.
func isNull(b []byte, vs, ve int) bool { return string(b[vs:ve]) == "null" }

// isTrue reports whether b[vs:ve] is the literal true.
func isTrue(b []byte, vs, ve int) bool { return string(b[vs:ve]) == "true" }
