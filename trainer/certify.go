package trainer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Versions are certified by the mesh's voters, not by the leader alone.
//
// Every trainer signs the delta it hands in (deltaClaim). The leader that
// publishes a version keeps the round's signed deltas; each voter fetches
// them from it, checks every signature against its trainer's certificate,
// recomputes the aggregate from them over its own copy of the parent and
// compares the result with the version the log committed. Only then does
// it vote: it signs the version's claim (chunks.Manifest.Claim: the
// version, its parent, the bundle, the raft term and index that committed
// it, its evaluations, the voter set) and sends the vote to the leader,
// which records a quorum of votes in the log (group.Certify). A version is
// shared with the devices only once certified under the voter set in
// force, and no round trains from a version that is not certified. A
// version that no quorum certifies within CertifyWait, or that so many
// voters refused that no quorum can, is retracted (group.Retract).

// signedDelta is a trainer's delta for a round as it signed it, with its
// certificate: what voters check a version against.
type signedDelta struct {
	Trainer mesh.PeerID     `json:"trainer"`
	Cert    []byte          `json:"cert"`
	Round   uint64          `json:"round"`
	Base    uint64          `json:"base"`
	Samples int             `json:"samples"`
	Batches []core.BatchID  `json:"batches"`
	Refused []group.Refusal `json:"refused,omitempty"`
	Sig     []byte          `json:"sig"`
	Delta   []byte          `json:"delta,omitempty"`
}

// deltaClaim is what a trainer signs for its delta of a round: the mesh,
// the round and its base, the samples, the batches it trained and those it
// refused, and the delta's SHA-256.
func deltaClaim(meshID string, round, base uint64, samples int, batches []core.BatchID, refused []group.Refusal, delta []byte) []byte {
	b := []byte("clawmesh/delta\n")
	b = binary.AppendUvarint(b, uint64(len(meshID)))
	b = append(b, meshID...)
	b = binary.AppendUvarint(b, round)
	b = binary.AppendUvarint(b, base)
	b = binary.AppendUvarint(b, uint64(max(samples, 0)))
	b = binary.AppendUvarint(b, uint64(len(batches)))
	for _, id := range batches {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	b = binary.AppendUvarint(b, uint64(len(refused)))
	for _, r := range refused {
		b = binary.AppendUvarint(b, uint64(len(r.ID)))
		b = append(b, r.ID...)
		b = binary.AppendUvarint(b, uint64(len(r.Reason)))
		b = append(b, r.Reason...)
	}
	h := sha256.Sum256(delta)
	return append(b, h[:]...)
}

// signDelta signs req's delta (payload) with this trainer's key.
func (t *Trainer) signDelta(req *request, payload []byte) {
	req.Sig = t.mesh.Sign(deltaClaim(t.mesh.MeshID(), req.Round, req.Base, req.Samples, req.Batches, req.Refused, payload))
}

// checkSigned checks a signed delta: its certificate is a trainer's of
// this mesh, valid and not revoked, for the trainer it names, and its key
// signed the delta.
func (t *Trainer) checkSigned(d *signedDelta) error {
	c, err := member.ParseCertificate(d.Cert)
	if err != nil {
		return fmt.Errorf("the certificate of %s: %w", d.Trainer, err)
	}
	admin, revoked, now := t.mesh.Trust()
	if err := c.Verify(admin, now, revoked); err != nil {
		return fmt.Errorf("the certificate of %s: %w", d.Trainer, err)
	}
	if mesh.PeerID(c.Subject()) != d.Trainer || c.Role() < member.RoleTrainer {
		return fmt.Errorf("a certificate of %s (%s) for a delta of %s", c.Subject(), c.Role(), d.Trainer)
	}
	claim := deltaClaim(t.mesh.MeshID(), d.Round, d.Base, d.Samples, d.Batches, d.Refused, d.Delta)
	if len(d.Sig) != ed25519.SignatureSize || !ed25519.Verify(c.SubjectKey(), claim, d.Sig) {
		return fmt.Errorf("the delta of %s in round %d: bad signature", d.Trainer, d.Round)
	}
	return nil
}

// certState is a trainer's part in certification: the signed deltas of the
// versions it published, what it checked, the votes it sent, and, on the
// leader, the votes it gathers.
type certState struct {
	mu sync.Mutex
	// published holds the signed deltas of the versions this trainer
	// published, by version hash (the newest few).
	published map[string][]signedDelta
	order     []string
	// checked holds the manifests of the versions this trainer checked
	// and found right, by version hash; refused those it found wrong.
	checked map[string]*chunks.Manifest
	refused map[string]string
	// sent: the vote (or refusal) for version hash under voter set hash
	// went to that leader.
	sent map[string]mesh.PeerID
	// votes and refusals gathered by the leader, by version hash and voter
	// set hash.
	// manifests are the leader's manifests of the versions voted on, by
	// versionKey (the newest few).
	manifests map[string]*chunks.Manifest
	votes     map[string]map[mesh.PeerID][]byte
	refusals  map[string]map[mesh.PeerID]string
	lastCheck map[string]time.Time
}

const keepPublished = 4

// maxCertMemo bounds what certState remembers of versions, votes and
// checks: only the newest version matters, and past this many entries
// those of other versions are dropped.
const maxCertMemo = 64

// prune drops the memory of versions but the one named keep (a
// versionKey) once it grows past maxCertMemo (c.mu held).
func (c *certState) prune(keep string) {
	if len(c.checked)+len(c.refused)+len(c.sent)+len(c.votes)+len(c.refusals)+len(c.lastCheck) < maxCertMemo {
		return
	}
	other := func(k string) bool { return !strings.HasPrefix(k, keep) }
	maps.DeleteFunc(c.checked, func(k string, _ *chunks.Manifest) bool { return other(k) })
	maps.DeleteFunc(c.refused, func(k, _ string) bool { return other(k) })
	maps.DeleteFunc(c.sent, func(k string, _ mesh.PeerID) bool { return other(k) })
	maps.DeleteFunc(c.votes, func(k string, _ map[mesh.PeerID][]byte) bool { return other(k) })
	maps.DeleteFunc(c.refusals, func(k string, _ map[mesh.PeerID]string) bool { return other(k) })
	maps.DeleteFunc(c.lastCheck, func(k string, _ time.Time) bool { return other(k) })
}

func (c *certState) init() {
	c.published = map[string][]signedDelta{}
	c.checked = map[string]*chunks.Manifest{}
	c.refused = map[string]string{}
	c.sent = map[string]mesh.PeerID{}
	c.votes = map[string]map[mesh.PeerID][]byte{}
	c.manifests = map[string]*chunks.Manifest{}
	c.refusals = map[string]map[mesh.PeerID]string{}
	c.lastCheck = map[string]time.Time{}
}

// deltasKey names the signed deltas of round's version hash.
func deltasKey(round uint64, hash string) string { return fmt.Sprintf("%s-r%d", hash, round) }

// keepDeltas keeps the signed deltas of the version (hash) of round that
// this trainer is about to publish, in memory and in DeltasDir, the
// newest keepPublished versions' only.
func (t *Trainer) keepDeltas(round uint64, hash string, ds []signedDelta) {
	c := &t.cert
	key := deltasKey(round, hash)
	c.mu.Lock()
	c.published[key] = ds
	c.order = append(c.order, key)
	for len(c.order) > keepPublished {
		delete(c.published, c.order[0])
		c.order = c.order[1:]
	}
	c.mu.Unlock()
	dir := filepath.Join(t.cfg.DataDir, DeltasDir)
	b, err := json.Marshal(ds)
	if err == nil {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			err = atomicfile.Write(filepath.Join(dir, key+".json"), b, 0o600)
		}
	}
	if err != nil {
		t.log.Warn("keeping a version's signed deltas on disk: a restart loses them", "err", err)
		return
	}
	es, _ := os.ReadDir(dir)
	if len(es) <= keepPublished {
		return
	}
	slices.SortFunc(es, func(a, b os.DirEntry) int {
		ia, _ := a.Info()
		ib, _ := b.Info()
		if ia == nil || ib == nil {
			return 0
		}
		return ia.ModTime().Compare(ib.ModTime())
	})
	for _, e := range es[:len(es)-keepPublished] {
		os.Remove(filepath.Join(dir, e.Name()))
	}
}

// publishedDeltas returns the signed deltas of a version this trainer
// published, from memory or, after a restart, from DeltasDir.
func (t *Trainer) publishedDeltas(round uint64, hash string) ([]signedDelta, bool) {
	key := deltasKey(round, hash)
	t.cert.mu.Lock()
	ds, ok := t.cert.published[key]
	t.cert.mu.Unlock()
	if ok {
		return ds, true
	}
	if !validHex(hash) {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(t.cfg.DataDir, DeltasDir, key+".json"))
	if err != nil || json.Unmarshal(b, &ds) != nil {
		return nil, false
	}
	return ds, true
}

func validHex(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// versionKey names one committed version: its number, hash and log
// index. Two versions may have the same bundle (a round whose deltas
// changed nothing), and a number comes back after a retraction.
func versionKey(v group.Version) string {
	return fmt.Sprintf("v%d/%s/%d", v.Version, v.Hash, v.Index)
}

// voteKey names a version under a voter set.
func voteKey(v group.Version, vs *member.VoterSet) string {
	h := vs.Hash()
	return versionKey(v) + "/" + string(h[:])
}

// mayVote says whether p is one of the mesh's voters now.
func (t *Trainer) mayVote(p mesh.PeerID) bool {
	vs := t.mesh.Voters()
	return vs != nil && vs.Has(string(p))
}

// versionManifest is the manifest of committed version v, whose bundle is
// in dir: what the leader shares and every voter builds the same from its
// own copy to vote on (unsigned, uncertified).
func (t *Trainer) versionManifest(v group.Version, dir string) (*chunks.Manifest, []byte, error) {
	b, err := weights.Pack(dir)
	if err != nil {
		return nil, nil, err
	}
	m, err := chunks.NewManifest(b)
	if err != nil {
		return nil, nil, err
	}
	var base, parentHash string
	t.group.view(func(s *group.State) {
		base = s.Config.Base
		if p, ok := s.Version(v.Parent); ok {
			parentHash = p.Hash
		}
	})
	m.MeshID, m.Version, m.Parent, m.Base, m.AdapterHash, m.ParentHash = t.mesh.MeshID(), v.Version, v.Parent, base, v.Hash, parentHash
	m.Term, m.Index = v.Term, v.Index
	// The version's held-out evaluations travel with it to the devices.
	for _, ev := range v.Evals {
		m.Evals = append(m.Evals, chunks.Eval{Task: ev.Task, Prompts: ev.Prompts, Passed: ev.Passed, MeanReward: ev.MeanReward})
	}
	if len(m.Evals) > chunks.MaxEvals || slices.ContainsFunc(m.Evals, func(e chunks.Eval) bool { return chunks.CheckEval(e) != nil }) {
		// Evaluations a device would refuse must not keep the version
		// from the devices.
		t.log.Warn("a version's evaluations left out of its manifest", "version", v.Name())
		m.Evals = nil
	}
	return m, b, nil
}

// submissions answers opSubmissions: the signed deltas of a version this
// trainer published.
func (t *Trainer) submissions(round uint64, hash string) ([]byte, error) {
	ds, ok := t.publishedDeltas(round, hash)
	if !ok {
		return nil, &rpcError{Code: codeNotFound, Msg: "trainer: not the publisher of " + short(hash) + ", or it no longer holds its deltas"}
	}
	return json.Marshal(ds)
}

// checkVersion recomputes committed version v from its round's signed
// deltas and returns its manifest if it is what they make, or says why
// not. errNoDeltas: they could not be had (the publisher is gone).
func (t *Trainer) checkVersion(ctx context.Context, v group.Version) (*chunks.Manifest, error) {
	var (
		cfg    group.Config
		parent group.Version
		steps  = map[core.BatchID]int{}
		ok     bool
	)
	t.group.view(func(s *group.State) {
		cfg = s.Config
		parent, ok = s.Version(v.Parent)
		for _, c := range v.Contributors {
			for _, id := range c.Batches {
				if b, found := s.Batches[id]; found {
					steps[id] = max(b.Steps, 1)
				}
			}
		}
	})
	if !ok || v.Parent+1 != v.Version {
		return nil, fmt.Errorf("%s's parent v%d is not in the lineage", v.Name(), v.Parent)
	}
	if parent.Version > 0 && parent.Cert == nil {
		return nil, fmt.Errorf("%s's parent %s is not certified", v.Name(), parent.Name())
	}
	var ds []signedDelta
	local, mine := t.publishedDeltas(v.Round, v.Hash)
	if mine {
		ds = local
	} else {
		if v.Publisher == "" || v.Publisher == t.self {
			return nil, fmt.Errorf("%w: %s's deltas are not held here", errNoDeltas, v.Name())
		}
		out, err := t.call(ctx, v.Publisher, request{Op: opSubmissions, Version: v.Version, Round: v.Round, Hash: v.Hash}, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: from its publisher %s: %w", errNoDeltas, v.Publisher, err)
		}
		if err := json.Unmarshal(out, &ds); err != nil {
			return nil, fmt.Errorf("%w: %s's deltas from %s: %w", errBadDeltas, v.Name(), v.Publisher, err)
		}
	}
	byTrainer := map[mesh.PeerID]*signedDelta{}
	for i := range ds {
		d := &ds[i]
		if byTrainer[d.Trainer] != nil {
			return nil, fmt.Errorf("%w: two deltas of %s", errBadDeltas, d.Trainer)
		}
		byTrainer[d.Trainer] = d
	}
	if len(byTrainer) != len(v.Contributors) {
		return nil, fmt.Errorf("%w: %d deltas for %d contributors", errBadDeltas, len(byTrainer), len(v.Contributors))
	}
	parentDir, err := t.ensureVersion(ctx, parent)
	if err != nil {
		return nil, err
	}
	parentAd, err := adapter.Read(parentDir)
	if err != nil {
		return nil, err
	}
	var parts []adapter.Contribution
	for _, c := range v.Contributors {
		d := byTrainer[c.Trainer]
		switch {
		case d == nil:
			return nil, fmt.Errorf("%w: no delta of contributor %s", errBadDeltas, c.Trainer)
		case d.Round != v.Round || d.Base != v.Parent:
			return nil, fmt.Errorf("%w: the delta of %s is of round %d from v%d, not round %d from v%d", errBadDeltas, c.Trainer, d.Round, d.Base, v.Round, v.Parent)
		case d.Samples != c.Samples || !slices.Equal(d.Batches, c.Batches):
			return nil, fmt.Errorf("%w: the delta of %s trained other batches or samples than the log says", errBadDeltas, c.Trainer)
		}
		if err := t.checkSigned(d); err != nil {
			return nil, fmt.Errorf("%w: %w", errBadDeltas, err)
		}
		weight := 0
		for _, id := range c.Batches {
			weight += steps[id]
		}
		if d.Samples > 0 && weight > 0 {
			dl, err := adapter.UnmarshalDelta(d.Delta, adapter.Limits{})
			if err != nil {
				return nil, fmt.Errorf("%w: the delta of %s: %w", errBadDeltas, c.Trainer, err)
			}
			parts = append(parts, adapter.Contribution{From: string(c.Trainer), Weight: float64(weight), Delta: dl})
		}
	}
	child := parentAd
	if len(parts) > 0 {
		agg, _, err := adapter.Aggregate(parts, aggOptions(cfg))
		if err != nil {
			return nil, err
		}
		if child, err = adapter.Apply(parentAd, agg); err != nil {
			return nil, err
		}
	}
	root := filepath.Join(t.cfg.DataDir, AdaptersDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".check-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "bundle")
	if err := child.Write(dir); err != nil {
		return nil, err
	}
	hash, err := adapter.Hash(dir)
	if err != nil {
		return nil, err
	}
	if hash != v.Hash {
		// Float arithmetic may round differently on another machine (a
		// fused multiply-add on arm64): the committed bundle is taken if
		// every weight is within recomputeTolerance of the recomputed one.
		committed, err := t.ensureVersion(ctx, v)
		if err != nil {
			return nil, err
		}
		cb, err := adapter.Read(committed)
		if err != nil {
			return nil, err
		}
		if d, ok := bundleDiff(cb, child); !ok || d > recomputeTolerance {
			return nil, fmt.Errorf("%w: %s is %s, its round's deltas make %s (largest difference %g)", errMismatch, v.Name(), short(v.Hash), short(hash), d)
		}
		dir = committed
	}
	m, _, err := t.versionManifest(v, dir)
	return m, err
}

// recomputeTolerance is the largest difference of a weight a voter
// accepts between the committed version and its own recomputation: float32
// rounding differences of one aggregation (a few units in the last place
// of weights of order 0.01–1) are far below it, and a change of this size
// moves nothing a user would see.
const recomputeTolerance = 1e-5

// bundleDiff is the largest absolute difference between a's weights and
// b's; ok is false when their configurations or tensors' names and shapes
// differ.
func bundleDiff(a, b *adapter.Bundle) (float64, bool) {
	if !bytes.Equal(a.Config, b.Config) || len(a.Tensors) != len(b.Tensors) {
		return math.Inf(1), false
	}
	var d float64
	for i, ta := range a.Tensors {
		tb := b.Tensors[i]
		if ta.Name != tb.Name || !slices.Equal(ta.Shape, tb.Shape) || len(ta.Data) != len(tb.Data) {
			return math.Inf(1), false
		}
		for j, x := range ta.Data {
			y := tb.Data[j]
			if x != x || y != y { // NaN
				return math.Inf(1), false
			}
			d = max(d, math.Abs(float64(x)-float64(y)))
		}
	}
	return d, true
}

var (
	errNoDeltas = errors.New("trainer: a version's deltas cannot be had")
	errMismatch = errors.New("trainer: a version is not what its round's deltas make")
	// errBadDeltas: the deltas its publisher gave for a version are not
	// its round's contributors' as the log records them (missing, extra,
	// other batches, a bad signature, undecodable). Anything else that
	// stops a check (a parent not fetched yet) is tried again, not held
	// against the version.
	errBadDeltas = errors.New("trainer: a version's deltas do not check out")
)

// certifyOnce is a voter's step: it votes for the newest version if it has
// not yet under the voter set in force (checking it first), or tells the
// leader why it will not.
func (t *Trainer) certifyOnce(ctx context.Context) {
	vs := t.mesh.Voters()
	if vs == nil || !vs.Has(string(t.self)) {
		return
	}
	var v group.Version
	var ok bool
	t.group.view(func(s *group.State) { v, ok = s.Current() })
	if !ok || v.Version == 0 {
		return
	}
	vsHash := vs.Hash()
	if v.Cert != nil && bytes.Equal(v.Cert.Voters, vs.Marshal()) {
		return
	}
	key, vk := voteKey(v, vs), versionKey(v)
	leader := t.group.leader()
	t.cert.mu.Lock()
	t.cert.prune(vk)
	sentTo := t.cert.sent[key]
	m := t.cert.checked[vk]
	why, refused := t.cert.refused[vk]
	last := t.cert.lastCheck[vk]
	t.cert.mu.Unlock()
	if leader == "" || sentTo == leader {
		return
	}
	if m == nil && !refused {
		if time.Since(last) < max(8*t.timing.Tick, time.Second) {
			return
		}
		t.cert.mu.Lock()
		t.cert.lastCheck[vk] = time.Now()
		t.cert.mu.Unlock()
		var err error
		if v.Cert != nil {
			// Certified under an earlier voter set: its votes are checked
			// again and the version taken on their word.
			m, err = t.recertify(ctx, v)
		} else {
			m, err = t.checkVersion(ctx, v)
		}
		switch {
		case err == nil:
			t.cert.mu.Lock()
			t.cert.checked[vk] = m
			t.cert.mu.Unlock()
		case errors.Is(err, errMismatch) || errors.Is(err, errBadDeltas):
			t.log.Warn("version refused: not what its round made", "version", v.Name(), "hash", core.ShortHash(v.Hash), "err", err)
			t.cert.mu.Lock()
			t.cert.refused[vk] = err.Error()
			t.cert.mu.Unlock()
			why, refused = err.Error(), true
			if errors.Is(err, errMismatch) && v.Publisher != t.self && v.Publisher == leader {
				// A leader that publishes what its round did not make is
				// not followed: this voter stops answering it, so that
				// with the other honest voters it loses its quorum and a
				// new leader retracts the version.
				t.cutOff.Store(v.Publisher, time.Now().Add(t.timing.CertifyWait))
				t.host.Disconnect(v.Publisher) // raft's streams to it close; new ones are refused
				t.log.Warn("the leader that published it is cut off", "leader", v.Publisher, "for", t.timing.CertifyWait)
			}
		default:
			t.log.Info("version not checked yet", "version", v.Name(), "err", err)
			return
		}
	}
	req := request{Op: opVote, Version: v.Version, Hash: v.Hash, Index: v.Index, VoterSet: vsHash[:]}
	if refused {
		req.Refuse = why
	} else {
		req.Sig = t.mesh.Sign(m.Claim(vs))
	}
	if _, err := t.toLeader(ctx, req, nil); err != nil {
		t.log.Debug("vote not taken yet", "version", v.Name(), "err", err)
		return
	}
	t.cert.mu.Lock()
	t.cert.sent[key] = leader
	t.cert.mu.Unlock()
	if !refused {
		t.log.Info("version checked and voted for", "version", v.Name(), "hash", core.ShortHash(v.Hash), "voter_set", vs.Seq())
	}
}

// recertify checks the certification v carries (under an earlier voter
// set) against this trainer's copy of v, and returns v's manifest.
func (t *Trainer) recertify(ctx context.Context, v group.Version) (*chunks.Manifest, error) {
	dir, err := t.ensureVersion(ctx, v)
	if err != nil {
		return nil, err
	}
	m, _, err := t.versionManifest(v, dir)
	if err != nil {
		return nil, err
	}
	old, err := member.ParseVoterSet(v.Cert.Voters)
	if err != nil {
		return nil, err
	}
	if !certifyWith(m, old, v.Cert.Votes) {
		return nil, fmt.Errorf("%s's certification under voter set %d has no quorum", v.Name(), old.Seq())
	}
	admin, _, _ := t.mesh.Trust()
	if err := m.VerifyCertified(admin, old); err != nil {
		return nil, err
	}
	m.Cert = nil
	return m, nil
}

// certifyWith attaches votes to m under vs; it says whether they reach
// vs's quorum.
func certifyWith(m *chunks.Manifest, vs *member.VoterSet, votes []group.Vote) bool {
	cv := make([]chunks.Vote, len(votes))
	for i, v := range votes {
		cv[i] = chunks.Vote{Peer: string(v.Peer), Sig: v.Sig}
	}
	return m.Certify(vs, cv)
}

// takeVote is the leader's side of opVote: a voter's vote (or refusal) for
// the newest version under the voter set in force. With a quorum of votes
// it certifies the version; with so many refusals that no quorum is left,
// it retracts it.
func (n *raftMember) takeVote(ctx context.Context, from mesh.PeerID, req request) error {
	t := n.t
	vs := t.mesh.Voters()
	if vs == nil || !vs.Has(string(from)) {
		return &rpcError{Code: codeRefused, Msg: fmt.Sprintf("trainer: %s is not a voter of this mesh", from)}
	}
	if h := vs.Hash(); !bytes.Equal(req.VoterSet, h[:]) {
		return &rpcError{Code: codeRefused, Msg: "trainer: a vote under another voter set than the one in force here"}
	}
	var v group.Version
	var ok bool
	n.view(func(s *group.State) { v, ok = s.Current() })
	if !ok || v.Version != req.Version || v.Hash != req.Hash || v.Index != req.Index {
		return fmt.Errorf("%w: a vote for v%d, the newest is %s", group.ErrVersion, req.Version, v.Name())
	}
	key := voteKey(v, vs)
	if req.Refuse != "" {
		t.cert.mu.Lock()
		if t.cert.refusals[key] == nil {
			t.cert.refusals[key] = map[mesh.PeerID]string{}
		}
		t.cert.refusals[key][from] = req.Refuse
		refusals := len(t.cert.refusals[key])
		t.cert.mu.Unlock()
		t.log.Warn("a voter refused the newest version", "version", v.Name(), "voter", from, "why", req.Refuse)
		if vs.Len()-refusals < vs.Quorum() {
			return t.retract(ctx, v, fmt.Sprintf("%d of %d voters found it is not what its round's deltas make", refusals, vs.Len()))
		}
		return nil
	}
	// The version's manifest is built once from the leader's copy: a
	// voter's votes cost the leader a signature check each, not a read of
	// the bundle.
	t.cert.mu.Lock()
	m := t.cert.manifests[versionKey(v)]
	t.cert.mu.Unlock()
	if m == nil {
		dir, err := t.ensureVersion(ctx, v)
		if err != nil {
			return err
		}
		if m, _, err = t.versionManifest(v, dir); err != nil {
			return err
		}
		t.cert.mu.Lock()
		if len(t.cert.manifests) >= keepPublished {
			clear(t.cert.manifests)
		}
		t.cert.manifests[versionKey(v)] = m
		t.cert.mu.Unlock()
	}
	if err := m.CheckVote(vs, chunks.Vote{Peer: string(from), Sig: req.Sig}); err != nil {
		return &rpcError{Code: codeRefused, Msg: err.Error()}
	}
	t.cert.mu.Lock()
	if t.cert.votes[key] == nil {
		t.cert.votes[key] = map[mesh.PeerID][]byte{}
	}
	t.cert.votes[key][from] = req.Sig
	var votes []group.Vote
	for p, sig := range t.cert.votes[key] {
		votes = append(votes, group.Vote{Peer: p, Sig: sig})
	}
	t.cert.mu.Unlock()
	if len(votes) < vs.Quorum() {
		return nil
	}
	slices.SortFunc(votes, func(a, b group.Vote) int { return cmp.Compare(a.Peer, b.Peer) })
	if err := n.propose(ctx, &group.Entry{Certify: &group.Certify{Version: v.Version, Hash: v.Hash, Voters: vs.Marshal(), Votes: votes}}); err != nil {
		return err
	}
	t.log.Info("version certified", "version", v.Name(), "hash", core.ShortHash(v.Hash), "votes", len(votes), "voters", vs.Len(), "voter_set", vs.Seq())
	return nil
}

// retract takes back the newest version, uncertified (leader only).
func (t *Trainer) retract(ctx context.Context, v group.Version, why string) error {
	if t.noRetract.Load() {
		return nil
	}
	if err := t.group.propose(ctx, &group.Entry{Retract: &group.Retract{Version: v.Version, Hash: v.Hash, Reason: why}}); err != nil {
		return err
	}
	t.log.Warn("version retracted: not certified", "version", v.Name(), "hash", core.ShortHash(v.Hash), "why", why)
	return nil
}

// awaitCertified is the leader's check before it plans a round: the newest
// version must be certified first. It retracts one left uncertified for
// CertifyWait. It says whether the newest version is certified.
func (t *Trainer) awaitCertified(ctx context.Context, cur group.Version) (bool, error) {
	if cur.Version == 0 || cur.Cert != nil {
		return true, nil
	}
	if vs := t.mesh.Voters(); vs == nil || vs.Quorum() == 0 {
		t.warnNoVoters()
		return false, nil
	}
	waited := time.Since(cur.At)
	if waited >= t.timing.CertifyWait {
		return false, t.retract(ctx, cur, fmt.Sprintf("no quorum of voters certified it within %s", t.timing.CertifyWait))
	}
	// Its publisher, which holds the deltas the voters check it against,
	// is gone: no quorum can come.
	if p := cur.Publisher; p != t.self && waited >= t.timing.CertifyWait/8 && !slices.Contains(t.group.live(), p) {
		return false, t.retract(ctx, cur, fmt.Sprintf("its publisher %s, which holds its round's deltas, is gone", p))
	}
	return false, nil
}

// warnNoVoters says, once a minute at most, that the mesh has no voter.
func (t *Trainer) warnNoVoters() {
	t.cert.mu.Lock()
	defer t.cert.mu.Unlock()
	if k := "novoters"; time.Since(t.cert.lastCheck[k]) > time.Minute {
		t.cert.lastCheck[k] = time.Now()
		t.log.Warn("the mesh has no voter: no version can be certified; the mesh's admin trusts a trainer with `clawmesh mesh trust PEER`")
	}
}

// atomicString is a string read and written atomically.
type atomicString struct{ v atomic.Value }

func (a *atomicString) Load() string {
	s, _ := a.v.Load().(string)
	return s
}

func (a *atomicString) Store(s string) { a.v.Store(s) }

// warnVolunteerWaits says, once a minute at most, that this trainer, a
// volunteer, waits for a trusted trainer to start the group.
func (t *Trainer) warnVolunteerWaits() {
	t.cert.mu.Lock()
	defer t.cert.mu.Unlock()
	if k := "volunteer"; time.Since(t.cert.lastCheck[k]) > time.Minute {
		t.cert.lastCheck[k] = time.Now()
		t.log.Warn("no trainers' group found, and this trainer is a volunteer: it waits for a trainer the mesh's admin trusts to start one")
	}
}
