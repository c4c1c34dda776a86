package mesh

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
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

// MayTell implements Teller: a revoked peer not refused lately may
// connect, to be shown its revocation (the certificate exchange carries
// it) and so learn that it was removed; only the open protocols serve it
// meanwhile, as they serve a stranger, and once told it is disconnected
// and refused for RefuseFor.
func (m *Mesh) MayTell(p PeerID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if until, ok := m.refused[p]; ok && m.now().Before(until) {
		return false
	}
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

// Admitted implements Gate.
func (m *Mesh) Admitted(p PeerID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.admitted[p]
	return ok
}

// Peers lists the admitted peers.
func (m *Mesh) Peers() []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Peer, 0, len(m.admitted))
	for _, p := range m.admitted {
		out = append(out, *p)
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

// Peer returns an admitted peer.
func (m *Mesh) Peer(p PeerID) (*Peer, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pe, ok := m.admitted[p]
	if !ok {
		return nil, false
	}
	c := *pe
	return &c, true
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
// time, runs the exchange again with an admitted peer in turn (so that
// peers admitted at the same moment learn of each other), and renews this
// peer's certificate when it is due.
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

// hello is what each side of the admit protocol sends: its certificate
// (none when it is about to join), the revocations it knows, where it
// listens, and where the other admitted peers it knows listen, so that the
// members of a mesh find each other (a trainer must reach the device a
// batch is on to pull it); the full hello also carries the voter set.
type hello struct {
	Cert        string     `json:"cert,omitempty"` // hex
	Revocations string     `json:"revocations,omitempty"`
	Addrs       []string   `json:"addrs,omitempty"`
	Peers       [][]string `json:"peers,omitempty"`
	Voters      string     `json:"voters,omitempty"` // the voter set in force, hex
}

// maxExchanged bounds the peers a hello names, and the addresses of each.
const maxExchanged = 64

// helloFor is the hello for peer p, whose certificate is cert if known: a
// bare one for a peer that is revoked (the revocations of it, so that it
// learns it was removed, and not where the members listen), the full one
// otherwise.
func (m *Mesh) helloFor(p PeerID, cert *member.Certificate) hello {
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	if !revs.IsRevoked(string(p)) && revs.RevocationOf(cert) == nil {
		return m.hello()
	}
	return m.bareHello(p)
}

// bareHello is this peer's certificate and the revocations of p only.
func (m *Mesh) bareHello(p PeerID) hello {
	m.mu.Lock()
	revs, cert := m.revs, m.cert
	m.mu.Unlock()
	l := member.NewRevocationList(m.admin)
	for _, r := range revs.Revocations() {
		if r.Subject() == string(p) {
			l.Add(r)
		}
	}
	return hello{Cert: hex.EncodeToString(cert.Marshal()), Revocations: hex.EncodeToString(l.Marshal())}
}

func (m *Mesh) hello() hello {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := hello{Cert: hex.EncodeToString(m.cert.Marshal()), Revocations: hex.EncodeToString(m.revs.Marshal()), Voters: m.votersHex()}
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

// admit runs the certificate exchange with p, as the side that opens it.
func (m *Mesh) admit(ctx context.Context, p PeerID) {
	link := m.linkOf(p)
	if link == 0 {
		return // not connected (any more)
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
	if err := writeMsg(s, m.helloFor(p, nil)); err != nil {
		s.Reset()
		return
	}
	var h hello
	if err := readMsg(bufio.NewReader(s), &h, maxMsg); err != nil {
		m.log.Debug("admit: no hello", "peer", p, "err", err)
		s.Reset()
		return
	}
	m.check(p, h, link)
}

// handleAdmit answers a peer's hello: with the full hello if its
// certificate is valid, else with the bare one (a revoked peer learns it
// was removed; a stranger learns nothing of the members). A peer about to
// be refused is given the time to read the answer before it is cut off.
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
	reply, valid := m.bareHello(p), false
	if h.Cert != "" {
		if _, err := m.verifyPeerCert(p, h.Cert); err == nil {
			reply, valid = m.hello(), true
		}
	}
	if err := writeMsg(s, reply); err != nil {
		s.Reset()
		return
	}
	if h.Cert != "" && !valid {
		// It is refused below: let it read the answer first (it closes
		// the stream once it has).
		s.CloseWrite()
		s.SetReadDeadline(time.Now().Add(tellTimeout))
		io.Copy(io.Discard, io.LimitReader(br, maxMsg))
	}
	m.check(p, h, link)
}

// tellTimeout bounds the telling of a revoked peer that it was removed.
const tellTimeout = 5 * time.Second

// tellAndDrop shows a revoked peer its revocation (an exchange of hellos:
// ours carries it), then disconnects it; once told, it is refused for
// RefuseFor (untold, it may connect again to be told).
func (m *Mesh) tellAndDrop(p PeerID) {
	ctx, cancel := context.WithTimeout(context.Background(), tellTimeout)
	defer cancel()
	told := false
	if s, err := m.host.NewStream(ctx, p, ProtoAdmit); err == nil {
		s.SetDeadline(time.Now().Add(tellTimeout))
		if writeMsg(s, m.bareHello(p)) == nil {
			var h hello
			// Its answer: it has read ours.
			told = readMsg(bufio.NewReader(s), &h, maxMsg) == nil
		}
		s.Close()
	}
	m.mu.Lock()
	if told {
		m.refused[p] = m.now().Add(m.cfg.RefuseFor)
	}
	delete(m.connected, p)
	delete(m.admitted, p)
	m.mu.Unlock()
	m.host.Disconnect(p)
}

// check admits p if its hello carries a valid certificate for it and the
// connection the exchange ran on (link) is still up, and takes in the
// revocations it knows.
func (m *Mesh) check(p PeerID, h hello, link uint64) {
	if h.Revocations != "" {
		if b, err := hex.DecodeString(h.Revocations); err == nil {
			if l, err := member.ParseRevocationList(m.admin, b); err == nil {
				m.merge(l)
			}
		}
	}
	m.takeVoters(p, h.Voters)
	if h.Cert == "" {
		return // joining: it has until the admission timeout
	}
	if m.Revoked() != nil {
		return // removed from the mesh: it admits no one
	}
	cert, err := m.verifyPeerCert(p, h.Cert)
	if err != nil {
		m.log.Info("peer refused", "peer", p, "err", err)
		m.mu.Lock()
		m.refused[p] = m.now().Add(m.cfg.RefuseFor)
		delete(m.connected, p)
		m.mu.Unlock()
		m.host.Disconnect(p)
		return
	}
	m.mu.Lock()
	if link == 0 || m.links[p] != link {
		// The connection closed during the exchange (or this side had
		// not yet heard it open: its own exchange, on that news, admits).
		m.mu.Unlock()
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
