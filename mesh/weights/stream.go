package weights

import (
	"io"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/clawmesh/clawmesh/mesh"
)

// ProtocolID is the weights protocol on the mesh host's streams: the same
// request and answer as on a QUIC stream, for a source the fetcher cannot
// reach over QUIC. A peer behind NAT is one: its QUIC listener is on a
// private address, while the host reaches it over a connection hole
// punching made direct. The host opens such streams only on direct
// connections, never through a relay, whose circuits carry too little
// for a bundle.
const ProtocolID = "/clawmesh/weights/1"

// stream is one request's stream, over QUIC or over the mesh host.
type stream interface {
	io.Reader
	io.Writer
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
	// closeWrite says our side is done: the peer reads io.EOF.
	closeWrite() error
	// abort ends the stream both ways at once: a refusal, an error.
	abort()
	// done frees the stream once our side is closed and what we wanted
	// read.
	done()
}

// quicStream is a stream of a QUIC connection.
type quicStream struct{ *quic.Stream }

func (s quicStream) closeWrite() error { return s.Stream.Close() }
func (s quicStream) abort()            { s.CancelWrite(statusError); s.CancelRead(0) }
func (s quicStream) done()             { s.CancelRead(0) }

// hostStream is a stream of the mesh host.
type hostStream struct{ mesh.Stream }

func (s hostStream) closeWrite() error { return s.CloseWrite() }
func (s hostStream) abort()            { s.Reset() }
func (s hostStream) done()             { s.Close() }
