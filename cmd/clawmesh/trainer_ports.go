package main

import (
	"net"

	ma "github.com/multiformats/go-multiaddr"
)

// checkTrainerAddrs tries, before the trainer sets anything up, each
// address it is told to listen on: every --p2p-listen multiaddr (TCP, or
// UDP for QUIC) and the --weights UDP address ("off": none). One taken, or
// not this machine's, is an error naming it and the flag that picks
// another. A multiaddr that is not an IP address and a TCP or UDP port
// (a DNS name, a relay) is left to libp2p, which says what is wrong.
func checkTrainerAddrs(p2p []string, weights string) error {
	for _, s := range p2p {
		network, addr, ok := multiaddrListen(s)
		if !ok {
			continue
		}
		if err := tryListen(network, addr); err != nil {
			return addrError(err, "the libp2p", "trainer", s, "p2p-listen")
		}
	}
	if weights != "off" {
		if err := tryListen("udp", weights); err != nil {
			return addrError(err, "the weights service", "trainer", weights, "weights")
		}
	}
	return nil
}

// multiaddrListen is the network ("tcp", "udp") and host:port a libp2p
// multiaddr listens on (/ip4/A/tcp/P, /ip6/A/udp/P/quic-v1, ...).
func multiaddrListen(s string) (network, addr string, ok bool) {
	m, err := ma.NewMultiaddr(s)
	if err != nil || len(m) < 2 {
		return "", "", false
	}
	ip, port := m[0], m[1]
	if c := ip.Protocol().Code; c != ma.P_IP4 && c != ma.P_IP6 {
		return "", "", false
	}
	switch port.Protocol().Code {
	case ma.P_TCP:
		network = "tcp"
	case ma.P_UDP:
		network = "udp"
	default:
		return "", "", false
	}
	return network, net.JoinHostPort(ip.Value(), port.Value()), true
}

// tryListen listens on addr and lets it go at once.
func tryListen(network, addr string) error {
	if network == "tcp" {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return err
		}
		return ln.Close()
	}
	pc, err := net.ListenPacket(network, addr)
	if err != nil {
		return err
	}
	return pc.Close()
}
