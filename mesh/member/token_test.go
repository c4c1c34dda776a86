package member

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestTokenRoundTrip(t *testing.T) {
	w := newWorld(t, 1)
	for _, tc := range []struct {
		name     string
		by       peer
		role     Role
		uses     int
		cert     bool
		maxChars int
	}{
		{"admin invites a member", w.admin, RoleMember, 1, false, 400},
		{"admin invites a trainer", w.admin, RoleTrainer, 5, false, 400},
		{"inviter invites a member", w.inviter, RoleMember, 3, true, 600},
		{"trainer invites a trainer", w.trainer, RoleTrainer, 1, true, 600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := w.token(tc.by, tc.role, tc.uses)
			s := tok.String()
			t.Logf("%d characters: %s", len(s), s)
			if len(s) > tc.maxChars {
				t.Errorf("token of %d characters, want at most %d", len(s), tc.maxChars)
			}
			if strings.ContainsAny(s, " \n\t=+/") || !strings.HasPrefix(s, TokenPrefix) {
				t.Errorf("token %q is not one copy-pasteable line", s)
			}
			p, err := ParseToken(s)
			if err != nil {
				t.Fatal(err)
			}
			if p.String() != s || !bytes.Equal(p.Marshal(), tok.Marshal()) {
				t.Fatal("parse → String changed the token")
			}
			if err := p.Verify(t0.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			if err := p.VerifyFor(w.adminPub, t0.Add(time.Hour), nil); err != nil {
				t.Fatal(err)
			}
			if p.MeshID() != MeshIDOf(w.adminPub) || !p.AdminKey().Equal(w.adminPub) || p.Inviter() != tc.by.id ||
				!p.InviterKey().Equal(tc.by.pub()) || p.Role() != tc.role || p.MaxUses() != tc.uses ||
				!p.Expires().Equal(t0.Add(DefaultTokenTTL)) || p.Nonce() != tok.Nonce() ||
				strings.Join(p.Addrs(), " ") != "/ip4/192.168.1.23/udp/4001/quic-v1 /ip4/203.0.113.7/tcp/4001" {
				t.Errorf("parsed token differs: %v", p.LogValue())
			}
			if (p.InviterCert() != nil) != tc.cert {
				t.Errorf("inviter certificate present: %v, want %v", p.InviterCert() != nil, tc.cert)
			}
			spec := p.CertSpecFor(w.invitee.id, w.invitee.pub())
			if spec.Role != tc.role || spec.MayInvite || spec.Subject != w.invitee.id {
				t.Errorf("CertSpecFor: %+v", spec)
			}
		})
	}
}

func TestTokenLogValue(t *testing.T) {
	w := newWorld(t, 1)
	tok := w.token(w.inviter, RoleMember, 1)
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("invite", "token", tok)
	out := buf.String()
	if !strings.Contains(out, "token.inviter="+w.inviter.id) {
		t.Errorf("log line %q lacks the inviter", out)
	}
	enc := tok.String()[len(TokenPrefix):]
	if strings.Contains(out, enc[:20]) || strings.Contains(out, fmt.Sprintf("%x", tok.Nonce())) {
		t.Errorf("log line %q holds the token", out)
	}
}

func TestParseTokenWhitespace(t *testing.T) {
	w := newWorld(t, 1)
	s := w.token(w.inviter, RoleMember, 1).String()
	wrap := func(s string, n int, sep string) string {
		var b strings.Builder
		for i := 0; i < len(s); i += n {
			if i > 0 {
				b.WriteString(sep)
			}
			b.WriteString(s[i:min(i+n, len(s))])
		}
		return b.String()
	}
	for _, tc := range []struct{ name, in string }{
		{"as is", s},
		{"surrounding newlines", "\n\n" + s + "\n"},
		{"CRLF and spaces", "  " + s + " \r\n"},
		{"tabs", "\t" + s + "\t"},
		{"wrapped at 64", wrap(s, 64, "\n")},
		{"wrapped at 76 with CRLF and indent", wrap(s, 76, "\r\n    ")},
		{"non-breaking spaces", "\u00a0" + s + "\u00a0"},
		{"byte order mark", "\ufeff" + s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseToken(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if p.String() != s {
				t.Fatal("a different token")
			}
		})
	}
}

func TestTokenTamper(t *testing.T) {
	w := newWorld(t, 1)
	for _, by := range []peer{w.admin, w.inviter} {
		tok := w.token(by, RoleMember, 2)
		s := tok.String()
		n := 0
		flips([]byte(s), func(i int, mask byte, f []byte) {
			p, err := ParseToken(string(f))
			if err == nil {
				err = p.Verify(t0.Add(time.Hour))
			}
			if err == nil {
				t.Fatalf("token by %s with character %d ^ %#x verifies", by.id, i, mask)
			}
			n++
		})
		flips(tok.Marshal(), func(i int, mask byte, f []byte) {
			p, err := ParseTokenBinary(f)
			if err == nil {
				err = p.Verify(t0.Add(time.Hour))
			}
			if err == nil {
				t.Fatalf("token by %s with byte %d ^ %#x verifies", by.id, i, mask)
			}
			n++
		})
		for i := range len(s) {
			if _, err := ParseToken(s[:i]); err == nil {
				t.Fatalf("token cut to %d characters parses", i)
			}
		}
		t.Logf("token by %s: %d flips refused", by.id, n)
	}
}

// TestTokenLastCharacter changes the last character of tokens whose
// base64 ends in a partial group, where a lax decoder ignores some bits: only
// the original may verify.
func TestTokenLastCharacter(t *testing.T) {
	w := newWorld(t, 1)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	rems := map[int]bool{}
	for pad := range 3 {
		tok, err := NewToken(w.admin.key, nil, TokenSpec{Inviter: w.admin.id, Addrs: []string{"/dns4/" + strings.Repeat("a", pad) + ".example/tcp/4001"}}, t0, w.rnd)
		if err != nil {
			t.Fatal(err)
		}
		s := tok.String()
		rems[len(s[len(TokenPrefix):])%4] = true
		for _, c := range alphabet {
			f := s[:len(s)-1] + string(c)
			p, err := ParseToken(f)
			if err == nil {
				err = p.Verify(t0)
			}
			if (err == nil) != (f == s) {
				t.Fatalf("last character %c of %s: %v", c, s, err)
			}
		}
	}
	if !rems[2] || !rems[3] {
		t.Fatalf("base64 lengths mod 4: %v, want 2 and 3 among them", rems)
	}
}

// forgeToken signs a token without NewToken's checks.
func forgeToken(tb testing.TB, key ed25519.PrivateKey, cert *Certificate, role Role, expires time.Time) *Token {
	tb.Helper()
	tok := &Token{
		adminKey: key.Public().(ed25519.PublicKey),
		inviter:  peerID("forger"),
		addrs:    []string{"/ip4/10.0.0.1/tcp/1"},
		role:     role,
		expires:  seconds(expires),
		maxUses:  1,
	}
	if cert != nil {
		tok.inviterCert, tok.inviter, tok.adminKey = cert, cert.subject, cert.rootKey()
	}
	body := tok.appendBody(nil)
	tok.sig = sign(key, body)
	p, err := ParseToken(TokenPrefix + tokenEncoding.EncodeToString(append(body, tok.sig...)))
	if err != nil {
		tb.Fatalf("forged token does not parse: %v", err)
	}
	return p
}

func TestTokenRefusals(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	tok := w.token(w.inviter, RoleMember, 1)
	revokeInviter := NewRevocationList(w.adminPub)
	rev, err := NewRevocation(w.admin.key, nil, w.inviter.id, "lost phone", t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := revokeInviter.Add(rev); err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	for _, tc := range []struct {
		name    string
		tok     *Token
		admin   ed25519.PublicKey // nil: Verify, else VerifyFor
		revoked Revoker
		now     time.Time
		want    error
		wantMsg string
	}{
		{"valid", tok, w.adminPub, revokeInviter.without(), t0, nil, ""},
		{"valid, last second", tok, nil, nil, tok.Expires().Add(-time.Second), nil, ""},
		{"expired", tok, nil, nil, tok.Expires(), ErrExpired, "the invite token expired at 2026-11-26T10:00:00Z (0s ago)"},
		{"expired a day ago", tok, w.adminPub, nil, tok.Expires().Add(day), ErrExpired, "the invite token expired at 2026-11-26T10:00:00Z (24h ago)"},
		{"other mesh", tok, other.adminPub, nil, t0, ErrOtherMesh, "is for mesh " + MeshIDOf(w.adminPub) + ", not " + MeshIDOf(other.adminPub)},
		{"admin token of other mesh", other.token(other.admin, RoleMember, 1), w.adminPub, nil, t0, ErrOtherMesh, ""},
		{"revoked inviter", tok, w.adminPub, revokeInviter, t0, ErrRevoked, "lost phone"},
		{"inviter certificate expired", forgeToken(t, w.inviter.key, w.inviter.cert, RoleMember, w.inviter.cert.Expires()), nil, nil, w.inviter.cert.Expires(), ErrExpired, "the inviter's certificate"},
		{"inviter without may-invite", forgeToken(t, w.plain.key, w.plain.cert, RoleMember, t0.Add(day)), nil, nil, t0, ErrNotAllowed, "may not invite"},
		{"role above the inviter's", forgeToken(t, w.inviter.key, w.inviter.cert, RoleTrainer, t0.Add(day)), nil, nil, t0, ErrNotAllowed, "trainer role"},
		{"invitee invites", forgeToken(t, w.invitee.key, w.invitee.cert, RoleMember, t0.Add(day)), nil, nil, t0, ErrNotAllowed, "at most two links"},
		{"outlives the inviter's certificate", forgeToken(t, w.inviter.key, w.inviter.cert, RoleMember, t0.Add(60*day)), nil, nil, t0, ErrNotAllowed, "outlasts"},
		{"signed by another key", forgeToken(t, w.plain.key, w.inviter.cert, RoleMember, t0.Add(day)), nil, nil, t0, ErrTampered, "signature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.admin == nil {
				err = tc.tok.Verify(tc.now)
			} else {
				err = tc.tok.VerifyFor(tc.admin, tc.now, tc.revoked)
			}
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

// without returns an empty list of l's mesh.
func (l *RevocationList) without() *RevocationList { return NewRevocationList(l.admin) }

func TestParseTokenErrors(t *testing.T) {
	w := newWorld(t, 1)
	tok := w.token(w.admin, RoleMember, 1)
	b := tok.Marshal()
	v2 := bytes.Clone(b)
	v2[0] = 2
	enc := tokenEncoding.EncodeToString
	for _, tc := range []struct {
		name, in string
		want     error
		wantMsg  string
	}{
		{"empty", "", ErrTampered, "not an invite token"},
		{"format 2", "clawmesh-invite2:" + enc(b), ErrVersion, "format 2"},
		{"format 10", "clawmesh-invite10:" + enc(b), ErrVersion, "format 10"},
		{"encoding version 2", TokenPrefix + enc(v2), ErrVersion, "encoding version 2"},
		{"other prefix", "clawmesh-invitation:" + enc(b), ErrTampered, "not an invite token"},
		{"upper case", strings.ToUpper(TokenPrefix) + enc(b), ErrTampered, "not an invite token"},
		{"padded", TokenPrefix + enc(b) + "==", ErrTampered, "base64url"},
		{"standard base64", TokenPrefix + strings.NewReplacer("-", "+", "_", "/").Replace(enc(b)) + "+/", ErrTampered, "base64url"},
		{"a certificate", TokenPrefix + enc(w.plain.cert.Marshal()), ErrTampered, "not an encoded invite token"},
		{"trailing byte", TokenPrefix + enc(append(bytes.Clone(b), 0)), ErrTampered, "trailing"},
		{"too long", TokenPrefix + strings.Repeat("A", tokenEncoding.EncodedLen(MaxEncodedSize)+1), ErrTampered, "too long"},
		{"far too long", strings.Repeat(" ", maxTokenText+1), ErrTampered, "too long"},
		{"no addresses", TokenPrefix + enc(noAddrs(t, w)), ErrTampered, "addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseToken(tc.in)
			checkErr(t, err, tc.want)
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
}

// noAddrs is a token signed by the admin with no addresses.
func noAddrs(tb testing.TB, w *world) []byte {
	tok := &Token{adminKey: w.adminPub, inviter: w.admin.id, role: RoleMember, expires: t0.Add(time.Hour), maxUses: 1}
	body := tok.appendBody(nil)
	return append(body, sign(w.admin.key, body)...)
}

func TestNewTokenRefusals(t *testing.T) {
	w := newWorld(t, 1)
	addrs := []string{"/ip4/10.0.0.1/tcp/4001"}
	for _, tc := range []struct {
		name string
		by   peer
		cert bool
		spec TokenSpec
		now  time.Time
		want error // nil: any error
	}{
		{"inviter without may-invite", w.plain, true, TokenSpec{Addrs: addrs}, t0, ErrNotAllowed},
		{"role above the inviter's", w.inviter, true, TokenSpec{Addrs: addrs, Role: RoleTrainer}, t0, ErrNotAllowed},
		{"admin role", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: addrs, Role: RoleAdmin}, t0, ErrNotAllowed},
		{"invitee invites", w.invitee, true, TokenSpec{Addrs: addrs}, t0, ErrNotAllowed},
		{"inviter certificate expired", w.inviter, true, TokenSpec{Addrs: addrs}, w.inviter.cert.Expires(), ErrExpired},
		{"key is not the certificate's", peer{key: w.plain.key, cert: w.inviter.cert}, true, TokenSpec{Addrs: addrs}, t0, ErrNotAllowed},
		{"inviter is not the certificate's", w.inviter, true, TokenSpec{Inviter: w.plain.id, Addrs: addrs}, t0, nil},
		{"admin without a peer id", w.admin, false, TokenSpec{Addrs: addrs}, t0, nil},
		{"no addresses", w.admin, false, TokenSpec{Inviter: w.admin.id}, t0, nil},
		{"address not UTF-8", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: []string{"/ip4/\xff"}}, t0, nil},
		{"empty address", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: []string{""}}, t0, nil},
		{"too many addresses", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: make([]string, MaxAddrs+1)}, t0, nil},
		{"too many uses", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: addrs, MaxUses: MaxTokenUses + 1}, t0, nil},
		{"negative uses", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: addrs, MaxUses: -1}, t0, nil},
		{"negative ttl", w.admin, false, TokenSpec{Inviter: w.admin.id, Addrs: addrs, TTL: -time.Hour}, t0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cert *Certificate
			if tc.cert {
				cert = tc.by.cert
			}
			_, err := NewToken(tc.by.key, cert, tc.spec, tc.now, w.rnd)
			if err == nil {
				t.Fatal("made a token")
			}
			if tc.want != nil {
				checkErr(t, err, tc.want)
			}
		})
	}
}

func TestNewTokenCapsExpiry(t *testing.T) {
	w := newWorld(t, 1)
	now := w.inviter.cert.Expires().Add(-time.Hour)
	tok, err := NewToken(w.inviter.key, w.inviter.cert, TokenSpec{Addrs: []string{"/a"}, TTL: 48 * time.Hour}, now, w.rnd)
	if err != nil {
		t.Fatal(err)
	}
	if !tok.Expires().Equal(w.inviter.cert.Expires()) {
		t.Errorf("token expires %v, inviter's certificate %v", tok.Expires(), w.inviter.cert.Expires())
	}
	// the admin's own certificate makes an admin token
	tok, err = NewToken(w.admin.key, w.admin.cert, TokenSpec{Addrs: []string{"/a"}}, t0, w.rnd)
	if err != nil {
		t.Fatal(err)
	}
	if tok.InviterCert() != nil || tok.Inviter() != w.admin.id {
		t.Errorf("admin token: inviter %s, certificate %v", tok.Inviter(), tok.InviterCert() != nil)
	}
	checkErr(t, tok.Verify(t0), nil)
}
