package member

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"
)

func TestCertificateRoundTrip(t *testing.T) {
	w := newWorld(t, 1)
	for _, tc := range []struct {
		name      string
		p         peer
		role      Role
		mayInvite bool
		issuer    string // "" for the admin
		expires   time.Time
	}{
		{"admin's own", w.admin, RoleAdmin, true, "", t0.Add(DefaultCertTTL)},
		{"admin-issued inviter", w.inviter, RoleMember, true, "", t0.Add(DefaultCertTTL)},
		{"admin-issued trainer", w.trainer, RoleTrainer, true, "", t0.Add(DefaultCertTTL)},
		{"admin-issued member", w.plain, RoleMember, false, "", t0.Add(DefaultCertTTL)},
		{"inviter-issued member", w.invitee, RoleMember, false, w.inviter.id, t0.Add(7 * 24 * time.Hour)},
		{"trainer-issued trainer", w.helper, RoleTrainer, false, w.trainer.id, t0.Add(DefaultCertTTL)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.p.cert.Marshal()
			c, err := ParseCertificate(b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(c.Marshal(), b) {
				t.Fatal("parse → marshal changed the bytes")
			}
			if err := c.Verify(w.adminPub, t0.Add(time.Hour), nil); err != nil {
				t.Fatal(err)
			}
			if c.Subject() != tc.p.id || !c.SubjectKey().Equal(tc.p.pub()) || c.Role() != tc.role ||
				c.MayInvite() != tc.mayInvite || !c.IssuedAt().Equal(t0) || !c.Expires().Equal(tc.expires) {
				t.Errorf("got %v %v %v %v %v %v", c.Subject(), c.Role(), c.MayInvite(), c.IssuedAt(), c.Expires(), c.SubjectKey())
			}
			if c.Serial() != tc.p.cert.Serial() || c.Serial() == ([SerialSize]byte{}) {
				t.Errorf("serial %x", c.Serial())
			}
			if tc.issuer == "" {
				if c.IssuerCert() != nil || !c.IssuerKey().Equal(w.adminPub) {
					t.Error("admin-issued certificate does not name the admin key as issuer")
				}
			} else if c.IssuerCert() == nil || c.IssuerCert().Subject() != tc.issuer || !c.IssuerKey().Equal(c.IssuerCert().SubjectKey()) {
				t.Errorf("issuer: want the certificate of %s", tc.issuer)
			}
			t.Logf("%d bytes", len(b))
		})
	}
}

func TestIssueCertificateRules(t *testing.T) {
	w := newWorld(t, 1)
	longer := forge(t, w.inviter.key, w.inviter.cert, CertSpec{Subject: peerID("mid"), SubjectKey: w.plain.pub(), MayInvite: true}, t0, t0.Add(time.Hour))
	for _, tc := range []struct {
		name    string
		key     ed25519.PrivateKey
		cert    *Certificate
		spec    CertSpec
		now     time.Time
		want    error
		wantMsg string
	}{
		{"admin issues trainer with may-invite", w.admin.key, nil, CertSpec{Role: RoleTrainer, MayInvite: true}, t0, nil, ""},
		{"admin issues with its own certificate", w.admin.key, w.admin.cert, CertSpec{MayInvite: true}, t0, nil, ""},
		{"member inviter issues member", w.inviter.key, w.inviter.cert, CertSpec{}, t0, nil, ""},
		{"trainer inviter issues trainer", w.trainer.key, w.trainer.cert, CertSpec{Role: RoleTrainer}, t0, nil, ""},
		{"inviter without may-invite", w.plain.key, w.plain.cert, CertSpec{}, t0, ErrNotAllowed, "may not invite"},
		{"member inviter grants trainer", w.inviter.key, w.inviter.cert, CertSpec{Role: RoleTrainer}, t0, ErrNotAllowed, "may not grant the trainer role"},
		{"trainer inviter grants admin", w.trainer.key, w.trainer.cert, CertSpec{Role: RoleAdmin}, t0, ErrNotAllowed, "admin role"},
		{"inviter grants may-invite", w.inviter.key, w.inviter.cert, CertSpec{MayInvite: true}, t0, ErrNotAllowed, "only the admin can"},
		{"inviter certificate expired", w.inviter.key, w.inviter.cert, CertSpec{}, w.inviter.cert.Expires(), ErrExpired, "expired at"},
		{"chain longer than 2", w.plain.key, longer, CertSpec{}, t0, ErrNotAllowed, "at most two links"},
		{"invitee invites", w.invitee.key, w.invitee.cert, CertSpec{}, t0, ErrNotAllowed, "at most two links"},
		{"admin role for another key", w.admin.key, nil, CertSpec{Role: RoleAdmin}, t0, ErrNotAllowed, "admin's own key"},
		{"key is not the certificate's", w.plain.key, w.inviter.cert, CertSpec{}, t0, ErrNotAllowed, "signing key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Subject, spec.SubjectKey = peerID("new"), w.invitee.pub()
			c, err := IssueCertificate(tc.key, tc.cert, spec, tc.now, w.rnd)
			checkErr(t, err, tc.want)
			if err != nil {
				if !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("error %q does not say %q", err, tc.wantMsg)
				}
				return
			}
			if err := c.Verify(w.adminPub, tc.now, nil); err != nil {
				t.Fatalf("issued certificate does not verify: %v", err)
			}
		})
	}
}

func TestIssueCertificateBadSpec(t *testing.T) {
	w := newWorld(t, 1)
	for _, tc := range []struct {
		name string
		spec CertSpec
		now  time.Time
	}{
		{"no subject", CertSpec{SubjectKey: w.plain.pub()}, t0},
		{"subject not UTF-8", CertSpec{Subject: "12D3\xff", SubjectKey: w.plain.pub()}, t0},
		{"long subject", CertSpec{Subject: strings.Repeat("x", MaxPeerIDLen+1), SubjectKey: w.plain.pub()}, t0},
		{"short key", CertSpec{Subject: "x", SubjectKey: w.plain.pub()[:31]}, t0},
		{"unknown role", CertSpec{Subject: "x", SubjectKey: w.plain.pub(), Role: 7}, t0},
		{"negative ttl", CertSpec{Subject: "x", SubjectKey: w.plain.pub(), TTL: -time.Hour}, t0},
		{"ttl too long", CertSpec{Subject: "x", SubjectKey: w.plain.pub(), TTL: MaxTTL + time.Hour}, t0},
		{"before 1970", CertSpec{Subject: "x", SubjectKey: w.plain.pub()}, time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := IssueCertificate(w.admin.key, nil, tc.spec, tc.now, w.rnd); err == nil {
				t.Fatal("issued")
			}
		})
	}
	if _, err := IssueCertificate(w.admin.key[:32], nil, CertSpec{Subject: "x", SubjectKey: w.plain.pub()}, t0, w.rnd); err == nil {
		t.Fatal("issued with a 32-byte private key")
	}
}

func TestVerifyCertificate(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	day := 24 * time.Hour
	newKey := w.key()
	spec := func(role Role, mayInvite bool) CertSpec {
		return CertSpec{Subject: peerID("forged"), SubjectKey: newKey.Public().(ed25519.PublicKey), Role: role, MayInvite: mayInvite}
	}
	mid := forge(t, w.inviter.key, w.inviter.cert, spec(RoleMember, true), t0, t0.Add(day))
	// an invitee whose certificate ends with its inviter's
	last := w.newPeer("last", w.inviter, CertSpec{TTL: 60 * day})
	for _, tc := range []struct {
		name    string
		c       *Certificate
		admin   ed25519.PublicKey
		now     time.Time
		want    error
		wantMsg string
	}{
		{"valid", w.invitee.cert, w.adminPub, t0.Add(time.Hour), nil, ""},
		{"valid a little early (clock skew)", w.invitee.cert, w.adminPub, t0.Add(-ClockSkew + time.Second), nil, ""},
		{"not yet valid", w.invitee.cert, w.adminPub, t0.Add(-ClockSkew - time.Second), ErrExpired, "not valid before"},
		{"last second", w.plain.cert, w.adminPub, w.plain.cert.Expires().Add(-time.Second), nil, ""},
		{"expired", w.plain.cert, w.adminPub, w.plain.cert.Expires(), ErrExpired, "expired at 2026-12-25T10:00:00Z (0s ago)"},
		{"inviter expired", last.cert, w.adminPub, w.inviter.cert.Expires(), ErrExpired, "its inviter"},
		{"other mesh", w.invitee.cert, other.adminPub, t0, ErrOtherMesh, "is for mesh " + MeshIDOf(w.adminPub)},
		{"other mesh's admin", other.plain.cert, w.adminPub, t0, ErrOtherMesh, ""},
		{"inviter without may-invite", forge(t, w.plain.key, w.plain.cert, spec(RoleMember, false), t0, t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "may not invite"},
		{"role escalation", forge(t, w.inviter.key, w.inviter.cert, spec(RoleTrainer, false), t0, t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "trainer role"},
		{"admin role from trainer", forge(t, w.trainer.key, w.trainer.cert, spec(RoleAdmin, false), t0, t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "admin role"},
		{"may-invite from inviter", forge(t, w.inviter.key, w.inviter.cert, spec(RoleMember, true), t0, t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "only the admin can"},
		{"chain of three", forge(t, newKey, mid, spec(RoleMember, false), t0, t0.Add(time.Hour)), w.adminPub, t0, ErrNotAllowed, "only the admin's direct invitees may invite"},
		{"outlives its inviter", forge(t, w.inviter.key, w.inviter.cert, spec(RoleMember, false), t0, t0.Add(60*day)), w.adminPub, t0, ErrNotAllowed, "outlasts"},
		{"issued before its inviter", forge(t, w.inviter.key, w.inviter.cert, spec(RoleMember, false), t0.Add(-time.Hour), t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "outlasts"},
		{"admin role for another key", forge(t, w.admin.key, nil, spec(RoleAdmin, false), t0, t0.Add(day)), w.adminPub, t0, ErrNotAllowed, "admin's own key"},
		{"signed by the wrong key", forge(t, w.plain.key, w.inviter.cert, spec(RoleMember, false), t0, t0.Add(day)), w.adminPub, t0, ErrTampered, "signature"},
		{"inviter's signature wrong", forge(t, w.inviter.key, badSig(w.inviter.cert), spec(RoleMember, false), t0, t0.Add(day)), w.adminPub, t0, ErrTampered, "signature of the certificate of its inviter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Verify(tc.admin, tc.now, nil)
			checkErr(t, err, tc.want)
			if err != nil && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
	if err := w.plain.cert.Verify(w.adminPub[:31], t0, nil); err == nil {
		t.Error("verified against a 31-byte admin key")
	}
}

// badSig returns c with one bit of its signature flipped.
func badSig(c *Certificate) *Certificate {
	b := *c
	b.sig = bytes.Clone(c.sig)
	b.sig[0] ^= 1
	b.raw = append(b.appendBody(nil), b.sig...)
	return &b
}

func TestCertificateTamper(t *testing.T) {
	w := newWorld(t, 1)
	for _, c := range []*Certificate{w.admin.cert, w.inviter.cert, w.invitee.cert, w.helper.cert} {
		b := c.Marshal()
		n := 0
		flips(b, func(i int, mask byte, f []byte) {
			p, err := ParseCertificate(f)
			if err == nil {
				err = p.Verify(w.adminPub, t0.Add(time.Hour), nil)
			}
			if err == nil {
				t.Fatalf("certificate of %s with byte %d ^ %#x verifies", c.Subject(), i, mask)
			}
			n++
		})
		for i := range b {
			if _, err := ParseCertificate(b[:i]); err == nil {
				t.Fatalf("certificate of %s cut to %d bytes parses", c.Subject(), i)
			}
		}
		t.Logf("certificate of %s: %d bytes, %d flips refused", c.Subject(), len(b), n)
	}
}

func TestParseCertificateErrors(t *testing.T) {
	w := newWorld(t, 1)
	good := w.invitee.cert.Marshal()
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name    string
		b       []byte
		want    error
		wantMsg string
	}{
		{"empty", nil, ErrTampered, "too short"},
		{"too long", append(bytes.Clone(good), make([]byte, MaxEncodedSize)...), ErrTampered, "over the 8192-byte limit"},
		{"version 2", edit(func(b []byte) []byte { b[0] = 2; return b }), ErrVersion, "version 2"},
		{"version 0", edit(func(b []byte) []byte { b[0] = 0; return b }), ErrVersion, "version 0"},
		{"a token", w.token(w.admin, RoleMember, 1).Marshal(), ErrTampered, "not an encoded certificate"},
		{"trailing byte", append(bytes.Clone(good), 0), ErrTampered, "trailing"},
		{"truncated", good[:len(good)-1], ErrTampered, "truncated"},
		{"non-minimal length", edit(func(b []byte) []byte {
			// the subject's length, 52, written as two bytes
			return append([]byte{b[0], b[1], 52 | 0x80, 0}, b[3:]...)
		}), ErrTampered, "canonical"},
		{"unknown flags", edit(func(b []byte) []byte { b[3+52+32+1] |= 2; return b }), ErrTampered, "flags"},
		{"unknown role", edit(func(b []byte) []byte { b[3+52+32] = 9; return b }), ErrTampered, "role"},
		{"inner version 2", edit(func(b []byte) []byte {
			i := bytes.Index(b, w.inviter.cert.Marshal())
			b[i] = 2
			return b
		}), ErrVersion, "issuer's certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCertificate(tc.b)
			checkErr(t, err, tc.want)
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
}

func TestRenewal(t *testing.T) {
	w := newWorld(t, 1)
	c := w.plain.cert
	at := t0.Add(20 * 24 * time.Hour)
	if !c.RenewAt().Equal(at) {
		t.Fatalf("RenewAt %v, want %v", c.RenewAt(), at)
	}
	for _, tc := range []struct {
		now  time.Time
		want bool
	}{
		{t0, false},
		{at.Add(-time.Second), false},
		{at, true},
		{c.Expires(), true},
	} {
		if got := c.NeedsRenewal(tc.now); got != tc.want {
			t.Errorf("NeedsRenewal(%v) = %v, want %v", tc.now, got, tc.want)
		}
	}
	now := at.Add(time.Hour)
	n, err := IssueCertificate(w.admin.key, nil, c.Spec(), now, w.rnd)
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject() != c.Subject() || !n.SubjectKey().Equal(c.SubjectKey()) || n.Role() != c.Role() || n.MayInvite() != c.MayInvite() {
		t.Error("renewed certificate differs")
	}
	if n.Serial() == c.Serial() || !n.Expires().Equal(now.Add(DefaultCertTTL)) || n.NeedsRenewal(now) {
		t.Errorf("renewed certificate: serial %x expires %v", n.Serial(), n.Expires())
	}
	later := c.Expires().Add(time.Hour)
	checkErr(t, c.Verify(w.adminPub, later, nil), ErrExpired)
	checkErr(t, n.Verify(w.adminPub, later, nil), nil)

	// an invitee's renewal ends with its inviter's certificate
	now = w.inviter.cert.Expires().Add(-24 * time.Hour)
	n, err = IssueCertificate(w.inviter.key, w.inviter.cert, w.invitee.cert.Spec(), now, w.rnd)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Expires().Equal(w.inviter.cert.Expires()) {
		t.Errorf("renewed invitee expires %v, inviter %v", n.Expires(), w.inviter.cert.Expires())
	}
	checkErr(t, n.Verify(w.adminPub, now, nil), nil)
}

func TestIssueWithinClockSkew(t *testing.T) {
	w := newWorld(t, 1)
	now := w.inviter.cert.IssuedAt().Add(-2 * time.Minute)
	c, err := IssueCertificate(w.inviter.key, w.inviter.cert, CertSpec{Subject: peerID("early"), SubjectKey: w.plain.pub(), TTL: time.Second}, now, w.rnd)
	if err != nil {
		t.Fatal(err)
	}
	if !c.IssuedAt().Equal(w.inviter.cert.IssuedAt()) || !c.Expires().Equal(c.IssuedAt().Add(time.Second)) {
		t.Errorf("issued %v, expires %v", c.IssuedAt(), c.Expires())
	}
	checkErr(t, c.Verify(w.adminPub, now, nil), nil)
}
