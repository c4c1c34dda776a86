package chunks

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

type testPeer struct {
	key ed25519.PrivateKey
	id  mesh.PeerID
}

// newTestPeer is a peer with a fresh key. A manifest names its signer only
// through the certificate, which takes any peer id: the id is made from
// the key here, not by libp2p, which this package does not link.
func newTestPeer(t testing.TB) testPeer {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testPeer{key: key, id: mesh.PeerID("peer-" + hex.EncodeToString(pub[:8]))}
}

// world is a mesh admin and a certified trainer.
type world struct {
	admin   ed25519.PrivateKey
	trainer testPeer
	cert    *member.Certificate
	meshID  string
}

func newWorld(t testing.TB) *world {
	t.Helper()
	_, admin, _ := ed25519.GenerateKey(rand.Reader)
	w := &world{admin: admin, trainer: newTestPeer(t)}
	w.cert = w.issue(t, w.trainer, member.RoleTrainer)
	w.meshID = member.MeshIDOf(admin.Public().(ed25519.PublicKey))
	return w
}

func (w *world) issue(t testing.TB, p testPeer, role member.Role) *member.Certificate {
	t.Helper()
	c, err := member.IssueCertificate(w.admin, nil, member.CertSpec{Subject: string(p.id), SubjectKey: p.key.Public().(ed25519.PublicKey), Role: role}, t0, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (w *world) pub() ed25519.PublicKey { return w.admin.Public().(ed25519.PublicKey) }

// manifest signs a manifest for b as version v at term/index.
func (w *world) manifest(t testing.TB, b []byte, v, term, index uint64) *Manifest {
	t.Helper()
	m, err := NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.MeshID, m.Version, m.Parent, m.Base, m.AdapterHash, m.Term, m.Index = w.meshID, v, v-1, "tiny", "abc", term, index
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil {
		t.Fatal(err)
	}
	return m
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
