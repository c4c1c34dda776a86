package weights

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// ChunkSize is the size of every chunk of a bundle but the last.
const ChunkSize = 1 << 20

// MaxBundle bounds a bundle's size (4 GiB: a LoRA adapter of a large model
// at a high rank stays well below it).
const MaxBundle = 4 << 30

const (
	manifestMagic = "CMWM1"
	maxManifest   = 64 + 3*255 + MaxBundle/ChunkSize*sha256.Size + 4096 + 2*member.MaxEncodedSize
)

var (
	// ErrManifest is a manifest that does not decode.
	ErrManifest = errors.New("weights: bad manifest")
	// ErrSignature is a manifest whose signature or signer does not check
	// out: not signed by a trainer certified by this mesh's admin, or by a
	// revoked one.
	ErrSignature = errors.New("weights: manifest not signed by a trainer of this mesh")
	// ErrStale is a manifest older than the last one accepted (fencing).
	ErrStale = errors.New("weights: stale manifest")
)

// Manifest describes one adapter version: the bundle's bytes by chunk, and
// where the version sits in the trainers' replicated log. The leader that
// committed the version (or a later one, re-announcing it) signs it.
type Manifest struct {
	MeshID  string
	Version uint64 // the adapter version (1, 2, ...)
	Parent  uint64 // the version it was trained from
	Base    string // the base model's name
	// AdapterHash is the trainers' canonical hash of the adapter (the
	// lineage's).
	AdapterHash string
	Bundle      [sha256.Size]byte   // SHA-256 of the whole bundle
	Size        uint64              // bundle bytes
	ChunkSize   uint32              // ChunkSize
	Chunks      [][sha256.Size]byte // SHA-256 of each chunk
	// Term and Index are those of the raft log entry that committed the
	// version; with Version they order manifests for fencing.
	Term, Index uint64
	// Created is when the manifest was signed (whole seconds).
	Created time.Time
	// Signer is the signing trainer's certificate (member.Certificate).
	Signer []byte
	Sig    []byte // Ed25519 over everything above
}

// Name is the version's name: "v7".
func (m *Manifest) Name() string { return fmt.Sprintf("v%d", m.Version) }

// BundleID is the bundle's SHA-256 in hex: what fetches name it by.
func (m *Manifest) BundleID() string { return hex.EncodeToString(m.Bundle[:]) }

// NewManifest describes bundle b (see Pack). The caller sets the lineage
// fields, then signs it.
func NewManifest(b []byte) (*Manifest, error) {
	if len(b) == 0 || len(b) > MaxBundle {
		return nil, fmt.Errorf("%w: bundle of %d bytes", ErrManifest, len(b))
	}
	m := &Manifest{Bundle: sha256.Sum256(b), Size: uint64(len(b)), ChunkSize: ChunkSize}
	for off := 0; off < len(b); off += ChunkSize {
		m.Chunks = append(m.Chunks, sha256.Sum256(b[off:min(off+ChunkSize, len(b))]))
	}
	return m, nil
}

// Chunk returns the offset and length of chunk i.
func (m *Manifest) Chunk(i int) (off int64, n int) {
	off = int64(i) * int64(m.ChunkSize)
	return off, int(min(int64(m.ChunkSize), int64(m.Size)-off))
}

// Sign signs m with key, the private key of the trainer that cert
// certifies.
func (m *Manifest) Sign(key ed25519.PrivateKey, cert *member.Certificate, now time.Time) error {
	if !bytes.Equal(key.Public().(ed25519.PublicKey), cert.SubjectKey()) {
		return fmt.Errorf("%w: the key is not the certificate's", ErrSignature)
	}
	m.Created = time.Unix(now.Unix(), 0).UTC()
	m.Signer = cert.Marshal()
	m.Sig = ed25519.Sign(key, m.body(nil))
	return nil
}

// Verify checks the chain mesh admin → trainer certificate → manifest: the
// signer's certificate is valid for this mesh now and not revoked, it
// certifies a trainer (or the admin), and its key signed m. It returns
// the signer's certificate.
func (m *Manifest) Verify(admin ed25519.PublicKey, now time.Time, revoked member.Revoker) (*member.Certificate, error) {
	cert, err := member.ParseCertificate(m.Signer)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSignature, err)
	}
	if err := cert.Verify(admin, now, revoked); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSignature, err)
	}
	if cert.Role() < member.RoleTrainer {
		return nil, fmt.Errorf("%w: signed by %s, who is not a trainer", ErrSignature, cert.Subject())
	}
	if cert.MeshID() != m.MeshID {
		return nil, fmt.Errorf("%w: for mesh %s, signed in mesh %s", ErrSignature, m.MeshID, cert.MeshID())
	}
	if !ed25519.Verify(cert.SubjectKey(), m.body(nil), m.Sig) {
		return nil, fmt.Errorf("%w: bad signature", ErrSignature)
	}
	return cert, nil
}

// Fence decides whether m may be accepted after last (nil: none yet): a
// version lower than the last one, or one whose log position is behind
// it, is stale; the same version must be the same bundle.
func (m *Manifest) Fence(last *Manifest) error {
	if last == nil {
		return nil
	}
	switch {
	case m.Version < last.Version:
		return fmt.Errorf("%w: %s after %s", ErrStale, m.Name(), last.Name())
	case m.Version > last.Version && (m.Term < last.Term || m.Index <= last.Index):
		return fmt.Errorf("%w: %s at term %d index %d is behind %s at term %d index %d",
			ErrStale, m.Name(), m.Term, m.Index, last.Name(), last.Term, last.Index)
	case m.Version == last.Version && (m.Bundle != last.Bundle || m.Index != last.Index):
		return fmt.Errorf("%w: a second %s (a different bundle or log entry)", ErrStale, m.Name())
	}
	return nil
}

// Marshal encodes m.
func (m *Manifest) Marshal() []byte {
	b := m.body(nil)
	return appendBytes(b, m.Sig)
}

func (m *Manifest) body(b []byte) []byte {
	b = append(b, manifestMagic...)
	b = appendString(b, m.MeshID)
	b = binary.AppendUvarint(b, m.Version)
	b = binary.AppendUvarint(b, m.Parent)
	b = appendString(b, m.Base)
	b = appendString(b, m.AdapterHash)
	b = append(b, m.Bundle[:]...)
	b = binary.AppendUvarint(b, m.Size)
	b = binary.AppendUvarint(b, uint64(m.ChunkSize))
	b = binary.AppendUvarint(b, uint64(len(m.Chunks)))
	for _, c := range m.Chunks {
		b = append(b, c[:]...)
	}
	b = binary.AppendUvarint(b, m.Term)
	b = binary.AppendUvarint(b, m.Index)
	b = binary.AppendUvarint(b, uint64(m.Created.Unix()))
	return appendBytes(b, m.Signer)
}

// ParseManifest decodes a manifest and checks that it is self-consistent
// (sizes and chunk count agree); Verify checks who signed it.
func ParseManifest(b []byte) (*Manifest, error) {
	if len(b) > maxManifest {
		return nil, fmt.Errorf("%w: %d bytes", ErrManifest, len(b))
	}
	d := decoder{b: b}
	if string(d.take(len(manifestMagic))) != manifestMagic {
		return nil, fmt.Errorf("%w: not a manifest", ErrManifest)
	}
	m := &Manifest{}
	m.MeshID = d.string(255)
	m.Version = d.uvarint()
	m.Parent = d.uvarint()
	m.Base = d.string(1024)
	m.AdapterHash = d.string(255)
	copy(m.Bundle[:], d.take(sha256.Size))
	m.Size = d.uvarint()
	cs := d.uvarint()
	n := d.uvarint()
	if d.err == nil && (m.Size == 0 || m.Size > MaxBundle || cs != ChunkSize || n != (m.Size+cs-1)/cs) {
		d.fail("size %d, chunk size %d, %d chunks", m.Size, cs, n)
	}
	m.ChunkSize = uint32(cs)
	if d.err == nil {
		m.Chunks = make([][sha256.Size]byte, n)
		for i := range m.Chunks {
			copy(m.Chunks[i][:], d.take(sha256.Size))
		}
	}
	m.Term = d.uvarint()
	m.Index = d.uvarint()
	created := d.uvarint()
	if created > 1<<40 {
		d.fail("time")
	}
	m.Created = time.Unix(int64(created), 0).UTC()
	m.Signer = d.bytes(2 * member.MaxEncodedSize)
	m.Sig = d.bytes(ed25519.SignatureSize)
	if d.err == nil && len(m.Sig) != ed25519.SignatureSize {
		d.fail("signature of %d bytes", len(m.Sig))
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return m, nil
}

func appendString(b []byte, s string) []byte { return appendBytes(b, []byte(s)) }

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// decoder reads what the append functions wrote; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrManifest, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(max int) []byte {
	n := d.uvarint()
	if d.err == nil && n > uint64(max) {
		d.fail("a field of %d bytes", n)
		return nil
	}
	return bytes.Clone(d.take(int(n)))
}

func (d *decoder) string(max int) string { return string(d.bytes(max)) }
