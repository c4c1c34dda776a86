package weights

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// The protocol on each QUIC stream: the fetcher writes one request and
// closes its side; the server answers with a status byte, then, for a
// manifest, its length and bytes, or, for chunks, each chunk's index,
// length and bytes in order. A status other than statusOK is followed by
// a message (length and text).
const (
	protoVersion = 1

	opManifest = 1 // bundle id (zero: the newest version held)
	opChunks   = 2 // bundle id, first chunk, count

	statusOK       = 0
	statusNotFound = 1
	statusBad      = 2
	statusError    = 3
	statusBusy     = 4 // serving as many requests as it will: ask another source, or later

	maxMessage = 1024
)

// ErrFrame is a request or response that does not decode.
var ErrFrame = errors.New("weights: bad frame")

// request is what a fetcher asks on one stream.
type request struct {
	Op     byte
	Bundle [sha256.Size]byte
	First  uint32
	Count  uint32
}

func (q request) marshal() []byte {
	b := []byte{protoVersion, q.Op}
	b = append(b, q.Bundle[:]...)
	if q.Op == opChunks {
		b = binary.AppendUvarint(b, uint64(q.First))
		b = binary.AppendUvarint(b, uint64(q.Count))
	}
	return b
}

// readRequest decodes a request; it reads at most what a request can be.
func readRequest(r io.Reader) (request, error) {
	var q request
	br := bufio.NewReaderSize(io.LimitReader(r, 2+sha256.Size+2*binary.MaxVarintLen32), 64)
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return q, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	if head[0] != protoVersion {
		return q, fmt.Errorf("%w: protocol version %d", ErrFrame, head[0])
	}
	q.Op = head[1]
	if q.Op != opManifest && q.Op != opChunks {
		return q, fmt.Errorf("%w: op %d", ErrFrame, q.Op)
	}
	if _, err := io.ReadFull(br, q.Bundle[:]); err != nil {
		return q, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	if q.Op == opManifest {
		return q, nil
	}
	first, err := binary.ReadUvarint(br)
	if err != nil || first > chunks.MaxBundle/chunks.ChunkSize {
		return q, fmt.Errorf("%w: first chunk", ErrFrame)
	}
	count, err := binary.ReadUvarint(br)
	if err != nil || count == 0 || count > chunks.MaxPerRequest {
		return q, fmt.Errorf("%w: chunk count", ErrFrame)
	}
	q.First, q.Count = uint32(first), uint32(count)
	return q, nil
}

// remoteError is a refusal the server sent.
type remoteError struct {
	status byte
	msg    string
}

func (e *remoteError) Error() string {
	what := "error"
	switch e.status {
	case statusNotFound:
		what = "not found"
	case statusBad:
		what = "bad request"
	case statusBusy:
		what = "busy"
	}
	return fmt.Sprintf("weights: the source answered %s: %s", what, e.msg)
}

func appendStatus(b []byte, status byte, msg string) []byte {
	b = append(b, status)
	if status != statusOK {
		if len(msg) > maxMessage {
			msg = msg[:maxMessage]
		}
		b = wire.AppendString(b, msg)
	}
	return b
}

// readStatus reads a response's status; a refusal comes back as a
// *remoteError.
func readStatus(r *bufio.Reader) error {
	s, err := r.ReadByte()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFrame, err)
	}
	if s == statusOK {
		return nil
	}
	msg, err := readBlob(r, maxMessage)
	if err != nil {
		return err
	}
	return &remoteError{status: s, msg: string(msg)}
}

// readBlob reads a length-prefixed blob of at most max bytes.
func readBlob(r *bufio.Reader, max int) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("%w: length: %w", ErrFrame, err)
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, n, max)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	return b, nil
}

// readChunkHeader reads the index and length that precede a chunk's bytes,
// and checks them against what was asked: chunks come in order, each of
// the length the manifest gives it.
func readChunkHeader(r *bufio.Reader, m *chunks.Manifest, want int) error {
	i, err := binary.ReadUvarint(r)
	if err != nil {
		return fmt.Errorf("%w: chunk index: %w", ErrFrame, err)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return fmt.Errorf("%w: chunk length: %w", ErrFrame, err)
	}
	if i != uint64(want) {
		return fmt.Errorf("%w: chunk %d where %d was due", ErrFrame, i, want)
	}
	if _, size := m.Chunk(want); n != uint64(size) {
		return fmt.Errorf("%w: chunk %d of %d bytes, not %d", ErrFrame, i, n, size)
	}
	return nil
}

func appendChunkHeader(b []byte, i, n int) []byte {
	b = binary.AppendUvarint(b, uint64(i))
	return binary.AppendUvarint(b, uint64(n))
}
