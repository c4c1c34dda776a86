package memnet_test

import (
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clawmesh/clawmesh/mesh/memnet"
)

// TestVirtualTime: made inside a synctest bubble, the network runs on the
// bubble's clock: an hour's latency passes at once, and exactly.
func TestVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := memnet.NewNetwork(memnet.Options{Seed: 1, Latency: time.Hour})
		defer n.Close()
		a, err := n.NewHost(memnet.HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := n.NewHost(memnet.HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b.Handle(protoEcho, echo)
		ctx := context.Background()
		if _, err := a.Connect(ctx, b.Addrs()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		s, err := a.NewStream(ctx, b.ID(), protoEcho)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != time.Hour {
			t.Errorf("opening a stream took %s, want the latency, 1h", d)
		}
		s.Write([]byte("hi"))
		s.CloseWrite()
		if got, err := io.ReadAll(s); err != nil || string(got) != "hi" {
			t.Errorf("echo: %q, %v", got, err)
		}

		pub, err := a.Join("t")
		if err != nil {
			t.Fatal(err)
		}
		sub, err := b.Join("t")
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		pub.Publish(ctx, []byte("news"))
		if _, err := sub.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != time.Hour {
			t.Errorf("a gossip message took %s, want the latency, 1h", d)
		}
	})
}
