package mesh

import (
	"fmt"
	"slices"
	"testing"
)

func TestInviteAddrs(t *testing.T) {
	got := InviteAddrs([]string{"/ip4/127.0.0.1/tcp/1", "/ip4/192.0.2.7/tcp/1", "/ip6/::1/tcp/1", "/ip6/2001:db8::1/udp/1/quic-v1"})
	want := []string{"/ip4/192.0.2.7/tcp/1", "/ip6/2001:db8::1/udp/1/quic-v1", "/ip4/127.0.0.1/tcp/1", "/ip6/::1/tcp/1"}
	if !slices.Equal(got, want) {
		t.Fatalf("InviteAddrs = %q, want %q", got, want)
	}
	var many []string
	for i := range 12 {
		many = append(many, fmt.Sprintf("/ip4/127.0.0.%d/tcp/1", i+1))
	}
	many = append(many, "/ip4/198.51.100.1/tcp/1")
	if got := InviteAddrs(many); len(got) != 8 || got[0] != "/ip4/198.51.100.1/tcp/1" {
		t.Fatalf("of 13 addresses kept %d, first %q: want 8, the reachable one first", len(got), got[0])
	}
	if got := InviteAddrs(nil); len(got) != 0 {
		t.Fatalf("no addresses gave %q", got)
	}
}
