package member

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"slices"
	"time"
	"unicode/utf8"
)

// MaxRevocationListSize bounds the encoding of a RevocationList.
const MaxRevocationListSize = 4 << 20

// A Revocation takes a peer out of a mesh for good. Signed by the admin it
// revokes the peer id: every certificate for it and every certificate it
// issued. Signed by an inviter (whose admin-issued certificate it carries) it
// revokes the certificates that inviter issued for the peer, and nothing
// else. A Revocation is immutable; it is made by NewRevocation or
// ParseRevocation and checked by Verify.
type Revocation struct {
	subject   string
	revokedAt time.Time
	reason    string
	issuerKey ed25519.PublicKey // the admin's when issuer is nil, else issuer.subjectKey
	issuer    *Certificate
	sig       []byte
	raw       []byte
}

// NewRevocation revokes subject, a peer id, for reason (a short text shown to
// people, at most MaxReasonLen bytes), signed with issuerKey at now.
// issuerCert is nil when issuerKey is the admin's key (the admin's own
// certificate counts as nil); otherwise it is the inviter's admin-issued
// certificate, which must certify issuerKey, allow inviting and be valid at
// now.
func NewRevocation(issuerKey ed25519.PrivateKey, issuerCert *Certificate, subject, reason string, now time.Time) (*Revocation, error) {
	pub, err := publicOf(issuerKey)
	if err != nil {
		return nil, err
	}
	if issuerCert != nil && issuerCert.isAdminSelf() && issuerCert.subjectKey.Equal(pub) {
		issuerCert = nil
	}
	if err := checkPeerID(subject, "revocation subject"); err != nil {
		return nil, err
	}
	if len(reason) > MaxReasonLen || !utf8.ValidString(reason) {
		return nil, fmt.Errorf("member: revocation reason must be UTF-8 of at most %d bytes", MaxReasonLen)
	}
	if err := checkTime(now, "revocation time"); err != nil {
		return nil, err
	}
	r := &Revocation{subject: subject, revokedAt: seconds(now), reason: reason, issuerKey: pub}
	if issuerCert != nil {
		if !issuerCert.subjectKey.Equal(pub) {
			return nil, fmt.Errorf("%w: the signing key is not the one the revoker's certificate (peer %s) certifies",
				ErrNotAllowed, quote(issuerCert.subject))
		}
		if err := mayRevoke(issuerCert); err != nil {
			return nil, err
		}
		if err := issuerCert.verify(issuerCert.rootKey(), now, nil, "the revoker's certificate"); err != nil {
			return nil, err
		}
		r.issuer = issuerCert
		if r.revokedAt.Before(issuerCert.issuedAt) {
			r.revokedAt = issuerCert.issuedAt
		}
	}
	body := r.appendBody(nil)
	r.sig = sign(issuerKey, body)
	r.raw = append(body, r.sig...)
	return r, nil
}

// mayRevoke says whether the holder of c may revoke (its own invitees).
func mayRevoke(c *Certificate) error {
	if c.issuer != nil || !c.mayInvite {
		return fmt.Errorf("%w: peer %s may not invite, so it has no invitees to revoke: only the admin or a peer's inviter may revoke it",
			ErrNotAllowed, quote(c.subject))
	}
	return nil
}

func (r *Revocation) appendBody(b []byte) []byte {
	b = append(b, encodingVersion, kindRevocation)
	b = appendString(b, r.subject)
	b = appendTime(b, r.revokedAt)
	b = appendString(b, r.reason)
	if r.issuer == nil {
		b = append(b, issuerAdmin)
		b = append(b, r.issuerKey...)
	} else {
		b = append(b, issuerCert)
		b = appendBytes(b, r.issuer.raw)
	}
	return b
}

// Marshal returns the revocation's canonical encoding.
func (r *Revocation) Marshal() []byte { return bytes.Clone(r.raw) }

// ParseRevocation decodes a revocation. It checks the form only; Verify
// checks the rest.
func ParseRevocation(b []byte) (*Revocation, error) {
	b = bytes.Clone(b)
	if err := header(b, MaxEncodedSize, kindRevocation, "revocation"); err != nil {
		return nil, err
	}
	d := &decoder{b: b[2:]}
	r := &Revocation{}
	r.subject = d.peerID("subject")
	r.revokedAt = d.time("revocation time")
	r.reason = d.string(MaxReasonLen, "reason")
	switch tag := d.byte("issuer"); {
	case d.err != nil:
	case tag == issuerAdmin:
		r.issuerKey = d.key("issuer key")
	case tag == issuerCert:
		nb := d.bytes(MaxEncodedSize, "revoker certificate")
		if d.err != nil {
			break
		}
		c, err := parseCertificate(nb, 0)
		if err != nil {
			return nil, fmt.Errorf("%w (in the revoker's certificate)", err)
		}
		r.issuer, r.issuerKey = c, c.subjectKey
	default:
		d.fail("unknown issuer tag %d", tag)
	}
	r.sig = d.take(ed25519.SignatureSize, "signature")
	if err := d.finish("revocation"); err != nil {
		return nil, err
	}
	r.raw = b
	if err := canonical(b, append(r.appendBody(nil), r.sig...), "revocation"); err != nil {
		return nil, err
	}
	return r, nil
}

// Verify checks the revocation for the mesh of adminPub: it is signed by the
// admin key, or by an inviter whose admin-issued certificate allows inviting
// and was valid when it revoked (else ErrOtherMesh, ErrTampered,
// ErrNotAllowed or ErrExpired). When subjectCert is not nil it must be a
// certificate for the revoked peer, and for an inviter's revocation one that
// inviter issued (else ErrNotAllowed). Without it an inviter's revocation
// still holds, but only over the certificates that inviter issued.
func (r *Revocation) Verify(adminPub ed25519.PublicKey, subjectCert *Certificate) error {
	if err := checkAdminKey(adminPub); err != nil {
		return err
	}
	what := "the revocation of peer " + quote(r.subject)
	if root := r.rootKey(); !root.Equal(adminPub) {
		return fmt.Errorf("%w: %s is from mesh %s, not %s", ErrOtherMesh, what, MeshIDOf(root), MeshIDOf(adminPub))
	}
	if !verifySig(r.issuerKey, r.raw[:len(r.raw)-ed25519.SignatureSize], r.sig) {
		return fmt.Errorf("%w: the signature of %s does not verify", ErrTampered, what)
	}
	if p := r.issuer; !r.ByAdmin() {
		label := "the revoker's certificate (peer " + quote(p.subject) + ")"
		if err := p.verifyChain(adminPub, label); err != nil {
			return err
		}
		if err := mayRevoke(p); err != nil {
			return err
		}
		if r.revokedAt.Before(p.issuedAt.Add(-ClockSkew)) || !r.revokedAt.Before(p.expires) {
			return fmt.Errorf("%w: %s was not valid when it revoked peer %s at %s (it was valid from %s to %s)",
				ErrExpired, label, quote(r.subject), stamp(r.revokedAt), stamp(p.issuedAt), stamp(p.expires))
		}
	}
	if c := subjectCert; c != nil {
		if c.subject != r.subject {
			return fmt.Errorf("%w: %s came with the certificate of another peer, %s", ErrNotAllowed, what, quote(c.subject))
		}
		if !r.ByAdmin() {
			if err := c.verifyChain(adminPub, "the certificate of peer "+quote(c.subject)); err != nil {
				return err
			}
			if !c.issuerKey.Equal(r.issuerKey) {
				return fmt.Errorf("%w: peer %s did not invite peer %s: only the admin or its inviter may revoke it",
					ErrNotAllowed, quote(r.issuer.subject), quote(r.subject))
			}
		}
	}
	return nil
}

func (r *Revocation) rootKey() ed25519.PublicKey {
	if r.issuer != nil {
		return r.issuer.rootKey()
	}
	return r.issuerKey
}

// MeshID is the id of the mesh the revocation claims (checked by Verify).
func (r *Revocation) MeshID() string { return MeshIDOf(r.rootKey()) }

// Subject is the revoked peer id.
func (r *Revocation) Subject() string { return r.subject }

// RevokedAt is when the revocation was made, in whole seconds.
func (r *Revocation) RevokedAt() time.Time { return r.revokedAt }

// Reason is the revoker's short explanation.
func (r *Revocation) Reason() string { return r.reason }

// IssuerKey is the key that signed the revocation.
func (r *Revocation) IssuerKey() ed25519.PublicKey { return bytes.Clone(r.issuerKey) }

// IssuerCert is the revoking inviter's certificate, or nil when the admin
// revoked (or the admin's own certificate, if whoever made the revocation
// put it there).
func (r *Revocation) IssuerCert() *Certificate { return r.issuer }

// ByAdmin reports whether the admin signed the revocation (and so revoked
// the peer id as a whole).
func (r *Revocation) ByAdmin() bool { return r.issuer == nil || r.issuer.isAdminSelf() }

// LogValue implements slog.LogValuer.
func (r *Revocation) LogValue() slog.Value {
	by := "admin"
	if r.issuer != nil {
		by = r.issuer.subject
	}
	return slog.GroupValue(
		slog.String("mesh", r.MeshID()),
		slog.String("subject", r.subject),
		slog.String("by", by),
		slog.Time("at", r.revokedAt),
		slog.String("reason", r.reason),
	)
}

// scope is what a revocation revokes: the subject's certificates issued by
// issuer (a key as a string), or all of them when issuer is "" (the admin).
type scope struct{ issuer, subject string }

func (r *Revocation) scope() scope {
	if r.ByAdmin() {
		return scope{subject: r.subject}
	}
	return scope{issuer: string(r.issuerKey), subject: r.subject}
}

// A RevocationList is the set of revocations of one mesh. It holds only
// revocations that verified against its admin key, one per scope (the earliest,
// so that merging is commutative), and is a Revoker for Certificate.Verify.
// It is a plain value: not safe for concurrent use, persisted and gossiped by
// the caller through Marshal and ParseRevocationList. The methods that read
// accept a nil list, which revokes nothing.
type RevocationList struct {
	admin ed25519.PublicKey
	m     map[scope]*Revocation
}

// NewRevocationList returns an empty list for the mesh of adminPub.
func NewRevocationList(adminPub ed25519.PublicKey) *RevocationList {
	return &RevocationList{admin: bytes.Clone(adminPub), m: map[scope]*Revocation{}}
}

// Add verifies r against the list's mesh (Revocation.Verify without a
// subject certificate) and adds it. Adding a revocation already there is a
// no-op.
func (l *RevocationList) Add(r *Revocation) error {
	if err := r.Verify(l.admin, nil); err != nil {
		return err
	}
	l.insert(r)
	return nil
}

func (l *RevocationList) insert(r *Revocation) {
	k := r.scope()
	if old := l.m[k]; old == nil || r.revokedAt.Before(old.revokedAt) ||
		r.revokedAt.Equal(old.revokedAt) && bytes.Compare(r.raw, old.raw) < 0 {
		l.m[k] = r
	}
}

// Merge adds every revocation of o, a list of the same mesh (else
// ErrOtherMesh).
func (l *RevocationList) Merge(o *RevocationList) error {
	if o == nil {
		return nil
	}
	if !o.admin.Equal(l.admin) {
		return fmt.Errorf("%w: the revocation list is for mesh %s, not %s", ErrOtherMesh, MeshIDOf(o.admin), MeshIDOf(l.admin))
	}
	for _, r := range o.m {
		l.insert(r)
	}
	return nil
}

// IsRevoked reports whether the admin revoked peerID. Inviters' revocations
// are scoped to the certificates they issued and do not count here; use
// RevocationOf (or Certificate.Verify) for a certificate.
func (l *RevocationList) IsRevoked(peerID string) bool {
	return l != nil && l.m[scope{subject: peerID}] != nil
}

// RevocationOf returns the revocation that revokes c, or nil: the admin's
// revocation of c's subject, or that of the inviter that issued c.
func (l *RevocationList) RevocationOf(c *Certificate) *Revocation {
	if l == nil || c == nil {
		return nil
	}
	if r := l.m[scope{subject: c.subject}]; r != nil {
		return r
	}
	if c.issuer != nil {
		return l.m[scope{issuer: string(c.issuerKey), subject: c.subject}]
	}
	return nil
}

// Len is the number of revocations in the list.
func (l *RevocationList) Len() int {
	if l == nil {
		return 0
	}
	return len(l.m)
}

// Revocations returns the list's revocations in canonical order.
func (l *RevocationList) Revocations() []*Revocation {
	if l == nil {
		return nil
	}
	rs := make([]*Revocation, 0, len(l.m))
	for _, r := range l.m {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b *Revocation) int { return bytes.Compare(a.raw, b.raw) })
	return rs
}

// Marshal encodes the list canonically: equal sets encode to equal bytes.
// The admin key is not included; ParseRevocationList takes it.
func (l *RevocationList) Marshal() []byte {
	b := []byte{encodingVersion, kindRevocationList}
	rs := l.Revocations()
	b = appendUvarint(b, len(rs))
	for _, r := range rs {
		b = appendBytes(b, r.raw)
	}
	return b
}

// ParseRevocationList decodes a list made by Marshal for the mesh of
// adminPub, verifying every revocation in it.
func ParseRevocationList(adminPub ed25519.PublicKey, b []byte) (*RevocationList, error) {
	if err := checkAdminKey(adminPub); err != nil {
		return nil, err
	}
	b = bytes.Clone(b)
	if err := header(b, MaxRevocationListSize, kindRevocationList, "revocation list"); err != nil {
		return nil, err
	}
	l := NewRevocationList(adminPub)
	d := &decoder{b: b[2:]}
	n := d.uvarint("count")
	for i := uint64(0); i < n && d.err == nil; i++ {
		rb := d.bytes(MaxEncodedSize, "revocation")
		if d.err != nil {
			break
		}
		r, err := ParseRevocation(rb)
		if err == nil {
			err = l.Add(r)
		}
		if err != nil {
			return nil, fmt.Errorf("%w (revocation %d of the list)", err, i+1)
		}
	}
	if err := d.finish("revocation list"); err != nil {
		return nil, err
	}
	if err := canonical(b, l.Marshal(), "revocation list"); err != nil {
		return nil, err
	}
	return l, nil
}
