package node

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/reward"
)

func TestPointsAt(t *testing.T) {
	lookup := func(h string) []net.IP {
		switch h {
		case "box.lan":
			return []net.IP{net.ParseIP("192.168.1.7")}
		case "model.lan":
			return []net.IP{net.ParseIP("192.168.1.9")}
		}
		return nil
	}
	local := func() []net.IP { return []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("192.168.1.7")} }
	for _, c := range []struct {
		upstream, listen string
		want             bool
	}{
		{"http://127.0.0.1:8423/v1", "127.0.0.1:8423", true},
		{"http://localhost:8423/v1", "127.0.0.1:8423", true},
		{"http://[::1]:8423/v1", "127.0.0.1:8423", true},
		{"http://0.0.0.0:8423/v1", "127.0.0.1:8423", true},
		{"http://127.0.0.1:8423/v1", "localhost:8423", true},
		{"http://127.0.0.1:8423/v1", "0.0.0.0:8423", true},
		{"http://127.0.0.1:8423/v1", ":8423", true},
		{"http://box.lan:8423/v1", ":8423", true},
		{"http://192.168.1.7:8423/v1", "192.168.1.7:8423", true},
		{"http://0.0.0.0:8423/v1", "192.168.1.7:8423", true},
		{"http://127.0.0.1/v1", "127.0.0.1:80", true},
		{"http://127.0.0.1:11434/v1", "127.0.0.1:8423", false},
		{"http://model.lan:8423/v1", ":8423", false},
		{"http://192.168.1.7:8423/v1", "127.0.0.1:8423", false},
		{"http://127.0.0.1:0/v1", "127.0.0.1:0", false},
		{"https://127.0.0.1/v1", "127.0.0.1:80", false},
		{"http://unknown.example:8423/v1", ":8423", false},
	} {
		if got := pointsAt(c.upstream, c.listen, lookup, local); got != c.want {
			t.Errorf("pointsAt(%s, %s) = %v, want %v", c.upstream, c.listen, got, c.want)
		}
	}
}

// TestPreflight: an upstream that is the gateway itself, and a plugin file
// that is missing, are refused before the data directory is made.
func TestPreflight(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	for _, cfg := range []Config{
		{DataDir: data, Upstream: "http://localhost:8423/v1", Listen: "127.0.0.1:8423"},
		{DataDir: data, Upstream: "http://127.0.0.1:8400/v1"}, // the default listen address
		{DataDir: data, Upstream: "http://127.0.0.1:9/v1", Plugins: []reward.PluginConfig{{Name: "gone", Path: filepath.Join(data, "gone.wasm"), Weight: 1, Enabled: true}}},
	} {
		_, err := New(context.Background(), cfg)
		if err == nil {
			t.Fatalf("%+v: started", cfg)
		}
		if _, serr := os.Stat(data); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("%v: the data directory was made", err)
		}
	}
	if err := Preflight(context.Background(), Config{DataDir: data, Upstream: "http://127.0.0.1:9/v1", Listen: "127.0.0.1:8423"}); err != nil {
		t.Errorf("a good config: %v", err)
	}
}
