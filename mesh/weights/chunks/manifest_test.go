package chunks

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// fixedWorld is a world whose keys come from fixed seeds, so that what it
// signs is the same bytes on every run.
func fixedWorld(t testing.TB) *world {
	t.Helper()
	admin := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize))
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, ed25519.SeedSize))
	w := &world{admin: admin, trainer: testPeer{key: key, id: fixedTrainerID}}
	// The certificate's serial is read from a fixed stream too.
	var err error
	w.cert, err = member.IssueCertificate(admin, nil, member.CertSpec{Subject: string(w.trainer.id), SubjectKey: key.Public().(ed25519.PublicKey), Role: member.RoleTrainer}, t0, bytes.NewReader(make([]byte, 64)))
	if err != nil {
		t.Fatal(err)
	}
	w.meshID = member.MeshIDOf(admin.Public().(ed25519.PublicKey))
	return w
}

// fixedTrainerID is the libp2p peer id of the key fixedWorld's trainer
// signs with (seed 2): the certificate's subject in
// testdata/manifest-cmwm1.hex.
const fixedTrainerID mesh.PeerID = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"

// fixedBundle is a bundle of two chunks, the same on every run.
func fixedBundle() []byte {
	b := make([]byte, ChunkSize+100)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// evalTask is a task set's name as the trainers write it: SHA-256, hex.
var evalTask = strings.Repeat("ab", 32)

// TestManifestCMWM1Unchanged: a manifest without evaluations is the bytes
// the format had before manifests carried any (testdata/manifest-cmwm1.hex,
// written by that code from the same keys and bundle), so devices that
// read only "CMWM1" read it; and those bytes parse, verify and re-encode
// identically.
func TestManifestCMWM1Unchanged(t *testing.T) {
	h, err := os.ReadFile(filepath.Join("testdata", "manifest-cmwm1.hex"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := hex.DecodeString(strings.TrimSpace(string(h)))
	if err != nil {
		t.Fatal(err)
	}
	w := fixedWorld(t)
	m := w.manifest(t, fixedBundle(), 3, 2, 40)
	if !bytes.Equal(m.Marshal(), old) {
		t.Fatal("a manifest without evaluations no longer encodes as before")
	}
	got, err := ParseManifest(old)
	if err != nil {
		t.Fatal(err)
	}
	if got.Evals != nil || got.Version != 3 || len(got.Chunks) != 2 || !bytes.Equal(got.Marshal(), old) {
		t.Fatalf("a CMWM1 manifest parsed as %+v", got)
	}
	if _, err := got.Verify(w.pub(), t0, nil); err != nil {
		t.Fatal(err)
	}
	// An empty list is no evaluation: still CMWM1.
	m.Evals = []Eval{}
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil || !bytes.Equal(m.Marshal(), old) {
		t.Fatalf("a manifest with an empty list of evaluations encodes differently: %v", err)
	}
}

func TestManifestEvalsRoundTrip(t *testing.T) {
	w := newWorld(t)
	m := w.manifest(t, randomBytes(t, ChunkSize+3), 4, 3, 50)
	m.Evals = []Eval{
		{Task: evalTask, Prompts: 4, Passed: 3, MeanReward: 0.5},
		{Task: strings.Repeat("0f", 32), Prompts: 1000, Passed: 0, MeanReward: -1},
		{Task: "c", Prompts: 0, Passed: 0, MeanReward: math.Copysign(0, -1)},
	}
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil {
		t.Fatal(err)
	}
	b := m.Marshal()
	if !bytes.HasPrefix(b, []byte("CMWM2")) {
		t.Fatalf("a manifest with evaluations starts %q", b[:5])
	}
	got, err := ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Evals) != len(m.Evals) {
		t.Fatalf("%d evaluations back, want %d", len(got.Evals), len(m.Evals))
	}
	for i, e := range got.Evals {
		want := m.Evals[i]
		if e.Task != want.Task || e.Prompts != want.Prompts || e.Passed != want.Passed ||
			math.Float64bits(e.MeanReward) != math.Float64bits(want.MeanReward) {
			t.Errorf("evaluation %d: %+v, want %+v", i, e, want)
		}
	}
	if !bytes.Equal(got.Marshal(), b) {
		t.Fatal("a manifest with evaluations re-encodes differently")
	}
	if _, err := got.Verify(w.pub(), t0, nil); err != nil {
		t.Fatal(err)
	}
	if p := got.Evals[0].PassAt1(); p != 0.75 {
		t.Fatalf("pass@1 %v, want 0.75", p)
	}
	if p := got.Evals[2].PassAt1(); p != 0 {
		t.Fatalf("pass@1 of no prompt %v, want 0", p)
	}
	// The signature covers the evaluations: a manifest that drops them
	// does not verify.
	dropped := *got
	dropped.Evals = nil
	if _, err := dropped.Verify(w.pub(), t0, nil); !errors.Is(err, ErrSignature) {
		t.Fatalf("a manifest stripped of its evaluations verified: %v", err)
	}
}

// TestManifestEvalsTampered changes one byte of an evaluation on the wire:
// what it decodes to still parses, and the signature refuses it.
func TestManifestEvalsTampered(t *testing.T) {
	w := newWorld(t)
	m := w.manifest(t, randomBytes(t, 100), 2, 1, 7)
	m.Evals = []Eval{{Task: evalTask, Prompts: 40, Passed: 30, MeanReward: 0.25}}
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil {
		t.Fatal(err)
	}
	b := m.Marshal()
	task := bytes.Index(b, []byte(evalTask))
	if task < 0 || bytes.Count(b, []byte(evalTask)) != 1 {
		t.Fatal("the task's name is not in the encoding once")
	}
	for _, c := range []struct {
		name string
		at   int
		to   byte
	}{
		{"task", task + 3, 'c'},
		{"prompts", task + len(evalTask), 41},
		{"passed", task + len(evalTask) + 1, 29},
		{"mean reward", task + len(evalTask) + 2, 1}, // the low byte of its bits
	} {
		t.Run(c.name, func(t *testing.T) {
			tb := bytes.Clone(b)
			if tb[c.at] == c.to {
				t.Fatalf("byte %d is already %d", c.at, c.to)
			}
			tb[c.at] = c.to
			got, err := ParseManifest(tb)
			if err != nil {
				t.Fatal(err)
			}
			if got.Evals[0] == m.Evals[0] {
				t.Fatal("the change did not reach the evaluation")
			}
			if _, err := got.Verify(w.pub(), t0, nil); !errors.Is(err, ErrSignature) {
				t.Fatalf("a changed evaluation verified: %v", err)
			}
		})
	}
}

// withEvalsSection encodes m (signed, without evaluations) as CMWM2 with
// section in place of its evals section.
func withEvalsSection(m *Manifest, section []byte) []byte {
	body := m.body(nil)
	signer := wire.AppendBytes(nil, m.Signer)
	b := append([]byte(manifestMagicEval), body[len(manifestMagic):len(body)-len(signer)]...)
	b = append(b, section...)
	b = append(b, signer...)
	return wire.AppendBytes(b, m.Sig)
}

// evalBytes is one evaluation's encoding.
func evalBytes(task string, prompts, passed uint64, reward float64) []byte {
	b := wire.AppendString(nil, task)
	b = binary.AppendUvarint(b, prompts)
	b = binary.AppendUvarint(b, passed)
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(reward))
}

func evalsSection(evs ...[]byte) []byte {
	b := binary.AppendUvarint(nil, uint64(len(evs)))
	for _, e := range evs {
		b = append(b, e...)
	}
	return b
}

// TestManifestEvalsStrict: every rule of the evals section refuses a
// manifest that breaks it with ErrManifest; a well-formed section of the
// same shape parses.
func TestManifestEvalsStrict(t *testing.T) {
	w := newWorld(t)
	m := w.manifest(t, randomBytes(t, 100), 2, 1, 7)
	good := evalBytes(evalTask, 4, 3, 0.5)
	if got, err := ParseManifest(withEvalsSection(m, evalsSection(good))); err != nil || len(got.Evals) != 1 || got.Evals[0].Passed != 3 {
		t.Fatalf("a well-formed evals section: %+v, %v", got, err)
	}
	most := make([][]byte, MaxEvals)
	for i := range most {
		most[i] = good
	}
	if got, err := ParseManifest(withEvalsSection(m, evalsSection(most...))); err != nil || len(got.Evals) != MaxEvals {
		t.Fatalf("%d evaluations: %v", MaxEvals, err)
	}
	if _, err := ParseManifest(withEvalsSection(m, evalsSection(evalBytes(evalTask, MaxEvalPrompts, MaxEvalPrompts, 1)))); err != nil {
		t.Fatalf("the most prompts: %v", err)
	}
	for _, c := range []struct {
		name    string
		section []byte
	}{
		{"no evaluation", evalsSection()},
		{"too many", evalsSection(append(most, good)...)},
		{"a count past the bytes", append(binary.AppendUvarint(nil, 2), good...)},
		{"a huge count", append(binary.AppendUvarint(nil, math.MaxUint64), good...)},
		{"passed over prompts", evalsSection(evalBytes(evalTask, 4, 5, 0.5))},
		{"too many prompts", evalsSection(evalBytes(evalTask, MaxEvalPrompts+1, 1, 0.5))},
		{"prompts past int", evalsSection(evalBytes(evalTask, math.MaxUint64, 1, 0.5))},
		{"a task name over 64 bytes", evalsSection(evalBytes(evalTask+"0", 4, 3, 0.5))},
		{"NaN reward", evalsSection(evalBytes(evalTask, 4, 3, math.NaN()))},
		{"infinite reward", evalsSection(evalBytes(evalTask, 4, 3, math.Inf(1)))},
		{"reward over 1", evalsSection(evalBytes(evalTask, 4, 3, 1.0000001))},
		{"reward under -1", evalsSection(evalBytes(evalTask, 4, 3, -2))},
		{"a truncated reward", evalsSection(good[:len(good)-3])},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := ParseManifest(withEvalsSection(m, c.section)); !errors.Is(err, ErrManifest) {
				t.Fatalf("parsed: %+v, %v", got, err)
			}
		})
	}
	// No bytes may follow the signature, of either kind of manifest.
	for _, b := range [][]byte{m.Marshal(), withEvalsSection(m, evalsSection(good))} {
		if _, err := ParseManifest(append(b, 0)); !errors.Is(err, ErrManifest) {
			t.Fatalf("a manifest with a trailing byte parsed: %v", err)
		}
	}
	// A CMWM1 manifest has no evals section: one that holds one is
	// refused, not read as evaluations.
	b := withEvalsSection(m, evalsSection(good))
	copy(b, manifestMagic)
	if _, err := ParseManifest(b); !errors.Is(err, ErrManifest) {
		t.Fatalf("a CMWM1 manifest with an evals section parsed: %v", err)
	}
}

// TestManifestSignRefusesBadEvals: the leader cannot sign evaluations
// that devices would refuse.
func TestManifestSignRefusesBadEvals(t *testing.T) {
	w := newWorld(t)
	m := w.manifest(t, randomBytes(t, 100), 2, 1, 7)
	for _, evs := range [][]Eval{
		make([]Eval, MaxEvals+1),
		{{Task: evalTask, Prompts: 2, Passed: 3}},
		{{Task: evalTask, Prompts: -1}},
		{{Task: evalTask, Prompts: 2, Passed: -1}},
		{{Task: evalTask, Prompts: MaxEvalPrompts + 1}},
		{{Task: evalTask + "0", Prompts: 2}},
		{{Task: evalTask, Prompts: 2, MeanReward: math.NaN()}},
		{{Task: evalTask, Prompts: 2, MeanReward: -1.5}},
	} {
		mm := *m
		mm.Evals = evs
		if err := mm.Sign(w.trainer.key, w.cert, t0); !errors.Is(err, ErrManifest) {
			t.Errorf("signed %d evaluations, the first %+v: %v", len(evs), evs[0], err)
		}
	}
}

func TestManifestSignedChain(t *testing.T) {
	w := newWorld(t)
	b := randomBytes(t, 2*ChunkSize+17)
	m := w.manifest(t, b, 3, 2, 40)
	m2, err := ParseManifest(m.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m2.Marshal(), m.Marshal()) || len(m2.Chunks) != 3 || m2.Size != uint64(len(b)) {
		t.Fatalf("round trip changed the manifest: %+v", m2)
	}
	if c, err := m2.Verify(w.pub(), t0.Add(time.Hour), nil); err != nil || c.Subject() != string(w.trainer.id) {
		t.Fatalf("verify: %v", err)
	}

	tampered := *m2
	tampered.Term++
	if _, err := tampered.Verify(w.pub(), t0, nil); !errors.Is(err, ErrSignature) {
		t.Fatalf("a changed term verified: %v", err)
	}

	member := newTestPeer(t)
	mm := *m2
	if err := mm.Sign(member.key, w.issue(t, member, 1), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := mm.Verify(w.pub(), t0, nil); !errors.Is(err, ErrSignature) {
		t.Fatalf("a manifest signed by a device (not a trainer) verified: %v", err)
	}

	other := newWorld(t)
	if _, err := m2.Verify(other.pub(), t0, nil); !errors.Is(err, ErrSignature) {
		t.Fatalf("a manifest of another mesh verified: %v", err)
	}

	if err := m2.Sign(member.key, w.cert, t0); err == nil {
		t.Fatal("signed with a key that is not the certificate's")
	}
}

func TestManifestRevokedSigner(t *testing.T) {
	w := newWorld(t)
	m := w.manifest(t, randomBytes(t, 100), 1, 1, 5)
	revs := member.NewRevocationList(w.pub())
	r, err := member.NewRevocation(w.admin, nil, string(w.trainer.id), "stolen laptop", t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := revs.Add(r); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Verify(w.pub(), t0.Add(time.Minute), revs); !errors.Is(err, ErrSignature) || !errors.Is(err, member.ErrRevoked) {
		t.Fatalf("a manifest signed by a revoked trainer: %v", err)
	}
}

func TestManifestFence(t *testing.T) {
	w := newWorld(t)
	b1, b2 := randomBytes(t, 100), randomBytes(t, 100)
	last := w.manifest(t, b1, 5, 3, 50)
	for _, tc := range []struct {
		name string
		m    *Manifest
		ok   bool
	}{
		{"next version", w.manifest(t, b2, 6, 3, 60), true},
		{"next version, later term", w.manifest(t, b2, 6, 4, 55), true},
		{"same commit re-announced", w.manifest(t, b1, 5, 3, 50), true},
		{"older version", w.manifest(t, b2, 4, 3, 40), false},
		{"newer version from a lower term", w.manifest(t, b2, 6, 2, 70), false},
		{"newer version at an earlier index", w.manifest(t, b2, 6, 3, 49), false},
		{"same version, other bundle", w.manifest(t, b2, 5, 3, 50), false},
		{"same version, other entry", w.manifest(t, b1, 5, 4, 51), false},
	} {
		err := tc.m.Fence(last)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrStale)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if err := last.Fence(nil); err != nil {
		t.Errorf("first manifest: %v", err)
	}
}
