package sim

import (
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// epoch is the wall-clock time virtual time 0 stands for: certificates,
// manifests and log entries carry epoch + virtual time.
var epoch = time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)

func wall(d time.Duration) time.Time { return epoch.Add(d) }

// randReader reads bytes from a seeded stream (certificate serials).
type randReader struct{ r *rand.Rand }

func (rr randReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(rr.r.Uint32())
	}
	return len(b), nil
}

// peer is a node's protocol state: its membership view and its adapter
// versions.
type peer struct {
	key  ed25519.PrivateKey
	cert *member.Certificate
	revs *member.RevocationList
	// admitted[k]: nbrs[k]'s certificate verified when they connected.
	admitted []bool
	// nbrHeld[k]: the newest version nbrs[k] said it holds.
	nbrHeld []uint64
	// learnt is when the node learnt of the run's revocation (-1: not yet).
	learnt time.Duration

	last *chunks.Manifest // newest manifest accepted (Verify, VerifyCertified, Fence)
	// voters is the newest voter set the node has seen (nil: none yet),
	// learnt from the certifications manifests carry.
	voters *member.VoterSet
	held   uint64 // newest version held whole
	asked  uint64 // newest version it asked a holder for a chunk of
	fetch  *fetch

	// Staleness: since when the node has served a version older than the
	// newest committed one (-1: not stale).
	staleSince time.Duration
	stale      time.Duration
	// Live time since the first version's publication: since when (-1: not
	// counting) and how much before that.
	liveSince time.Duration
	liveTime  time.Duration
	// sleeps: when a device fell asleep or left, in order.
	sleeps []time.Duration

	bytesUp int64 // chunk bytes sent
}

// message is one gossip message spreading over the gossipsub meshes.
type message struct {
	kind    string // "offer" or "revoke"
	version uint64
	data    []byte
	origin  int
	at      time.Duration
	seen    []bool
	wasLive []bool
	// wanted: nodes that asked for it (IWANT) and wait for it.
	wanted []bool
	// liveAt: devices live when it was published; delivered: those of them
	// it reached.
	liveAt, delivered int
	copies, lost      int
	// ihaves: IHAVEs sent; pulled: copies sent for an IWANT.
	ihaves, pulled int
	// deliveredAt: how long after publication (seconds) each device live
	// then got it, in order.
	deliveredAt []float64
}

// sendTo reports whether a sends anything to b now: b reachable, admitted,
// and not revoked as far as a knows (the real revocation list's answer).
func (w *world) sendTo(a, b *node) bool {
	if !w.reach(a, b) {
		return false
	}
	pa := w.peers[a.id]
	if pa.revs.IsRevoked(string(b.pid)) {
		return false
	}
	if w.peers[b.id].revs.IsRevoked(string(a.pid)) {
		return false
	}
	return w.admitted(a, b)
}

// admitted reports whether a admitted b: a neighbour whose certificate a
// verified, or any trainer (whose certificate comes with its manifests),
// or any peer for a trainer (which verifies devices as they connect).
func (w *world) admitted(a, b *node) bool {
	if a.trainer || b.trainer {
		return true
	}
	if k, ok := slices.BinarySearch(a.nbrs, b.id); ok {
		return w.peers[a.id].admitted[k]
	}
	return false
}

// setupMembership makes the admin key, every peer's key and certificate
// (real mesh/member code), and verifies each connection's certificate.
func (w *world) setupMembership() error {
	rk := w.rKeys
	seed := func() []byte {
		b := make([]byte, ed25519.SeedSize)
		randReader{rk}.Read(b)
		return b
	}
	w.adminKey = ed25519.NewKeyFromSeed(seed())
	w.adminPub = w.adminKey.Public().(ed25519.PublicKey)
	w.meshID = member.MeshIDOf(w.adminPub)
	w.peers = make([]*peer, len(w.nodes))
	for i, n := range w.nodes {
		k := ed25519.NewKeyFromSeed(seed())
		role := member.RoleMember
		if n.trainer {
			role = member.RoleTrainer
		}
		c, err := member.IssueCertificate(w.adminKey, nil, member.CertSpec{Subject: string(n.pid), SubjectKey: k.Public().(ed25519.PublicKey), Role: role, TTL: 365 * 24 * time.Hour}, wall(0), randReader{rk})
		if err != nil {
			return fmt.Errorf("sim: certificate of %s: %w", n.pid, err)
		}
		w.peers[i] = &peer{key: k, cert: c, revs: member.NewRevocationList(w.adminPub), learnt: -1, staleSince: -1, liveSince: -1,
			admitted: make([]bool, len(n.nbrs)), nbrHeld: make([]uint64, len(n.nbrs))}
	}
	for i, n := range w.nodes {
		p := w.peers[i]
		for k, j := range n.nbrs {
			// The connection gater: the peer's certificate, checked as the
			// real node checks it.
			err := w.peers[j].cert.Verify(w.adminPub, wall(0), p.revs)
			p.admitted[k] = err == nil
			if err != nil {
				w.admissionRefused++
			}
		}
	}
	return nil
}

// setupVoters has the admin sign the set of the group's voters (real
// mesh/member code), each with the key its certificate certifies.
func (w *world) setupVoters() error {
	var vs []member.Voter
	for _, t := range w.voters() {
		vs = append(vs, member.Voter{Peer: string(t.n.pid), Key: w.peers[t.n.id].key.Public().(ed25519.PublicKey)})
	}
	s, err := member.NewVoterSet(w.adminKey, 1, vs, wall(0))
	if err != nil {
		return fmt.Errorf("sim: voter set: %w", err)
	}
	w.voterSet = s
	return nil
}

// certify has every voter the leader l reaches that applied m's version
// as m describes it vote for m (real mesh/weights code), and attaches the
// votes to m; it says whether they reach a quorum.
func (w *world) certify(l *trainerPeer, m *chunks.Manifest) bool {
	var votes []chunks.Vote
	for _, t := range w.reachable(l) {
		ver, ok := t.st.Version(m.Version)
		if !ok || ver.Hash != m.AdapterHash || ver.Term != m.Term || ver.Index != m.Index || !w.votes(t, m) {
			continue
		}
		v, err := m.VoteFor(w.peers[t.n.id].key, string(t.n.pid), w.voterSet)
		if err != nil {
			w.fail("%s's vote: %v", t.n.pid, err)
			continue
		}
		votes = append(votes, v)
	}
	return m.Certify(w.voterSet, votes)
}

// publish sends a gossip message from origin to its mesh (gossipsub
// with flood publishing off, as mesh/p2p runs it).
func (w *world) publish(origin int, m *message) {
	m.origin, m.at = origin, w.now
	m.seen = make([]bool, len(w.nodes))
	m.wanted = make([]bool, len(w.nodes))
	m.wasLive = make([]bool, len(w.nodes))
	for i := range w.o.Nodes {
		if w.live(w.nodes[i]) && !w.isVictim(i) && i != origin {
			m.wasLive[i] = true
			m.liveAt++
		}
	}
	w.msgs = append(w.msgs, m)
	m.seen[origin] = true
	w.forward(origin, -1, m)
}

// forward sends m from a to each peer of a's mesh but prev, and has a
// announce it to others at its next heartbeats.
func (w *world) forward(a, prev int, m *message) {
	na := w.nodes[a]
	w.repairMesh(a)
	w.gossipLater(a, m)
	for _, j := range na.mesh {
		if j == prev {
			continue
		}
		nb := w.nodes[j]
		if !w.sendTo(na, nb) {
			continue
		}
		m.copies++
		w.gossipBytes += msgBytes
		if w.rGossip.Float64() < w.lossOf(na, nb) {
			m.lost++
			continue
		}
		sent := w.now
		w.after(w.latency(na, nb)+time.Duration(msgBytes/w.rate(na, nb)*float64(time.Second)), func() {
			w.deliver(a, j, sent, m)
		})
	}
}

// deliver hands m, sent by a at sent, to b.
func (w *world) deliver(a, b int, sent time.Duration, m *message) {
	na, nb := w.nodes[a], w.nodes[b]
	// The connection is gone if either end left, slept or was cut off, or
	// if a learnt meanwhile that b is revoked (it closes the connection).
	if !w.sendTo(na, nb) {
		return
	}
	w.recordReceipt(a, b, sent)
	if m.seen[b] {
		return
	}
	m.seen[b] = true
	if m.wasLive[b] {
		m.delivered++
		m.deliveredAt = append(m.deliveredAt, seconds(w.now-m.at))
	}
	switch m.kind {
	case "offer":
		if !w.handleOffer(b, m.data) {
			return
		}
	case "revoke":
		if !w.handleRevocation(b, m.data) {
			return
		}
	}
	w.forward(b, a, m)
}

// recordReceipt logs what reaches the revoked peer, for the invariant.
func (w *world) recordReceipt(from, to int, sent time.Duration) {
	if to == w.victim && w.victim >= 0 {
		w.victimReceipts = append(w.victimReceipts, receipt{from: from, sent: sent, at: w.now})
	}
}

type receipt struct {
	from     int
	sent, at time.Duration
}

// handleRevocation: node b parses and verifies a revocation (real code)
// and stops talking to its subject.
func (w *world) handleRevocation(b int, data []byte) bool {
	rv, err := member.ParseRevocation(data)
	if err != nil {
		return false
	}
	p := w.peers[b]
	if err := p.revs.Add(rv); err != nil {
		return false
	}
	if p.learnt < 0 {
		p.learnt = w.now
	}
	return true
}

// mergeRevocations: node b merges a neighbour's revocation list, read from
// the wire (real code), and stops talking to whoever it revokes.
func (w *world) mergeRevocations(b int, data []byte) {
	l, err := member.ParseRevocationList(w.adminPub, data)
	if err != nil {
		return
	}
	p := w.peers[b]
	if err := p.revs.Merge(l); err != nil {
		return
	}
	if w.victim >= 0 && p.learnt < 0 && p.revs.IsRevoked(string(w.nodes[w.victim].pid)) {
		p.learnt = w.now
	}
}

func (w *world) isVictim(i int) bool { return i == w.victim && w.victim >= 0 }

// revoke has the admin revoke the victim; the leader (or the first live
// trainer) gossips the revocation.
func (w *world) revoke() {
	if w.victim < 0 {
		return
	}
	rv, err := member.NewRevocation(w.adminKey, nil, string(w.nodes[w.victim].pid), "revoked in simulation", wall(w.now))
	if err != nil {
		w.fail("revocation: %v", err)
		return
	}
	origin := -1
	for _, t := range w.trainers {
		if w.live(t.n) && (origin < 0 || t.n.id == w.leaderNode()) {
			origin = t.n.id
		}
	}
	if origin < 0 {
		w.after(time.Second, w.revoke)
		return
	}
	w.revokedAt = w.now
	w.handleRevocation(origin, rv.Marshal())
	w.publish(origin, &message{kind: "revoke", data: rv.Marshal()})
}

func (w *world) fail(format string, a ...any) {
	w.violations = append(w.violations, fmt.Sprintf("%.3fs: ", seconds(w.now))+fmt.Sprintf(format, a...))
}
