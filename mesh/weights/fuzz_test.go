package weights

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

func FuzzFrames(f *testing.F) {
	w := newWorld(f)
	m := w.manifest(f, make([]byte, 3*chunks.ChunkSize), 1, 1, 1)
	f.Add(request{Op: opChunks, First: 1, Count: 2}.marshal())
	f.Add(request{Op: opManifest}.marshal())
	f.Add(appendChunkHeader(nil, 0, chunks.ChunkSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := readRequest(bytes.NewReader(b)); err == nil {
			if q.Op == opChunks && (q.Count == 0 || q.Count > chunks.MaxPerRequest) {
				t.Fatalf("a request for %d chunks decoded", q.Count)
			}
			if q2, err := readRequest(bytes.NewReader(q.marshal())); err != nil || q2 != q {
				t.Fatalf("a request does not survive re-encoding: %+v, %+v, %v", q, q2, err)
			}
		}
		r := bufio.NewReader(bytes.NewReader(b))
		readStatus(r)
		readChunkHeader(bufio.NewReader(bytes.NewReader(b)), m, 1)
		if o, err := parseOffer(b); err == nil && !bytes.Equal(o.marshal(), b) {
			t.Fatal("an offer that decodes re-encodes differently")
		}
	})
}
