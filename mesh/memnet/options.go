package memnet

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Defaults for the zero values of Options.
const (
	// DefaultStreamBuffer is how many bytes a stream holds in each
	// direction before its writer blocks: yamux's initial window.
	DefaultStreamBuffer = 256 << 10
	// DefaultMaxMessage bounds one gossip message, as mesh/p2p's default.
	DefaultMaxMessage = 64 << 10
	// DefaultSeenTTL is how long a host remembers a gossip message it has
	// seen: go-libp2p-pubsub's default.
	DefaultSeenTTL = 2 * time.Minute
	// TopicBuffer is how many received messages a Topic holds for Next;
	// beyond it new ones are dropped, as in mesh/p2p.
	TopicBuffer = 256
)

// Options configure a Network. The zero value of every field means its
// default.
type Options struct {
	// Seed seeds every random draw (see the package comment).
	Seed uint64
	// Latency and Jitter delay each stream opened (before the peer's
	// handler gets it) and each gossip message on each hop, by Latency
	// plus a draw in [0, Jitter). Zero: no delay.
	Latency, Jitter time.Duration
	// Drop is the probability that a gossip message is lost on a link,
	// for every link SetDrop does not set. Streams are reliable.
	Drop float64
	// StreamBuffer is how many bytes a stream holds in each direction
	// before its writer blocks; default DefaultStreamBuffer.
	StreamBuffer int
	// MaxMessage bounds one gossip message's data; default
	// DefaultMaxMessage.
	MaxMessage int
	// SeenTTL is how long a host remembers a gossip message, so that it
	// delivers and forwards it only once; default DefaultSeenTTL.
	SeenTTL time.Duration
	// Logger receives the network's logs; default: none.
	Logger *slog.Logger
}

// Validate reports the first invalid field, wrapping ErrOptions.
func (o *Options) Validate() error {
	switch {
	case o.Latency < 0 || o.Jitter < 0:
		return fmt.Errorf("%w: negative Latency %s or Jitter %s", ErrOptions, o.Latency, o.Jitter)
	case !(o.Drop >= 0 && o.Drop <= 1):
		return fmt.Errorf("%w: Drop %v is not a probability", ErrOptions, o.Drop)
	case o.StreamBuffer < 0:
		return fmt.Errorf("%w: negative StreamBuffer %d", ErrOptions, o.StreamBuffer)
	case o.MaxMessage < 0:
		return fmt.Errorf("%w: negative MaxMessage %d", ErrOptions, o.MaxMessage)
	case o.SeenTTL < 0:
		return fmt.Errorf("%w: negative SeenTTL %s", ErrOptions, o.SeenTTL)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.StreamBuffer == 0 {
		o.StreamBuffer = DefaultStreamBuffer
	}
	if o.MaxMessage == 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.SeenTTL == 0 {
		o.SeenTTL = DefaultSeenTTL
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// HostOptions configure a Host. Every field may be left zero.
type HostOptions struct {
	// Key is the host's identity: its id is the libp2p peer id of the
	// key's public half, as mesh/p2p's, so that the mesh's certificates
	// verify against it. If both Key and ID are empty, the Network makes a
	// key (NewKey) and Host.Key returns it.
	Key ed25519.PrivateKey
	// ID names a host without a key: any text without '/' or white
	// space. If Key is set too, it must be the key's id.
	ID mesh.PeerID
	// Gate decides admission (mesh.Gate). Nil admits every peer and
	// blocks none.
	Gate mesh.Gate
	// Open are the protocols any connected peer may open; every other
	// protocol is for admitted peers only.
	Open []string
	// NewAddr gives the host a fresh address (a port of the system's
	// choosing, as `clawmesh join` listens on), which peers that knew
	// the id's usual address do not know. By default a host listens at
	// its id's usual address, the same every time (a device on a fixed
	// port, restarted).
	NewAddr bool
}

// validID reports whether id can name a host: it must fit in an address
// (…/p2p/<id>) and a log line.
func validID(id mesh.PeerID) error {
	if id == "" || strings.ContainsAny(string(id), "/ \t\r\n") {
		return fmt.Errorf("%w: %q (an id is non-empty text without '/' or white space)", ErrBadPeer, id)
	}
	return nil
}

// openGate is the Gate of a host made without one.
type openGate struct{}

func (openGate) Blocked(mesh.PeerID) bool  { return false }
func (openGate) Admitted(mesh.PeerID) bool { return true }
