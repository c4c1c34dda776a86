package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestCodecRoundTrip(t *testing.T) {
	logs := []*raft.Log{
		{Index: 1},
		{Index: math.MaxUint64, Term: math.MaxUint64, Type: 255},
		testLog(12345),
		{Index: 2, Data: make([]byte, 1<<16), AppendedAt: time.Unix(-1, 999_999_999)},
		{Index: 3, Extensions: []byte{0}, AppendedAt: time.Unix(0, 0)},
		{Index: 4, AppendedAt: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)},
		{Index: 5, AppendedAt: time.Now()},                  // with a monotonic reading and a location
		{Index: 6, AppendedAt: time.Unix(math.MaxInt64, 0)}, // beyond what time.Time holds: wraps, the same way back
	}
	for _, l := range logs {
		b := appendLog(nil, l)
		if len(b) > encodedLen(l) {
			t.Errorf("log %d: %d bytes, encodedLen %d", l.Index, len(b), encodedLen(l))
		}
		var got raft.Log
		if err := decodeLog(b, &got); err != nil {
			t.Fatalf("log %d: %v", l.Index, err)
		}
		if !sameLog(&got, l) {
			t.Fatalf("decoded %+v, want %+v", got, *l)
		}
		if again := appendLog(nil, &got); !bytes.Equal(again, b) {
			t.Fatalf("log %d: re-encoding differs", l.Index)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := appendLog(nil, testLog(300))
	cases := map[string][]byte{
		"empty":         nil,
		"version 0":     append([]byte{0}, good[1:]...),
		"version 2":     append([]byte{2}, good[1:]...),
		"trailing":      append(append([]byte{}, good...), 0),
		"overlong":      {1, 0x80, 0x00, 0, 0, 0, 0, 0},
		"overflow":      {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0},
		"long data":     {1, 1, 1, 0, 5, 'a', 'b', 0, 0},
		"time flag 2":   {1, 1, 1, 0, 0, 0, 2},
		"nanos":         append([]byte{1, 1, 1, 0, 0, 0, 1, 0}, 0x80, 0x94, 0xeb, 0xdc, 0x03), // 1e9
		"zero time set": binary.AppendUvarint(binary.AppendVarint([]byte{1, 1, 1, 0, 0, 0, 1}, time.Time{}.Unix()), 0),
	}
	// Every proper prefix of a good encoding is truncated.
	for n := range len(good) {
		cases[fmt.Sprintf("prefix %d", n)] = good[:n]
	}
	for name, b := range cases {
		var l raft.Log
		if err := decodeLog(b, &l); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decodeLog = %v, want ErrCorrupt", name, err)
		}
	}
}

// FuzzDecodeLog: decodeLog never panics, refuses with ErrCorrupt whatever
// it does not accept, and whatever it accepts re-encodes to the very same
// bytes (the encoding is canonical).
func FuzzDecodeLog(f *testing.F) {
	for _, l := range []*raft.Log{{Index: 1}, testLog(7), testLog(1 << 40), {Index: 9, AppendedAt: time.Unix(-5, 3)}} {
		b := appendLog(nil, l)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		err := decodeLog(b, &l)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if again := appendLog(nil, &l); !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, l, again)
		}
	})
}

// FuzzRoundTrip: every log encodes and decodes back to itself.
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint64(1), uint64(1), uint8(0), []byte("x"), []byte(nil), int64(0), int64(0))
	f.Add(uint64(math.MaxUint64), uint64(0), uint8(255), []byte(nil), []byte("e"), int64(1e9), int64(5))
	f.Fuzz(func(t *testing.T, index, term uint64, typ uint8, data, ext []byte, sec, nsec int64) {
		l := &raft.Log{Index: index, Term: term, Type: raft.LogType(typ), Data: data, Extensions: ext}
		if sec != 0 || nsec != 0 {
			l.AppendedAt = time.Unix(sec, nsec)
		}
		b := appendLog(nil, l)
		if len(b) > encodedLen(l) {
			t.Fatalf("%d bytes, encodedLen %d", len(b), encodedLen(l))
		}
		var got raft.Log
		if err := decodeLog(b, &got); err != nil {
			t.Fatalf("%+v: %v", *l, err)
		}
		if !sameLog(&got, l) {
			t.Fatalf("decoded %+v, want %+v", got, *l)
		}
	})
}
