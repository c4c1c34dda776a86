package node

import "testing"

// TestBrowserHost: the login URL of a gateway listening on every address
// names loopback, which a browser on this machine opens; a gateway on a
// named address keeps it.
func TestBrowserHost(t *testing.T) {
	for _, c := range []struct{ listen, want string }{
		{"0.0.0.0:8400", "127.0.0.1:8400"},
		{"[::]:8400", "localhost:8400"},
		{":8400", "127.0.0.1:8400"},
		{"127.0.0.1:8400", "127.0.0.1:8400"},
		{"localhost:8400", "localhost:8400"},
		{"[::1]:8400", "[::1]:8400"},
		{"192.168.1.20:8400", "192.168.1.20:8400"},
	} {
		if got := browserHost(c.listen); got != c.want {
			t.Errorf("browserHost(%q) = %q, want %q", c.listen, got, c.want)
		}
	}
}
