package weights

import (
	"context"
	"crypto/rand"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// meshPeer is a peer of a real mesh on loopback and its data directory.
type meshPeer struct {
	*peer.Peer
	data string
}

// startMeshPeer runs the peer of data until the test ends.
func startMeshPeer(t *testing.T, data string) meshPeer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := peer.Start(ctx, peer.Options{DataDir: data, Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"},
		AdmitTimeout: 3 * time.Second, RefuseFor: time.Minute, Stall: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return meshPeer{p, data}
}

// joinMesh makes a data directory joined to the admin's mesh in role.
func joinMesh(t *testing.T, admin meshPeer, role member.Role) string {
	t.Helper()
	key, _, err := peer.Identity(admin.data)
	if err != nil {
		t.Fatal(err)
	}
	// The tests sign their own voter sets: no token makes a voter.
	o := mesh.InviteOptions{Role: role, TTL: time.Hour, Uses: 1, Addrs: admin.Host.Addrs()}
	if role == member.RoleTrainer {
		o.Voter = mesh.MakeVolunteer
	}
	tok, err := mesh.InviteWith(admin.data, key, o, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if _, err := peer.Join(context.Background(), data, tok.String(), []string{"/ip4/127.0.0.1/tcp/0"}, nil); err != nil {
		t.Fatalf("join: %v", err)
	}
	return data
}

// identity is p's identity key and peer id, as a test peer.
func (p meshPeer) identity(t *testing.T) testPeer {
	t.Helper()
	key, _, err := peer.Identity(p.data)
	if err != nil {
		t.Fatal(err)
	}
	return testPeer{key: key, id: p.Mesh.ID()}
}

// startService runs a weights service for p until the test ends;
// advertise, if set, are the QUIC addresses it offers; metrics, if set,
// count what it accepts and refuses.
func startService(t *testing.T, p meshPeer, advertise []string, metrics *Metrics) *Service {
	t.Helper()
	s, err := New(Config{Dir: filepath.Join(p.data, "weights"), Key: p.identity(t).key, Mesh: p.Mesh, Host: p.Host, Advertise: advertise,
		AnnounceEvery: time.Second, Metrics: metrics, Fetcher: FetcherConfig{FallbackAfter: 500 * time.Millisecond, StallTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })
	return s
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestServiceBehindNAT: a device whose QUIC address nobody can reach (as
// behind NAT) fetches a version, offers it, and serves it to another
// device over the mesh host once the trainer that made it is gone.
func TestServiceBehindNAT(t *testing.T) {
	adminData := t.TempDir()
	key, id, err := peer.Identity(adminData)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(adminData, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	admin := startMeshPeer(t, adminData)
	tr := startMeshPeer(t, joinMesh(t, admin, member.RoleTrainer))
	nat := startMeshPeer(t, joinMesh(t, admin, member.RoleMember))
	other := startMeshPeer(t, joinMesh(t, admin, member.RoleMember))
	for _, pair := range [][2]meshPeer{{tr, nat}, {tr, other}, {nat, other}} {
		waitUntil(t, "the peers to admit each other", func() bool {
			return pair[0].Mesh.Admitted(pair[1].Mesh.ID()) && pair[1].Mesh.Admitted(pair[0].Mesh.ID())
		})
	}
	trSvc := startService(t, tr, nil, nil)
	natSvc := startService(t, nat, []string{silentUDP(t)}, nil)
	otherSvc := startService(t, other, nil, nil)

	adminKey, err := mesh.LoadAdminKey(adminData)
	if err != nil {
		t.Fatal(err)
	}
	trainer := tr.identity(t)
	b := randomBytes(t, 3*chunks.ChunkSize+5)
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.MeshID, m.Version, m.Base, m.AdapterHash, m.Term, m.Index = tr.Mesh.MeshID(), 1, "tiny", "abc", 1, 3
	certify(t, m, voterSet(t, adminKey, 1, trainer), []testPeer{trainer}, trainer.key, tr.Mesh.Cert())
	ctx := context.Background()
	if err := trSvc.Publish(ctx, m, b); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the device behind NAT to hear of v1", func() bool { return natSvc.Latest() != nil })
	if err := natSvc.Fetch(ctx, m, nil); err != nil {
		t.Fatalf("the device behind NAT fetching from the trainer: %v", err)
	}
	// The trainer stops serving: only the device behind NAT holds v1.
	trSvc.Close()
	waitUntil(t, "the other device to hear that the device behind NAT holds v1", func() bool {
		return slices.ContainsFunc(otherSvc.Sources(m), func(s Source) bool { return s.Peer == nat.Mesh.ID() })
	})
	if err := otherSvc.Fetch(ctx, m, nil); err != nil {
		t.Fatalf("fetching from the device behind NAT: %v", err)
	}
	if _, err := otherSvc.Dir().Manifest(m.BundleID()); err != nil {
		t.Errorf("the other device does not hold v1: %v", err)
	}
}
