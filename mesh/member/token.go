package member

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"
)

// TokenPrefix starts every invite token's text form; the digit is the format
// version.
const TokenPrefix = "clawmesh-invite1:"

// roleVoter, set in a token's role byte, makes the trainer that joins a
// voter. Roles fit in the low bits; a token without the bit encodes as
// tokens did before voters existed.
const roleVoter = 0x80

// DefaultTokenTTL is a token's lifetime when TokenSpec.TTL is zero.
const DefaultTokenTTL = 24 * time.Hour

// maxTokenText bounds the text ParseToken looks at, white space included.
const maxTokenText = 64 << 10

var tokenEncoding = base64.RawURLEncoding.Strict()

// TokenSpec is what an inviter puts in an invite token.
type TokenSpec struct {
	// Inviter is the inviter's peer id. Required when the admin invites;
	// otherwise the inviter's certificate names it, and Inviter must be
	// empty or equal to it.
	Inviter string
	// Addrs are the inviter's current addresses (multiaddr strings), where
	// the joiner dials to redeem the token; at least one.
	Addrs []string
	// Role is the role offered; zero means RoleMember.
	Role Role
	// TTL is the lifetime; zero means DefaultTokenTTL. A token is cut short
	// at its inviter certificate's expiry.
	TTL time.Duration
	// MaxUses is how many peers may join with the token; zero means 1.
	MaxUses int
	// Voter makes each trainer that joins with the token a voter: the
	// admin's device, redeeming it, adds the trainer to the voter set it
	// signs. Only a trainer token signed with the admin key may say so.
	Voter bool
}

// A Token invites a peer into a mesh. It carries what the joiner needs to
// find the inviter and to check what it is joining (the admin key, the
// inviter's certificate), and is signed by the inviter. The inviter redeems
// it (Ledger.Redeem) and issues the joiner's certificate. A Token is
// immutable; anyone holding one may join, so treat its text as a secret.
type Token struct {
	adminKey    ed25519.PublicKey
	inviter     string
	inviterCert *Certificate // nil when the admin invites
	addrs       []string
	role        Role
	expires     time.Time
	nonce       [NonceSize]byte
	maxUses     int
	voter       bool
	sig         []byte
	raw         []byte
}

// NewToken makes an invite token signed with inviterKey. inviterCert is nil
// when inviterKey is the admin's key (the admin's own certificate counts as
// nil); otherwise it is the inviter's admin-issued certificate, which must
// certify inviterKey, allow inviting, be valid at now, and hold a role at
// least spec.Role. The nonce is read from rand.
func NewToken(inviterKey ed25519.PrivateKey, inviterCert *Certificate, spec TokenSpec, now time.Time, rand io.Reader) (*Token, error) {
	pub, err := publicOf(inviterKey)
	if err != nil {
		return nil, err
	}
	if inviterCert != nil && inviterCert.isAdminSelf() && inviterCert.subjectKey.Equal(pub) {
		if spec.Inviter == "" {
			spec.Inviter = inviterCert.subject
		}
		inviterCert = nil
	}
	role := spec.Role.orMember()
	if !role.valid() {
		return nil, fmt.Errorf("member: token: unknown role %d", spec.Role)
	}
	if role == RoleAdmin {
		return nil, fmt.Errorf("%w: a token cannot offer the admin role", ErrNotAllowed)
	}
	if spec.Voter && role != RoleTrainer {
		return nil, fmt.Errorf("member: token: only a trainer can be made a voter, not a %s", role)
	}
	if spec.Voter && inviterCert != nil {
		return nil, fmt.Errorf("%w: only the mesh admin may make a voter (the admin key signs the voter set)", ErrNotAllowed)
	}
	uses := spec.MaxUses
	if uses == 0 {
		uses = 1
	}
	if uses < 1 || uses > MaxTokenUses {
		return nil, fmt.Errorf("member: token: %d uses, want 1 to %d", spec.MaxUses, MaxTokenUses)
	}
	if err := checkAddrs(spec.Addrs); err != nil {
		return nil, fmt.Errorf("member: token: %w", err)
	}
	if err := checkTime(now, "token time"); err != nil {
		return nil, err
	}
	exp, err := lifetime(now, spec.TTL, DefaultTokenTTL, "token")
	if err != nil {
		return nil, err
	}
	t := &Token{
		addrs:   append([]string(nil), spec.Addrs...),
		role:    role,
		expires: exp,
		maxUses: uses,
	}
	t.voter = spec.Voter
	if inviterCert == nil {
		if err := checkPeerID(spec.Inviter, "token inviter"); err != nil {
			return nil, err
		}
		t.adminKey, t.inviter = pub, spec.Inviter
	} else {
		if !inviterCert.subjectKey.Equal(pub) {
			return nil, fmt.Errorf("%w: the signing key is not the one the inviter's certificate (peer %s) certifies",
				ErrNotAllowed, quote(inviterCert.subject))
		}
		if spec.Inviter != "" && spec.Inviter != inviterCert.subject {
			return nil, fmt.Errorf("member: token: inviter %s but the certificate is for %s", quote(spec.Inviter), quote(inviterCert.subject))
		}
		if err := mayGrant(inviterCert, role, false); err != nil {
			return nil, err
		}
		if err := inviterCert.verify(inviterCert.rootKey(), now, nil, "the inviter's certificate"); err != nil {
			return nil, err
		}
		t.inviterCert, t.inviter, t.adminKey = inviterCert, inviterCert.subject, inviterCert.rootKey()
		if t.expires.After(inviterCert.expires) {
			t.expires = inviterCert.expires
		}
	}
	if err := readRandom(rand, t.nonce[:]); err != nil {
		return nil, err
	}
	body := t.appendBody(nil)
	t.sig = sign(inviterKey, body)
	t.raw = append(body, t.sig...)
	return t, nil
}

func checkAddrs(addrs []string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("no addresses")
	}
	if len(addrs) > MaxAddrs {
		return fmt.Errorf("%d addresses, limit %d", len(addrs), MaxAddrs)
	}
	for _, a := range addrs {
		if a == "" || len(a) > MaxAddrLen {
			return fmt.Errorf("address of %d bytes, want 1 to %d", len(a), MaxAddrLen)
		}
		if !utf8.ValidString(a) {
			return fmt.Errorf("address %q is not UTF-8", a)
		}
	}
	return nil
}

func (t *Token) appendBody(b []byte) []byte {
	b = append(b, encodingVersion, kindToken)
	if t.inviterCert == nil {
		b = append(b, issuerAdmin)
		b = append(b, t.adminKey...)
		b = appendString(b, t.inviter)
	} else {
		b = append(b, issuerCert)
		b = appendBytes(b, t.inviterCert.raw)
	}
	b = append(b, byte(len(t.addrs)))
	for _, a := range t.addrs {
		b = appendString(b, a)
	}
	rb := byte(t.role)
	if t.voter {
		rb |= roleVoter
	}
	b = append(b, rb)
	b = appendTime(b, t.expires)
	b = append(b, t.nonce[:]...)
	return appendUvarint(b, t.maxUses)
}

// Marshal returns the token's binary encoding (String is its text form).
func (t *Token) Marshal() []byte { return bytes.Clone(t.raw) }

// String returns the token as one line of text to copy and paste:
// TokenPrefix followed by the binary encoding in unpadded base64url. It is a
// secret: whoever holds it may join.
func (t *Token) String() string { return TokenPrefix + tokenEncoding.EncodeToString(t.raw) }

// ParseToken reads a token as String writes it, ignoring white space
// anywhere in s (line breaks, indentation from pasting). It checks the form
// only; Verify checks the rest.
func ParseToken(s string) (*Token, error) {
	if len(s) > maxTokenText {
		return nil, fmt.Errorf("%w: invite token of %d characters is too long", ErrTampered, len(s))
	}
	s = trimSpace(s)
	if !strings.HasPrefix(s, TokenPrefix) {
		if v, ok := tokenVersion(s); ok {
			return nil, fmt.Errorf("%w: invite token format %s; this build reads format 1 (a newer clawmesh may read it)", ErrVersion, v)
		}
		return nil, fmt.Errorf("%w: not an invite token: it should start with %q", ErrTampered, TokenPrefix)
	}
	payload := s[len(TokenPrefix):]
	if len(payload) > tokenEncoding.EncodedLen(MaxEncodedSize) {
		return nil, fmt.Errorf("%w: invite token of %d characters is too long", ErrTampered, len(s))
	}
	b, err := tokenEncoding.DecodeString(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: invite token is not valid base64url (was it cut short or edited?): %v", ErrTampered, err)
	}
	return ParseTokenBinary(b)
}

// tokenVersion recognizes "clawmesh-invite<N>:" with another N.
func tokenVersion(s string) (string, bool) {
	const stem = "clawmesh-invite"
	rest, ok := strings.CutPrefix(s, stem)
	if !ok {
		return "", false
	}
	i := 0
	for i < len(rest) && i < 8 && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || i >= len(rest) || rest[i] != ':' {
		return "", false
	}
	return rest[:i], true
}

// ParseTokenBinary decodes a token's binary encoding (Marshal). It checks
// the form only; Verify checks the rest.
func ParseTokenBinary(b []byte) (*Token, error) {
	b = bytes.Clone(b)
	if err := header(b, MaxEncodedSize, kindToken, "invite token"); err != nil {
		return nil, err
	}
	d := &decoder{b: b[2:]}
	t := &Token{}
	switch tag := d.byte("inviter"); {
	case d.err != nil:
	case tag == issuerAdmin:
		t.adminKey = d.key("admin key")
		t.inviter = d.peerID("inviter")
	case tag == issuerCert:
		nb := d.bytes(MaxEncodedSize, "inviter certificate")
		if d.err != nil {
			break
		}
		c, err := parseCertificate(nb, 0)
		if err != nil {
			return nil, fmt.Errorf("%w (in the inviter's certificate)", err)
		}
		t.inviterCert, t.inviter, t.adminKey = c, c.subject, c.rootKey()
	default:
		d.fail("unknown inviter tag %d", tag)
	}
	n := int(d.byte("addresses"))
	if d.err == nil && (n < 1 || n > MaxAddrs) {
		d.fail("%d addresses, want 1 to %d", n, MaxAddrs)
	}
	for i := 0; i < n && d.err == nil; i++ {
		a := d.string(MaxAddrLen, "address")
		if d.err == nil && a == "" {
			d.fail("empty address")
		}
		t.addrs = append(t.addrs, a)
	}
	rb := d.byte("role")
	t.role, t.voter = Role(rb&^roleVoter), rb&roleVoter != 0
	if d.err == nil && (!t.role.valid() || t.role == RoleAdmin) {
		d.fail("role %v cannot be offered", t.role)
	}
	if d.err == nil && t.voter && t.role != RoleTrainer {
		d.fail("a %s made a voter: only a trainer can be", t.role)
	}
	t.expires = d.time("expiry")
	copy(t.nonce[:], d.take(NonceSize, "nonce"))
	uses := d.uvarint("uses")
	if d.err == nil && (uses < 1 || uses > MaxTokenUses) {
		d.fail("%d uses, want 1 to %d", uses, MaxTokenUses)
	}
	t.maxUses = int(uses)
	t.sig = d.take(ed25519.SignatureSize, "signature")
	if err := d.finish("invite token"); err != nil {
		return nil, err
	}
	t.raw = b
	if err := canonical(b, append(t.appendBody(nil), t.sig...), "invite token"); err != nil {
		return nil, err
	}
	return t, nil
}

// Verify checks what a token says about itself, as a joiner can before it
// dials: the signature (else ErrTampered), the inviter's certificate and its
// right to offer the role (else ErrTampered, ErrNotAllowed or ErrExpired),
// and the token's expiry (else ErrExpired). The mesh it belongs to is
// MeshID; an inviter uses VerifyFor or Ledger.Redeem to check that too.
func (t *Token) Verify(now time.Time) error {
	if !verifySig(t.InviterKey(), t.raw[:len(t.raw)-ed25519.SignatureSize], t.sig) {
		return fmt.Errorf("%w: the invite token's signature does not verify", ErrTampered)
	}
	if c := t.inviterCert; c != nil {
		if t.Voter() {
			return fmt.Errorf("%w: the invite token makes a voter, which only the mesh admin may do, but inviter %s signed it",
				ErrNotAllowed, quote(c.subject))
		}
		if err := mayGrant(c, t.role, false); err != nil {
			return err
		}
		if t.expires.After(c.expires) {
			return fmt.Errorf("%w: the invite token (expires %s) outlasts the inviter's certificate (expires %s)",
				ErrNotAllowed, stamp(t.expires), stamp(c.expires))
		}
		if err := c.verify(t.adminKey, now, nil, "the inviter's certificate"); err != nil {
			return err
		}
	}
	if !now.Before(t.expires) {
		return fmt.Errorf("%w: the invite token expired at %s (%s)", ErrExpired, stamp(t.expires), ago(t.expires, now))
	}
	return nil
}

// VerifyFor is Verify for the mesh of adminPub (else ErrOtherMesh), also
// refusing a token whose inviter was revoked (ErrRevoked).
func (t *Token) VerifyFor(adminPub ed25519.PublicKey, now time.Time, revoked Revoker) error {
	if err := checkAdminKey(adminPub); err != nil {
		return err
	}
	if !t.adminKey.Equal(adminPub) {
		return fmt.Errorf("%w: the invite token is for mesh %s, not %s", ErrOtherMesh, t.MeshID(), MeshIDOf(adminPub))
	}
	if err := t.Verify(now); err != nil {
		return err
	}
	if c := t.inviterCert; c != nil && revoked != nil {
		if r := revoked.RevocationOf(c); r != nil {
			return fmt.Errorf("%w: the invite token's inviter %s was revoked at %s: %s",
				ErrRevoked, quote(c.subject), stamp(r.revokedAt), quote(r.reason))
		}
	}
	return nil
}

// MeshID is the id of the mesh the token invites into.
func (t *Token) MeshID() string { return MeshIDOf(t.adminKey) }

// AdminKey is the mesh's admin key, against which the joiner checks
// certificates.
func (t *Token) AdminKey() ed25519.PublicKey { return bytes.Clone(t.adminKey) }

// Inviter is the inviter's peer id.
func (t *Token) Inviter() string { return t.inviter }

// InviterKey is the key that signed the token.
func (t *Token) InviterKey() ed25519.PublicKey {
	if t.inviterCert != nil {
		return bytes.Clone(t.inviterCert.subjectKey)
	}
	return bytes.Clone(t.adminKey)
}

// InviterCert is the inviter's certificate, or nil when the admin invites.
func (t *Token) InviterCert() *Certificate { return t.inviterCert }

// Addrs are the inviter's addresses.
func (t *Token) Addrs() []string { return append([]string(nil), t.addrs...) }

// Role is the role offered.
func (t *Token) Role() Role { return t.role }

// Expires is the first instant the token is no longer valid.
func (t *Token) Expires() time.Time { return t.expires }

// Nonce is the token's one-time random nonce; the Ledger counts uses by it.
func (t *Token) Nonce() [NonceSize]byte { return t.nonce }

// MaxUses is how many times the token may be redeemed.
func (t *Token) MaxUses() int { return t.maxUses }

// Voter says whether the trainer that joins with the token is to be a
// voter (TokenSpec.Voter).
func (t *Token) Voter() bool { return t.voter }

// CertSpecFor returns the spec of the certificate the inviter issues when it
// redeems the token for a joiner: the offered role, no may-invite.
func (t *Token) CertSpecFor(subject string, subjectKey ed25519.PublicKey) CertSpec {
	return CertSpec{Subject: subject, SubjectKey: bytes.Clone(subjectKey), Role: t.role}
}

// LogValue implements slog.LogValuer; it leaves out the encoding, so a
// logged token cannot be used to join.
func (t *Token) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("mesh", t.MeshID()),
		slog.String("inviter", t.inviter),
		slog.String("role", t.role.String()),
		slog.Int("max_uses", t.maxUses),
		slog.Bool("voter", t.Voter()),
		slog.Time("expires", t.expires),
	)
}
