package weights

import (
	"context"
	"crypto/ed25519"
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

// certMesh is a mesh on loopback (libp2p hosts, gossip, the bundles over
// QUIC) with a trainer that leads and votes, a trainer with a valid
// certificate that is not a voter, and a device; the admin's voter sets
// name the leader and trainers that only vote here.
type certMesh struct {
	adminKey       ed25519.PrivateKey
	leader, rogue  meshPeer
	leaderSvc      *Service
	dev            device
	rogueGossip    gossiper
	lead           testPeer
	voter2, voter3 testPeer
	set1           *member.VoterSet // the leader, voter2, voter3
}

// newCertMesh starts the mesh; prepare, if set, readies the device's data
// directory first.
func newCertMesh(t *testing.T, prepare func(data string, rogue meshPeer)) *certMesh {
	t.Helper()
	adminData := t.TempDir()
	key, id, err := peer.Identity(adminData)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.Init(adminData, "home", key, id, time.Now(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	c := &certMesh{}
	if c.adminKey, err = mesh.LoadAdminKey(adminData); err != nil {
		t.Fatal(err)
	}
	admin := startMeshPeer(t, adminData)
	c.leader = startMeshPeer(t, joinMesh(t, admin, member.RoleTrainer))
	c.rogue = startMeshPeer(t, joinMesh(t, admin, member.RoleTrainer))
	devData := joinMesh(t, admin, member.RoleMember)
	if prepare != nil {
		prepare(devData, c.rogue)
	}
	dev := startMeshPeer(t, devData)
	for _, pair := range [][2]meshPeer{{c.leader, dev}, {c.rogue, dev}} {
		waitUntil(t, "the peers to admit each other", func() bool {
			return pair[0].Mesh.Admitted(pair[1].Mesh.ID()) && pair[1].Mesh.Admitted(pair[0].Mesh.ID())
		})
	}
	c.leaderSvc = startService(t, c.leader, nil, nil)
	c.dev = startDevice(t, dev)
	c.rogueGossip = newGossiper(t, c.rogue)
	c.lead, c.voter2, c.voter3 = c.leader.identity(t), newTestPeer(t), newTestPeer(t)
	c.set1 = voterSet(t, c.adminKey, 1, c.lead, c.voter2, c.voter3)
	return c
}

// publish has the leader publish version v of b, certified under vs by
// by, and waits until the device accepts it.
func (c *certMesh) publish(t *testing.T, b []byte, v, term, index uint64, vs *member.VoterSet, by ...testPeer) *chunks.Manifest {
	t.Helper()
	m := version(t, b, v, term, index, vs, by, c.leader)
	if err := c.leaderSvc.Publish(context.Background(), m, b); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the device to accept "+m.Name(), func() bool {
		l := c.dev.svc.Latest()
		return l != nil && l.Version == v && l.Cert != nil && l.Cert.Voters.Seq() == vs.Seq()
	})
	return m
}

// refuses has the rogue trainer offer m until the device refuses it (or
// takes it), then checks that the device refuses it as uncertified and
// still holds want (nil: nothing) as the last accepted.
func (c *certMesh) refuses(t *testing.T, what string, m *chunks.Manifest, want *chunks.Manifest) {
	t.Helper()
	before := c.dev.refused(t, "uncertified")
	taken := func() bool {
		l := c.dev.svc.Latest()
		return (l == nil) != (want == nil) || l != nil && l.Version != want.Version
	}
	c.rogueGossip.offerUntil(t, "the device to refuse "+what, m, func() bool {
		return c.dev.refused(t, "uncertified") > before || taken()
	})
	if taken() {
		t.Fatalf("the device accepted %s: %s", what, c.dev.svc.Latest().Name())
	}
	if err := c.dev.svc.Accept(m, Source{}); !errors.Is(err, chunks.ErrUncertified) {
		t.Fatalf("the device offered %s: %v", what, err)
	}
}

// TestRogueTrainerCannotPublish: a trainer with a valid certificate that
// is not a voter signs its own v1000 with a made-up term and index; the
// device refuses it, and the certified v2 that follows, at the group's
// real term and index, is accepted and fetched.
func TestRogueTrainerCannotPublish(t *testing.T) {
	c := newCertMesh(t, nil)
	forged := version(t, randomBytes(t, 1000), 1000, 1<<30, 1<<40, nil, nil, c.rogue)
	c.refuses(t, "the rogue's v1000", forged, nil)

	b := randomBytes(t, 3*chunks.ChunkSize+5)
	v2 := c.publish(t, b, 2, 1, 7, c.set1, c.lead, c.voter2)
	if err := c.dev.svc.Fetch(context.Background(), v2, nil); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, c.dev.svc.Dir().BundlePath(v2.BundleID()), b)
}

// TestForgedLastVersionSetAside: a device that an older release left
// holding a forged v1000 (its bundle, and its manifest as the last
// accepted) takes up the certified chain: it accepts the certified v3,
// fetches it, and offers it before the forged one.
func TestForgedLastVersionSetAside(t *testing.T) {
	forgedBundle := randomBytes(t, 2*chunks.ChunkSize+9)
	var forged *chunks.Manifest
	c := newCertMesh(t, func(data string, rogue meshPeer) {
		forged = version(t, forgedBundle, 1000, 1<<30, 1<<40, nil, nil, rogue)
		d, err := OpenDir(filepath.Join(data, "weights"))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := d.Add(forged, forgedBundle); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "weights", fenceFile), forged.Marshal(), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if m := c.dev.svc.Latest(); m != nil {
		t.Fatalf("the device starts with %s, an uncertified manifest, as the last accepted", m.Name())
	}
	b := randomBytes(t, 3*chunks.ChunkSize+5)
	v3 := c.publish(t, b, 3, 2, 12, c.set1, c.lead, c.voter2, c.voter3)
	if err := c.dev.svc.Fetch(context.Background(), v3, nil); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, c.dev.svc.Dir().BundlePath(v3.BundleID()), b)
	if held := c.dev.svc.Dir().Held(); len(held) != 2 || held[0].Version != 3 {
		t.Fatalf("the device offers %s first, not v3", held[0].Name())
	}
	c.refuses(t, "the forged v1000 again", forged, v3)
}

// TestRogueVoterBelowQuorum: a version with the vote of one voter of three
// is refused, however its numbers compare.
func TestRogueVoterBelowQuorum(t *testing.T) {
	c := newCertMesh(t, nil)
	v2 := c.publish(t, randomBytes(t, 1000), 2, 1, 7, c.set1, c.lead, c.voter2)
	lone := version(t, randomBytes(t, 1000), 3, 1<<30, 1<<40, c.set1, []testPeer{c.voter3}, c.rogue)
	c.refuses(t, "a version with one vote of three", lone, v2)
}

// TestVoterSetChange: a manifest carrying a voter set the admin signed,
// newer than the device's, makes the device adopt it (the first one
// too); the same version certified again under the new set replaces the
// one kept, beside its bundle as well; a version certified under the set
// replaced, by all its voters, is refused, and accepted certified under
// the new one.
func TestVoterSetChange(t *testing.T) {
	c := newCertMesh(t, nil)
	ctx := context.Background()
	b2 := randomBytes(t, 2*chunks.ChunkSize+3)
	v2 := c.publish(t, b2, 2, 1, 7, c.set1, c.lead, c.voter2)
	if vs := c.dev.Mesh.Voters(); vs == nil || vs.Seq() != 1 {
		t.Fatalf("the device did not adopt the voter set v2 carries: %v", vs)
	}
	if err := c.dev.svc.Fetch(ctx, v2, nil); err != nil {
		t.Fatal(err)
	}

	// The admin makes voter4 a voter in voter3's place. v2, certified
	// again under the new set, carries it to the device.
	voter4 := newTestPeer(t)
	set2 := voterSet(t, c.adminKey, 2, c.lead, c.voter2, voter4)
	c.publish(t, b2, 2, 1, 7, set2, c.lead, voter4)
	if vs := c.dev.Mesh.Voters(); vs.Seq() != 2 {
		t.Fatalf("the device holds voter set %d, not 2", vs.Seq())
	}
	if m, err := c.dev.svc.Dir().Manifest(v2.BundleID()); err != nil || m.Cert.Voters.Seq() != 2 {
		t.Fatalf("the device keeps v2 beside its bundle certified under an older set (%v)", err)
	}
	c.refuses(t, "v2 certified under the set replaced", v2, v2)

	b3 := randomBytes(t, chunks.ChunkSize+1)
	stale := version(t, b3, 3, 1, 9, c.set1, []testPeer{c.lead, c.voter2, c.voter3}, c.leader)
	c.refuses(t, "v3 certified under the set replaced", stale, v2)
	v3 := c.publish(t, b3, 3, 1, 9, set2, c.lead, c.voter2)
	if err := c.dev.svc.Fetch(ctx, v3, nil); err != nil {
		t.Fatal(err)
	}
	checkBundle(t, c.dev.svc.Dir().BundlePath(v3.BundleID()), b3)
}
