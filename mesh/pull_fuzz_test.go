package mesh

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"
)

// FuzzPullReply: no reply to a pull makes the puller panic, it accepts a
// body only of the size announced, and the memory the body takes follows
// the bytes that came, whatever size the reply declares.
func FuzzPullReply(f *testing.F) {
	msg := func(v any, body string) []byte {
		b, _ := json.Marshal(v)
		return append(append(binary.AppendUvarint(nil, uint64(len(b))), b...), body...)
	}
	f.Add(msg(pullReply{Status: "ok", Size: 5}, "hello"), int64(5))
	f.Add(msg(pullReply{Status: "ok", Size: 32 << 20}, "a few bytes"), int64(32<<20))
	f.Add(msg(pullReply{Status: "not_found"}, ""), int64(5))
	f.Add(msg(pullReply{Status: "refused", Error: "no"}, ""), int64(5))
	f.Add(msg(pullReply{Status: "ok", Size: -1}, ""), int64(5))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, int64(1))
	f.Fuzz(func(t *testing.T, b []byte, announced int64) {
		const maxSize = 32 << 20
		man := Manifest{Size: announced}
		br := bufio.NewReader(bytes.NewReader(b))
		size, err := readPullReply(br, man, maxSize)
		if err != nil {
			return
		}
		if size != announced || size <= 0 || size > maxSize {
			t.Fatalf("accepted a body of %d bytes, announced %d", size, announced)
		}
		var st PullStats
		m := &Mesh{cfg: Config{Stall: time.Second}}
		buf, err := m.readBody(nopStream{}, br, size, &st)
		if err == nil && int64(len(buf)) != size {
			t.Fatalf("read %d bytes of %d", len(buf), size)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("reading from memory: %v", err)
		}
		if most := 2*firstRead + 4*int64(len(b)); st.Allocated.Load() > most {
			t.Fatalf("%d bytes in, %d allocated (declared %d)", len(b), st.Allocated.Load(), size)
		}
	})
}

// nopStream is a Stream whose deadlines and resets do nothing.
type nopStream struct{ io.ReadWriteCloser }

func (nopStream) CloseWrite() error                { return nil }
func (nopStream) Reset() error                     { return nil }
func (nopStream) SetDeadline(time.Time) error      { return nil }
func (nopStream) SetReadDeadline(time.Time) error  { return nil }
func (nopStream) SetWriteDeadline(time.Time) error { return nil }
func (nopStream) RemotePeer() PeerID               { return "" }
