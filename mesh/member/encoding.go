package member

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on what decoders and constructors accept.
const (
	// MaxEncodedSize bounds the binary encoding of a certificate, token or
	// revocation; decoders refuse anything longer before reading it.
	MaxEncodedSize = 8 << 10
	// MaxPeerIDLen bounds a peer id (a libp2p peer id is about 52 bytes).
	MaxPeerIDLen = 128
	// MaxAddrs bounds the addresses a token carries; MaxAddrLen each one.
	MaxAddrs   = 16
	MaxAddrLen = 256
	// MaxReasonLen bounds a revocation's reason, in bytes of UTF-8.
	MaxReasonLen = 200
	// MaxTokenUses bounds a token's uses.
	MaxTokenUses = 1000
	// MaxTTL bounds the lifetime of a certificate or token.
	MaxTTL = 10 * 365 * 24 * time.Hour
	// ClockSkew is how far before its issue time a certificate is already
	// accepted, for peers whose clocks run a little behind the issuer's.
	ClockSkew = 5 * time.Minute
	// SerialSize and NonceSize are the sizes of a certificate's serial and
	// a token's nonce, both random.
	SerialSize = 16
	NonceSize  = 16
)

const (
	encodingVersion = 1

	kindCert           = 'C'
	kindToken          = 'T'
	kindRevocation     = 'R'
	kindRevocationList = 'V'
	kindLedger         = 'L'
	kindVoterSet       = 'S'

	// issuer tags: what follows is the admin's key, or the issuer's
	// certificate.
	issuerAdmin = 0
	issuerCert  = 1

	// maxNesting bounds certificates nested in certificates while parsing;
	// Verify refuses more than one (a chain of two), the parser a little
	// more so that Verify can say why.
	maxNesting = 3

	// maxUnix is the last second of the year 9999: times are stored as
	// uvarint Unix seconds no larger than this.
	maxUnix = 253402300799
)

// signingContext prefixes every signed message, so that a signature made
// here cannot be taken for one made by another protocol with the same key.
var signingContext = []byte("clawmesh/member\n")

func sign(key ed25519.PrivateKey, body []byte) []byte {
	msg := make([]byte, 0, len(signingContext)+len(body))
	msg = append(append(msg, signingContext...), body...)
	return ed25519.Sign(key, msg)
}

func verifySig(pub ed25519.PublicKey, body, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	msg := make([]byte, 0, len(signingContext)+len(body))
	msg = append(append(msg, signingContext...), body...)
	return ed25519.Verify(pub, msg, sig)
}

var meshIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// MeshIDOf returns the id of the mesh whose admin public key is adminPub:
// "m" followed by the lowercase base32 of the first 15 bytes of the key's
// SHA-256, 25 characters in all.
func MeshIDOf(adminPub ed25519.PublicKey) string {
	sum := sha256.Sum256(adminPub)
	return "m" + meshIDEncoding.EncodeToString(sum[:15])
}

// NewKey generates an Ed25519 key pair from rand: the admin's key when a mesh
// is created, or a peer's signing key. Pass crypto/rand.Reader; tests pass a
// deterministic reader.
func NewKey(rand io.Reader) (ed25519.PrivateKey, error) {
	if rand == nil {
		return nil, fmt.Errorf("member: no randomness source")
	}
	_, priv, err := ed25519.GenerateKey(rand)
	if err != nil {
		return nil, fmt.Errorf("member: generate key: %w", err)
	}
	return priv, nil
}

func publicOf(key ed25519.PrivateKey) (ed25519.PublicKey, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("member: signing key has %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	return key.Public().(ed25519.PublicKey), nil
}

func checkAdminKey(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("member: admin public key has %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	return nil
}

func readRandom(rand io.Reader, b []byte) error {
	if rand == nil {
		return fmt.Errorf("member: no randomness source")
	}
	if _, err := io.ReadFull(rand, b); err != nil {
		return fmt.Errorf("member: read randomness: %w", err)
	}
	return nil
}

func checkPeerID(id, what string) error {
	if id == "" {
		return fmt.Errorf("member: %s: empty peer id", what)
	}
	if len(id) > MaxPeerIDLen {
		return fmt.Errorf("member: %s: peer id of %d bytes, limit %d", what, len(id), MaxPeerIDLen)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("member: %s: peer id is not UTF-8", what)
	}
	return nil
}

// seconds returns t truncated to whole seconds in UTC, as encodings hold it.
func seconds(t time.Time) time.Time { return time.Unix(t.Unix(), 0).UTC() }

func checkTime(t time.Time, what string) error {
	if s := t.Unix(); s < 0 || s > maxUnix {
		return fmt.Errorf("member: %s %s is outside the years 1970 to 9999", what, stamp(t))
	}
	return nil
}

// lifetime returns start+ttl (ttl zero means def) in whole seconds, checking
// the bounds.
func lifetime(start time.Time, ttl, def time.Duration, what string) (time.Time, error) {
	if ttl == 0 {
		ttl = def
	}
	if ttl < time.Second || ttl > MaxTTL {
		return time.Time{}, fmt.Errorf("member: %s lifetime %v outside 1s to %v", what, ttl, MaxTTL)
	}
	exp := seconds(start).Add(ttl.Truncate(time.Second))
	if err := checkTime(exp, what+" expiry"); err != nil {
		return time.Time{}, err
	}
	return exp, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendUvarint(b []byte, n int) []byte { return binary.AppendUvarint(b, uint64(n)) }

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendTime(b []byte, t time.Time) []byte { return binary.AppendUvarint(b, uint64(t.Unix())) }

// header checks the size, version and kind of an encoding.
func header(b []byte, max int, kind byte, what string) error {
	if len(b) > max {
		return fmt.Errorf("%w: %s of %d bytes is over the %d-byte limit", ErrTampered, what, len(b), max)
	}
	if len(b) < 2 {
		return fmt.Errorf("%w: %s of %d bytes is too short", ErrTampered, what, len(b))
	}
	if b[0] != encodingVersion {
		return fmt.Errorf("%w: %s has encoding version %d, this build reads version %d (a newer clawmesh may read it)",
			ErrVersion, what, b[0], encodingVersion)
	}
	if b[1] != kind {
		return fmt.Errorf("%w: not an encoded %s (kind byte %#x)", ErrTampered, what, b[1])
	}
	return nil
}

// decoder reads fields off an encoding; the first problem sticks in err and
// every later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("%s: truncated", what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte(what string) byte {
	v := d.take(1, what)
	if v == nil {
		return 0
	}
	return v[0]
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n == 0 {
		d.fail("%s: truncated", what)
		return 0
	}
	if n < 0 {
		d.fail("%s: varint overflows 64 bits", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// length reads a uvarint length no larger than max.
func (d *decoder) length(max int, what string) int {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(max) {
		d.fail("%s: %d bytes, limit %d", what, n, max)
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(max int, what string) []byte { return d.take(d.length(max, what), what) }

func (d *decoder) string(max int, what string) string {
	s := string(d.bytes(max, what))
	if d.err == nil && !utf8.ValidString(s) {
		d.fail("%s: not UTF-8", what)
	}
	return s
}

func (d *decoder) peerID(what string) string {
	s := d.string(MaxPeerIDLen, what)
	if d.err == nil && s == "" {
		d.fail("%s: empty", what)
	}
	return s
}

func (d *decoder) key(what string) ed25519.PublicKey {
	return ed25519.PublicKey(d.take(ed25519.PublicKeySize, what))
}

func (d *decoder) time(what string) time.Time {
	v := d.uvarint(what)
	if d.err == nil && v > maxUnix {
		d.fail("%s: %d is after the year 9999", what, v)
		return time.Time{}
	}
	return time.Unix(int64(v), 0).UTC()
}

// finish reports the first problem, or bytes left over, as ErrTampered.
func (d *decoder) finish(what string) error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("%w: %s: %v", ErrTampered, what, d.err)
	}
	return nil
}

// canonical refuses an input that does not re-encode to itself.
func canonical(in, re []byte, what string) error {
	if !bytes.Equal(in, re) {
		return fmt.Errorf("%w: %s is not in canonical form", ErrTampered, what)
	}
	return nil
}

// quote prints a peer-supplied string safely.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// trimSpace removes every white space character, wherever it is.
func trimSpace(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\n', '\r', '\v', '\f', 0x85, 0xA0, 0x2028, 0x2029, 0xFEFF, 0x200B:
			return -1
		}
		return r
	}, s)
}
