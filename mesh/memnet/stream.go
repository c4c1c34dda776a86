package memnet

import (
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// Stream is one end of a stream between two hosts: a mesh.Stream, and a
// net.Conn too. Its methods may be called concurrently.
type Stream struct {
	c      *conn
	root   *Stream // the opener's end, by which c knows the stream
	proto  string
	local  Addr
	remote Addr
	rx, tx *pipe // what we read; what we write (the peer's rx)
	rdl    deadline
	wdl    deadline
}

var (
	_ mesh.Stream = (*Stream)(nil)
	_ net.Conn    = (*Stream)(nil)
)

// Addr is a host's address as a net.Addr (for Stream's net.Conn methods).
type Addr struct {
	ID   mesh.PeerID
	Addr string // the multiaddr, ending in /p2p/<id>
}

// Network is "memnet".
func (Addr) Network() string { return "memnet" }

func (a Addr) String() string { return a.Addr }

// newStreamPair makes the two ends of a stream, from (the opener) to to.
func newStreamPair(c *conn, proto string, from, to Addr, buffer int) (local, remote *Stream) {
	ab, ba := newPipe(buffer), newPipe(buffer)
	local = &Stream{c: c, proto: proto, local: from, remote: to, rx: ba, tx: ab}
	remote = &Stream{c: c, root: local, proto: proto, local: to, remote: from, rx: ab, tx: ba}
	local.root = local
	local.rdl.init()
	local.wdl.init()
	remote.rdl.init()
	remote.wdl.init()
	return local, remote
}

// Protocol is the stream's protocol.
func (s *Stream) Protocol() string { return s.proto }

// RemotePeer is the host at the other end.
func (s *Stream) RemotePeer() mesh.PeerID { return s.remote.ID }

// LocalAddr is this host's address.
func (s *Stream) LocalAddr() net.Addr { return s.local }

// RemoteAddr is the other host's address.
func (s *Stream) RemoteAddr() net.Addr { return s.remote }

// Read reads what the peer wrote. After the peer's CloseWrite and the
// data before it, it returns io.EOF; after a reset, an error wrapping
// ErrReset; after this end's Close, ErrStreamClosed; past the read
// deadline, os.ErrDeadlineExceeded.
func (s *Stream) Read(b []byte) (int, error) {
	p := s.rx
	for {
		p.mu.Lock()
		switch {
		case p.rclosed:
			p.mu.Unlock()
			return 0, ErrStreamClosed
		case p.err != nil:
			err := p.err
			p.mu.Unlock()
			return 0, err
		case s.rdl.expired():
			p.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		case p.n > 0:
			n := p.get(b)
			if n > 0 {
				p.changed()
			}
			p.mu.Unlock()
			return n, nil
		case p.eof:
			p.mu.Unlock()
			return 0, io.EOF
		case len(b) == 0:
			p.mu.Unlock()
			return 0, nil
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-s.rdl.wait():
		}
	}
}

// Write writes b whole, blocking while the stream's buffer towards the
// peer is full. After CloseWrite or Close it returns ErrStreamClosed;
// after a reset, an error wrapping ErrReset; past the write deadline,
// os.ErrDeadlineExceeded with what was written. What is written after
// the peer closed its reading end is dropped, as yamux drops it.
func (s *Stream) Write(b []byte) (int, error) {
	p := s.tx
	n := 0
	for {
		p.mu.Lock()
		switch {
		case p.err != nil:
			err := p.err
			p.mu.Unlock()
			return n, err
		case p.eof:
			p.mu.Unlock()
			return n, ErrStreamClosed
		case s.wdl.expired():
			p.mu.Unlock()
			return n, os.ErrDeadlineExceeded
		case p.rclosed:
			p.mu.Unlock()
			return len(b), nil
		}
		if k := p.put(b[n:]); k > 0 {
			n += k
			p.changed()
		}
		if n == len(b) {
			p.mu.Unlock()
			return n, nil
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-s.wdl.wait():
		}
	}
}

// CloseWrite ends this end's writing: the peer reads io.EOF after what
// was written. After a reset it returns the reset's error.
func (s *Stream) CloseWrite() error {
	p := s.tx
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return err
	}
	if !p.eof {
		p.eof = true
		p.changed()
	}
	p.mu.Unlock()
	s.finished()
	return nil
}

// CloseRead ends this end's reading: what the peer wrote and this end has
// not read is dropped, and so is what it writes later (the peer is not
// told, as with yamux).
func (s *Stream) CloseRead() error {
	p := s.rx
	p.mu.Lock()
	if !p.rclosed {
		p.rclosed = true
		p.drop()
		p.changed()
	}
	p.mu.Unlock()
	s.finished()
	return nil
}

// Close is CloseRead and CloseWrite, as a libp2p stream's: the peer still
// reads what was written, then io.EOF. Pending reads and writes of this
// end return ErrStreamClosed.
func (s *Stream) Close() error {
	_ = s.CloseRead()
	return s.CloseWrite()
}

// Reset aborts the stream in both directions: reads and writes at both
// ends fail with ErrReset, and what was not read is lost. Resetting a
// stream this end has closed does nothing.
func (s *Stream) Reset() error {
	s.tx.mu.Lock()
	wclosed := s.tx.eof
	s.tx.mu.Unlock()
	s.rx.mu.Lock()
	rclosed := s.rx.rclosed
	s.rx.mu.Unlock()
	if wclosed && rclosed {
		return nil
	}
	s.reset(ErrReset)
	return nil
}

// reset fails both directions with err (unless they already failed).
func (s *Stream) reset(err error) {
	for _, p := range []*pipe{s.tx, s.rx} {
		p.mu.Lock()
		if p.err == nil {
			p.err = err
			p.drop()
			p.changed()
		}
		p.mu.Unlock()
	}
	s.c.remove(s.root)
}

// finished forgets the stream once both directions are done.
func (s *Stream) finished() {
	if s.tx.done() && s.rx.done() {
		s.c.remove(s.root)
	}
}

// SetDeadline sets the read and write deadlines.
func (s *Stream) SetDeadline(t time.Time) error {
	s.rdl.set(t)
	s.wdl.set(t)
	return nil
}

// SetReadDeadline makes reads pending and later fail with
// os.ErrDeadlineExceeded once t has passed; zero means none.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.rdl.set(t)
	return nil
}

// SetWriteDeadline makes writes pending and later fail with
// os.ErrDeadlineExceeded once t has passed; zero means none.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.wdl.set(t)
	return nil
}

// pipe is one direction of a stream: a ring buffer, its writer's and its
// reader's state, and a channel closed (and replaced) at every change,
// which blocked readers and writers wait on.
type pipe struct {
	mu      sync.Mutex
	size    int
	ring    []byte // made at the first write
	r, n    int    // where unread bytes start, how many
	eof     bool   // the writer closed
	rclosed bool   // the reader closed: writes are dropped
	err     error  // reset
	wake    chan struct{}
}

func newPipe(size int) *pipe { return &pipe{size: size, wake: make(chan struct{})} }

// changed wakes the goroutines waiting on p. p.mu is held.
func (p *pipe) changed() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// put copies as much of b as fits; p.mu is held.
func (p *pipe) put(b []byte) int {
	if p.ring == nil {
		p.ring = make([]byte, p.size)
	}
	total := 0
	for len(b) > 0 && p.n < p.size {
		w := (p.r + p.n) % p.size
		end := p.size
		if w < p.r {
			end = p.r
		}
		k := copy(p.ring[w:end], b)
		p.n += k
		total += k
		b = b[k:]
	}
	return total
}

// get copies unread bytes into b; p.mu is held.
func (p *pipe) get(b []byte) int {
	total := 0
	for len(b) > 0 && p.n > 0 {
		end := min(p.r+p.n, p.size)
		k := copy(b, p.ring[p.r:end])
		p.r = (p.r + k) % p.size
		p.n -= k
		total += k
		b = b[k:]
	}
	if p.n == 0 {
		p.r = 0
	}
	return total
}

// drop forgets the unread bytes and the buffer; p.mu is held.
func (p *pipe) drop() {
	p.ring, p.r, p.n = nil, 0, 0
}

// done reports a direction nothing more will go through.
func (p *pipe) done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err != nil || (p.eof && p.rclosed)
}

// deadline is a settable deadline: wait returns a channel closed once it
// has passed (as net.Pipe's).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	passed chan struct{}
}

func (d *deadline) init() { d.passed = make(chan struct{}) }

// set sets the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.passed // the timer fired: wait for it to close passed
	}
	d.timer = nil
	closed := isClosed(d.passed)
	if t.IsZero() {
		if closed {
			d.passed = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.passed = make(chan struct{})
		}
		passed := d.passed
		d.timer = time.AfterFunc(dur, func() { close(passed) })
		return
	}
	if !closed {
		close(d.passed)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.passed
}

func (d *deadline) expired() bool { return isClosed(d.wait()) }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
