package peer_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
)

// inviteWith is invite with options.
func inviteWith(t *testing.T, data string, p *peer.Peer, o mesh.InviteOptions) *member.Token {
	t.Helper()
	key, _, _ := peer.Identity(data)
	if o.Addrs == nil {
		o.Addrs = p.Host.Addrs()
	}
	if o.TTL == 0 {
		o.TTL = time.Hour
	}
	tok, err := mesh.InviteWith(data, key, o, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// votersOf is the peer ids of vs, and its number ("none" for nil).
func votersOf(vs *member.VoterSet) string {
	if vs == nil {
		return "none"
	}
	var ids []string
	for _, v := range vs.Voters() {
		ids = append(ids, v.Peer)
	}
	return fmt.Sprintf("%d:%s", vs.Seq(), strings.Join(ids, ","))
}

// idOf is the peer id of a data directory.
func idOf(t *testing.T, data string) mesh.PeerID {
	t.Helper()
	_, id, err := peer.Identity(data)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// signVoters signs a voter set with the key in signer's data directory
// (the mesh admin's, or any other).
func signVoters(t *testing.T, key ed25519.PrivateKey, seq uint64, ids ...mesh.PeerID) *member.VoterSet {
	t.Helper()
	var vs []member.Voter
	for _, id := range ids {
		k, err := p2p.PublicKey(id)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, member.Voter{Peer: string(id), Key: k})
	}
	s, err := member.NewVoterSet(key, seq, vs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestVoterSetSpreads: the mesh's first trainer token makes a voter; its
// redemption has the admin's device sign the voter set, which reaches a
// member connected before and one that joins after, and is kept on disk
// by each. The next trainer token makes a volunteer.
func TestVoterSetSpreads(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	b, _, stopB := startLogged(t, bData)
	waitFor(t, "the member admitted", func() bool { return admitted(a, b) })
	if a.Mesh.Voters() != nil || b.Mesh.Voters() != nil {
		t.Fatal("a voter set before any trainer")
	}

	first := inviteWith(t, adminData, a, mesh.InviteOptions{Role: member.RoleTrainer, Uses: 1})
	if !first.Voter() {
		t.Fatal("the first trainer token of a mesh with no voter makes a volunteer")
	}
	tData := join(t, first.String())
	tid := idOf(t, tData)
	want := fmt.Sprintf("1:%s", tid)
	if got := votersOf(a.Mesh.Voters()); got != want {
		t.Fatalf("the admin's voter set after the redemption: %s, want %s", got, want)
	}
	waitFor(t, "the member connected before to learn the voter set", func() bool { return votersOf(b.Mesh.Voters()) == want })

	// The mesh has a voter now: the next trainer token makes a volunteer.
	second := inviteWith(t, adminData, a, mesh.InviteOptions{Role: member.RoleTrainer, Uses: 1})
	if second.Voter() {
		t.Fatal("a trainer token makes a voter though the mesh has one")
	}
	join(t, second.String())
	if got := votersOf(a.Mesh.Voters()); got != want {
		t.Fatalf("a volunteer's redemption changed the voter set: %s", got)
	}

	// A member that joins after learns it in the certificate exchange.
	cData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	c := start(t, cData)
	waitFor(t, "the member joining after to learn the voter set", func() bool { return votersOf(c.Mesh.Voters()) == want })

	// Kept on disk: a restarted member has it before it meets anyone.
	stopB()
	key, _, _ := peer.Identity(bData)
	m, err := mesh.New(mesh.Config{DataDir: bData, Key: key, KeyOf: p2p.PublicKey})
	if err != nil {
		t.Fatal(err)
	}
	if got := votersOf(m.Voters()); got != want {
		t.Errorf("the member's voter set after a restart: %s, want %s", got, want)
	}
	st := a.Mesh.State()
	admin, _ := st.AdminKey()
	for _, d := range []string{adminData, cData} {
		vs, err := mesh.LoadVoters(d, admin)
		if err != nil || votersOf(vs) != want {
			t.Errorf("the voter set kept in %s: %s, %v", d, votersOf(vs), err)
		}
	}
}

// TestVoterSetRefusals: a voter set not signed by the mesh's admin is
// refused, from the gossip as from the caller, and an older one is
// ignored, in the certificate exchange as from the caller; a damaged file
// stops the peer with a clear error.
func TestVoterSetRefusals(t *testing.T) {
	adminData := newMesh(t, "home")
	a := start(t, adminData)
	tData := join(t, invite(t, adminData, a, member.RoleTrainer, 1))
	tid := idOf(t, tData)
	adminKey, err := mesh.LoadAdminKey(adminData)
	if err != nil {
		t.Fatal(err)
	}
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	b, blog, _ := startLogged(t, bData)
	waitFor(t, "the member admitted", func() bool { return admitted(a, b) })
	waitFor(t, "the member to learn the voter set", func() bool { return votersOf(b.Mesh.Voters()) == "1:"+string(tid) })

	// From the caller.
	otherKey, _ := member.NewKey(rand.Reader)
	if ok, err := b.Mesh.AdoptVoters(signVoters(t, otherKey, 9, idOf(t, bData))); ok || !errors.Is(err, member.ErrOtherMesh) {
		t.Errorf("a set another key signed: %v, %v", ok, err)
	}
	if ok, err := b.Mesh.AdoptVoters(signVoters(t, adminKey, 1)); ok || err != nil {
		t.Errorf("a set as old as the one in force: %v, %v", ok, err)
	}
	if got := votersOf(b.Mesh.Voters()); got != "1:"+string(tid) {
		t.Fatalf("after refusals, the voter set is %s", got)
	}

	// From the gossip: a member of the mesh publishes sets another key
	// signed (each with a higher number, so that none is a repeat), then
	// one the admin signed.
	xData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	xKey, xid, _ := peer.Identity(xData)
	x, err := peer.Start(context.Background(), peer.Options{DataDir: xData, Listen: loopback, AdmitTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	if _, err := x.Host.Connect(context.Background(), b.Host.Addrs()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the publisher admitted", func() bool { return admitted(b, x) })
	topic, err := x.Host.Join(mesh.TopicName(x.Mesh.MeshID(), "voters/1"))
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(100)
	waitFor(t, "the member to refuse a forged voter set", func() bool {
		seq++
		topic.Publish(context.Background(), signVoters(t, xKey, seq, xid).Marshal())
		time.Sleep(100 * time.Millisecond)
		return strings.Contains(blog.String(), "a voter set refused")
	})
	if got := votersOf(b.Mesh.Voters()); got != "1:"+string(tid) {
		t.Fatalf("a forged voter set from the gossip was adopted: %s", got)
	}
	genuine := signVoters(t, adminKey, 2, tid, xid)
	waitFor(t, "the member to adopt the admin's set from the gossip", func() bool {
		topic.Publish(context.Background(), genuine.Marshal())
		time.Sleep(100 * time.Millisecond)
		return votersOf(b.Mesh.Voters()) == votersOf(genuine)
	})

	// In the certificate exchange: a member that kept an older set learns
	// the newer one, and does not pass its older one on.
	cData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	if err := mesh.SaveVoters(cData, signVoters(t, adminKey, 1, tid)); err != nil {
		t.Fatal(err)
	}
	c := start(t, cData, b.Host.Addrs()...)
	waitFor(t, "the member with an older set admitted", func() bool { return admitted(b, c) })
	waitFor(t, "the member with an older set to learn the newer", func() bool { return votersOf(c.Mesh.Voters()) == votersOf(genuine) })
	if got := votersOf(b.Mesh.Voters()); got != votersOf(genuine) {
		t.Errorf("an older set replaced a newer one: %s", got)
	}

	// A set another key signed, in the file: the peer does not start.
	dData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	if err := os.WriteFile(filepath.Join(dData, mesh.Dir, "voters.bin"), signVoters(t, otherKey, 5, xid).Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	dKey, _, _ := peer.Identity(dData)
	if _, err := mesh.New(mesh.Config{DataDir: dData, Key: dKey, KeyOf: p2p.PublicKey}); err == nil || !strings.Contains(err.Error(), "voters.bin is damaged") {
		t.Errorf("a voter set of another mesh on disk: %v", err)
	}
}

// TestTrustUntrust: only the admin's device makes a trainer a voter, of
// a trainer it knows; the set spreads; untrusting the last voter is
// allowed; an inviter's voter token is refused; offline, the set is kept
// and spreads at the next start.
func TestTrustUntrust(t *testing.T) {
	ctx := context.Background()
	adminData := newMesh(t, "home")
	a, _, stopA := startLogged(t, adminData)
	t1Data := join(t, inviteWith(t, adminData, a, mesh.InviteOptions{Role: member.RoleTrainer, Voter: mesh.MakeVolunteer}).String())
	t1 := idOf(t, t1Data)
	bData := join(t, invite(t, adminData, a, member.RoleMember, 1))
	b := start(t, bData)
	waitFor(t, "the member admitted", func() bool { return admitted(a, b) })
	if a.Mesh.Voters() != nil {
		t.Fatalf("a volunteer token made a voter: %s", votersOf(a.Mesh.Voters()))
	}

	// Refusals.
	if _, err := b.Mesh.TrustVoter(ctx, t1); !errors.Is(err, member.ErrNotAllowed) || !strings.Contains(err.Error(), "only the mesh admin") {
		t.Errorf("a member trusts: %v", err)
	}
	if _, err := a.Mesh.TrustVoter(ctx, "12D3KooWbogus"); !errors.Is(err, mesh.ErrBadPeerID) {
		t.Errorf("trusting a bad id: %v", err)
	}
	if _, err := a.Mesh.TrustVoter(ctx, b.Mesh.ID()); !errors.Is(err, mesh.ErrNotTrainer) {
		t.Errorf("trusting a member: %v", err)
	}
	stranger := idOf(t, t.TempDir())
	if _, err := a.Mesh.TrustVoter(ctx, stranger); !errors.Is(err, mesh.ErrUnknownPeer) {
		t.Errorf("trusting a peer never seen: %v", err)
	}
	if _, err := a.Mesh.UntrustVoter(ctx, t1); !errors.Is(err, mesh.ErrNotVoter) {
		t.Errorf("untrusting a volunteer: %v", err)
	}
	if a.Mesh.Voters() != nil {
		t.Fatalf("refusals signed a voter set: %s", votersOf(a.Mesh.Voters()))
	}

	// Trust, then untrust the only voter.
	vs, err := a.Mesh.TrustVoter(ctx, t1)
	if err != nil || votersOf(vs) != "1:"+string(t1) {
		t.Fatalf("trust: %s, %v", votersOf(vs), err)
	}
	waitFor(t, "the member to learn the trusted trainer", func() bool { return votersOf(b.Mesh.Voters()) == "1:"+string(t1) })
	if _, err := a.Mesh.TrustVoter(ctx, t1); !errors.Is(err, mesh.ErrAlreadyVoter) {
		t.Errorf("trusting twice: %v", err)
	}
	vs, err = a.Mesh.UntrustVoter(ctx, t1)
	if err != nil || vs.Len() != 0 || vs.Seq() != 2 || vs.Quorum() != 0 {
		t.Fatalf("untrusting the last voter: %s, %v", votersOf(vs), err)
	}
	waitFor(t, "the member to learn the empty set", func() bool { return votersOf(b.Mesh.Voters()) == "2:" })

	// An inviter (a trainer whose certificate lets it invite, without the
	// admin key) cannot make a voter; its trainer tokens make volunteers.
	adminKey, err := mesh.LoadAdminKey(adminData)
	if err != nil {
		t.Fatal(err)
	}
	invData := t.TempDir()
	ikey, iid, _ := peer.Identity(invData)
	icert, err := member.IssueCertificate(adminKey, nil, member.CertSpec{Subject: string(iid), SubjectKey: ikey.Public().(ed25519.PublicKey), Role: member.RoleTrainer, MayInvite: true}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ast := a.Mesh.State()
	if err := mesh.SaveState(invData, &mesh.State{MeshID: ast.MeshID, Admin: ast.Admin, Cert: hex.EncodeToString(icert.Marshal())}); err != nil {
		t.Fatal(err)
	}
	key, _, _ := peer.Identity(invData)
	_, err = mesh.InviteWith(invData, key, mesh.InviteOptions{Role: member.RoleTrainer, Voter: mesh.MakeVoter, Addrs: a.Host.Addrs()}, time.Now(), rand.Reader)
	if !errors.Is(err, member.ErrNotAllowed) || !strings.Contains(err.Error(), "only the mesh admin may make a voter") {
		t.Errorf("an inviter's voter token: %v", err)
	}
	tok, err := mesh.InviteWith(invData, key, mesh.InviteOptions{Role: member.RoleTrainer, Addrs: a.Host.Addrs()}, time.Now(), rand.Reader)
	if err != nil || tok.Voter() || tok.InviterCert() == nil {
		t.Errorf("an inviter's trainer token, the mesh without a voter: %v, %v", tok, err)
	}

	// Offline: kept, and spread when the admin's device next runs.
	stopA()
	akey, _, _ := peer.Identity(adminData)
	vs, err = mesh.TrustOffline(adminData, akey, p2p.PublicKey, t1, time.Now())
	if err != nil || votersOf(vs) != "3:"+string(t1) {
		t.Fatalf("offline trust: %s, %v", votersOf(vs), err)
	}
	a2 := start(t, adminData, b.Host.Addrs()...)
	waitFor(t, "the member to learn the set trusted offline", func() bool { return votersOf(b.Mesh.Voters()) == "3:"+string(t1) })

	// Revoking a voter takes it out of the voter set.
	if _, err := a2.Mesh.Revoke(ctx, t1, mesh.RevokeOptions{Reason: "gone rogue"}); err != nil {
		t.Fatal(err)
	}
	if vs := a2.Mesh.Voters(); votersOf(vs) != "4:" {
		t.Fatalf("the voter set after the voter's revocation: %s", votersOf(vs))
	}
	waitFor(t, "the member to learn the voter is out", func() bool { return votersOf(b.Mesh.Voters()) == "4:" })
}
