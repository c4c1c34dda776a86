package member

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// DefaultCertTTL is a certificate's lifetime when CertSpec.TTL is zero.
// Certificates are short-lived so that a lost device drops out of the mesh
// even if nobody revokes it; NeedsRenewal says when to reissue.
const DefaultCertTTL = 30 * 24 * time.Hour

// CertSpec is what an issuer puts in a certificate.
type CertSpec struct {
	// Subject is the subject's libp2p peer id (required).
	Subject string
	// SubjectKey is the subject's Ed25519 signing key (required).
	SubjectKey ed25519.PublicKey
	// Role is the subject's role; zero means RoleMember.
	Role Role
	// MayInvite lets the subject invite others and issue their
	// certificates. Only the admin can grant it.
	MayInvite bool
	// TTL is the lifetime; zero means DefaultCertTTL. An inviter-issued
	// certificate is cut short at its inviter certificate's expiry.
	TTL time.Duration
}

// A Certificate says that a peer id, holding a signing key, is in a mesh with
// a role. It is signed by the admin, or by an inviter whose own (admin-signed)
// certificate it carries. A Certificate is immutable; it is made by
// IssueCertificate or ParseCertificate, and checked by Verify.
type Certificate struct {
	subject    string
	subjectKey ed25519.PublicKey
	role       Role
	mayInvite  bool
	serial     [SerialSize]byte
	issuedAt   time.Time
	expires    time.Time
	issuerKey  ed25519.PublicKey // the admin's when issuer is nil, else issuer.subjectKey
	issuer     *Certificate
	sig        []byte
	raw        []byte // the whole encoding; the signature covers raw[:len(raw)-64]
}

// IssueCertificate issues a certificate for spec, signed with issuerKey.
// issuerCert is nil when issuerKey is the admin's key (the admin's own
// certificate counts as nil); otherwise it is the issuer's admin-issued
// certificate, which must certify issuerKey, allow inviting, be valid at now,
// and hold a role at least spec.Role, and spec.MayInvite must be false (see
// the package documentation for the rules). The serial is read from rand.
func IssueCertificate(issuerKey ed25519.PrivateKey, issuerCert *Certificate, spec CertSpec, now time.Time, rand io.Reader) (*Certificate, error) {
	pub, err := publicOf(issuerKey)
	if err != nil {
		return nil, err
	}
	if issuerCert != nil && issuerCert.isAdminSelf() && issuerCert.subjectKey.Equal(pub) {
		issuerCert = nil
	}
	role := spec.Role.orMember()
	if !role.valid() {
		return nil, fmt.Errorf("member: certificate: unknown role %d", spec.Role)
	}
	if err := checkPeerID(spec.Subject, "certificate subject"); err != nil {
		return nil, err
	}
	if len(spec.SubjectKey) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("member: certificate: subject key has %d bytes, want %d", len(spec.SubjectKey), ed25519.PublicKeySize)
	}
	if err := checkTime(now, "issue time"); err != nil {
		return nil, err
	}
	c := &Certificate{
		subject:    spec.Subject,
		subjectKey: bytes.Clone(spec.SubjectKey),
		role:       role,
		mayInvite:  spec.MayInvite,
		issuedAt:   seconds(now),
		issuerKey:  pub,
	}
	if issuerCert != nil && c.issuedAt.Before(issuerCert.issuedAt) {
		// now is within ClockSkew before the issuer's certificate
		c.issuedAt = issuerCert.issuedAt
	}
	exp, err := lifetime(c.issuedAt, spec.TTL, DefaultCertTTL, "certificate")
	if err != nil {
		return nil, err
	}
	c.expires = exp
	if issuerCert == nil {
		if role == RoleAdmin && !spec.SubjectKey.Equal(pub) {
			return nil, fmt.Errorf("%w: only the admin's own key can hold the admin role", ErrNotAllowed)
		}
	} else {
		if !issuerCert.subjectKey.Equal(pub) {
			return nil, fmt.Errorf("%w: the signing key is not the one the issuer's certificate (peer %s) certifies",
				ErrNotAllowed, quote(issuerCert.subject))
		}
		if err := mayGrant(issuerCert, role, spec.MayInvite); err != nil {
			return nil, err
		}
		if err := issuerCert.verify(issuerCert.rootKey(), now, nil, "the issuer's certificate"); err != nil {
			return nil, err
		}
		c.issuer = issuerCert
		if c.expires.After(issuerCert.expires) {
			c.expires = issuerCert.expires
		}
	}
	if err := readRandom(rand, c.serial[:]); err != nil {
		return nil, err
	}
	c.sign(issuerKey)
	return c, nil
}

// sign fills in the signature and the encoding.
func (c *Certificate) sign(key ed25519.PrivateKey) {
	body := c.appendBody(nil)
	c.sig = sign(key, body)
	c.raw = append(body, c.sig...)
}

func (c *Certificate) appendBody(b []byte) []byte {
	b = append(b, encodingVersion, kindCert)
	b = appendString(b, c.subject)
	b = append(b, c.subjectKey...)
	var flags byte
	if c.mayInvite {
		flags = 1
	}
	b = append(b, byte(c.role), flags)
	b = append(b, c.serial[:]...)
	b = appendTime(b, c.issuedAt)
	b = appendTime(b, c.expires)
	if c.issuer == nil {
		b = append(b, issuerAdmin)
		b = append(b, c.issuerKey...)
	} else {
		b = append(b, issuerCert)
		b = appendBytes(b, c.issuer.raw)
	}
	return b
}

// Marshal returns the certificate's canonical encoding, the bytes its issuer
// signed followed by the signature.
func (c *Certificate) Marshal() []byte { return bytes.Clone(c.raw) }

// ParseCertificate decodes a certificate. It checks the form only (sizes,
// version, canonical encoding); Verify checks signatures, the chain rules,
// validity and revocation.
func ParseCertificate(b []byte) (*Certificate, error) {
	return parseCertificate(bytes.Clone(b), 0)
}

func parseCertificate(b []byte, depth int) (*Certificate, error) {
	if err := header(b, MaxEncodedSize, kindCert, "certificate"); err != nil {
		return nil, err
	}
	d := &decoder{b: b[2:]}
	c := &Certificate{}
	c.subject = d.peerID("subject")
	c.subjectKey = d.key("subject key")
	c.role = Role(d.byte("role"))
	if d.err == nil && !c.role.valid() {
		d.fail("unknown role %d", c.role)
	}
	switch flags := d.byte("flags"); {
	case flags&^1 != 0:
		d.fail("unknown flags %#x", flags)
	default:
		c.mayInvite = flags == 1
	}
	copy(c.serial[:], d.take(SerialSize, "serial"))
	c.issuedAt = d.time("issue time")
	c.expires = d.time("expiry")
	if d.err == nil && !c.expires.After(c.issuedAt) {
		d.fail("expires (%s) before it is issued (%s)", stamp(c.expires), stamp(c.issuedAt))
	}
	switch tag := d.byte("issuer"); {
	case d.err != nil:
	case tag == issuerAdmin:
		c.issuerKey = d.key("issuer key")
	case tag == issuerCert:
		if depth+1 >= maxNesting {
			d.fail("certificates nested %d deep", depth+2)
			break
		}
		nb := d.bytes(MaxEncodedSize, "issuer certificate")
		if d.err != nil {
			break
		}
		p, err := parseCertificate(nb, depth+1)
		if err != nil {
			return nil, fmt.Errorf("%w (in the issuer's certificate)", err)
		}
		c.issuer, c.issuerKey = p, p.subjectKey
	default:
		d.fail("unknown issuer tag %d", tag)
	}
	c.sig = d.take(ed25519.SignatureSize, "signature")
	if err := d.finish("certificate"); err != nil {
		return nil, err
	}
	c.raw = b
	if err := canonical(b, append(c.appendBody(nil), c.sig...), "certificate"); err != nil {
		return nil, err
	}
	return c, nil
}

// A Revoker says whether a certificate has been revoked, returning the
// revocation, or nil when it stands. *RevocationList is one; a nil Revoker
// (or a nil *RevocationList) revokes nothing.
type Revoker interface {
	RevocationOf(c *Certificate) *Revocation
}

// Verify checks the certificate for the mesh of adminPub at now: the chain
// leads to the admin key (else ErrOtherMesh) in at most two links, every
// signature holds (else ErrTampered), every link follows the chain rules
// (else ErrNotAllowed), neither the certificate nor its issuer's is revoked
// according to revoked (else ErrRevoked), and both are valid at now (else
// ErrExpired).
func (c *Certificate) Verify(adminPub ed25519.PublicKey, now time.Time, revoked Revoker) error {
	return c.verify(adminPub, now, revoked, "")
}

// verify is Verify naming the certificate label in errors ("" for "the
// certificate of peer X").
func (c *Certificate) verify(adminPub ed25519.PublicKey, now time.Time, revoked Revoker, label string) error {
	if c == nil {
		return fmt.Errorf("%w: no certificate", ErrTampered)
	}
	if label == "" {
		label = "the certificate of peer " + quote(c.subject)
	} else {
		label += " (peer " + quote(c.subject) + ")"
	}
	if err := c.verifyChain(adminPub, label); err != nil {
		return err
	}
	if revoked != nil {
		if r := revoked.RevocationOf(c); r != nil {
			return fmt.Errorf("%w: %s was revoked at %s: %s", ErrRevoked, label, stamp(r.revokedAt), quote(r.reason))
		}
		if p := c.issuer; p != nil {
			if r := revoked.RevocationOf(p); r != nil {
				return fmt.Errorf("%w: %s was issued by inviter %s, who was revoked at %s: %s",
					ErrRevoked, label, quote(p.subject), stamp(r.revokedAt), quote(r.reason))
			}
		}
	}
	if p := c.issuer; p != nil {
		if err := p.validAt(now, "the certificate of its inviter "+quote(p.subject)); err != nil {
			return err
		}
	}
	return c.validAt(now, label)
}

// verifyChain checks the mesh, the length of the chain, its signatures and
// its rules: everything but time and revocation.
func (c *Certificate) verifyChain(adminPub ed25519.PublicKey, label string) error {
	if err := checkAdminKey(adminPub); err != nil {
		return err
	}
	if root := c.rootKey(); !root.Equal(adminPub) {
		return fmt.Errorf("%w: %s is for mesh %s, not %s", ErrOtherMesh, label, MeshIDOf(root), MeshIDOf(adminPub))
	}
	if c.issuer != nil && c.issuer.issuer != nil {
		return fmt.Errorf("%w: %s was issued by %s, who was itself invited by %s: only the admin's direct invitees may invite",
			ErrNotAllowed, label, quote(c.issuer.subject), quote(c.issuer.issuer.subject))
	}
	for x := c; x != nil; x = x.issuer {
		if !verifySig(x.issuerKey, x.raw[:len(x.raw)-ed25519.SignatureSize], x.sig) {
			if x == c {
				return fmt.Errorf("%w: the signature of %s does not verify", ErrTampered, label)
			}
			return fmt.Errorf("%w: the signature of the certificate of its inviter %s does not verify", ErrTampered, quote(x.subject))
		}
		if x.role == RoleAdmin && (x.issuer != nil || !x.subjectKey.Equal(x.issuerKey)) {
			return fmt.Errorf("%w: the certificate of peer %s claims the admin role, which only the admin's own key can hold",
				ErrNotAllowed, quote(x.subject))
		}
	}
	if p := c.issuer; p != nil {
		if err := mayGrant(p, c.role, c.mayInvite); err != nil {
			return err
		}
		if c.issuedAt.Before(p.issuedAt) || c.expires.After(p.expires) {
			return fmt.Errorf("%w: %s (%s to %s) outlasts the certificate of its inviter %s (%s to %s)",
				ErrNotAllowed, label, stamp(c.issuedAt), stamp(c.expires), quote(p.subject), stamp(p.issuedAt), stamp(p.expires))
		}
	}
	return nil
}

// mayGrant says whether the holder of inviter may grant role and mayInvite,
// by certificate or by token.
func mayGrant(inviter *Certificate, role Role, mayInvite bool) error {
	who := quote(inviter.subject)
	switch {
	case inviter.issuer != nil:
		return fmt.Errorf("%w: peer %s was itself invited by %s: only the admin's direct invitees may invite (chains have at most two links)",
			ErrNotAllowed, who, quote(inviter.issuer.subject))
	case !inviter.mayInvite:
		return fmt.Errorf("%w: peer %s may not invite: its certificate does not allow it", ErrNotAllowed, who)
	case mayInvite:
		return fmt.Errorf("%w: peer %s may not let others invite: only the admin can", ErrNotAllowed, who)
	case role == RoleAdmin || role > inviter.role:
		return fmt.Errorf("%w: peer %s, a %s, may not grant the %s role", ErrNotAllowed, who, inviter.role, role)
	}
	return nil
}

func (c *Certificate) validAt(now time.Time, label string) error {
	if now.Before(c.issuedAt.Add(-ClockSkew)) {
		return fmt.Errorf("%w: %s is not valid before %s (%s): check this device's clock",
			ErrExpired, label, stamp(c.issuedAt), ago(c.issuedAt, now))
	}
	if !now.Before(c.expires) {
		return fmt.Errorf("%w: %s expired at %s (%s)", ErrExpired, label, stamp(c.expires), ago(c.expires, now))
	}
	return nil
}

// rootKey is the key that signed the first certificate of the chain: the
// admin key of the mesh the certificate claims.
func (c *Certificate) rootKey() ed25519.PublicKey {
	for c.issuer != nil {
		c = c.issuer
	}
	return c.issuerKey
}

func (c *Certificate) isAdminSelf() bool {
	return c.issuer == nil && c.role == RoleAdmin && c.subjectKey.Equal(c.issuerKey)
}

// MeshID is the id of the mesh the certificate claims (checked by Verify).
func (c *Certificate) MeshID() string { return MeshIDOf(c.rootKey()) }

// Subject is the certified peer id.
func (c *Certificate) Subject() string { return c.subject }

// SubjectKey is the certified peer's signing key.
func (c *Certificate) SubjectKey() ed25519.PublicKey { return bytes.Clone(c.subjectKey) }

// Role is the certified role.
func (c *Certificate) Role() Role { return c.role }

// MayInvite says whether the subject may invite others.
func (c *Certificate) MayInvite() bool { return c.mayInvite }

// Serial is the certificate's random serial number.
func (c *Certificate) Serial() [SerialSize]byte { return c.serial }

// IssuedAt is when the certificate was issued, in whole seconds.
func (c *Certificate) IssuedAt() time.Time { return c.issuedAt }

// Expires is the first instant the certificate is no longer valid.
func (c *Certificate) Expires() time.Time { return c.expires }

// IssuerKey is the key that signed the certificate: the admin's, or that of
// the inviter IssuerCert certifies.
func (c *Certificate) IssuerKey() ed25519.PublicKey { return bytes.Clone(c.issuerKey) }

// IssuerCert is the inviter's certificate, or nil when the admin issued this
// one.
func (c *Certificate) IssuerCert() *Certificate { return c.issuer }

// RenewAt is when the certificate should be renewed: two thirds into its
// lifetime.
func (c *Certificate) RenewAt() time.Time {
	life := c.expires.Sub(c.issuedAt)
	return c.issuedAt.Add(life / 3 * 2).Add(life % 3 * 2 / 3)
}

// NeedsRenewal reports whether now is past RenewAt. To renew, issue again:
// IssueCertificate(key, issuerCert, c.Spec(), now, rand).
func (c *Certificate) NeedsRenewal(now time.Time) bool { return !now.Before(c.RenewAt()) }

// Spec returns the spec that issues a certificate like this one: same
// subject, key, role, may-invite and lifetime.
func (c *Certificate) Spec() CertSpec {
	return CertSpec{
		Subject:    c.subject,
		SubjectKey: bytes.Clone(c.subjectKey),
		Role:       c.role,
		MayInvite:  c.mayInvite,
		TTL:        c.expires.Sub(c.issuedAt),
	}
}

// LogValue implements slog.LogValuer.
func (c *Certificate) LogValue() slog.Value {
	issuer := "admin"
	if c.issuer != nil {
		issuer = c.issuer.subject
	}
	return slog.GroupValue(
		slog.String("mesh", c.MeshID()),
		slog.String("subject", c.subject),
		slog.String("role", c.role.String()),
		slog.Bool("may_invite", c.mayInvite),
		slog.String("issuer", issuer),
		slog.Time("expires", c.expires),
	)
}
