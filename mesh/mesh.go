package mesh

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// Defaults.
const (
	DefaultAdmitTimeout = 20 * time.Second
	DefaultRefuseFor    = 2 * time.Minute
	exchangeTimeout     = 10 * time.Second
	// refreshEvery is how often a peer runs the exchange again with one
	// admitted peer, in turn, to learn the peers it admitted since: two
	// peers that joined through a third at the same moment were each
	// admitted before the third knew the other, and would never meet.
	refreshEvery = 5 * time.Second
)

// Config configures a Mesh. The zero value of each optional field means
// its default.
type Config struct {
	// DataDir holds the membership (Dir). Required; it must be in a mesh.
	DataDir string
	// Key is this peer's identity key, the one its peer id names.
	// Required.
	Key ed25519.PrivateKey
	// KeyOf returns the public key a peer id names (mesh/p2p.KeyOf).
	// Required.
	KeyOf func(PeerID) (ed25519.PublicKey, error)
	// AdmitTimeout is how long a connected peer has to show a valid
	// certificate (or to join) before it is disconnected and refused for
	// RefuseFor; defaults 20s and 2m.
	AdmitTimeout, RefuseFor time.Duration
	// Bootstrap are peers to dial at start, beside those the state names.
	Bootstrap []string
	// Stall is how long a batch pull may make no progress before it is
	// given up and another source tried; default DefaultStall.
	Stall  time.Duration
	Now    func() time.Time
	Rand   io.Reader
	Logger *slog.Logger
}

// Peer is an admitted peer.
type Peer struct {
	ID   PeerID
	Cert *member.Certificate
	// Since is when it was admitted.
	Since time.Time
	// Addrs are the addresses it says it listens on.
	Addrs []string
}

// Mesh is a peer's membership at work: it admits peers by certificate
// (it is the Host's Gate), redeems invite tokens it issued, spreads and
// enforces revocations and renews its certificate. It is safe for
// concurrent use.
type Mesh struct {
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	self  PeerID
	admin ed25519.PublicKey
	// adminKey is set on the device that made the mesh.
	adminKey ed25519.PrivateKey

	revMu    sync.Mutex // serializes revocation merges
	ledgerMu sync.Mutex // serializes redemptions
	knownMu  sync.Mutex // serializes writes of the known members

	mu        sync.Mutex
	state     *State
	cert      *member.Certificate
	revs      *member.RevocationList
	ledger    *member.Ledger
	admitted  map[PeerID]*Peer
	connected map[PeerID]time.Time // peers connected, not yet admitted: since when
	// links numbers each connected peer's connection (gen counts them):
	// an exchange admits its peer only if the connection it ran on is
	// still the one up, so that an exchange that ends after its
	// connection closed leaves no peer admitted but not connected.
	links   map[PeerID]uint64
	gen     uint64
	refused map[PeerID]time.Time // until when
	onAdmit []func(*Peer)
	// known are the peers this device admitted or issued certificates to
	// (DATA/mesh/members.json).
	known map[PeerID]Known
	// trainerIn has a token when a trainer was admitted since the shipper
	// last looked.
	trainerIn chan struct{}
	// ship is the announcement schedule of the batches Ship ships.
	ship schedule

	host     Host
	revTopic Topic

	voters voterState
}

// New loads the membership in cfg.DataDir. It returns ErrNotJoined for a
// directory in no mesh.
func New(cfg Config) (*Mesh, error) {
	if cfg.DataDir == "" || len(cfg.Key) != ed25519.PrivateKeySize || cfg.KeyOf == nil {
		return nil, errors.New("mesh: config needs DataDir, Key and KeyOf")
	}
	if cfg.AdmitTimeout == 0 {
		cfg.AdmitTimeout = DefaultAdmitTimeout
	}
	if cfg.RefuseFor == 0 {
		cfg.RefuseFor = DefaultRefuseFor
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	st, err := LoadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	admin, _ := st.AdminKey()
	cert, _ := st.Certificate()
	m := &Mesh{
		cfg: cfg, log: cfg.Logger.With("component", "mesh"), now: cfg.Now, admin: admin, state: st, cert: cert,
		admitted: map[PeerID]*Peer{}, connected: map[PeerID]time.Time{}, refused: map[PeerID]time.Time{}, links: map[PeerID]uint64{},
		trainerIn: make(chan struct{}, 1),
	}
	if !bytes.Equal(cert.SubjectKey(), cfg.Key.Public().(ed25519.PublicKey)) {
		return nil, fmt.Errorf("mesh: the certificate in %s is for another key than this peer's identity", cfg.DataDir)
	}
	m.self = PeerID(cert.Subject())
	if k, err := LoadAdminKey(cfg.DataDir); err == nil {
		if !bytes.Equal(k.Public().(ed25519.PublicKey), admin) {
			return nil, fmt.Errorf("mesh: the admin key in %s is not this mesh's", cfg.DataDir)
		}
		m.adminKey = k
	} else if !errors.Is(err, ErrNotAdmin) {
		return nil, err
	}
	if m.revs, err = LoadRevocations(cfg.DataDir, admin); err != nil {
		return nil, err
	}
	if m.voters.set, err = LoadVoters(cfg.DataDir, admin); err != nil {
		return nil, err
	}
	if m.ledger, err = LoadLedger(cfg.DataDir, admin, m.self); err != nil {
		return nil, err
	}
	if m.known, err = LoadKnown(cfg.DataDir); err != nil {
		// A convenience record: a damaged one is started afresh.
		m.log.Warn("the known members", "err", err)
	}
	return m, nil
}

// ID is this peer's id.
func (m *Mesh) ID() PeerID { return m.self }

// MeshID is the mesh's id.
func (m *Mesh) MeshID() string { return m.state.MeshID }

// State returns a copy of the membership.
func (m *Mesh) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return *m.state
}

// Cert is this peer's certificate.
func (m *Mesh) Cert() *member.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert
}

// IsAdmin reports whether this device holds the mesh's admin key.
func (m *Mesh) IsAdmin() bool { return m.adminKey != nil }

// Blocked implements Gate: revoked peers, and peers refused admission
// lately.
func (m *Mesh) Blocked(p PeerID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if until, ok := m.refused[p]; ok {
		if m.now().Before(until) {
			return true
		}
		delete(m.refused, p)
	}
	return m.revs.IsRevoked(string(p))
}

// MayTell implements Teller: a peer the admin revoked may always connect,
// to be shown its revocation (the admit protocol carries it) and so learn
// that it was removed, also when it comes back to redeem a new token under
// its old peer id (the redeem protocol then says it was removed); only the
// open protocols serve it meanwhile, as they serve a stranger, and once
// told it is disconnected.
func (m *Mesh) MayTell(p PeerID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revs.IsRevoked(string(p))
}

// Revoked returns the revocation that removed this peer from the mesh, or
// nil while it is a member.
func (m *Mesh) Revoked() *member.Revocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revs.RevocationOf(m.cert)
}

// RevokedBy says who signed a revocation: the mesh admin, or the inviter
// that issued the certificate it revokes.
func RevokedBy(r *member.Revocation) string {
	if r.ByAdmin() || r.IssuerCert() == nil {
		return "the mesh admin"
	}
	return "its inviter " + r.IssuerCert().Subject()
}

// logRemoved says, once, that this peer was removed from the mesh, by
// whom, why, and what to do.
func (m *Mesh) logRemoved(r *member.Revocation) {
	m.log.Error("this device was removed from the mesh: every peer refuses it and its batches will not ship; "+
		"to take part again, ask the mesh admin for a new invite and join with it from a fresh data directory (this peer id stays refused)",
		"by", RevokedBy(r), "reason", r.Reason(), "at", r.RevokedAt().Format(time.RFC3339))
}

// Admitted implements Gate: p was admitted on this connection and the
// certificate it showed still holds now (it has not expired, and neither
// it nor its inviter's was revoked since).
func (m *Mesh) Admitted(p PeerID) bool {
	_, ok := m.Peer(p)
	return ok
}

// holds reports whether an admitted peer's certificate still holds now
// against revs: it is Certificate.Verify less the chain and its
// signatures, which were verified when the peer was admitted and cannot
// change since (a Verify costs some 150 µs of signature checks, and
// Admitted runs on every stream and gossip frame): each certificate of the
// chain is within its validity and not revoked. The list is replaced,
// never changed, so it is read without the lock.
func (m *Mesh) holds(pe *Peer, now time.Time, revs *member.RevocationList) bool {
	return certHolds(pe.Cert, now, revs)
}

func certHolds(c *member.Certificate, now time.Time, revs *member.RevocationList) bool {
	if c == nil {
		return false
	}
	for ; c != nil; c = c.IssuerCert() {
		if now.Before(c.IssuedAt().Add(-member.ClockSkew)) || !now.Before(c.Expires()) || revs.RevocationOf(c) != nil {
			return false
		}
	}
	return true
}

// Peers lists the admitted peers whose certificates still hold.
func (m *Mesh) Peers() []Peer {
	now := m.now()
	m.mu.Lock()
	revs := m.revs
	all := make([]Peer, 0, len(m.admitted))
	for _, p := range m.admitted {
		all = append(all, *p)
	}
	m.mu.Unlock()
	out := all[:0]
	for _, p := range all {
		if m.holds(&p, now, revs) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Peer) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

// Peer returns an admitted peer, if its certificate still holds.
func (m *Mesh) Peer(p PeerID) (*Peer, bool) {
	now := m.now()
	m.mu.Lock()
	pe, ok := m.admitted[p]
	revs := m.revs
	var c Peer
	if ok {
		c = *pe
	}
	m.mu.Unlock()
	if !ok || !m.holds(&c, now, revs) {
		return nil, false
	}
	return &c, true
}

// dropLapsed disconnects the admitted peers whose certificates no longer
// hold: expired (or revoked, if the revocation's news did not drop them).
// Run calls it every second; Admitted refuses them meanwhile.
func (m *Mesh) dropLapsed() {
	now := m.now()
	type lapsed struct {
		p   PeerID
		err error
	}
	var gone []lapsed
	m.mu.Lock()
	for p, pe := range m.admitted {
		if !m.holds(pe, now, m.revs) {
			gone = append(gone, lapsed{p, pe.Cert.Verify(m.admin, now, m.revs)})
			delete(m.admitted, p)
		}
	}
	m.mu.Unlock()
	for _, l := range gone {
		m.log.Info("peer disconnected: its certificate no longer holds", "peer", l.p, "err", l.err)
		m.host.Disconnect(l.p)
	}
}

// OnAdmit calls fn (without blocking the caller's work: fn runs on its own
// goroutine) each time a peer is admitted. Call it before Start.
func (m *Mesh) OnAdmit(fn func(*Peer)) {
	m.mu.Lock()
	m.onAdmit = append(m.onAdmit, fn)
	m.mu.Unlock()
}

// Trust returns what a signature from this mesh is checked against now:
// the admin's key, the revocations known, and the time.
func (m *Mesh) Trust() (admin ed25519.PublicKey, revoked member.Revoker, now time.Time) {
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	return m.admin, revs, m.now()
}

// Revocations returns the revocations this peer knows.
func (m *Mesh) Revocations() []*member.Revocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revs.Revocations()
}

// Start serves the mesh's protocols on h and admits peers as they
// connect; it dials the bootstrap peers. Run does the periodic work.
func (m *Mesh) Start(ctx context.Context, h Host) error {
	m.host = h
	h.Handle(ProtoAdmit, m.handleAdmit)
	h.Handle(ProtoRedeem, m.handleRedeem)
	h.Handle(ProtoRenew, m.handleRenew)
	h.Notify(m.notify)
	t, err := h.Join(topicRevocations(m.state.MeshID))
	if err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	m.revTopic = t
	m.mu.Lock()
	m.state.Addrs = h.Addrs()
	m.state.Updated = m.now().UTC()
	st := *m.state
	m.mu.Unlock()
	if err := SaveState(m.cfg.DataDir, &st); err != nil {
		m.log.Warn("saving the state", "err", err)
	}
	if r := m.Revoked(); r != nil {
		m.logRemoved(r)
	}
	return nil
}

// Run dials the bootstrap peers, then until ctx is done: reads
// revocations from the mesh, disconnects peers that were not admitted in
// time and admitted peers whose certificates expired, runs the exchange
// again with an admitted peer in turn (so that peers admitted at the same
// moment learn of each other), and renews this peer's certificate when it
// is due.
func (m *Mesh) Run(ctx context.Context) error {
	if m.host == nil {
		return errors.New("mesh: Run before Start")
	}
	go m.readRevocations(ctx)
	go m.runVoters(ctx)
	m.dialBootstrap(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastRenew := time.Time{}
	lastRefresh := time.Now()
	var turn int
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		m.expireUnadmitted()
		m.dropLapsed()
		if time.Since(lastRefresh) >= refreshEvery {
			lastRefresh = time.Now()
			if p, ok := m.nextRefresh(turn); ok {
				turn++
				go m.admit(ctx, p)
			}
		}
		if now := m.now(); m.Cert().NeedsRenewal(now) && now.Sub(lastRenew) > 10*time.Second {
			lastRenew = now
			if err := m.renew(ctx); err != nil {
				m.log.Warn("renewing the certificate", "err", err, "expires", m.Cert().Expires())
			}
		}
	}
}

func (m *Mesh) dialBootstrap(ctx context.Context) {
	st := m.State()
	addrs := append(slices.Clone(st.Bootstrap), m.cfg.Bootstrap...)
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := m.host.Connect(dctx, []string{a}); err != nil {
			m.log.Debug("bootstrap peer unreachable", "addr", a, "err", err)
		}
		cancel()
	}
}

// notify tracks connections: a new one gets the certificate exchange, a
// closed one is forgotten.
func (m *Mesh) notify(p PeerID, up bool) {
	m.mu.Lock()
	if !up {
		delete(m.connected, p)
		delete(m.admitted, p)
		delete(m.links, p)
		m.mu.Unlock()
		return
	}
	m.gen++
	m.links[p] = m.gen
	if _, ok := m.admitted[p]; !ok {
		m.connected[p] = m.now()
	}
	m.mu.Unlock()
	go m.admit(context.Background(), p)
}

// nextRefresh is the admitted peer whose turn it is to be asked again
// which peers it knows.
func (m *Mesh) nextRefresh(turn int) (PeerID, bool) {
	m.mu.Lock()
	ids := make([]PeerID, 0, len(m.admitted))
	for p := range m.admitted {
		ids = append(ids, p)
	}
	m.mu.Unlock()
	if len(ids) == 0 {
		return "", false
	}
	slices.Sort(ids)
	return ids[turn%len(ids)], true
}

// expireUnadmitted disconnects, and refuses for a while, peers connected
// for longer than the admission timeout without being admitted.
func (m *Mesh) expireUnadmitted() {
	now := m.now()
	var late []PeerID
	m.mu.Lock()
	for p, since := range m.connected {
		if _, ok := m.admitted[p]; ok {
			delete(m.connected, p)
			continue
		}
		if now.Sub(since) > m.cfg.AdmitTimeout {
			late = append(late, p)
			delete(m.connected, p)
			m.refused[p] = now.Add(m.cfg.RefuseFor)
		}
	}
	m.mu.Unlock()
	for _, p := range late {
		m.log.Info("peer refused: no valid certificate for this mesh in time", "peer", p)
		m.host.Disconnect(p)
	}
}

// The admit protocol. Each side of a new connection opens it (admit) and
// answers the other's (handleAdmit). Neither side says anything about the
// mesh (its id, its admin, its members, its revocations, even its own
// certificate) to a peer before that peer has shown it knows the mesh,
// and neither names a member before the other's certificate checked out:
//
//	opener                                  answerer
//	proof (opener, answerer)           ->
//	                                   <-   proof (answerer, opener); to a
//	                                        peer without one: an empty hello
//	its certificate                    ->
//	                                   <-   its certificate, the revocations,
//	                                        where it and its peers listen; to
//	                                        a certificate that does not check
//	                                        out: the revocations of it, if
//	                                        any, and it is refused
//	the revocations, where it and its  ->
//	peers listen (once the answerer's
//	certificate checked out)
//
// A proof is an HMAC of the two peer ids keyed with the mesh admin's
// public key: a peer that never held a token or a certificate of the mesh
// cannot make one, nor tell from one which mesh it is for, and one made
// for a pair of peers is worth nothing to a third (the transport
// authenticates the ids). Some side must show something first, and a
// certificate names the mesh, its admin and the inviter; with the proofs,
// each side shows its certificate only to a peer that knows the mesh,
// whichever side dialled (mDNS and the peer cache dial peers no member
// vouched for). A peer the admin revoked is shown its revocations instead
// of a proof (tell), and is then refused: it learns it was removed, and
// nothing else. The redeem protocol is the one other exchange open to a
// peer without a certificate, and it answers only once the token checked
// out.

// hello is one message of the admit protocol; each step fills some of its
// fields. Cert, Revocations and Voters are hex (member encodings); the
// voter set travels only in the hello of a peer whose certificate checked
// out.
type hello struct {
	Proof       string     `json:"proof,omitempty"` // hex
	Cert        string     `json:"cert,omitempty"`
	Revocations string     `json:"revocations,omitempty"`
	Addrs       []string   `json:"addrs,omitempty"`
	Peers       [][]string `json:"peers,omitempty"`
	Voters      string     `json:"voters,omitempty"` // the voter set in force, hex
}

// maxExchanged bounds the peers a hello names, and the addresses of each.
const maxExchanged = 64

// proofContext separates the admit proof from any other use of the key.
const proofContext = "clawmesh/admit/2 proof\x00"

// proof is the HMAC, keyed with the admin's public key, of from and to.
func (m *Mesh) proof(from, to PeerID) []byte {
	mac := hmac.New(sha256.New, m.admin)
	mac.Write([]byte(proofContext))
	mac.Write([]byte(from))
	mac.Write([]byte{0})
	mac.Write([]byte(to))
	return mac.Sum(nil)
}

// proofHolds reports whether got (hex) is the proof from makes for to.
func (m *Mesh) proofHolds(got string, from, to PeerID) bool {
	b, err := hex.DecodeString(got)
	return err == nil && hmac.Equal(b, m.proof(from, to))
}

// tellHello is what a refused peer p is shown: the revocations of it, and
// that of the inviter that issued cert (the certificate it showed, if
// any); an empty hello when there are none.
func (m *Mesh) tellHello(p PeerID, cert *member.Certificate) hello {
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	l := member.NewRevocationList(m.admin)
	for _, r := range revs.Revocations() {
		if r.Subject() == string(p) {
			l.Add(r)
		}
	}
	if cert != nil && cert.Subject() == string(p) && cert.IssuerCert() != nil {
		if r := revs.RevocationOf(cert.IssuerCert()); r != nil {
			l.Add(r)
		}
	}
	if l.Len() == 0 {
		return hello{}
	}
	return hello{Revocations: hex.EncodeToString(l.Marshal())}
}

// hello is all this peer tells a peer whose certificate checked out: its
// certificate, the revocations, where it listens and where the peers it
// admitted listen. A peer removed from the mesh tells only the
// revocations.
func (m *Mesh) hello() hello {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := hello{Revocations: hex.EncodeToString(m.revs.Marshal())}
	if m.revs.RevocationOf(m.cert) != nil {
		return h
	}
	h.Cert = hex.EncodeToString(m.cert.Marshal())
	h.Voters = m.votersHex()
	if m.host != nil {
		h.Addrs = firstN(m.host.Addrs(), 16)
	}
	for _, pe := range m.admitted {
		if len(h.Peers) == maxExchanged {
			break
		}
		if len(pe.Addrs) > 0 {
			h.Peers = append(h.Peers, firstN(pe.Addrs, 16))
		}
	}
	return h
}

// certHello is this peer's certificate, with the revocations of it if it
// was removed from the mesh: a peer that had not heard of them learns them
// before it answers.
func (m *Mesh) certHello() hello {
	cert := m.Cert()
	h := m.tellHello(m.self, cert)
	h.Cert = hex.EncodeToString(cert.Marshal())
	return h
}

func firstN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// linkOf is the number of p's connection now (0: not connected).
func (m *Mesh) linkOf(p PeerID) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.links[p]
}

// revokedPeer reports a peer the admin revoked.
func (m *Mesh) revokedPeer(p PeerID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revs.IsRevoked(string(p))
}

// admit runs the admit protocol with p, as the side that opens it.
func (m *Mesh) admit(ctx context.Context, p PeerID) {
	link := m.linkOf(p)
	if link == 0 {
		return // not connected (any more)
	}
	if m.revokedPeer(p) {
		// A revoked peer that connected to be told. One that does not
		// serve the protocol (a host joining with a token) is left to
		// the redeem protocol, which says why it refuses.
		m.tell(p, nil, false)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	s, err := m.host.NewStream(ctx, p, ProtoAdmit)
	if err != nil {
		m.log.Debug("admit: no stream", "peer", p, "err", err)
		return
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	br := bufio.NewReader(s)
	var h hello
	if err := exchange(s, br, hello{Proof: hex.EncodeToString(m.proof(m.self, p))}, &h); err != nil {
		m.log.Debug("admit: no answer", "peer", p, "err", err)
		s.Reset()
		return
	}
	m.takeRevocations(h)
	if !m.proofHolds(h.Proof, p, m.self) {
		if h.Proof != "" {
			m.refuse(p, errors.New("mesh: its proof of the mesh does not hold (a peer of another mesh)"))
		}
		// Else a peer that does not know the mesh (a stranger, a host
		// joining), or this peer was told it was removed: nothing more
		// is said.
		return
	}
	if err := exchange(s, br, m.certHello(), &h); err != nil {
		m.log.Debug("admit: no certificate", "peer", p, "err", err)
		s.Reset()
		return
	}
	m.takeRevocations(h)
	if h.Cert == "" {
		return // it refused this peer's certificate (and said why if revoked)
	}
	cert, err := m.verifyPeerCert(p, h.Cert)
	if err != nil {
		m.refuse(p, err)
		return
	}
	if err := writeMsg(s, m.hello()); err != nil {
		s.Reset()
		return
	}
	m.admitPeer(p, cert, h, link)
}

// exchange writes out and reads the answer into in.
func exchange(s Stream, br *bufio.Reader, out hello, in *hello) error {
	if err := writeMsg(s, out); err != nil {
		return err
	}
	*in = hello{}
	return readMsg(br, in, maxMsg)
}

// handleAdmit answers a peer's admit protocol (see the protocol above).
func (m *Mesh) handleAdmit(s Stream) {
	defer s.Close()
	p := s.RemotePeer()
	link := m.linkOf(p)
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	br := bufio.NewReader(s)
	var h hello
	if err := readMsg(br, &h, maxMsg); err != nil {
		s.Reset()
		return
	}
	m.takeRevocations(h)
	if m.revokedPeer(p) {
		m.answerAndRefuse(s, br, p, m.tellHello(p, nil), errors.New("mesh: revoked by the mesh admin"))
		return
	}
	if !m.proofHolds(h.Proof, p, m.self) {
		// A peer that does not know the mesh learns nothing of it. A
		// stranger without a proof has until the admission timeout (it
		// may be joining); a wrong proof is another mesh's.
		writeMsg(s, hello{})
		if h.Proof != "" {
			s.CloseWrite()
			m.refuse(p, errors.New("mesh: its proof of the mesh does not hold (a peer of another mesh)"))
		}
		return
	}
	if err := exchange(s, br, hello{Proof: hex.EncodeToString(m.proof(m.self, p))}, &h); err != nil {
		s.Reset()
		return
	}
	m.takeRevocations(h)
	cert, err := m.verifyPeerCert(p, h.Cert)
	if err != nil {
		var shown *member.Certificate
		if b, derr := hex.DecodeString(h.Cert); derr == nil {
			shown, _ = member.ParseCertificate(b)
		}
		m.answerAndRefuse(s, br, p, m.tellHello(p, shown), err)
		return
	}
	if err := exchange(s, br, m.hello(), &h); err != nil {
		// It refused this peer's certificate, or went.
		return
	}
	m.takeRevocations(h)
	m.admitPeer(p, cert, h, link)
}

// answerAndRefuse sends a refused peer its answer, gives it the time to
// read it (it closes the stream once it has), then disconnects it and
// refuses it for RefuseFor.
func (m *Mesh) answerAndRefuse(s Stream, br *bufio.Reader, p PeerID, answer hello, why error) {
	if writeMsg(s, answer) == nil {
		s.CloseWrite()
		s.SetReadDeadline(time.Now().Add(tellTimeout))
		io.Copy(io.Discard, io.LimitReader(br, maxMsg))
	}
	m.refuse(p, why)
}

// refuse disconnects p and refuses it for RefuseFor. A peer refused again
// while it still is (a revoked peer connecting to be told, again) is
// logged at debug level only.
func (m *Mesh) refuse(p PeerID, why error) {
	now := m.now()
	m.mu.Lock()
	again := now.Before(m.refused[p])
	m.refused[p] = now.Add(m.cfg.RefuseFor)
	delete(m.connected, p)
	delete(m.admitted, p)
	m.mu.Unlock()
	if again {
		m.log.Debug("peer refused again", "peer", p, "err", why)
	} else {
		m.log.Info("peer refused", "peer", p, "err", why)
	}
	m.host.Disconnect(p)
}

// tellTimeout bounds the telling of a revoked peer that it was removed.
const tellTimeout = 5 * time.Second

// tellAndDrop shows a revoked peer its revocations (cert: the certificate
// it was admitted with, if any), then disconnects it.
func (m *Mesh) tellAndDrop(p PeerID, cert *member.Certificate) { m.tell(p, cert, true) }

// tell opens the admit protocol to p to show it its revocations (cert as
// for tellHello); p answers once it has read them. A peer told is
// disconnected and refused for RefuseFor; one that could not be told is
// disconnected only if drop.
func (m *Mesh) tell(p PeerID, cert *member.Certificate, drop bool) {
	ctx, cancel := context.WithTimeout(context.Background(), tellTimeout)
	defer cancel()
	told := false
	if s, err := m.host.NewStream(ctx, p, ProtoAdmit); err == nil {
		s.SetDeadline(time.Now().Add(tellTimeout))
		var h hello
		told = exchange(s, bufio.NewReader(s), m.tellHello(p, cert), &h) == nil
		s.Close()
	}
	if told {
		m.refuse(p, errors.New("mesh: revoked (it was told)"))
		return
	}
	if !drop {
		return
	}
	m.mu.Lock()
	delete(m.connected, p)
	delete(m.admitted, p)
	m.mu.Unlock()
	m.host.Disconnect(p)
}

// takeRevocations merges the revocations a hello carries (each is checked
// against the admin key: anyone's are taken).
func (m *Mesh) takeRevocations(h hello) {
	if h.Revocations == "" {
		return
	}
	if b, err := hex.DecodeString(h.Revocations); err == nil {
		if l, err := member.ParseRevocationList(m.admin, b); err == nil {
			m.merge(l)
		}
	}
}

// admitPeer admits p, whose certificate cert checked out in the exchange
// that ran on connection link, if that connection is still the one up and
// cert still holds; h is what p said of where it and its peers listen.
// This peer admits no one once it was removed from the mesh.
func (m *Mesh) admitPeer(p PeerID, cert *member.Certificate, h hello, link uint64) {
	m.takeVoters(p, h.Voters)
	if m.Revoked() != nil {
		return
	}
	m.mu.Lock()
	if link == 0 || m.links[p] != link {
		// The connection closed during the exchange (or this side had
		// not yet heard it open: its own exchange, on that news, admits).
		m.mu.Unlock()
		return
	}
	if cert.Verify(m.admin, m.now(), m.revs) != nil {
		m.mu.Unlock() // revoked, or expired, during the exchange
		return
	}
	prev, was := m.admitted[p]
	pe := &Peer{ID: p, Cert: cert, Since: m.now(), Addrs: firstN(h.Addrs, 16)}
	if was {
		pe.Since = prev.Since // an exchange run again, not a new admission
	}
	m.admitted[p] = pe
	delete(m.connected, p)
	fns := slices.Clone(m.onAdmit)
	var dial [][]string
	for _, addrs := range firstN(h.Peers, maxExchanged) {
		if q := addrPeer(addrs); q != "" && q != m.self && m.admitted[q] == nil && !m.revs.IsRevoked(string(q)) {
			dial = append(dial, firstN(addrs, 16))
		}
	}
	m.mu.Unlock()
	if !was {
		m.log.Info("peer admitted", "peer", p, "role", cert.Role())
		m.remember(p, cert.Role().String(), false)
		if cert.Role() == member.RoleTrainer {
			select {
			case m.trainerIn <- struct{}{}:
			default:
			}
		}
		for _, fn := range fns {
			go fn(pe)
		}
	}
	for _, addrs := range dial {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), exchangeTimeout)
			defer cancel()
			if _, err := m.host.Connect(ctx, addrs); err != nil {
				m.log.Debug("a peer named by another unreachable", "addrs", addrs, "err", err)
			}
		}()
	}
}

// addrPeer returns the peer id the multiaddrs end in (/p2p/ID), if they
// all name the same one.
func addrPeer(addrs []string) PeerID {
	var id PeerID
	for _, a := range addrs {
		i := strings.LastIndex(a, "/p2p/")
		if i < 0 {
			return ""
		}
		q := PeerID(a[i+5:])
		if id != "" && q != id {
			return ""
		}
		id = q
	}
	return id
}

// verifyPeerCert checks that hexCert is a valid certificate of this mesh
// for peer p and the key its id names.
func (m *Mesh) verifyPeerCert(p PeerID, hexCert string) (*member.Certificate, error) {
	b, err := hex.DecodeString(hexCert)
	if err != nil {
		return nil, fmt.Errorf("%w: certificate not hex", member.ErrTampered)
	}
	cert, err := member.ParseCertificate(b)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	if err := cert.Verify(m.admin, m.now(), revs); err != nil {
		return nil, err
	}
	if cert.Subject() != string(p) {
		return nil, fmt.Errorf("%w: the certificate is %s's, shown by %s", member.ErrNotAllowed, cert.Subject(), p)
	}
	key, err := m.cfg.KeyOf(p)
	if err != nil || !bytes.Equal(key, cert.SubjectKey()) {
		return nil, fmt.Errorf("%w: the certificate's key is not the one peer %s's id names", member.ErrNotAllowed, p)
	}
	return cert, nil
}
