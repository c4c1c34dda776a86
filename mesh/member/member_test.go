package member

import (
	"crypto/ed25519"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// t0 is the time every fixture is made at.
var t0 = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

// sentinels lists every sentinel error, to check that an error wraps the
// expected one and no other.
var sentinels = []error{ErrTampered, ErrExpired, ErrExhausted, ErrRevoked, ErrOtherMesh, ErrNotAllowed, ErrVersion}

// peer is a fixture peer: its id, signing key and certificate.
type peer struct {
	id   string
	key  ed25519.PrivateKey
	cert *Certificate
}

func (p peer) pub() ed25519.PublicKey { return p.key.Public().(ed25519.PublicKey) }

// world is one mesh, made deterministically from a seed at t0:
//
//	admin (own certificate)
//	├── inviter   member, may invite
//	│   └── invitee   member
//	├── trainer   trainer, may invite
//	│   └── helper    trainer
//	└── plain     member, may not invite
type world struct {
	tb       testing.TB
	rnd      *rand.ChaCha8
	admin    peer
	inviter  peer
	invitee  peer
	trainer  peer
	helper   peer
	plain    peer
	adminPub ed25519.PublicKey
}

func newWorld(tb testing.TB, seed byte) *world {
	tb.Helper()
	w := &world{tb: tb, rnd: rand.NewChaCha8([32]byte{seed})}
	w.admin = peer{id: peerID("admin"), key: w.key()}
	w.adminPub = w.admin.pub()
	w.admin.cert = w.issue(w.admin, w.admin.id, w.admin.pub(), CertSpec{Role: RoleAdmin, MayInvite: true})
	w.inviter = w.newPeer("inviter", w.admin, CertSpec{MayInvite: true})
	w.invitee = w.newPeer("invitee", w.inviter, CertSpec{TTL: 7 * 24 * time.Hour})
	w.trainer = w.newPeer("trainer", w.admin, CertSpec{Role: RoleTrainer, MayInvite: true})
	w.helper = w.newPeer("helper", w.trainer, CertSpec{Role: RoleTrainer})
	w.plain = w.newPeer("plain", w.admin, CertSpec{})
	return w
}

// peerID makes a string shaped like a libp2p Ed25519 peer id (52
// characters).
func peerID(name string) string {
	s := "12D3KooW" + name
	for len(s) < 52 {
		s += "z"
	}
	return s[:52]
}

func (w *world) key() ed25519.PrivateKey {
	w.tb.Helper()
	k, err := NewKey(w.rnd)
	if err != nil {
		w.tb.Fatal(err)
	}
	return k
}

// issue has by issue a certificate for id and key; spec's subject fields are
// filled in.
func (w *world) issue(by peer, id string, key ed25519.PublicKey, spec CertSpec) *Certificate {
	w.tb.Helper()
	spec.Subject, spec.SubjectKey = id, key
	var byCert *Certificate
	if by.id != w.admin.id {
		byCert = by.cert
	}
	c, err := IssueCertificate(by.key, byCert, spec, t0, w.rnd)
	if err != nil {
		w.tb.Fatalf("issue %s by %s: %v", id, by.id, err)
	}
	return c
}

func (w *world) newPeer(name string, by peer, spec CertSpec) peer {
	w.tb.Helper()
	p := peer{id: peerID(name), key: w.key()}
	p.cert = w.issue(by, p.id, p.pub(), spec)
	return p
}

// token makes a token invited by p offering role with uses uses.
func (w *world) token(p peer, role Role, uses int) *Token {
	w.tb.Helper()
	var c *Certificate
	if p.id != w.admin.id {
		c = p.cert
	}
	tok, err := NewToken(p.key, c, TokenSpec{
		Inviter: p.id,
		Addrs:   []string{"/ip4/192.168.1.23/udp/4001/quic-v1", "/ip4/203.0.113.7/tcp/4001"},
		Role:    role,
		MaxUses: uses,
	}, t0, w.rnd)
	if err != nil {
		w.tb.Fatalf("token by %s: %v", p.id, err)
	}
	return tok
}

// forge signs a certificate without any of IssueCertificate's checks, for
// tests of what Verify refuses. It goes through Marshal and
// ParseCertificate, so the parser accepts it.
func forge(tb testing.TB, key ed25519.PrivateKey, issuer *Certificate, spec CertSpec, from, to time.Time) *Certificate {
	tb.Helper()
	c := &Certificate{
		subject:    spec.Subject,
		subjectKey: spec.SubjectKey,
		role:       spec.Role.orMember(),
		mayInvite:  spec.MayInvite,
		serial:     [SerialSize]byte{0xf0, 0x0d},
		issuedAt:   seconds(from),
		expires:    seconds(to),
		issuerKey:  key.Public().(ed25519.PublicKey),
		issuer:     issuer,
	}
	c.sign(key)
	p, err := ParseCertificate(c.Marshal())
	if err != nil {
		tb.Fatalf("forged certificate does not parse: %v", err)
	}
	return p
}

// checkErr fails unless err wraps want and no other sentinel (want nil:
// err is nil).
func checkErr(tb testing.TB, err, want error) {
	tb.Helper()
	if want == nil {
		if err != nil {
			tb.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, want) {
		tb.Fatalf("error %v, want %v", err, want)
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			tb.Fatalf("error %v wraps %v as well as %v", err, s, want)
		}
	}
	if !strings.HasPrefix(err.Error(), "member: ") {
		tb.Fatalf("error %q does not start with the package name", err)
	}
}

// flips returns, for every byte of b and every bit, b with that bit
// flipped.
func flips(b []byte, yield func(i int, mask byte, c []byte)) {
	for i := range b {
		for bit := range 8 {
			c := []byte(string(b))
			mask := byte(1) << bit
			c[i] ^= mask
			yield(i, mask, c)
		}
	}
}

func TestMeshIDOf(t *testing.T) {
	w := newWorld(t, 1)
	id := MeshIDOf(w.adminPub)
	if len(id) != 25 || id[0] != 'm' || strings.ToLower(id) != id {
		t.Fatalf("mesh id %q: want m and 24 lowercase base32 characters", id)
	}
	other := newWorld(t, 2)
	if MeshIDOf(other.adminPub) == id {
		t.Fatal("two admin keys give the same mesh id")
	}
	for _, c := range []*Certificate{w.admin.cert, w.inviter.cert, w.invitee.cert, w.helper.cert} {
		if c.MeshID() != id {
			t.Errorf("certificate of %s: mesh %s, want %s", c.Subject(), c.MeshID(), id)
		}
	}
}

func TestAgo(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s ago"},
		{45 * time.Second, "45s ago"},
		{12 * time.Minute, "12m ago"},
		{12*time.Minute + 5*time.Second, "12m5s ago"},
		{90 * time.Minute, "1h30m ago"},
		{24 * time.Hour, "24h ago"},
		{5 * 24 * time.Hour, "5 days ago"},
		{-5 * time.Minute, "in 5m"},
	} {
		if got := ago(t0, t0.Add(tc.d)); got != tc.want {
			t.Errorf("ago(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestRoleString(t *testing.T) {
	for _, r := range []Role{RoleMember, RoleTrainer, RoleAdmin} {
		got, err := ParseRole(r.String())
		if err != nil || got != r {
			t.Errorf("ParseRole(%q) = %v, %v", r.String(), got, err)
		}
	}
	if _, err := ParseRole("root"); err == nil {
		t.Error("ParseRole(root) accepted")
	}
	if s := Role(9).String(); s != "role(9)" {
		t.Errorf("Role(9) = %q", s)
	}
}

func TestNoRandomness(t *testing.T) {
	w := newWorld(t, 1)
	if _, err := NewKey(nil); err == nil {
		t.Error("NewKey(nil) worked")
	}
	if _, err := IssueCertificate(w.admin.key, nil, CertSpec{Subject: "x", SubjectKey: w.plain.pub()}, t0, nil); err == nil {
		t.Error("IssueCertificate with nil rand worked")
	}
	if _, err := NewToken(w.admin.key, nil, TokenSpec{Inviter: "x", Addrs: []string{"/a"}}, t0, strings.NewReader("short")); err == nil {
		t.Error("NewToken with 5 bytes of randomness worked")
	}
}
