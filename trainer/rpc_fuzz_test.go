package trainer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"sync/atomic"
	"testing"
)

// FuzzReadRequest: no bytes a trainer sends make the reading of a request
// and its payload panic, and the memory it takes follows the bytes that
// came, whatever size the request declares.
func FuzzReadRequest(f *testing.F) {
	frame := func(v any, payload string) []byte {
		b, _ := json.Marshal(v)
		return append(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...), payload...)
	}
	f.Add(frame(request{Op: opHold, Hash: "00", Size: 3}, "abc"))
	f.Add(frame(request{Op: opDelta, Round: 2, Size: maxPayload}, "a few bytes"))
	f.Add(frame(request{Op: opBatch, Size: maxPayload + 1}, ""))
	f.Add(frame(request{Op: opJoin, Size: -1}, ""))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, '{'})
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		var req request
		if err := readFrame(r, &req); err != nil {
			return
		}
		var alloc atomic.Int64
		p, err := readPayload(r, req.Size, &alloc)
		if err == nil && int64(len(p)) != req.Size {
			t.Fatalf("a payload of %d bytes read for %d declared", len(p), req.Size)
		}
		if most := 2*firstRead + 4*int64(len(b)); alloc.Load() > most {
			t.Fatalf("%d bytes in, %d allocated (declared %d)", len(b), alloc.Load(), req.Size)
		}
	})
}
