package raftnet

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/clawmesh/clawmesh/mesh"
)

// fuzzHost is the part of a mesh.Host a Layer uses: it keeps the handler
// New registers, and NewStream returns a stream that records what raft
// writes to it and reads nothing.
type fuzzHost struct {
	mesh.Host // the rest: unused
	handler   mesh.StreamHandler
	mu        sync.Mutex
	sent      bytes.Buffer
}

func (h *fuzzHost) ID() mesh.PeerID                        { return "fuzz-local" }
func (h *fuzzHost) Handle(_ string, fn mesh.StreamHandler) { h.handler = fn }
func (h *fuzzHost) write(b []byte)                         { h.mu.Lock(); h.sent.Write(b); h.mu.Unlock() }
func (h *fuzzHost) Connect(context.Context, []string) (mesh.PeerID, error) {
	return "", errors.New("fuzz: no network")
}

func (h *fuzzHost) NewStream(context.Context, mesh.PeerID, string) (mesh.Stream, error) {
	return newFuzzStream(nil, h.write), nil
}

// take returns what was written since the last take.
func (h *fuzzHost) take() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := bytes.Clone(h.sent.Bytes())
	h.sent.Reset()
	return b
}

// fuzzStream reads its bytes, then io.EOF; it hands what is written to
// write (if set); done is closed once it is closed or reset.
type fuzzStream struct {
	r     *bytes.Reader
	write func([]byte)
	once  sync.Once
	done  chan struct{}
}

func newFuzzStream(b []byte, write func([]byte)) *fuzzStream {
	return &fuzzStream{r: bytes.NewReader(b), write: write, done: make(chan struct{})}
}

func (s *fuzzStream) Read(b []byte) (int, error) { return s.r.Read(b) }
func (s *fuzzStream) Write(b []byte) (int, error) {
	if s.write != nil {
		s.write(b)
	}
	return len(b), nil
}
func (s *fuzzStream) Close() error                     { s.once.Do(func() { close(s.done) }); return nil }
func (s *fuzzStream) CloseWrite() error                { return nil }
func (s *fuzzStream) Reset() error                     { return s.Close() }
func (s *fuzzStream) SetDeadline(time.Time) error      { return nil }
func (s *fuzzStream) SetReadDeadline(time.Time) error  { return nil }
func (s *fuzzStream) SetWriteDeadline(time.Time) error { return nil }
func (s *fuzzStream) RemotePeer() mesh.PeerID          { return "fuzz-remote" }

// rpcSeeds are the bytes raft's transport sends for each kind of RPC, as a
// peer's stream carries them.
func rpcSeeds(t testing.TB) [][]byte {
	h := &fuzzHost{}
	tr := NewTransport(New(h, nil), TransportOptions{Timeout: time.Second})
	defer tr.Close()
	id, addr := raft.ServerID("fuzz-remote"), raft.ServerAddress("fuzz-remote")
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("fuzz-local"), Addr: []byte("fuzz-local")}
	var seeds [][]byte
	// Each fails once the request is sent: the stream answers nothing.
	tr.AppendEntries(id, addr, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 3, PrevLogEntry: 1, PrevLogTerm: 1,
		Entries: []*raft.Log{{Index: 2, Term: 3, Type: raft.LogCommand, Data: []byte("entry")}}, LeaderCommitIndex: 1}, &raft.AppendEntriesResponse{})
	seeds = append(seeds, h.take())
	tr.AppendEntries(id, addr, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 3}, &raft.AppendEntriesResponse{}) // a heartbeat
	seeds = append(seeds, h.take())
	tr.RequestVote(id, addr, &raft.RequestVoteRequest{RPCHeader: hdr, Term: 4, LastLogIndex: 2, LastLogTerm: 3}, &raft.RequestVoteResponse{})
	seeds = append(seeds, h.take())
	tr.RequestPreVote(id, addr, &raft.RequestPreVoteRequest{RPCHeader: hdr, Term: 4, LastLogIndex: 2, LastLogTerm: 3}, &raft.RequestPreVoteResponse{})
	seeds = append(seeds, h.take())
	tr.TimeoutNow(id, addr, &raft.TimeoutNowRequest{RPCHeader: hdr}, &raft.TimeoutNowResponse{})
	seeds = append(seeds, h.take())
	tr.InstallSnapshot(id, addr, &raft.InstallSnapshotRequest{RPCHeader: hdr, SnapshotVersion: raft.SnapshotVersionMax, Term: 4,
		LastLogIndex: 2, LastLogTerm: 3, Size: 4}, &raft.InstallSnapshotResponse{}, bytes.NewReader([]byte("snap")))
	seeds = append(seeds, h.take())
	return seeds
}

// FuzzTransportRPC: whatever bytes a peer's raft stream carries, the
// transport over a Layer decodes them without panicking, hands the RPCs it
// decodes to raft, and closes the stream once its bytes run out.
func FuzzTransportRPC(f *testing.F) {
	for _, s := range rpcSeeds(f) {
		if len(s) == 0 {
			f.Fatal("a seed RPC wrote nothing")
		}
		f.Add(s)
		f.Add(append(bytes.Clone(s), s...)) // two on one stream
		f.Add(s[:len(s)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{0xff})
	f.Add([]byte{0, 0xdf, 0xff, 0xff, 0xff, 0xff}) // a huge map
	f.Fuzz(func(t *testing.T, b []byte) {
		h := &fuzzHost{}
		tr := NewTransport(New(h, nil), TransportOptions{Timeout: time.Second})
		defer tr.Close()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case rpc := <-tr.Consumer():
					rpc.Respond(nil, errors.New("fuzz: refused"))
				case <-stop:
					return
				}
			}
		}()
		s := newFuzzStream(b, nil)
		h.handler(s)
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Fatal("the transport did not close a stream whose bytes ran out")
		}
	})
}
