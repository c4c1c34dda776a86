package mesh

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// ---- revocations

// merge takes in the revocations of l that this peer did not know, saves
// them, and disconnects the peers they revoke. The list is replaced, never
// changed in place, so readers may hold it without the lock.
func (m *Mesh) merge(l *member.RevocationList) {
	m.revMu.Lock()
	defer m.revMu.Unlock()
	m.mu.Lock()
	cur := m.revs
	m.mu.Unlock()
	next := member.NewRevocationList(m.admin)
	if err := next.Merge(cur); err != nil {
		return
	}
	before := next.Len()
	if err := next.Merge(l); err != nil || next.Len() == before {
		return
	}
	m.mu.Lock()
	m.revs = next
	var gone []PeerID
	for p, pe := range m.admitted {
		if next.RevocationOf(pe.Cert) != nil {
			gone = append(gone, p)
			delete(m.admitted, p)
		}
	}
	m.mu.Unlock()
	if err := SaveRevocations(m.cfg.DataDir, next); err != nil {
		m.log.Warn("saving revocations", "err", err)
	}
	for _, p := range gone {
		m.log.Info("peer revoked: disconnected", "peer", p)
		if m.host != nil {
			m.host.Disconnect(p)
		}
	}
}

// Revoke removes a peer from the mesh: it signs a revocation (with the
// admin key on the admin's device, else as the inviter that issued the
// peer's certificate), keeps it, publishes it to the mesh and disconnects
// the peer. The peer's certificate, if this peer has seen it, lets an
// inviter's revocation be checked here.
func (m *Mesh) Revoke(ctx context.Context, peer PeerID, reason string) (*member.Revocation, error) {
	r, err := m.sign(peer, reason)
	if err != nil {
		return nil, err
	}
	l := member.NewRevocationList(m.admin)
	if err := l.Add(r); err != nil {
		return nil, err
	}
	m.merge(l)
	if m.host != nil {
		m.host.Disconnect(peer)
		if m.revTopic != nil {
			if err := m.revTopic.Publish(ctx, r.Marshal()); err != nil {
				m.log.Warn("publishing a revocation", "err", err)
			}
		}
	}
	return r, nil
}

// RevokeOffline signs a revocation in dataDir, for a peer that is not
// running: it is kept and spreads when the peer next runs.
func RevokeOffline(dataDir string, key ed25519.PrivateKey, keyOf func(PeerID) (ed25519.PublicKey, error), peer PeerID, reason string, now time.Time) (*member.Revocation, error) {
	m, err := New(Config{DataDir: dataDir, Key: key, KeyOf: keyOf, Now: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	return m.Revoke(context.Background(), peer, reason)
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
// peer needs a certificate that lets it invite.
func Invite(dataDir string, key ed25519.PrivateKey, role member.Role, ttl time.Duration, uses int, addrs []string, now time.Time, rand io.Reader) (*member.Token, error) {
	st, err := LoadState(dataDir)
	if err != nil {
		return nil, err
	}
	cert, _ := st.Certificate()
	if len(addrs) == 0 {
		addrs = st.Addrs
	}
	if len(addrs) == 0 {
		return nil, errors.New("mesh: no address to put in the token: start the node (or trainer) once, so that it knows where it listens")
	}
	spec := member.TokenSpec{Inviter: cert.Subject(), Addrs: addrs, Role: role, TTL: ttl, MaxUses: uses}
	if admin, err := LoadAdminKey(dataDir); err == nil {
		return member.NewToken(admin, nil, spec, now, rand)
	} else if !errors.Is(err, ErrNotAdmin) {
		return nil, err
	}
	if !cert.MayInvite() {
		return nil, fmt.Errorf("%w: this peer's certificate does not let it invite (ask the mesh admin)", member.ErrNotAllowed)
	}
	return member.NewToken(key, cert, spec, now, rand)
}

// redeemRequest and redeemReply are the redeem protocol's messages.
type redeemRequest struct {
	Token string `json:"token"`
}

type redeemReply struct {
	Error       string `json:"error,omitempty"`
	Cert        string `json:"cert,omitempty"`
	Name        string `json:"name,omitempty"`
	Revocations string `json:"revocations,omitempty"`
}

// handleRedeem redeems a token this peer issued for the peer that opened
// the stream: one use of it, and a certificate for that peer's key.
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
		writeMsg(s, redeemReply{Error: err.Error()})
		return
	}
	h := m.hello()
	m.log.Info("invite redeemed", "peer", p, "role", cert.Role())
	writeMsg(s, redeemReply{Cert: hex.EncodeToString(cert.Marshal()), Name: m.State().Name, Revocations: h.Revocations})
}

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
	if revs.IsRevoked(string(p)) {
		return nil, fmt.Errorf("%w: peer %s was removed from this mesh", member.ErrRevoked, p)
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
	return cert, nil
}

// ErrUnreachable reports that no address in a token answered.
var ErrUnreachable = errors.New("mesh: cannot reach the inviter")

// Join redeems token with its inviter over h and records the membership
// in dataDir. The inviter must be online: Join says so when no address in
// the token answers.
func Join(ctx context.Context, h Host, dataDir, token string, now time.Time) (*State, error) {
	if _, err := LoadState(dataDir); err == nil {
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
	var p PeerID
	var errs []string
	for _, a := range tok.Addrs() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		p, err = h.Connect(cctx, []string{a})
		cancel()
		if err == nil {
			break
		}
		errs = append(errs, fmt.Sprintf("%s: %v", a, err))
	}
	if p == "" {
		return nil, fmt.Errorf("%w at any address in the token (is it online?): %s", ErrUnreachable, strings.Join(errs, "; "))
	}
	if string(p) != tok.Inviter() {
		return nil, fmt.Errorf("%w: the peer at the token's address is %s, not the inviter %s", member.ErrTampered, p, tok.Inviter())
	}
	sctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	s, err := h.NewStream(sctx, p, ProtoRedeem)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreachable, err)
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
		return nil, &RefusedError{Reason: rep.Error}
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
	if err := writeMsg(s, m.hello()); err != nil {
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
