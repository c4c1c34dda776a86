package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Key layout. Every key starts with a short ASCII prefix naming its space;
// the variable parts are binary so that ordering is exact.
//
//	s/<id>                              step record (or tombstone), see record.go
//	bm/<sha256>                         a message in canonical JSON
//	bt/<sha256>                         a tools list in canonical JSON
//	i/st/<state:1><time:8><id>          state index (live steps and tombstones)
//	i/se/<uvarint len><session><time:8><id>  session index (live steps)
//	i/t/<time:8><id>                    time index (live steps)
//	ob/<batch id>                       an outbox batch (JSON), see outbox.go
//	op/<batch id>                       an outbox batch's payload: its bytes as they leave
//
// <time:8> is the step time (Timings.Start) in Unix nanoseconds, big endian
// with the sign bit flipped, so byte order is time order. The id is always the
// last component, so it needs no terminator and ties in time sort by id.
var (
	prefixStep      = []byte("s/")
	prefixMsg       = []byte("bm/")
	prefixTools     = []byte("bt/")
	prefixState     = []byte("i/st/")
	prefixSession   = []byte("i/se/")
	prefixTime      = []byte("i/t/")
	prefixOutbox    = []byte("ob/")
	prefixPayload   = []byte("op/")
	prefixStepEnd   = prefixEnd(prefixStep)
	prefixMsgEnd    = prefixEnd(prefixMsg)
	prefixToolsEnd  = prefixEnd(prefixTools)
	prefixOutboxEnd = prefixEnd(prefixOutbox)
)

// hash is the content address of a blob: sha256 of its canonical JSON.
type hash [sha256.Size]byte

func stepKey(id core.StepID) []byte {
	return append(append(make([]byte, 0, len(prefixStep)+len(id)), prefixStep...), id...)
}

func blobKey(prefix []byte, h hash) []byte {
	return append(append(make([]byte, 0, len(prefix)+len(h)), prefix...), h[:]...)
}

// encodeTime maps a time to 8 bytes whose byte order is time order.
func encodeTime(dst []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(dst, timeOrd(t))
}

// Times outside what int64 nanoseconds can hold (years 1678 to 2262) are
// clamped to its ends, so the order stays monotonic.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

func timeOrd(t time.Time) uint64 {
	switch {
	case t.Before(minTime):
		t = minTime
	case t.After(maxTime):
		t = maxTime
	}
	return uint64(t.UnixNano()) ^ (1 << 63)
}

func ordTime(u uint64) time.Time { return time.Unix(0, int64(u^(1<<63))).UTC() }

func statePrefix(st core.State) []byte {
	return append(append([]byte{}, prefixState...), byte(st))
}

func stateKey(st core.State, t time.Time, id core.StepID) []byte {
	k := statePrefix(st)
	k = encodeTime(k, t)
	return append(k, id...)
}

func sessionPrefix(se core.SessionID) []byte {
	k := append([]byte{}, prefixSession...)
	k = binary.AppendUvarint(k, uint64(len(se)))
	return append(k, se...)
}

func sessionKey(se core.SessionID, t time.Time, id core.StepID) []byte {
	k := sessionPrefix(se)
	k = encodeTime(k, t)
	return append(k, id...)
}

func timeKey(t time.Time, id core.StepID) []byte {
	k := append([]byte{}, prefixTime...)
	k = encodeTime(k, t)
	return append(k, id...)
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte{}, p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < math.MaxUint8 {
			end[i]++
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}

// indexRange is the key range of one index restricted to [since, until) and
// to entries after the cursor (cursorTime, cursorID), when set.
type indexRange struct {
	lower, upper []byte
	prefixLen    int // bytes before <time:8>
}

func makeRange(prefix []byte, since, until time.Time, cursor *cursorPos) indexRange {
	r := indexRange{prefixLen: len(prefix)}
	r.lower = append([]byte{}, prefix...)
	if !since.IsZero() {
		r.lower = encodeTime(r.lower, since)
	}
	if cursor != nil {
		c := encodeTime(append([]byte{}, prefix...), cursor.t)
		c = append(append(c, cursor.id...), 0) // the immediate successor
		if string(c) > string(r.lower) {
			r.lower = c
		}
	}
	if !until.IsZero() {
		r.upper = encodeTime(append([]byte{}, prefix...), until)
	} else {
		r.upper = prefixEnd(prefix)
	}
	return r
}

type cursorPos struct {
	t  time.Time
	id core.StepID
}

// splitIndexKey extracts the time and id from an index key whose fixed prefix
// is prefixLen bytes long.
func splitIndexKey(k []byte, prefixLen int) (time.Time, core.StepID, bool) {
	if len(k) < prefixLen+8 {
		return time.Time{}, "", false
	}
	t := ordTime(binary.BigEndian.Uint64(k[prefixLen:]))
	return t, core.StepID(k[prefixLen+8:]), true
}
