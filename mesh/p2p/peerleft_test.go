package p2p

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
)

// TestPeerLeftOnCleanClose: a stream cut because its peer closed its host
// reads an error that says the peer left (mesh.ErrPeerLeft), not a bare
// reset.
func TestPeerLeftOnCleanClose(t *testing.T) {
	o := testOptions(t, newGate(false))
	o.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	a := startHost(t, o)
	b := newTestHost(t, newGate(false))
	got := make(chan mesh.Stream, 1)
	b.Handle(openProto, func(s mesh.Stream) { got <- s })
	connect(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	s, err := a.NewStream(ctx, b.ID(), openProto)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var in mesh.Stream
	select {
	case in = <-got:
	case <-ctx.Done():
		t.Fatal("the stream did not arrive")
	}
	one := make([]byte, 1)
	if _, err := in.Read(one); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	in.SetReadDeadline(time.Now().Add(waitFor))
	_, err = in.Read(one)
	if !errors.Is(err, mesh.ErrPeerLeft) {
		t.Fatalf("read after the peer closed its host: %v, want mesh.ErrPeerLeft", err)
	}
}
