package weights

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// device is a device's weights service and what it counts.
type device struct {
	meshPeer
	svc *Service
	reg *prometheus.Registry
}

func startDevice(t *testing.T, p meshPeer) device {
	t.Helper()
	reg := prometheus.NewRegistry()
	return device{p, startService(t, p, nil, NewMetrics(reg)), reg}
}

// refused is how many manifests d refused for reason.
func (d device) refused(t *testing.T, reason string) float64 {
	t.Helper()
	fams, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "clawmesh_weights_versions_refused_total" {
			continue
		}
		for _, x := range f.GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return x.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// gossiper offers manifests on a mesh's weights topic as a modified peer
// would: without checking them first.
type gossiper struct {
	topic mesh.Topic
	from  mesh.PeerID
}

func newGossiper(t *testing.T, p meshPeer) gossiper {
	t.Helper()
	tp, err := p.Host.Join(topicWeights(p.Mesh.MeshID()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return gossiper{tp, p.Mesh.ID()}
}

// offerUntil offers m again and again until done (at most 30s): until the
// devices have either refused it or taken it.
func (g gossiper) offerUntil(t *testing.T, what string, m *chunks.Manifest, done func() bool) {
	t.Helper()
	var n uint64
	waitUntil(t, what, func() bool {
		n++
		o := &offer{Manifest: m, Source: Source{Peer: g.from}, Nonce: n}
		if err := g.topic.Publish(context.Background(), o.marshal()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		return done()
	})
}

// version makes a manifest for bundle b as version v at term/index,
// certified under vs by the votes of by and signed by signer.
func version(t *testing.T, b []byte, v, term, index uint64, vs *member.VoterSet, by []testPeer, signer meshPeer) *chunks.Manifest {
	t.Helper()
	m, err := chunks.NewManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.MeshID, m.Version, m.Parent, m.Base, m.AdapterHash, m.ParentHash, m.Term, m.Index = signer.Mesh.MeshID(), v, v-1, "tiny", "hash", "parent", term, index
	id := signer.identity(t)
	if vs == nil {
		if err := m.Sign(id.key, signer.Mesh.Cert(), time.Now()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	certify(t, m, vs, by, id.key, signer.Mesh.Cert())
	return m
}

// TestDevicesAcceptOnlyCertified runs a mesh on loopback (libp2p hosts,
// gossip, the bundles over QUIC) with a trainer that leads and votes, a
// trainer with a valid certificate that is not a voter, and two devices,
// one of which an older release left holding a forged v1000:
//
//   - the rogue trainer's v1000 with a made-up term and index, which it
//     signs alone, is refused by every device, and the certified v2 that
//     follows is accepted;
//   - the device that holds the forged v1000 accepts v2 and fetches it;
//   - a version with one vote of three (a rogue voter) is refused;
//   - a manifest carrying a newer voter set signed by the admin makes the
//     devices adopt it, the same v2 certified again under it replaces the
//     one kept, and a manifest certified under the set it replaced is
//     refused.
func TestDevicesAcceptOnlyCertified(t *testing.T) {
	adminData := t.TempDir()
	key, id, err := peer.Identity(adminData)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(adminData, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	adminKey, err := mesh.LoadAdminKey(adminData)
	if err != nil {
		t.Fatal(err)
	}
	admin := startMeshPeer(t, adminData)
	leader := startMeshPeer(t, joinMesh(t, admin, member.RoleTrainer))
	rogue := startMeshPeer(t, joinMesh(t, admin, member.RoleTrainer))

	// What an older release accepted from the rogue: a v1000 it signed
	// alone, its bundle held and its manifest kept as the last accepted.
	forgedBundle := randomBytes(t, 2*chunks.ChunkSize+9)
	forged := version(t, forgedBundle, 1000, 1<<30, 1<<40, nil, nil, rogue)
	oldData := joinMesh(t, admin, member.RoleMember)
	d, err := OpenDir(filepath.Join(oldData, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Add(forged, forgedBundle); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := os.WriteFile(filepath.Join(oldData, "weights", fenceFile), forged.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}

	dev := startMeshPeer(t, joinMesh(t, admin, member.RoleMember))
	old := startMeshPeer(t, oldData)
	for _, pair := range [][2]meshPeer{{leader, dev}, {leader, old}, {rogue, dev}, {rogue, old}, {dev, old}} {
		waitUntil(t, "the peers to admit each other", func() bool {
			return pair[0].Mesh.Admitted(pair[1].Mesh.ID()) && pair[1].Mesh.Admitted(pair[0].Mesh.ID())
		})
	}
	leaderSvc := startService(t, leader, nil, nil)
	devices := []device{startDevice(t, dev), startDevice(t, old)}
	if m := devices[1].svc.Latest(); m != nil {
		t.Fatalf("the device starts with %s, an uncertified manifest, as the last accepted", m.Name())
	}
	rogueGossip := newGossiper(t, rogue)

	// The admin's voters: the leader and two trainers that only vote here.
	voter2, voter3, voter4 := newTestPeer(t), newTestPeer(t), newTestPeer(t)
	lead := leader.identity(t)
	set1 := voterSet(t, adminKey, 1, lead, voter2, voter3)
	set2 := voterSet(t, adminKey, 2, lead, voter2, voter4)

	// The rogue trainer's v1000 reaches the devices and is refused.
	rogueGossip.offerUntil(t, "the devices to refuse the rogue's v1000", forged, func() bool {
		for _, d := range devices {
			if d.svc.Latest() == nil && d.refused(t, "uncertified") == 0 {
				return false
			}
		}
		return true
	})
	for _, d := range devices {
		if err := d.svc.Accept(forged, Source{}); !errors.Is(err, chunks.ErrUncertified) {
			t.Fatalf("%s offered the rogue's v1000: %v", d.Mesh.ID(), err)
		}
		if m := d.svc.Latest(); m != nil {
			t.Fatalf("%s accepted %s, signed by a trainer alone", d.Mesh.ID(), m.Name())
		}
	}

	// The certified v2 follows, at the group's real term and index: every
	// device takes it (the one holding the forged v1000 too) and learns
	// the voter set from it.
	b2 := randomBytes(t, 3*chunks.ChunkSize+5)
	v2 := version(t, b2, 2, 1, 7, set1, []testPeer{lead, voter2}, leader)
	ctx := context.Background()
	if err := leaderSvc.Publish(ctx, v2, b2); err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		waitUntil(t, "the devices to accept v2", func() bool { m := d.svc.Latest(); return m != nil && m.Version == 2 })
		if vs := d.Mesh.Voters(); vs == nil || vs.Seq() != 1 {
			t.Fatalf("%s did not adopt the voter set v2 carries: %v", d.Mesh.ID(), vs)
		}
		if err := d.svc.Fetch(ctx, v2, nil); err != nil {
			t.Fatalf("%s fetching v2: %v", d.Mesh.ID(), err)
		}
		if held := d.svc.Dir().Held(); held[0].Version != 2 {
			t.Fatalf("%s offers %s first, not v2", d.Mesh.ID(), held[0].Name())
		}
	}
	checkBundle(t, devices[1].svc.Dir().BundlePath(v2.BundleID()), b2)

	// A rogue voter's vote alone (one of three) certifies nothing.
	before := devices[0].refused(t, "uncertified")
	lone := version(t, forgedBundle, 3, 1<<30, 1<<40, set1, []testPeer{voter3}, rogue)
	rogueGossip.offerUntil(t, "the devices to refuse a version with one vote of three", lone, func() bool {
		return devices[0].refused(t, "uncertified") > before || devices[0].svc.Latest().Version != 2
	})
	for _, d := range devices {
		if err := d.svc.Accept(lone, Source{}); !errors.Is(err, chunks.ErrUncertified) {
			t.Fatalf("%s offered a version with one vote of three: %v", d.Mesh.ID(), err)
		}
		if m := d.svc.Latest(); m.Version != 2 {
			t.Fatalf("a version with one vote of three accepted: %s", m.Name())
		}
	}

	// The admin makes voter4 a voter in voter3's place. v2, certified
	// again under the new set, carries it to the devices: they adopt it,
	// and keep v2's new certification, which is what they offer from now.
	v2again := version(t, b2, 2, 1, 7, set2, []testPeer{lead, voter4}, leader)
	if err := leaderSvc.Publish(ctx, v2again, b2); err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		waitUntil(t, "the devices to take v2 certified again", func() bool {
			m := d.svc.Latest()
			return m.Version == 2 && m.Cert.Voters.Seq() == 2
		})
		if vs := d.Mesh.Voters(); vs.Seq() != 2 {
			t.Fatalf("%s did not adopt voter set 2: %d", d.Mesh.ID(), vs.Seq())
		}
		if m, err := d.svc.Dir().Manifest(v2.BundleID()); err != nil || m.Cert.Voters.Seq() != 2 {
			t.Fatalf("%s keeps v2 beside its bundle under voter set %d (%v)", d.Mesh.ID(), m.Cert.Voters.Seq(), err)
		}
	}

	// A v3 certified by every voter of the set replaced is refused; the
	// same v3 certified under the set in force is accepted.
	b3 := randomBytes(t, chunks.ChunkSize+1)
	stale := version(t, b3, 3, 1, 9, set1, []testPeer{lead, voter2, voter3}, leader)
	before = devices[0].refused(t, "uncertified")
	rogueGossip.offerUntil(t, "the devices to refuse v3 certified under the set replaced", stale, func() bool {
		return devices[0].refused(t, "uncertified") > before || devices[0].svc.Latest().Version != 2
	})
	for _, d := range devices {
		if err := d.svc.Accept(stale, Source{}); !errors.Is(err, chunks.ErrUncertified) {
			t.Fatalf("%s offered a version certified under a replaced voter set: %v", d.Mesh.ID(), err)
		}
		if m := d.svc.Latest(); m.Version != 2 {
			t.Fatalf("a version certified under a replaced voter set accepted: %s", m.Name())
		}
	}
	v3 := version(t, b3, 3, 1, 9, set2, []testPeer{lead, voter2}, leader)
	if err := leaderSvc.Publish(ctx, v3, b3); err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		waitUntil(t, "the devices to accept v3", func() bool { return d.svc.Latest().Version == 3 })
		if err := d.svc.Fetch(ctx, v3, nil); err != nil {
			t.Fatalf("%s fetching v3: %v", d.Mesh.ID(), err)
		}
	}
	checkBundle(t, devices[1].svc.Dir().BundlePath(v3.BundleID()), b3)

	// The forged v1000 once more: refused as ever.
	if err := devices[1].svc.Accept(forged, Source{}); !errors.Is(err, chunks.ErrUncertified) {
		t.Fatalf("the forged v1000 after v3: %v", err)
	}
}
