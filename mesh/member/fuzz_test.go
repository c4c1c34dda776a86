package member

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// Every decoder of peer bytes is fuzzed. The properties: no panic; an error
// wraps ErrTampered or ErrVersion and no other sentinel; anything accepted
// re-encodes to exactly its input; and, since the fuzzer cannot sign,
// anything that verifies for the fixture mesh is one of the seeds.

func checkParseErr(t *testing.T, err error) { checkErrIn(t, err, ErrTampered, ErrVersion) }

// checkErrIn fails unless err is nil or wraps exactly one sentinel, one of
// allowed.
func checkErrIn(t *testing.T, err error, allowed ...error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, s := range allowed {
		if errors.Is(err, s) {
			checkErr(t, err, s)
			return
		}
	}
	t.Fatalf("error %v wraps none of %v", err, allowed)
}

// known collects the encodings of the seeds.
type known map[string]bool

func (k known) add(b []byte) []byte { k[string(b)] = true; return b }

func FuzzParseToken(f *testing.F) {
	w := newWorld(f, 1)
	seeds := known{}
	for _, tok := range []*Token{w.token(w.admin, RoleMember, 1), w.token(w.inviter, RoleMember, 3), w.token(w.trainer, RoleTrainer, 2), w.voterToken(2)} {
		seeds.add(tok.Marshal())
		f.Add(tok.String())
		f.Add(string(tok.Marshal()))
		f.Add("\n  " + tok.String()[:100] + "\n" + tok.String()[100:] + "\r\n")
	}
	f.Add("clawmesh-invite2:AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		check := func(tok *Token) {
			b := tok.Marshal()
			again, err := ParseToken(tok.String())
			if err != nil || !bytes.Equal(again.Marshal(), b) {
				t.Fatalf("String does not parse back: %v", err)
			}
			_ = tok.MeshID()
			_ = tok.LogValue()
			_ = tok.Verify(t0)
			if tok.Voter() && (tok.Role() != RoleTrainer || tok.Verify(t0) == nil && tok.InviterCert() != nil) {
				t.Fatalf("a voter token of a %s by %s is accepted", tok.Role(), tok.Inviter())
			}
			if tok.VerifyFor(w.adminPub, t0, nil) == nil && !seeds[string(b)] {
				t.Fatalf("a token that is not a seed verifies: %s", tok)
			}
		}
		tok, err := ParseToken(s)
		checkParseErr(t, err)
		if err == nil {
			if tok.String() != trimSpace(s) {
				t.Fatalf("ParseToken(%q).String() = %q", s, tok.String())
			}
			check(tok)
		}
		tok, err = ParseTokenBinary([]byte(s))
		checkParseErr(t, err)
		if err == nil {
			if !bytes.Equal(tok.Marshal(), []byte(s)) {
				t.Fatalf("ParseTokenBinary(%x).Marshal() = %x", s, tok.Marshal())
			}
			check(tok)
		}
	})
}

func FuzzParseCertificate(f *testing.F) {
	w := newWorld(f, 1)
	seeds := known{}
	for _, p := range []peer{w.admin, w.inviter, w.invitee, w.trainer, w.helper, w.plain} {
		f.Add(seeds.add(p.cert.Marshal()))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCertificate(b)
		checkParseErr(t, err)
		if err != nil {
			return
		}
		if !bytes.Equal(c.Marshal(), b) {
			t.Fatalf("ParseCertificate(%x).Marshal() = %x", b, c.Marshal())
		}
		_ = c.LogValue()
		_ = c.NeedsRenewal(t0)
		_ = c.Spec()
		_ = c.Verify(c.rootKey(), c.IssuedAt(), nil)
		if c.Verify(w.adminPub, t0.Add(time.Hour), nil) == nil && !seeds[string(b)] {
			t.Fatalf("a certificate that is not a seed verifies: %x", b)
		}
	})
}

func FuzzParseRevocation(f *testing.F) {
	w := newWorld(f, 1)
	seeds := known{}
	for _, r := range []*Revocation{
		w.revoke(w.admin, w.plain.id, "left the team", t0),
		w.revoke(w.inviter, w.invitee.id, "lost phone", t0),
		w.revoke(w.trainer, w.helper.id, "", t0),
	} {
		f.Add(seeds.add(r.Marshal()))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRevocation(b)
		checkParseErr(t, err)
		if err != nil {
			return
		}
		if !bytes.Equal(r.Marshal(), b) {
			t.Fatalf("ParseRevocation(%x).Marshal() = %x", b, r.Marshal())
		}
		_ = r.LogValue()
		_ = r.Verify(r.rootKey(), w.invitee.cert)
		if r.Verify(w.adminPub, nil) == nil && !seeds[string(b)] {
			t.Fatalf("a revocation that is not a seed verifies: %x", b)
		}
	})
}

func FuzzParseRevocationList(f *testing.F) {
	w := newWorld(f, 1)
	l := NewRevocationList(w.adminPub)
	f.Add(l.Marshal())
	for _, r := range []*Revocation{w.revoke(w.admin, w.plain.id, "left", t0), w.revoke(w.inviter, w.invitee.id, "", t0)} {
		if err := l.Add(r); err != nil {
			f.Fatal(err)
		}
		f.Add(l.Marshal())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseRevocationList(w.adminPub, b)
		// the list verifies its revocations, so any refusal may come back
		checkErrIn(t, err, sentinels...)
		if err != nil {
			return
		}
		if !bytes.Equal(p.Marshal(), b) {
			t.Fatalf("ParseRevocationList(%x).Marshal() = %x", b, p.Marshal())
		}
		if err := p.Merge(l); err != nil {
			t.Fatal(err)
		}
		_ = p.RevocationOf(w.invitee.cert)
	})
}

func FuzzParseLedger(f *testing.F) {
	w := newWorld(f, 1)
	l := NewLedger(w.adminPub, w.inviter.id)
	f.Add(l.Marshal())
	for range 2 {
		if err := l.Redeem(w.token(w.inviter, RoleMember, 2), t0); err != nil {
			f.Fatal(err)
		}
		f.Add(l.Marshal())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseLedger(b)
		checkParseErr(t, err)
		if err != nil {
			return
		}
		if !bytes.Equal(p.Marshal(), b) {
			t.Fatalf("ParseLedger(%x).Marshal() = %x", b, p.Marshal())
		}
		p.Prune(t0.Add(time.Hour))
	})
}
