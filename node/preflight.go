package node

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/reward"
)

// Preflight checks, before anything is made or opened, what would stop New
// later: the config, an upstream that is the gateway itself (every call
// would loop back into it), and the files of the enabled reward plugins.
// New runs it first; a command may run it before it makes the data
// directory or binds the gateway's address.
func Preflight(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	if selfUpstream(ctx, cfg.Upstream, listen) {
		return fmt.Errorf("%w: upstream %s is this node's own gateway (listen %s): every call would come back to it; point the upstream at the LLM server", ErrConfig, cfg.Upstream, listen)
	}
	if !cfg.NoScoring && cfg.Plugins != nil {
		if err := reward.Check(cfg.Plugins, true); err != nil {
			return fmt.Errorf("node: reward plugins: %w", err)
		}
	}
	return nil
}

// selfUpstream reports whether upstream, a URL, reaches the gateway that
// listens on listen: the same port, on an address of this host that the
// listener answers on (127.0.0.1, localhost, [::1] and 0.0.0.0 count as
// one). A host name is looked up, for a second at most.
func selfUpstream(ctx context.Context, upstream, listen string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	lookup := func(host string) []net.IP {
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return nil
		}
		ips := make([]net.IP, len(addrs))
		for i, a := range addrs {
			ips[i] = a.IP
		}
		return ips
	}
	return pointsAt(upstream, listen, lookup, localIPs)
}

// localIPs are this host's interface addresses.
func localIPs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips
}

// pointsAt is selfUpstream with the lookups given: lookup resolves a host
// name, local lists this host's addresses.
func pointsAt(upstream, listen string, lookup func(string) []net.IP, local func() []net.IP) bool {
	u, err := url.Parse(upstream)
	if err != nil || u.Hostname() == "" {
		return false
	}
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	uport := u.Port()
	if uport == "" {
		uport = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if uport != lport || lport == "0" {
		return false
	}
	ips := func(host string) []net.IP {
		switch {
		case host == "":
			return []net.IP{net.IPv4zero}
		case strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost"):
			return []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		if ip := net.ParseIP(host); ip != nil {
			return []net.IP{ip}
		}
		return lookup(host)
	}
	isLocal := func(ip net.IP) bool {
		if ip.IsLoopback() || ip.IsUnspecified() {
			return true
		}
		for _, l := range local() {
			if l.Equal(ip) {
				return true
			}
		}
		return false
	}
	// The loopback and unspecified addresses are one: a call to any of
	// them reaches a listener on any of them (near enough: a listener on
	// 127.0.0.1 does not answer [::1], but nothing else should be on the
	// gateway's port there either).
	same := func(l, u net.IP) bool {
		switch {
		case l.Equal(u):
			return true
		case (l.IsLoopback() || l.IsUnspecified()) && (u.IsLoopback() || u.IsUnspecified()):
			return true
		case l.IsUnspecified():
			return isLocal(u) // a listener on every address
		case u.IsUnspecified():
			return isLocal(l) // 0.0.0.0 reaches this host
		}
		return false
	}
	for _, l := range ips(lhost) {
		for _, ui := range ips(u.Hostname()) {
			if same(l, ui) {
				return true
			}
		}
	}
	return false
}
