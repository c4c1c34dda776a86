package chunks

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// ChunkSize is the size of every chunk of a bundle but the last.
const ChunkSize = 1 << 20

// MaxBundle bounds a bundle's size (4 GiB: a LoRA adapter of a large model
// at a high rank stays well below it).
const MaxBundle = 4 << 30

// A manifest without evaluations is encoded as "CMWM1" (what devices read
// before manifests carried any); one with evaluations as "CMWM2", which adds
// the evals section before the signer.
//
// A certified manifest is "CMWM3": the parent's adapter hash after the
// adapter hash, the evals section always (its count may be 0), and the
// Certification before the signer.
const (
	manifestMagic     = "CMWM1"
	manifestMagicEval = "CMWM2"
	manifestMagicCert = "CMWM3"
	// MaxEvals bounds a manifest's evaluations, MaxEvalPrompts an
	// evaluation's held-out prompts, and maxEvalTask its task's name (a
	// SHA-256 in hex is 64 bytes).
	MaxEvals       = 64
	MaxEvalPrompts = 1 << 20
	maxEvalTask    = 64
	maxEvalSize    = 1 + maxEvalTask + 2*binary.MaxVarintLen64 + 8
	// maxCertSize bounds a Certification's encoding.
	maxCertSize = member.MaxEncodedSize + 2*binary.MaxVarintLen64 + member.MaxVoters*(member.MaxPeerIDLen+2+ed25519.SignatureSize)
	// MaxManifestSize bounds an encoded manifest.
	MaxManifestSize = 64 + 4*255 + MaxBundle/ChunkSize*sha256.Size + 4096 + 2*member.MaxEncodedSize + 1 + MaxEvals*maxEvalSize + maxCertSize
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
	// ErrUncertified is a manifest without the votes of a quorum of the
	// mesh's voters in force.
	ErrUncertified = errors.New("weights: version not certified by the mesh's voters")
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
	// lineage's); ParentHash the parent version's (certified manifests
	// only).
	AdapterHash string
	ParentHash  string
	Bundle      [sha256.Size]byte   // SHA-256 of the whole bundle
	Size        uint64              // bundle bytes
	ChunkSize   uint32              // ChunkSize
	Chunks      [][sha256.Size]byte // SHA-256 of each chunk
	// Term and Index are those of the raft log entry that committed the
	// version; with Version they order manifests for fencing.
	Term, Index uint64
	// Created is when the manifest was signed (whole seconds).
	Created time.Time
	// Evals are the version's evaluations at signing (none: not evaluated, or no task set).
	Evals []Eval
	// Cert holds the voters' votes for the version (nil: an uncertified
	// manifest, as trainers signed them before versions were certified).
	Cert *Certification
	// Signer is the signing trainer's certificate (member.Certificate).
	Signer []byte
	Sig    []byte // Ed25519 over everything above
}

// Eval is the version's evaluation on one task set's held-out split, as the
// trainers committed it: Passed of Prompts held-out prompts passed (pass@1 =
// Passed/Prompts), and the verifier's mean reward over them.
type Eval struct {
	Task       string // the task set's SHA-256, hex
	Prompts    int
	Passed     int
	MeanReward float64
}

// PassAt1 is the share of the held-out prompts passed (0 with none).
func (e Eval) PassAt1() float64 {
	if e.Prompts <= 0 {
		return 0
	}
	return float64(e.Passed) / float64(e.Prompts)
}

// CheckEval says why e cannot travel in a manifest (nil: it can).
func CheckEval(e Eval) error { return e.check() }

// check says why e cannot travel in a manifest: a task name over 64
// bytes, prompts out of [0, MaxEvalPrompts], more passed than prompts, or
// a mean reward that is not a number in [-1, 1].
func (e Eval) check() error {
	switch {
	case len(e.Task) > maxEvalTask:
		return fmt.Errorf("an evaluation's task of %d bytes", len(e.Task))
	case e.Prompts < 0 || e.Prompts > MaxEvalPrompts:
		return fmt.Errorf("an evaluation of %d prompts", e.Prompts)
	case e.Passed < 0 || e.Passed > e.Prompts:
		return fmt.Errorf("an evaluation with %d of %d prompts passed", e.Passed, e.Prompts)
	case math.IsNaN(e.MeanReward) || e.MeanReward < -1 || e.MeanReward > 1:
		return fmt.Errorf("an evaluation with mean reward %v", e.MeanReward)
	}
	return nil
}

// Name is the version's name: "v7".
func (m *Manifest) Name() string { return fmt.Sprintf("v%d", m.Version) }

// BundleID is the bundle's SHA-256 in hex: what fetches name it by.
func (m *Manifest) BundleID() string { return hex.EncodeToString(m.Bundle[:]) }

// NewManifest describes bundle b (see weights.Pack). The caller sets the lineage
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
// certifies. It refuses (ErrManifest) evaluations that devices would not
// parse: more than MaxEvals, or one out of bounds.
func (m *Manifest) Sign(key ed25519.PrivateKey, cert *member.Certificate, now time.Time) error {
	if !bytes.Equal(key.Public().(ed25519.PublicKey), cert.SubjectKey()) {
		return fmt.Errorf("%w: the key is not the certificate's", ErrSignature)
	}
	if len(m.Evals) > MaxEvals {
		return fmt.Errorf("%w: %d evaluations", ErrManifest, len(m.Evals))
	}
	for _, e := range m.Evals {
		if err := e.check(); err != nil {
			return fmt.Errorf("%w: %w", ErrManifest, err)
		}
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
//
// A certified manifest is fenced only by a certified one: after an
// uncertified last one (which anyone holding a trainer's key could have
// signed, with any numbers), the certified chain is taken up whatever its
// numbers; after a certified one, an uncertified manifest is refused
// (ErrUncertified) whatever its numbers.
func (m *Manifest) Fence(last *Manifest) error {
	switch {
	case last == nil || m.Cert != nil && last.Cert == nil:
		return nil
	case m.Cert == nil && last.Cert != nil:
		return fmt.Errorf("%w: an uncertified %s after the certified %s", ErrUncertified, m.Name(), last.Name())
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
	return wire.AppendBytes(b, m.Sig)
}

func (m *Manifest) body(b []byte) []byte {
	switch {
	case m.Cert != nil:
		b = append(b, manifestMagicCert...)
	case len(m.Evals) == 0:
		b = append(b, manifestMagic...)
	default:
		b = append(b, manifestMagicEval...)
	}
	b = wire.AppendString(b, m.MeshID)
	b = binary.AppendUvarint(b, m.Version)
	b = binary.AppendUvarint(b, m.Parent)
	b = wire.AppendString(b, m.Base)
	b = wire.AppendString(b, m.AdapterHash)
	if m.Cert != nil {
		b = wire.AppendString(b, m.ParentHash)
	}
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
	if len(m.Evals) > 0 || m.Cert != nil {
		b = appendEvals(b, m.Evals)
	}
	if m.Cert != nil {
		b = m.Cert.append(b)
	}
	return wire.AppendBytes(b, m.Signer)
}

func appendEvals(b []byte, evals []Eval) []byte {
	b = binary.AppendUvarint(b, uint64(len(evals)))
	for _, e := range evals {
		b = wire.AppendString(b, e.Task)
		b = binary.AppendUvarint(b, uint64(e.Prompts))
		b = binary.AppendUvarint(b, uint64(e.Passed))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.MeanReward))
	}
	return b
}

// ParseManifest decodes a manifest ("CMWM1", "CMWM2" with evaluations, or
// "CMWM3" certified)
// and checks that it is self-consistent (sizes and chunk count agree,
// evaluations within bounds); Verify checks who signed it.
func ParseManifest(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrManifest, len(b))
	}
	d := wire.NewDecoder(b, ErrManifest)
	magic := string(d.Take(len(manifestMagic)))
	if magic != manifestMagic && magic != manifestMagicEval && magic != manifestMagicCert {
		return nil, fmt.Errorf("%w: not a manifest", ErrManifest)
	}
	m := &Manifest{}
	m.MeshID = d.String(255)
	m.Version = d.Uvarint()
	m.Parent = d.Uvarint()
	m.Base = d.String(1024)
	m.AdapterHash = d.String(255)
	if magic == manifestMagicCert {
		m.ParentHash = d.String(255)
	}
	copy(m.Bundle[:], d.Take(sha256.Size))
	m.Size = d.Uvarint()
	cs := d.Uvarint()
	n := d.Uvarint()
	if d.Err() == nil && (m.Size == 0 || m.Size > MaxBundle || cs != ChunkSize || n != (m.Size+cs-1)/cs) {
		d.Fail("size %d, chunk size %d, %d chunks", m.Size, cs, n)
	}
	m.ChunkSize = uint32(cs)
	if d.Err() == nil {
		m.Chunks = make([][sha256.Size]byte, n)
		for i := range m.Chunks {
			copy(m.Chunks[i][:], d.Take(sha256.Size))
		}
	}
	m.Term = d.Uvarint()
	m.Index = d.Uvarint()
	created := d.Uvarint()
	if created > 1<<40 {
		d.Fail("time")
	}
	m.Created = time.Unix(int64(created), 0).UTC()
	switch magic {
	case manifestMagicEval:
		m.Evals = readEvals(d, 1)
	case manifestMagicCert:
		m.Evals = readEvals(d, 0)
		m.Cert = readCert(d)
	}
	m.Signer = d.Bytes(2 * member.MaxEncodedSize)
	m.Sig = d.Bytes(ed25519.SignatureSize)
	if d.Err() == nil && len(m.Sig) != ed25519.SignatureSize {
		d.Fail("signature of %d bytes", len(m.Sig))
	}
	if d.Err() == nil && d.Len() != 0 {
		d.Fail("%d trailing bytes", d.Len())
	}
	if d.Err() != nil {
		return nil, d.Err()
	}
	return m, nil
}

// readEvals reads the evals section: at least least evaluations (an
// uncertified manifest without any is "CMWM1"), at most MaxEvals, each
// within Eval's bounds.
func readEvals(d *wire.Decoder, least uint64) []Eval {
	n := d.Uvarint()
	if d.Err() == nil && (n < least || n > MaxEvals) {
		d.Fail("%d evaluations", n)
	}
	if d.Err() != nil || n == 0 {
		return nil
	}
	evs := make([]Eval, 0, n)
	for range n {
		task := d.String(maxEvalTask)
		prompts, passed := d.Uvarint(), d.Uvarint()
		bits := d.Take(8)
		if d.Err() != nil {
			return nil
		}
		if prompts > MaxEvalPrompts || passed > prompts {
			d.Fail("an evaluation with %d of %d prompts passed", passed, prompts)
			return nil
		}
		e := Eval{Task: task, Prompts: int(prompts), Passed: int(passed), MeanReward: math.Float64frombits(binary.LittleEndian.Uint64(bits))}
		if err := e.check(); err != nil {
			d.Fail("%v", err)
			return nil
		}
		evs = append(evs, e)
	}
	return evs
}
