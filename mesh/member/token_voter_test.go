package member

import (
	"testing"
	"time"
)

// voterToken makes a trainer token by the admin that makes a voter.
func (w *world) voterToken(uses int) *Token {
	w.tb.Helper()
	tok, err := NewToken(w.admin.key, nil, TokenSpec{
		Inviter: w.admin.id, Addrs: []string{"/ip4/192.168.1.23/udp/4001/quic-v1"}, Role: RoleTrainer, MaxUses: uses, Voter: true,
	}, t0, w.rnd)
	if err != nil {
		w.tb.Fatalf("voter token: %v", err)
	}
	return tok
}

// TestVoterToken: the admin's trainer token may say that its trainer is
// to be a voter; the flag survives the text form, is covered by the
// signature, and a token without it encodes as before the flag existed.
func TestVoterToken(t *testing.T) {
	w := newWorld(t, 1)
	tok := w.voterToken(2)
	p, err := ParseToken(tok.String())
	if err != nil {
		t.Fatal(err)
	}
	if !p.Voter() || p.Role() != RoleTrainer || p.MaxUses() != 2 {
		t.Fatalf("parsed voter token: %v", p.LogValue())
	}
	if err := p.VerifyFor(w.adminPub, t0.Add(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	plain := w.token(w.admin, RoleTrainer, 2)
	if plain.Voter() {
		t.Fatal("a token without the flag makes a voter")
	}
	// The flag is the role byte's high bit: a plain token's role byte is
	// the role alone, as before voters existed.
	v := *plain
	v.voter = true
	a, b := plain.appendBody(nil), v.appendBody(nil)
	var diff []int
	for i := range a {
		if a[i] != b[i] {
			diff = append(diff, i)
		}
	}
	if len(a) != len(b) || len(diff) != 1 || a[diff[0]] != byte(RoleTrainer) || b[diff[0]] != byte(RoleTrainer)|0x80 {
		t.Fatalf("the flag changes bytes %v of the encoding", diff)
	}
	// The flag is signed: clearing it from a voter token, or setting it
	// on a plain one, breaks the signature.
	flip := func(tok *Token) *Token {
		t.Helper()
		q := *tok
		q.voter = !q.voter
		body := q.appendBody(nil)
		p, err := ParseTokenBinary(append(body, tok.sig...))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if q := flip(tok); q.Voter() || q.Verify(t0) == nil {
		t.Error("a voter token with the flag cleared verifies")
	}
	if q := flip(plain); !q.Voter() || q.Verify(t0) == nil {
		t.Error("a plain token with the flag set verifies")
	}
}

// TestVoterTokenRefusals: only the admin's key makes a voter, only of a
// trainer.
func TestVoterTokenRefusals(t *testing.T) {
	w := newWorld(t, 1)
	addrs := []string{"/ip4/10.0.0.1/tcp/4001"}
	if _, err := NewToken(w.trainer.key, w.trainer.cert, TokenSpec{Addrs: addrs, Role: RoleTrainer, Voter: true}, t0, w.rnd); err == nil {
		t.Error("an inviter made a voter token")
	} else {
		checkErr(t, err, ErrNotAllowed)
	}
	if _, err := NewToken(w.admin.key, nil, TokenSpec{Inviter: w.admin.id, Addrs: addrs, Role: RoleMember, Voter: true}, t0, w.rnd); err == nil {
		t.Error("a member token made a voter")
	}
	// An inviter's token with the flag, signed by the inviter: it parses
	// (the form is right) but does not verify.
	forged := &Token{adminKey: w.adminPub, inviter: w.trainer.id, inviterCert: w.trainer.cert, addrs: addrs, role: RoleTrainer,
		expires: t0.Add(time.Hour), maxUses: 1, voter: true}
	body := forged.appendBody(nil)
	p, err := ParseTokenBinary(append(body, sign(w.trainer.key, body)...))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(t0); err == nil {
		t.Error("an inviter's voter token verifies")
	} else {
		checkErr(t, err, ErrNotAllowed)
	}
	member := &Token{adminKey: w.adminPub, inviter: w.admin.id, addrs: addrs, role: RoleMember, expires: t0.Add(time.Hour), maxUses: 1, voter: true}
	body = member.appendBody(nil)
	if _, err := ParseTokenBinary(append(body, sign(w.admin.key, body)...)); err == nil {
		t.Error("a member token that makes a voter parsed")
	}
}
