package mesh

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// ---- revocations

// merge takes in the revocations of l that this peer did not know, saves
// them, and drops the admitted peers they revoke: each is shown its
// revocation, then disconnected and refused (tellAndDrop). It returns
// those peers. The list is replaced, never changed in place, so readers
// may hold it without the lock. When the news revokes this peer itself, it
// says so, once.
func (m *Mesh) merge(l *member.RevocationList) []PeerID {
	m.revMu.Lock()
	defer m.revMu.Unlock()
	m.mu.Lock()
	cur := m.revs
	m.mu.Unlock()
	next := member.NewRevocationList(m.admin)
	if err := next.Merge(cur); err != nil {
		return nil
	}
	before := next.Len()
	if err := next.Merge(l); err != nil || next.Len() == before {
		return nil
	}
	m.mu.Lock()
	cert := m.cert
	m.mu.Unlock()
	// Kept and said before the list is in use: once Revoked reports the
	// news, the data directory and the log have it.
	if err := SaveRevocations(m.cfg.DataDir, next); err != nil {
		m.log.Warn("saving revocations", "err", err)
	}
	if out := next.RevocationOf(cert); out != nil && cur.RevocationOf(cert) == nil {
		m.logRemoved(out)
	}
	m.mu.Lock()
	m.revs = next
	var gone []PeerID
	certs := map[PeerID]*member.Certificate{}
	for p, pe := range m.admitted {
		if next.RevocationOf(pe.Cert) != nil || pe.Cert.IssuerCert() != nil && next.RevocationOf(pe.Cert.IssuerCert()) != nil {
			gone = append(gone, p)
			certs[p] = pe.Cert
			delete(m.admitted, p)
		}
	}
	m.mu.Unlock()
	for _, p := range gone {
		m.log.Info("peer revoked: disconnected", "peer", p)
		if m.host != nil {
			go m.tellAndDrop(p, certs[p])
		}
	}
	return gone
}

// Errors of Revoke.
var (
	// ErrBadPeerID: the peer to revoke is not a peer id.
	ErrBadPeerID = errors.New("mesh: not a peer id")
	// ErrUnknownPeer: the peer to revoke is none this device admitted or
	// issued a certificate to (RevokeOptions.Force revokes it anyway).
	ErrUnknownPeer = errors.New("mesh: not a member or trainer this device knows")
	// ErrAlreadyRevoked: the peer is revoked already, as this device's
	// revocation would revoke it.
	ErrAlreadyRevoked = errors.New("mesh: already revoked")
)

// RevokeOptions say why and how a peer is revoked.
type RevokeOptions struct {
	// Reason is kept with the revocation and shown to the peer.
	Reason string
	// Force revokes a peer this device does not know: one it never
	// admitted nor issued a certificate to.
	Force bool
}

// Revoke removes a peer from the mesh: it signs a revocation (with the
// admin key on the admin's device, else as the inviter that issued the
// peer's certificate), keeps it, publishes it to the mesh and shows it to
// the peer, which is then disconnected. The peer must be a peer id this
// device knows (Known) unless o.Force; a peer revoked already is not
// revoked again: Revoke returns the revocation there is and an error
// wrapping ErrAlreadyRevoked. On the admin's device, a revoked voter
// leaves the voter set too.
func (m *Mesh) Revoke(ctx context.Context, peer PeerID, o RevokeOptions) (*member.Revocation, error) {
	if _, err := m.cfg.KeyOf(peer); err != nil {
		return nil, fmt.Errorf("%w: %q (a peer id looks like 12D3KooW..., as 'clawmesh mesh peers' lists them)", ErrBadPeerID, clip(string(peer), 60))
	}
	if peer == m.self {
		return nil, fmt.Errorf("mesh: a peer cannot revoke itself")
	}
	var issuer ed25519.PublicKey // nil: the admin's revocation
	if m.adminKey == nil {
		if !m.Cert().MayInvite() {
			return nil, fmt.Errorf("%w: only the mesh admin, or the inviter that let the peer in, may revoke it", member.ErrNotAllowed)
		}
		issuer = m.cfg.Key.Public().(ed25519.PublicKey)
	}
	if r := m.revocationOf(peer, issuer); r != nil {
		return r, fmt.Errorf("%w: %s was removed from the mesh on %s by %s%s", ErrAlreadyRevoked, peer,
			r.RevokedAt().Local().Format(time.RFC3339), RevokedBy(r), reasonNote(r.Reason()))
	}
	if _, ok := m.Known(peer); !ok && !o.Force {
		return nil, fmt.Errorf("%w: %s was never admitted by this device nor invited by it; check the id ('clawmesh mesh peers' lists the peers connected now), or revoke it anyway with --force", ErrUnknownPeer, peer)
	}
	r, err := m.sign(peer, o.Reason)
	if err != nil {
		return nil, err
	}
	l := member.NewRevocationList(m.admin)
	if err := l.Add(r); err != nil {
		return nil, err
	}
	gone := m.merge(l)
	if m.host != nil {
		if m.revTopic != nil {
			if err := m.revTopic.Publish(ctx, r.Marshal()); err != nil {
				m.log.Warn("publishing a revocation", "err", err)
			}
		}
		if !slices.Contains(gone, peer) && m.linkOf(peer) != 0 {
			go m.tellAndDrop(peer, nil)
		}
	}
	// A revoked trainer votes no more: the admin's device signs the voter
	// set without it.
	if vs := m.Voters(); m.adminKey != nil && vs != nil && vs.Has(string(peer)) {
		if _, err := m.UntrustVoter(ctx, peer); err != nil {
			m.log.Warn("taking a revoked voter out of the voter set", "peer", peer, "err", err)
		} else {
			m.log.Info("revoked voter taken out of the voter set", "peer", peer)
		}
	}
	return r, nil
}

// revocationOf returns the revocation of p that one by issuer (nil: the
// admin) would repeat: the admin's, or issuer's own.
func (m *Mesh) revocationOf(p PeerID, issuer ed25519.PublicKey) *member.Revocation {
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	var own *member.Revocation
	for _, r := range revs.Revocations() {
		switch {
		case r.Subject() != string(p):
		case r.ByAdmin():
			return r
		case issuer != nil && issuer.Equal(r.IssuerKey()):
			own = r
		}
	}
	return own
}

func reasonNote(reason string) string {
	if reason == "" {
		return ""
	}
	return " (reason: " + reason + ")"
}

// clip cuts s to n bytes at most, marking the cut, and makes it one line.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// RevokeOffline signs a revocation in dataDir, for a peer that is not
// running: it is kept and spreads when the peer next runs. It checks as
// Revoke does.
func RevokeOffline(dataDir string, key ed25519.PrivateKey, keyOf func(PeerID) (ed25519.PublicKey, error), peer PeerID, o RevokeOptions, now time.Time) (*member.Revocation, error) {
	m, err := New(Config{DataDir: dataDir, Key: key, KeyOf: keyOf, Now: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	return m.Revoke(context.Background(), peer, o)
}

func (m *Mesh) sign(peer PeerID, reason string) (*member.Revocation, error) {
	if peer == m.self {
		return nil, fmt.Errorf("mesh: a peer cannot revoke itself")
	}
	if m.adminKey != nil {
		return member.NewRevocation(m.adminKey, nil, string(peer), reason, m.now())
	}
	cert := m.Cert()
	if !cert.MayInvite() {
		return nil, fmt.Errorf("%w: only the mesh admin, or the inviter that let the peer in, may revoke it", member.ErrNotAllowed)
	}
	return member.NewRevocation(m.cfg.Key, cert, string(peer), reason, m.now())
}

// readRevocations takes in the revocations the mesh publishes.
func (m *Mesh) readRevocations(ctx context.Context) {
	for {
		msg, err := m.revTopic.Next(ctx)
		if err != nil {
			return
		}
		r, err := member.ParseRevocation(msg.Data)
		if err != nil {
			m.log.Debug("a malformed revocation", "from", msg.From, "err", err)
			continue
		}
		var subject *member.Certificate
		if pe, ok := m.Peer(PeerID(r.Subject())); ok {
			subject = pe.Cert
		}
		if err := r.Verify(m.admin, subject); err != nil {
			m.log.Info("a revocation refused", "from", msg.From, "err", err)
			continue
		}
		l := member.NewRevocationList(m.admin)
		if err := l.Add(r); err == nil {
			m.merge(l)
		}
	}
}

// ---- invites and joining

// InviteAddrs orders a peer's addresses for an invite token: those others
// can reach first, loopback last, 8 at most.
func InviteAddrs(addrs []string) []string {
	var out, loop []string
	for _, a := range addrs {
		if strings.Contains(a, "/ip4/127.") || strings.Contains(a, "/ip6/::1/") {
			loop = append(loop, a)
		} else {
			out = append(out, a)
		}
	}
	out = append(out, loop...)
	if len(out) > 8 {
		out = out[:8]
	}
	return out
}

// Invite makes an invite token for role, valid for ttl and uses
// redemptions, that peers redeem with this peer at addrs (this peer's
// addresses now). The admin's device signs with the admin key; another
// peer needs a certificate that lets it invite. A trainer token makes a
// voter as VoterIfNone says (InviteWith chooses).
func Invite(dataDir string, key ed25519.PrivateKey, role member.Role, ttl time.Duration, uses int, addrs []string, now time.Time, rand io.Reader) (*member.Token, error) {
	return InviteWith(dataDir, key, InviteOptions{Role: role, TTL: ttl, Uses: uses, Addrs: addrs}, now, rand)
}

// redeemRequest and redeemReply are the redeem protocol's messages.
type redeemRequest struct {
	Token string `json:"token"`
}

type redeemReply struct {
	Error string `json:"error,omitempty"`
	// Revocation (hex) is the revocation that removed the joining peer id,
	// sent with the refusal so that it can check it and say so.
	Revocation  string `json:"revocation,omitempty"`
	Cert        string `json:"cert,omitempty"`
	Name        string `json:"name,omitempty"`
	Revocations string `json:"revocations,omitempty"`
}

// handleRedeem redeems a token this peer issued for the peer that opened
// the stream: one use of it, and a certificate for that peer's key. The
// peer learns of the mesh only once its token checked out: a refusal of a
// token of another mesh does not name this one.
func (m *Mesh) handleRedeem(s Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	var req redeemRequest
	if err := readMsg(bufio.NewReader(s), &req, maxMsg); err != nil {
		s.Reset()
		return
	}
	p := s.RemotePeer()
	cert, err := m.redeem(p, req.Token)
	if err != nil {
		m.log.Info("invite refused", "peer", p, "err", err)
		rep := redeemReply{Error: err.Error()}
		var removed *removedErr
		switch {
		case errors.Is(err, member.ErrOtherMesh):
			rep.Error = member.ErrOtherMesh.Error() + ": the invite token is for another mesh than this peer's"
		case errors.As(err, &removed):
			rep.Revocation = hex.EncodeToString(removed.r.Marshal())
		}
		writeMsg(s, rep)
		return
	}
	h := m.hello()
	m.log.Info("invite redeemed", "peer", p, "role", cert.Role())
	writeMsg(s, redeemReply{Cert: hex.EncodeToString(cert.Marshal()), Name: m.State().Name, Revocations: h.Revocations})
}

// removedErr is redeem's refusal of a peer id that was removed from the
// mesh: r removed it.
type removedErr struct {
	r   *member.Revocation
	msg string
}

func (e *removedErr) Error() string { return e.msg }
func (e *removedErr) Unwrap() error { return member.ErrRevoked }

func (m *Mesh) redeem(p PeerID, token string) (*member.Certificate, error) {
	tok, err := member.ParseToken(token)
	if err != nil {
		return nil, err
	}
	now := m.now()
	m.mu.Lock()
	revs := m.revs
	m.mu.Unlock()
	if err := tok.VerifyFor(m.admin, now, revs); err != nil {
		return nil, err
	}
	var issuer ed25519.PublicKey // the key that would sign its certificate: nil for the admin's
	if tok.InviterCert() != nil {
		issuer = m.cfg.Key.Public().(ed25519.PublicKey)
	}
	if r := m.revocationOf(p, issuer); r != nil {
		return nil, &removedErr{r: r, msg: fmt.Sprintf("%v: %s", member.ErrRevoked, removedLine(p, tok.MeshID(), r))}
	}
	key, err := m.cfg.KeyOf(p)
	if err != nil {
		return nil, fmt.Errorf("mesh: the joining peer's key: %w", err)
	}
	m.ledgerMu.Lock()
	defer m.ledgerMu.Unlock()
	if err := m.ledger.Redeem(tok, now); err != nil {
		return nil, err
	}
	spec := tok.CertSpecFor(string(p), key)
	var cert *member.Certificate
	if tok.InviterCert() == nil {
		if m.adminKey == nil {
			return nil, fmt.Errorf("%w: the token was signed with the admin key, which is not on this device", member.ErrNotAllowed)
		}
		cert, err = member.IssueCertificate(m.adminKey, nil, spec, now, m.cfg.Rand)
	} else {
		cert, err = member.IssueCertificate(m.cfg.Key, m.Cert(), spec, now, m.cfg.Rand)
	}
	if err != nil {
		return nil, err
	}
	// The use counts only once the ledger is on disk: a token cannot be
	// replayed after a crash.
	if err := SaveLedger(m.cfg.DataDir, m.ledger); err != nil {
		return nil, err
	}
	m.remember(p, cert.Role().String(), true)
	if tok.Voter() {
		m.grantVoter(context.Background(), p, cert)
	}
	return cert, nil
}

// ErrUnreachable reports that no address in a token answered.
var ErrUnreachable = errors.New("mesh: cannot reach the inviter")

// UnreachableError is Join's error when no address in the token answered:
// its message is one line; Detail has each address's error.
type UnreachableError struct {
	Addrs []string
	Errs  []error // one per address
}

func (e *UnreachableError) Error() string {
	n := "its address"
	if len(e.Addrs) != 1 {
		n = fmt.Sprintf("any of its %d addresses", len(e.Addrs))
	}
	return fmt.Sprintf("%v at %s: is its node (or trainer) running, and online where this device can reach it?", ErrUnreachable, n)
}

func (e *UnreachableError) Unwrap() error { return ErrUnreachable }

// Detail is each address tried, and its error, a line or more each.
func (e *UnreachableError) Detail() string {
	var b strings.Builder
	for i, a := range e.Addrs {
		fmt.Fprintf(&b, "%s: %v\n", a, e.Errs[i])
	}
	return b.String()
}

// JoinAttempt is one try to reach the inviter at one address of a token,
// as JoinOptions.Progress is told of it: before (Done false) and after.
type JoinAttempt struct {
	Addr  string
	N, Of int // which address, of how many
	Done  bool
	Err   error // after: why the address did not answer; nil if it did
}

// JoinOptions tune Join. The zero value is the default.
type JoinOptions struct {
	// Progress, if set, is told of each address tried, before and after.
	Progress func(JoinAttempt)
	// DialTimeout bounds each address's try; default 10s.
	DialTimeout time.Duration
}

// Join redeems token with its inviter over h and records the membership
// in dataDir. The inviter must be online: Join says so when no address in
// the token answers.
func Join(ctx context.Context, h Host, dataDir, token string, now time.Time) (*State, error) {
	return JoinWith(ctx, h, dataDir, token, now, JoinOptions{})
}

// JoinWith is Join with options. When no address in the token answers,
// its error is an *UnreachableError.
func JoinWith(ctx context.Context, h Host, dataDir, token string, now time.Time, o JoinOptions) (*State, error) {
	if _, err := LoadState(dataDir); err == nil {
		if rerr := Removed(dataDir); rerr != nil {
			return nil, rerr
		}
		return nil, fmt.Errorf("%w (%s): a data directory belongs to one mesh", ErrJoined, dataDir)
	} else if !errors.Is(err, ErrNotJoined) {
		return nil, err
	}
	tok, err := member.ParseToken(token)
	if err != nil {
		return nil, err
	}
	if err := tok.Verify(now); err != nil {
		return nil, err
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	progress := o.Progress
	if progress == nil {
		progress = func(JoinAttempt) {}
	}
	var p PeerID
	unreachable := &UnreachableError{}
	addrs := tok.Addrs()
	for i, a := range addrs {
		progress(JoinAttempt{Addr: a, N: i + 1, Of: len(addrs)})
		cctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
		p, err = h.Connect(cctx, []string{a})
		cancel()
		progress(JoinAttempt{Addr: a, N: i + 1, Of: len(addrs), Done: true, Err: err})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		unreachable.Addrs = append(unreachable.Addrs, a)
		unreachable.Errs = append(unreachable.Errs, err)
	}
	if p == "" {
		return nil, unreachable
	}
	if string(p) != tok.Inviter() {
		return nil, fmt.Errorf("%w: the peer at the token's address is %s, not the inviter %s", member.ErrTampered, p, tok.Inviter())
	}
	sctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	s, err := h.NewStream(sctx, p, ProtoRedeem)
	if err != nil {
		return nil, fmt.Errorf("%w: it answered, but not on the invite protocol: %s", ErrUnreachable, clip(err.Error(), 200))
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	if err := writeMsg(s, redeemRequest{Token: tok.String()}); err != nil {
		return nil, err
	}
	var rep redeemReply
	if err := readMsg(bufio.NewReader(s), &rep, maxMsg); err != nil {
		return nil, fmt.Errorf("mesh: the inviter's answer: %w", err)
	}
	if rep.Error != "" {
		// The inviter's words, a claim: one line, bounded.
		refused := &RefusedError{Reason: clip(rep.Error, 1000)}
		if r, err := removal(rep.Revocation, tok.AdminKey(), h.ID()); err == nil {
			return nil, &RemovedError{Peer: h.ID(), MeshID: tok.MeshID(), Revocation: r, refused: refused}
		}
		return nil, refused
	}
	b, err := hex.DecodeString(rep.Cert)
	if err != nil {
		return nil, fmt.Errorf("%w: certificate", ErrMessage)
	}
	cert, err := member.ParseCertificate(b)
	if err != nil {
		return nil, err
	}
	admin := tok.AdminKey()
	if err := cert.Verify(admin, now, nil); err != nil {
		return nil, err
	}
	if cert.Subject() != string(h.ID()) {
		return nil, fmt.Errorf("%w: the certificate is for %s, not this peer", member.ErrTampered, cert.Subject())
	}
	st := &State{
		MeshID: tok.MeshID(), Name: rep.Name, Admin: hex.EncodeToString(admin), Cert: rep.Cert,
		Bootstrap: tok.Addrs(), Updated: now.UTC(),
	}
	if rb, err := hex.DecodeString(rep.Revocations); err == nil && len(rb) > 0 {
		if l, err := member.ParseRevocationList(admin, rb); err == nil {
			SaveRevocations(dataDir, l)
		}
	}
	if err := SaveState(dataDir, st); err != nil {
		return nil, err
	}
	return st, nil
}

// RefusedError is the inviter's refusal of a token, in its words (which
// say which case it is: expired, already redeemed, revoked, another mesh).
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "mesh: the inviter refused the token: " + e.Reason }

// RemovedError is the error of a device whose peer id was removed from
// the mesh it tries to join (or joined): Revocation, checked against the
// mesh's admin key, says by whom, when and why. Its message is one line
// that says so, who may let the device back in and how. When the inviter
// said so, it is also the inviter's *RefusedError.
type RemovedError struct {
	Peer       PeerID
	MeshID     string
	Revocation *member.Revocation
	refused    *RefusedError
}

func (e *RemovedError) Error() string { return "mesh: " + removedLine(e.Peer, e.MeshID, e.Revocation) }

func (e *RemovedError) Unwrap() []error {
	if e.refused == nil {
		return []error{member.ErrRevoked}
	}
	return []error{member.ErrRevoked, e.refused}
}

// NewIdentity reports whether the device can take part again only under
// a new peer id: the admin removed this one (an inviter's revocation bars
// only that inviter's certificates for it).
func (e *RemovedError) NewIdentity() bool { return e.Revocation.ByAdmin() }

// removedLine says that peer p was removed from mesh meshID by r, and what
// to do.
func removedLine(p PeerID, meshID string, r *member.Revocation) string {
	what := "this peer id is refused for good: to take part again, ask the mesh admin (or an inviter) for a new invite " +
		"and join with it under a new identity, from a fresh data directory"
	if !r.ByAdmin() {
		what = "that inviter's certificates stay refused to this peer id: ask the mesh admin for a new invite"
	}
	return fmt.Sprintf("this device (peer %s) was removed from the mesh %s by %s on %s%s; %s",
		p, meshID, RevokedBy(r), r.RevokedAt().UTC().Format(time.RFC3339), reasonNote(clip(r.Reason(), member.MaxReasonLen)), what)
}

// removal parses and checks the revocation an inviter sent with its
// refusal (hex): one of the mesh of admin, of peer p.
func removal(hexRev string, admin ed25519.PublicKey, p PeerID) (*member.Revocation, error) {
	if hexRev == "" {
		return nil, errors.New("mesh: no revocation")
	}
	b, err := hex.DecodeString(hexRev)
	if err != nil {
		return nil, fmt.Errorf("%w: revocation not hex", ErrMessage)
	}
	r, err := member.ParseRevocation(b)
	if err != nil {
		return nil, err
	}
	if err := r.Verify(admin, nil); err != nil {
		return nil, err
	}
	if r.Subject() != string(p) {
		return nil, fmt.Errorf("%w: the revocation is of %s, not this peer", member.ErrTampered, r.Subject())
	}
	return r, nil
}

// Removed returns the error saying that the peer of dataDir was removed
// from its mesh, if the revocations it knows say so; nil if they do not
// (or dataDir is in no mesh).
func Removed(dataDir string) *RemovedError {
	st, err := LoadState(dataDir)
	if err != nil {
		return nil
	}
	admin, err := st.AdminKey()
	if err != nil {
		return nil
	}
	cert, err := st.Certificate()
	if err != nil {
		return nil
	}
	revs, err := LoadRevocations(dataDir, admin)
	if err != nil {
		return nil
	}
	if r := revs.RevocationOf(cert); r != nil {
		return &RemovedError{Peer: PeerID(cert.Subject()), MeshID: st.MeshID, Revocation: r}
	}
	return nil
}

// ---- renewal

type renewReply struct {
	Error string `json:"error,omitempty"`
	Cert  string `json:"cert,omitempty"`
}

// renew asks an admitted peer that may issue this peer's certificate
// (the admin's device, or an inviter) for a fresh one.
func (m *Mesh) renew(ctx context.Context) error {
	var last error = errors.New("no peer that may renew it is connected")
	for _, pe := range m.Peers() {
		if !pe.Cert.MayInvite() {
			continue
		}
		cert, err := m.renewWith(ctx, pe.ID)
		if err != nil {
			last = err
			continue
		}
		m.mu.Lock()
		m.cert = cert
		m.state.Cert = hex.EncodeToString(cert.Marshal())
		m.state.Updated = m.now().UTC()
		st := *m.state
		m.mu.Unlock()
		m.log.Info("certificate renewed", "by", pe.ID, "expires", cert.Expires())
		return SaveState(m.cfg.DataDir, &st)
	}
	return last
}

func (m *Mesh) renewWith(ctx context.Context, p PeerID) (*member.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	s, err := m.host.NewStream(ctx, p, ProtoRenew)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	if err := writeMsg(s, m.certHello()); err != nil {
		return nil, err
	}
	var rep renewReply
	if err := readMsg(bufio.NewReader(s), &rep, maxMsg); err != nil {
		return nil, err
	}
	if rep.Error != "" {
		return nil, errors.New(rep.Error)
	}
	cert, err := m.verifyPeerCert(m.self, rep.Cert)
	if err != nil {
		return nil, err
	}
	if !cert.Expires().After(m.Cert().Expires()) {
		return nil, errors.New("mesh: the renewed certificate expires no later")
	}
	return cert, nil
}

// handleRenew issues a fresh certificate like the one the peer shows, if
// this peer may.
func (m *Mesh) handleRenew(s Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(exchangeTimeout))
	var h hello
	if err := readMsg(bufio.NewReader(s), &h, maxMsg); err != nil {
		s.Reset()
		return
	}
	p := s.RemotePeer()
	old, err := m.verifyPeerCert(p, h.Cert)
	if err != nil {
		writeMsg(s, renewReply{Error: err.Error()})
		return
	}
	spec := old.Spec()
	var cert *member.Certificate
	if m.adminKey != nil {
		cert, err = member.IssueCertificate(m.adminKey, nil, spec, m.now(), m.cfg.Rand)
	} else {
		cert, err = member.IssueCertificate(m.cfg.Key, m.Cert(), spec, m.now(), m.cfg.Rand)
	}
	if err != nil {
		writeMsg(s, renewReply{Error: err.Error()})
		return
	}
	m.log.Info("certificate renewed for a peer", "peer", p, "expires", cert.Expires())
	writeMsg(s, renewReply{Cert: hex.EncodeToString(cert.Marshal())})
}
