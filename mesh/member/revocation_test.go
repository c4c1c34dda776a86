package member

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"
)

func (w *world) revoke(by peer, subject, reason string, now time.Time) *Revocation {
	w.tb.Helper()
	var c *Certificate
	if by.id != w.admin.id {
		c = by.cert
	}
	r, err := NewRevocation(by.key, c, subject, reason, now)
	if err != nil {
		w.tb.Fatalf("%s revokes %s: %v", by.id, subject, err)
	}
	return r
}

// forgeRevocation signs a revocation without NewRevocation's checks.
func forgeRevocation(tb testing.TB, key ed25519.PrivateKey, cert *Certificate, subject string, at time.Time) *Revocation {
	tb.Helper()
	r := &Revocation{subject: subject, revokedAt: seconds(at), reason: "forged", issuerKey: key.Public().(ed25519.PublicKey), issuer: cert}
	body := r.appendBody(nil)
	p, err := ParseRevocation(append(body, sign(key, body)...))
	if err != nil {
		tb.Fatalf("forged revocation does not parse: %v", err)
	}
	return p
}

func TestRevocationVerify(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	for _, tc := range []struct {
		name    string
		r       *Revocation
		subject *Certificate
		admin   ed25519.PublicKey
		want    error
		wantMsg string
	}{
		{"admin revokes a member", w.revoke(w.admin, w.plain.id, "left", t0), nil, w.adminPub, nil, ""},
		{"admin revokes a member, with its certificate", w.revoke(w.admin, w.plain.id, "left", t0), w.plain.cert, w.adminPub, nil, ""},
		{"admin revokes an inviter's invitee", w.revoke(w.admin, w.invitee.id, "", t0), w.invitee.cert, w.adminPub, nil, ""},
		{"admin revokes with its own certificate", w.revoke(w.admin, w.invitee.id, "", t0), w.invitee.cert, w.adminPub, nil, ""},
		{"inviter revokes its invitee", w.revoke(w.inviter, w.invitee.id, "stolen laptop", t0.Add(time.Hour)), w.invitee.cert, w.adminPub, nil, ""},
		{"inviter revokes its invitee, no certificate", w.revoke(w.inviter, w.invitee.id, "", t0), nil, w.adminPub, nil, ""},
		{"inviter revokes another inviter's invitee", w.revoke(w.inviter, w.helper.id, "", t0), w.helper.cert, w.adminPub, ErrNotAllowed, "did not invite"},
		{"inviter revokes the admin's invitee", w.revoke(w.inviter, w.plain.id, "", t0), w.plain.cert, w.adminPub, ErrNotAllowed, "did not invite"},
		{"inviter revokes with a forged certificate", w.revoke(w.inviter, w.helper.id, "", t0), badSig(w.helper.cert), w.adminPub, ErrTampered, "signature"},
		{"certificate of another peer", w.revoke(w.admin, w.plain.id, "", t0), w.invitee.cert, w.adminPub, ErrNotAllowed, "another peer"},
		{"other mesh's admin", other.revoke(other.admin, w.plain.id, "", t0), nil, w.adminPub, ErrOtherMesh, "from mesh " + MeshIDOf(other.adminPub)},
		{"other mesh's inviter", other.revoke(other.inviter, w.invitee.id, "", t0), nil, w.adminPub, ErrOtherMesh, ""},
		{"member without may-invite", forgeRevocation(t, w.plain.key, w.plain.cert, w.invitee.id, t0), nil, w.adminPub, ErrNotAllowed, "may not invite"},
		{"invitee revokes", forgeRevocation(t, w.invitee.key, w.invitee.cert, w.plain.id, t0), nil, w.adminPub, ErrNotAllowed, "may not invite"},
		{"inviter's certificate had expired", forgeRevocation(t, w.inviter.key, w.inviter.cert, w.invitee.id, w.inviter.cert.Expires()), nil, w.adminPub, ErrExpired, "was not valid when it revoked"},
		{"wrong key", forgeRevocation(t, w.plain.key, w.inviter.cert, w.invitee.id, t0), nil, w.adminPub, ErrTampered, "signature"},
		{"revoker's certificate forged", forgeRevocation(t, w.inviter.key, badSig(w.inviter.cert), w.invitee.id, t0), nil, w.adminPub, ErrTampered, "signature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseRevocation(tc.r.Marshal())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(p.Marshal(), tc.r.Marshal()) {
				t.Fatal("parse → marshal changed the bytes")
			}
			err = p.Verify(tc.admin, tc.subject)
			checkErr(t, err, tc.want)
			if err != nil {
				t.Logf("%v", err)
				if !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("error %q does not say %q", err, tc.wantMsg)
				}
			}
		})
	}
}

func TestNewRevocationRefusals(t *testing.T) {
	w := newWorld(t, 1)
	for _, tc := range []struct {
		name   string
		by     peer
		reason string
		now    time.Time
		want   error // nil: any error
	}{
		{"member without may-invite", w.plain, "", t0, ErrNotAllowed},
		{"invitee", w.invitee, "", t0, ErrNotAllowed},
		{"inviter's certificate expired", w.inviter, "", w.inviter.cert.Expires(), ErrExpired},
		{"key is not the certificate's", peer{id: "x", key: w.plain.key, cert: w.inviter.cert}, "", t0, ErrNotAllowed},
		{"long reason", w.admin, strings.Repeat("x", MaxReasonLen+1), t0, nil},
		{"reason not UTF-8", w.admin, "\xff", t0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *Certificate
			if tc.by.id != w.admin.id {
				c = tc.by.cert
			}
			_, err := NewRevocation(tc.by.key, c, w.invitee.id, tc.reason, tc.now)
			if err == nil {
				t.Fatal("revoked")
			}
			if tc.want != nil {
				checkErr(t, err, tc.want)
			}
		})
	}
	r := w.revoke(w.admin, w.plain.id, strings.Repeat("é", MaxReasonLen/2), t0)
	if !r.ByAdmin() || r.Subject() != w.plain.id || !r.RevokedAt().Equal(t0) || len(r.Reason()) != MaxReasonLen || !r.IssuerKey().Equal(w.adminPub) || r.MeshID() != MeshIDOf(w.adminPub) {
		t.Errorf("revocation: %v", r.LogValue())
	}
	if r := w.revoke(w.admin, w.plain.id, "", t0); r.IssuerCert() != nil {
		t.Error("admin's revocation carries a certificate")
	}
}

func TestRevokedCertificates(t *testing.T) {
	w := newWorld(t, 1)
	now := t0.Add(time.Hour)
	for _, tc := range []struct {
		name    string
		revs    []*Revocation
		cert    *Certificate
		want    error
		wantMsg string
		banned  []string // peer ids IsRevoked reports
	}{
		{"nothing revoked", nil, w.invitee.cert, nil, "", nil},
		{"admin revokes the subject", []*Revocation{w.revoke(w.admin, w.invitee.id, "lost", t0)}, w.invitee.cert, ErrRevoked, `was revoked at 2026-11-25T10:00:00Z: "lost"`, []string{w.invitee.id}},
		{"admin revokes the issuer", []*Revocation{w.revoke(w.admin, w.inviter.id, "spam", t0)}, w.invitee.cert, ErrRevoked, "issued by inviter", []string{w.inviter.id}},
		{"admin revokes the issuer, its own certificate", []*Revocation{w.revoke(w.admin, w.inviter.id, "spam", t0)}, w.inviter.cert, ErrRevoked, "was revoked", []string{w.inviter.id}},
		{"inviter revokes its invitee", []*Revocation{w.revoke(w.inviter, w.invitee.id, "", t0)}, w.invitee.cert, ErrRevoked, "was revoked", nil},
		{"trainer revokes its invitee", []*Revocation{w.revoke(w.trainer, w.helper.id, "", t0)}, w.helper.cert, ErrRevoked, "was revoked", nil},
		{"inviter revokes another's invitee: no effect", []*Revocation{w.revoke(w.inviter, w.helper.id, "", t0)}, w.helper.cert, nil, "", nil},
		{"inviter revokes the admin's invitee: no effect", []*Revocation{w.revoke(w.inviter, w.plain.id, "", t0)}, w.plain.cert, nil, "", nil},
		{"inviter revokes the admin's own: no effect", []*Revocation{w.revoke(w.inviter, w.admin.id, "", t0)}, w.admin.cert, nil, "", nil},
		{"others revoked", []*Revocation{w.revoke(w.admin, w.plain.id, "", t0), w.revoke(w.trainer, w.helper.id, "", t0)}, w.invitee.cert, nil, "", []string{w.plain.id}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewRevocationList(w.adminPub)
			for _, r := range tc.revs {
				if err := l.Add(r); err != nil {
					t.Fatal(err)
				}
			}
			err := tc.cert.Verify(w.adminPub, now, l)
			checkErr(t, err, tc.want)
			if err != nil {
				t.Logf("%v", err)
				if !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("error %q does not say %q", err, tc.wantMsg)
				}
			}
			for _, p := range []peer{w.admin, w.inviter, w.invitee, w.trainer, w.helper, w.plain} {
				want := false
				for _, id := range tc.banned {
					want = want || id == p.id
				}
				if l.IsRevoked(p.id) != want {
					t.Errorf("IsRevoked(%s) = %v, want %v", p.id, !want, want)
				}
			}
		})
	}
	var nilList *RevocationList
	checkErr(t, w.invitee.cert.Verify(w.adminPub, now, nilList), nil)
	if nilList.IsRevoked(w.plain.id) || nilList.Len() != 0 || nilList.Revocations() != nil {
		t.Error("nil list revokes")
	}
}

func TestRevocationListMerge(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	first := w.revoke(w.admin, w.plain.id, "first", t0)
	tie := w.revoke(w.admin, w.plain.id, "same second", t0)
	later := w.revoke(w.admin, w.plain.id, "later", t0.Add(time.Hour))
	scoped := w.revoke(w.inviter, w.invitee.id, "", t0)
	helper := w.revoke(w.trainer, w.helper.id, "", t0)
	list := func(rs ...*Revocation) *RevocationList {
		l := NewRevocationList(w.adminPub)
		for _, r := range rs {
			if err := l.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		return l
	}
	copyOf := func(l *RevocationList) *RevocationList {
		c, err := ParseRevocationList(w.adminPub, l.Marshal())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := list(later, scoped, first)
	b := list(helper, tie, later, helper)
	if a.Len() != 2 || b.Len() != 2 {
		t.Fatalf("lengths %d, %d, want 2, 2", a.Len(), b.Len())
	}
	if r := a.RevocationOf(w.plain.cert); r != first {
		t.Errorf("kept %q, want the earliest", r.Reason())
	}
	ab, ba := copyOf(a), copyOf(b)
	checkErr(t, ab.Merge(b), nil)
	checkErr(t, ba.Merge(a), nil)
	if !bytes.Equal(ab.Marshal(), ba.Marshal()) {
		t.Fatal("merge is not commutative")
	}
	if ab.Len() != 3 {
		t.Fatalf("merged length %d, want 3", ab.Len())
	}
	keep := first
	if bytes.Compare(tie.raw, first.raw) < 0 {
		keep = tie
	}
	if got := ab.RevocationOf(w.plain.cert); got.Reason() != keep.Reason() {
		t.Errorf("merged list kept %q, want %q", got.Reason(), keep.Reason())
	}
	same := func(a, b *Revocation) bool { return a != nil && bytes.Equal(a.Marshal(), b.Marshal()) }
	if !same(ab.RevocationOf(w.invitee.cert), scoped) || !same(ab.RevocationOf(w.helper.cert), helper) || ab.RevocationOf(w.inviter.cert) != nil {
		t.Error("merged list lost a revocation")
	}
	enc := ab.Marshal()
	p := copyOf(ab)
	if !bytes.Equal(p.Marshal(), enc) || p.Len() != 3 || !p.IsRevoked(w.plain.id) {
		t.Fatal("round trip changed the list")
	}
	if rs := p.Revocations(); len(rs) != 3 || bytes.Compare(rs[0].raw, rs[1].raw) >= 0 || bytes.Compare(rs[1].raw, rs[2].raw) >= 0 {
		t.Error("Revocations not in canonical order")
	}
	t.Logf("list of 3 revocations: %d bytes", len(enc))

	// other meshes
	o := NewRevocationList(other.adminPub)
	checkErr(t, o.Add(other.revoke(other.admin, w.plain.id, "", t0)), nil)
	checkErr(t, ab.Merge(o), ErrOtherMesh)
	checkErr(t, ab.Add(other.revoke(other.admin, w.invitee.id, "", t0)), ErrOtherMesh)
	if ab.Len() != 3 || ab.IsRevoked(w.invitee.id) {
		t.Error("a refused revocation changed the list")
	}
	_, err := ParseRevocationList(other.adminPub, enc)
	checkErr(t, err, ErrOtherMesh)
	checkErr(t, ab.Merge(nil), nil)

	// empty
	e := copyOf(NewRevocationList(w.adminPub))
	if e.Len() != 0 || len(e.Marshal()) != 3 {
		t.Errorf("empty list: %d revocations, %d bytes", e.Len(), len(e.Marshal()))
	}
}

func TestParseRevocationListErrors(t *testing.T) {
	w := newWorld(t, 1)
	r1 := w.revoke(w.admin, w.plain.id, "", t0)
	r2 := w.revoke(w.inviter, w.invitee.id, "", t0)
	l := NewRevocationList(w.adminPub)
	checkErr(t, l.Add(r1), nil)
	checkErr(t, l.Add(r2), nil)
	good := l.Marshal()
	rs := l.Revocations()
	encode := func(rs ...*Revocation) []byte {
		b := appendUvarint([]byte{encodingVersion, kindRevocationList}, len(rs))
		for _, r := range rs {
			b = appendBytes(b, r.raw)
		}
		return b
	}
	if !bytes.Equal(encode(rs...), good) {
		t.Fatal("test encoder differs from Marshal")
	}
	for _, tc := range []struct {
		name    string
		b       []byte
		want    error
		wantMsg string
	}{
		{"out of order", encode(rs[1], rs[0]), ErrTampered, "canonical"},
		{"twice", encode(rs[0], rs[0], rs[1]), ErrTampered, "canonical"},
		{"count too high", append([]byte{encodingVersion, kindRevocationList, 3}, good[3:]...), ErrTampered, "truncated"},
		{"count too low", append([]byte{encodingVersion, kindRevocationList, 1}, good[3:]...), ErrTampered, "trailing"},
		{"version 2", append([]byte{2}, good[1:]...), ErrVersion, ""},
		{"a ledger", NewLedger(w.adminPub, w.inviter.id).Marshal(), ErrTampered, "not an encoded revocation list"},
		{"too long", make([]byte, MaxRevocationListSize+1), ErrTampered, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRevocationList(w.adminPub, tc.b)
			checkErr(t, err, tc.want)
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
	n := 0
	flips(good, func(i int, mask byte, f []byte) {
		if _, err := ParseRevocationList(w.adminPub, f); err == nil {
			t.Fatalf("list with byte %d ^ %#x parses", i, mask)
		}
		n++
	})
	t.Logf("list of %d bytes: %d flips refused", len(good), n)
}

func TestRevocationTamper(t *testing.T) {
	w := newWorld(t, 1)
	for _, r := range []*Revocation{w.revoke(w.admin, w.plain.id, "left the team", t0), w.revoke(w.inviter, w.invitee.id, "lost phone", t0)} {
		b := r.Marshal()
		n := 0
		flips(b, func(i int, mask byte, f []byte) {
			p, err := ParseRevocation(f)
			if err == nil {
				err = p.Verify(w.adminPub, nil)
			}
			if err == nil {
				t.Fatalf("revocation with byte %d ^ %#x verifies", i, mask)
			}
			n++
		})
		for i := range b {
			if _, err := ParseRevocation(b[:i]); err == nil {
				t.Fatalf("revocation cut to %d bytes parses", i)
			}
		}
		t.Logf("revocation by %s: %d bytes, %d flips refused", r.LogValue(), len(b), n)
	}
}

func TestRevocationWithAdminCertificate(t *testing.T) {
	w := newWorld(t, 1)
	// NewRevocation drops the admin's own certificate; one made with it
	// anyway is the admin's revocation.
	r := forgeRevocation(t, w.admin.key, w.admin.cert, w.plain.id, t0)
	if !r.ByAdmin() {
		t.Fatal("not the admin's")
	}
	checkErr(t, r.Verify(w.adminPub, w.plain.cert), nil)
	l := NewRevocationList(w.adminPub)
	checkErr(t, l.Add(r), nil)
	if !l.IsRevoked(w.plain.id) {
		t.Error("the admin's revocation is scoped")
	}
	checkErr(t, w.plain.cert.Verify(w.adminPub, t0, l), ErrRevoked)
	if n := w.revoke(w.admin, w.plain.id, "", t0); n.IssuerCert() != nil || !n.ByAdmin() {
		t.Error("NewRevocation kept the admin's certificate")
	}
}
