package mesh

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// TestCertHoldsIsVerify: the check Admitted makes at every use agrees with
// Certificate.Verify on every certificate, time and revocation list: an
// admin-issued and an inviter-issued certificate, before, within and after
// their validity and their inviter's, revoked by the admin, by their
// inviter, or through their inviter's revocation.
func TestCertHoldsIsVerify(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	adminPub, admin, _ := ed25519.GenerateKey(rand.Reader)
	key := func() (ed25519.PublicKey, ed25519.PrivateKey) {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		return pub, priv
	}
	issue := func(by ed25519.PrivateKey, byCert *member.Certificate, spec member.CertSpec, at time.Time) *member.Certificate {
		t.Helper()
		c, err := member.IssueCertificate(by, byCert, spec, at, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	invPub, invKey := key()
	inviter := issue(admin, nil, member.CertSpec{Subject: "12D3KooWInviter", SubjectKey: invPub, MayInvite: true, TTL: 48 * time.Hour}, t0)
	mPub, _ := key()
	member1 := issue(admin, nil, member.CertSpec{Subject: "12D3KooWMember", SubjectKey: mPub, TTL: 10 * time.Hour}, t0.Add(time.Hour))
	iPub, _ := key()
	invitee := issue(invKey, inviter, member.CertSpec{Subject: "12D3KooWInvitee", SubjectKey: iPub, TTL: 10 * time.Hour}, t0.Add(time.Hour))
	longPub, _ := key()
	long := issue(invKey, inviter, member.CertSpec{Subject: "12D3KooWLong", SubjectKey: longPub}, t0.Add(time.Hour)) // cut at the inviter's expiry

	revoke := func(by ed25519.PrivateKey, byCert *member.Certificate, subject string) *member.RevocationList {
		t.Helper()
		r, err := member.NewRevocation(by, byCert, subject, "test", t0.Add(2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		l := member.NewRevocationList(adminPub)
		if err := l.Add(r); err != nil {
			t.Fatal(err)
		}
		return l
	}
	lists := map[string]*member.RevocationList{
		"none":                      member.NewRevocationList(adminPub),
		"nil":                       nil,
		"admin revokes member":      revoke(admin, nil, "12D3KooWMember"),
		"admin revokes invitee":     revoke(admin, nil, "12D3KooWInvitee"),
		"inviter revokes invitee":   revoke(invKey, inviter, "12D3KooWInvitee"),
		"admin revokes the inviter": revoke(admin, nil, "12D3KooWInviter"),
		"inviter revokes another":   revoke(invKey, inviter, "12D3KooWOther"),
	}
	times := []time.Time{
		t0.Add(time.Hour - member.ClockSkew - time.Second), t0.Add(time.Hour - member.ClockSkew), t0.Add(2 * time.Hour),
		t0.Add(11*time.Hour - time.Second), t0.Add(11 * time.Hour), t0.Add(47 * time.Hour), t0.Add(48 * time.Hour), t0.Add(49 * time.Hour),
	}
	certs := map[string]*member.Certificate{"inviter": inviter, "member": member1, "invitee": invitee, "long": long}
	var held, refused int
	for cn, c := range certs {
		for ln, l := range lists {
			for _, now := range times {
				var revs member.Revoker
				if l != nil {
					revs = l
				}
				want := c.Verify(adminPub, now, revs)
				if got := certHolds(c, now, l); got != (want == nil) {
					t.Errorf("%s, revocations %s, at %s: holds %v, Verify says %v", cn, ln, now.Sub(t0), got, want)
				}
				if want == nil {
					held++
				} else {
					refused++
				}
			}
		}
	}
	if held == 0 || refused == 0 {
		t.Fatalf("the cases do not cover both outcomes: %d held, %d refused", held, refused)
	}
}
