package weights

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// Holdings is what a server serves: the bundles a peer holds.
type Holdings interface {
	// Open returns the manifest and bytes of the bundle with that SHA-256;
	// a zero id asks for the newest version held. If the reader is an
	// io.Closer, the server closes it when done.
	Open(bundle [sha256.Size]byte) (*chunks.Manifest, io.ReaderAt, bool)
}

// inMemory is an optional capability of the reader Holdings.Open returns:
// the bundle's bytes in memory (a mapped file), which the server hands to
// its stream without copying them into a buffer first. The reader may
// also be an io.Closer, which the server closes once it is done with it.
type inMemory interface {
	// Bytes returns n bytes at off, or false if it cannot.
	Bytes(off int64, n int) ([]byte, bool)
}

// Gate says which peers may fetch: those admitted to the mesh.
type Gate interface {
	Admitted(mesh.PeerID) bool
}

// ServerConfig configures a Server.
type ServerConfig struct {
	Key      ed25519.PrivateKey // the peer's identity key
	Gate     Gate
	Holdings Holdings
	Logger   *slog.Logger
	// WriteTimeout bounds each write to a fetcher that stopped reading
	// (default 30s).
	WriteTimeout time.Duration
	// Metrics, if set, counts the bytes served.
	Metrics *Metrics
	// MaxServing is how many chunk requests the server serves at once
	// (default 4); one more is answered busy at once, and its fetcher
	// asks another source, or this one a little later. A holder so takes
	// a few fetchers at a time at full speed, and the others spread over
	// the peers that fetched before them.
	MaxServing int
}

// Server serves the bundles a peer holds over QUIC to the mesh's admitted
// peers, and, through ServeStream, over the mesh host's streams.
type Server struct {
	cfg ServerConfig
	id  *identity
	ln  *quic.Listener
	log *slog.Logger

	serving chan struct{} // a slot per chunk request being served
	busy    atomic.Int64  // requests answered busy

	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[*quic.Conn]struct{}
	streams map[mesh.Stream]struct{} // the mesh host's, being served
	closed  bool
}

// Listen starts a server on a UDP address ("127.0.0.1:0").
func Listen(addr string, cfg ServerConfig) (*Server, error) {
	if cfg.Gate == nil || cfg.Holdings == nil {
		return nil, errors.New("weights: a server needs a Gate and Holdings")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.MaxServing <= 0 {
		cfg.MaxServing = 4
	}
	id, err := newIdentity(cfg.Key)
	if err != nil {
		return nil, err
	}
	tc, err := id.config("")
	if err != nil {
		return nil, err
	}
	// Each connection gets its own config: libp2p's check is single-use.
	tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return id.config("") }
	ln, err := quic.ListenAddr(addr, tc, quicConfig())
	if err != nil {
		return nil, fmt.Errorf("weights: listen %s: %w", addr, err)
	}
	s := &Server{cfg: cfg, id: id, ln: ln, log: cfg.Logger.With("component", "weights"), conns: map[*quic.Conn]struct{}{}, streams: map[mesh.Stream]struct{}{},
		serving: make(chan struct{}, cfg.MaxServing)}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the UDP address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// ID is the server's peer id.
func (s *Server) ID() mesh.PeerID { return s.id.id }

// Close stops the server and ends its connections.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.CloseWithError(0, "closing")
	}
	for st := range s.streams {
		st.Reset()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept(context.Background())
		if err != nil {
			return
		}
		p, err := remotePeer(c)
		if err != nil || !s.cfg.Gate.Admitted(p) {
			s.log.Debug("refused a weights connection", "peer", p, "err", err)
			c.CloseWithError(1, "not admitted")
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.CloseWithError(0, "closing")
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c, p)
	}
}

func (s *Server) serveConn(c *quic.Conn, p mesh.PeerID) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	var streams sync.WaitGroup
	defer streams.Wait()
	for {
		st, err := c.AcceptStream(context.Background())
		if err != nil {
			return
		}
		if !s.cfg.Gate.Admitted(p) { // revoked since it connected
			c.CloseWithError(1, "not admitted")
			return
		}
		streams.Add(1)
		go func() {
			defer streams.Done()
			s.serveStream(quicStream{st}, p)
		}()
	}
}

// ServeStream serves one request that came on a stream of the mesh host
// (ProtocolID), from a fetcher that could not reach the QUIC listener. It
// owns the stream; a peer that is not admitted is refused.
func (s *Server) ServeStream(st mesh.Stream) {
	p := st.RemotePeer()
	s.mu.Lock()
	if s.closed || !s.cfg.Gate.Admitted(p) {
		s.mu.Unlock()
		s.log.Debug("refused a weights stream", "peer", p)
		st.Reset()
		return
	}
	s.streams[st] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, st)
		s.mu.Unlock()
		s.wg.Done()
	}()
	s.serveStream(hostStream{st}, p)
}

func (s *Server) serveStream(st stream, p mesh.PeerID) {
	defer func() {
		st.closeWrite()
		st.done()
	}()
	st.SetReadDeadline(time.Now().Add(s.cfg.WriteTimeout))
	q, err := readRequest(st)
	if err != nil {
		s.refuse(st, statusBad, err.Error())
		return
	}
	st.SetReadDeadline(time.Time{})
	m, r, ok := s.cfg.Holdings.Open(q.Bundle)
	if !ok {
		s.refuse(st, statusNotFound, "no such bundle here")
		return
	}
	if c, ok := r.(io.Closer); ok {
		defer c.Close()
	}
	mem, _ := r.(inMemory)
	w := bufio.NewWriterSize(st, 64<<10)
	switch q.Op {
	case opManifest:
		b := appendStatus(nil, statusOK, "")
		s.write(st, w, wire.AppendBytes(b, m.Marshal()))
	case opChunks:
		if uint64(q.First)+uint64(q.Count) > uint64(len(m.Chunks)) {
			s.refuse(st, statusBad, fmt.Sprintf("chunks %d..%d of %d", q.First, q.First+q.Count, len(m.Chunks)))
			return
		}
		select {
		case s.serving <- struct{}{}:
			defer func() { <-s.serving }()
		default:
			s.busy.Add(1)
			s.refuse(st, statusBusy, fmt.Sprintf("serving %d requests", cap(s.serving)))
			return
		}
		if !s.write(st, w, []byte{statusOK}) {
			return
		}
		var buf []byte
		for i := int(q.First); i < int(q.First+q.Count); i++ {
			off, n := m.Chunk(i)
			chunk, ok := []byte(nil), false
			if mem != nil {
				chunk, ok = mem.Bytes(off, n)
			}
			if !ok {
				if buf == nil {
					buf = make([]byte, m.ChunkSize)
				}
				if _, err := r.ReadAt(buf[:n], off); err != nil {
					s.log.Warn("reading a held bundle", "version", m.Name(), "bundle", core.ShortHash(m.BundleID()), "chunk", i, "err", err)
					st.abort()
					return
				}
				chunk = buf[:n]
			}
			if !s.write(st, w, appendChunkHeader(nil, i, n)) {
				return
			}
			// The chunk goes straight to the stream, not through w's buffer.
			if w.Flush() != nil {
				st.abort()
				return
			}
			st.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if _, err := st.Write(chunk); err != nil {
				st.abort()
				return
			}
			s.cfg.Metrics.serve(n)
		}
	}
	st.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if err := w.Flush(); err != nil {
		st.abort()
	}
	s.log.Debug("served", "peer", p, "op", q.Op, "first", q.First, "count", q.Count)
}

func (s *Server) write(st stream, w *bufio.Writer, b []byte) bool {
	st.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if _, err := w.Write(b); err != nil {
		st.abort()
		return false
	}
	return true
}

func (s *Server) refuse(st stream, status byte, msg string) {
	st.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	st.Write(appendStatus(nil, status, msg))
}
