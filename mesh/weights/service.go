package weights

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/mesh/weights/internal/wire"
)

// An offer is the one gossip message of the weights topic: a signed
// manifest and a peer that holds its bundle and serves it at addrs. Every
// holder offers what it holds, so fetchers spread over them.
type offer struct {
	Manifest *chunks.Manifest
	Source   Source
	Nonce    uint64 // makes a repeated offer a new gossip message
}

const (
	offerMagic = "CMWO1"
	maxAddrs   = 8
)

func (o *offer) marshal() []byte {
	b := []byte(offerMagic)
	b = wire.AppendBytes(b, o.Manifest.Marshal())
	b = wire.AppendString(b, string(o.Source.Peer))
	b = binary.AppendUvarint(b, uint64(len(o.Source.Addrs)))
	for _, a := range o.Source.Addrs {
		b = wire.AppendString(b, a)
	}
	return binary.AppendUvarint(b, o.Nonce)
}

// parseOffer decodes an offer (not checking the manifest's signature).
func parseOffer(b []byte) (*offer, error) {
	d := wire.NewDecoder(b, chunks.ErrManifest)
	if string(d.Take(len(offerMagic))) != offerMagic {
		return nil, fmt.Errorf("%w: not an offer", chunks.ErrManifest)
	}
	mb := d.Bytes(chunks.MaxManifestSize)
	o := &offer{}
	o.Source.Peer = mesh.PeerID(d.String(128))
	n := d.Uvarint()
	if n > maxAddrs {
		d.Fail("%d addresses", n)
	}
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		o.Source.Addrs = append(o.Source.Addrs, d.String(256))
	}
	o.Nonce = d.Uvarint()
	if d.Err() == nil && d.Len() != 0 {
		d.Fail("%d trailing bytes", d.Len())
	}
	if d.Err() != nil {
		return nil, d.Err()
	}
	m, err := chunks.ParseManifest(mb)
	if err != nil {
		return nil, err
	}
	o.Manifest = m
	return o, nil
}

func topicWeights(meshID string) string { return mesh.TopicName(meshID, "weights/1") }

// Config configures a Service.
type Config struct {
	// Dir is where bundles are kept (a Dir), with the last accepted
	// certified manifest (for fencing) beside them.
	Dir  string
	Key  ed25519.PrivateKey // the peer's identity key
	Mesh *mesh.Mesh
	Host mesh.Host
	// Listen is the UDP address the QUIC server listens on (default
	// "127.0.0.1:0"; ":0" for every interface).
	Listen string
	// Advertise are the host:port addresses others dial (default: the
	// listening address, or, when it is unspecified, the port on each IP
	// address the mesh host advertises).
	Advertise []string
	// AnnounceEvery is how often the newest bundle held is offered again,
	// for peers that joined since (default 15s).
	AnnounceEvery time.Duration
	// OnManifest is called (from the service's loop; it must not block
	// for long) for each manifest accepted as the last: verified,
	// certified, and a newer version than the last one, or the same one
	// certified again under a newer voter set.
	OnManifest func(*chunks.Manifest)
	Fetcher    FetcherConfig
	Logger     *slog.Logger
	// Metrics, if set, counts the transfers and the manifests accepted
	// and refused.
	Metrics *Metrics
}

// Service is one peer's part in spreading adapter versions: it serves
// what it holds over QUIC and the mesh host's streams, offers it on gossip, learns of new versions
// from others' offers (verifying and fencing their manifests) and fetches
// them from every peer that offers them.
type Service struct {
	cfg     Config
	dir     *Dir
	srv     *Server
	fetcher *Fetcher
	topic   mesh.Topic
	log     *slog.Logger
	addrs   []string

	mu      sync.Mutex
	last    *chunks.Manifest                    // the newest accepted
	sources map[[32]byte]map[mesh.PeerID]Source // by bundle
	watch   map[[32]byte]chan struct{}          // closed when a bundle's sources change
	kick    chan struct{}
}

// fenceFile keeps the last accepted manifest.
const fenceFile = "accepted.manifest"

// New opens the bundle directory and starts the QUIC server.
func New(cfg Config) (*Service, error) {
	if cfg.Mesh == nil || cfg.Host == nil {
		return nil, errors.New("weights: a service needs the mesh and its host")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.AnnounceEvery <= 0 {
		cfg.AnnounceEvery = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := OpenDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, dir: d, log: cfg.Logger.With("component", "weights"),
		sources: map[[32]byte]map[mesh.PeerID]Source{}, watch: map[[32]byte]chan struct{}{}, kick: make(chan struct{}, 1)}
	if b, err := os.ReadFile(filepath.Join(cfg.Dir, fenceFile)); err == nil {
		switch m, err := chunks.ParseManifest(b); {
		case err != nil:
		case m.Cert == nil:
			// What an older release accepted: a manifest any trainer could
			// have signed, with any numbers. It fences nothing; the next
			// certified version is taken whatever its number.
			s.log.Warn("the last version accepted is not certified by the mesh's voters: it is set aside for the next certified one", "version", m.Name(), "bundle", core.ShortHash(m.BundleID()))
		default:
			s.last = m
		}
	}
	fc := cfg.Fetcher
	fc.Key, fc.Logger, fc.Host = cfg.Key, cfg.Logger, cfg.Host
	if s.fetcher, err = NewFetcher(fc); err != nil {
		return nil, err
	}
	s.srv, err = Listen(cfg.Listen, ServerConfig{Key: cfg.Key, Gate: cfg.Mesh, Holdings: d, Logger: cfg.Logger, Metrics: cfg.Metrics})
	if err != nil {
		return nil, err
	}
	s.addrs = cfg.Advertise
	if len(s.addrs) == 0 {
		s.addrs = advertise(s.srv.Addr().(*net.UDPAddr), cfg.Host.Addrs())
	}
	cfg.Host.Handle(ProtocolID, s.srv.ServeStream)
	return s, nil
}

// advertise returns the addresses to offer for a server listening at la:
// la itself, or, when it listens on every interface, its port on each IP
// address of the host's multiaddrs.
func advertise(la *net.UDPAddr, hostAddrs []string) []string {
	if !la.IP.IsUnspecified() {
		return []string{la.String()}
	}
	port := strconv.Itoa(la.Port)
	var out []string
	for _, a := range hostAddrs {
		ip := multiaddrIP(a)
		if ip == "" || slices.Contains(out, net.JoinHostPort(ip, port)) {
			continue
		}
		out = append(out, net.JoinHostPort(ip, port))
	}
	if len(out) == 0 {
		out = []string{net.JoinHostPort("127.0.0.1", port)}
	}
	// Loopback last: a peer on another machine that dials it reaches
	// itself (and the handshake's peer id check refuses it).
	slices.SortStableFunc(out, func(a, b string) int {
		la, lb := isLoopback(a), isLoopback(b)
		switch {
		case la == lb:
			return 0
		case lb:
			return -1
		}
		return 1
	})
	return firstN(out, maxAddrs)
}

func isLoopback(hostport string) bool {
	h, _, _ := net.SplitHostPort(hostport)
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// multiaddrIP returns the IP address of a /ip4/ or /ip6/ multiaddr; none
// for a relayed one, whose IP address is the relay's.
func multiaddrIP(a string) string {
	if strings.Contains(a, "/p2p-circuit") {
		return ""
	}
	parts := strings.Split(strings.TrimPrefix(a, "/"), "/")
	if len(parts) < 2 || (parts[0] != "ip4" && parts[0] != "ip6") || net.ParseIP(parts[1]) == nil {
		return ""
	}
	return parts[1]
}

func firstN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Dir is the bundles held.
func (s *Service) Dir() *Dir { return s.dir }

// Self is this peer as a source.
func (s *Service) Self() Source { return Source{Peer: s.cfg.Host.ID(), Addrs: s.addrs} }

// Latest is the newest certified manifest accepted (nil: none yet).
func (s *Service) Latest() *chunks.Manifest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Run joins the weights topic and handles offers until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	t, err := s.cfg.Host.Join(topicWeights(s.cfg.Mesh.MeshID()))
	if err != nil {
		return fmt.Errorf("weights: joining the topic: %w", err)
	}
	s.mu.Lock()
	s.topic = t
	s.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.announceLoop(ctx)
	}()
	for {
		msg, err := t.Next(ctx)
		if err != nil {
			break
		}
		o, err := parseOffer(msg.Data)
		if err != nil {
			s.log.Debug("a bad weights offer", "from", msg.From, "err", err)
			continue
		}
		if err := s.Accept(o.Manifest, o.Source); err != nil {
			s.log.Debug("an offer refused", "from", msg.From, "version", o.Manifest.Name(), "err", err)
		}
	}
	wg.Wait()
	t.Close()
	return ctx.Err()
}

func (s *Service) announceLoop(ctx context.Context) {
	tk := time.NewTicker(s.cfg.AnnounceEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-s.kick:
		}
		if held := s.dir.Held(); len(held) > 0 {
			s.offer(ctx, held[0])
		}
	}
}

// offer gossips that this peer holds m.
func (s *Service) offer(ctx context.Context, m *chunks.Manifest) {
	s.mu.Lock()
	t := s.topic
	s.mu.Unlock()
	if t == nil {
		return
	}
	o := &offer{Manifest: m, Source: s.Self(), Nonce: uint64(time.Now().UnixNano())}
	if err := t.Publish(ctx, o.marshal()); err != nil && ctx.Err() == nil {
		s.log.Debug("offering a version", "version", m.Name(), "err", err)
	}
}

// Accept checks a manifest (the signer's certificate, the voters'
// certification, then fencing against the last certified version), notes
// source (if any) as holding its bundle, and, when it is new, keeps it as
// the last accepted and calls OnManifest. The same version certified
// again under the voter set now in force replaces the one kept, and the
// manifest held beside its bundle, so that what this peer offers carries
// the certification its peers check.
func (s *Service) Accept(m *chunks.Manifest, source Source) (err error) {
	isNew := false
	defer func() { s.cfg.Metrics.accept(err, isNew) }()
	if err := s.check(m); err != nil {
		return err
	}
	s.mu.Lock()
	if err := m.Fence(s.last); err != nil {
		s.mu.Unlock()
		return err
	}
	if source.Peer != "" && source.Peer != s.cfg.Host.ID() {
		if s.sources[m.Bundle] == nil {
			s.sources[m.Bundle] = map[mesh.PeerID]Source{}
		}
		if _, known := s.sources[m.Bundle][source.Peer]; !known {
			if w := s.watch[m.Bundle]; w != nil {
				close(w)
				delete(s.watch, m.Bundle)
			}
		}
		s.sources[m.Bundle][source.Peer] = source
	}
	// Fence took m: it is a later version, or the same one (whose
	// certification may be newer), or the certified chain taken up again
	// after an uncertified manifest.
	isNew = s.last == nil || m.Version > s.last.Version || s.last.Cert == nil
	recertified := !isNew && !sameVoters(m, s.last)
	if recertified {
		// Beside the bundle first: once Latest has the new
		// certification, so has what this peer offers. Rare enough to
		// write under the lock.
		s.recertify(m)
	}
	if isNew || recertified {
		s.last = m
	}
	s.mu.Unlock()
	if isNew || recertified {
		if err := atomicfile.Write(filepath.Join(s.cfg.Dir, fenceFile), m.Marshal(), 0o600); err != nil {
			s.log.Warn("keeping the last accepted manifest", "err", err)
		}
	}
	if isNew {
		s.log.Info("version announced", "version", m.Name(), "hash", core.ShortHash(m.AdapterHash), "bundle", core.ShortHash(m.BundleID()), "bytes", m.Size, "term", m.Term, "index", m.Index,
			"voters", m.Cert.Voters.Seq(), "votes", len(m.Cert.Votes)) // check made sure of m.Cert
	}
	if (isNew || recertified) && s.cfg.OnManifest != nil {
		s.cfg.OnManifest(m)
	}
	return nil
}

// check verifies m for this mesh: signed by one of its trainers, and
// certified by a quorum of the voter set in force. A newer voter set that
// m's certification carries, signed by the mesh's admin, is adopted first:
// it is how a device that missed the set's gossip learns it.
func (s *Service) check(m *chunks.Manifest) error {
	admin, revoked, now := s.cfg.Mesh.Trust()
	if m.MeshID != s.cfg.Mesh.MeshID() {
		return fmt.Errorf("%w: for mesh %s", chunks.ErrSignature, m.MeshID)
	}
	if _, err := m.Verify(admin, now, revoked); err != nil {
		return err
	}
	if c := m.Cert; c != nil && c.Voters != nil && s.cfg.Mesh.Voters().Newer(c.Voters) {
		adopted, err := s.cfg.Mesh.AdoptVoters(c.Voters)
		if err != nil {
			return fmt.Errorf("%w: %w", chunks.ErrUncertified, err)
		}
		if adopted {
			s.log.Info("voter set adopted from a version's certification", "voters", c.Voters.Seq(), "of", c.Voters.Len(), "version", m.Name())
		}
	}
	return m.VerifyCertified(admin, s.cfg.Mesh.Voters())
}

// sameVoters says whether a and b were certified under the same voter set.
func sameVoters(a, b *chunks.Manifest) bool {
	if a.Cert == nil || b.Cert == nil {
		return a.Cert == b.Cert
	}
	return a.Cert.Voters.Hash() == b.Cert.Voters.Hash()
}

// recertify keeps m, the same version certified again, beside its bundle
// if this peer holds it.
func (s *Service) recertify(m *chunks.Manifest) {
	held, err := s.dir.Manifest(m.BundleID())
	if err != nil || held.Version != m.Version || sameVoters(held, m) {
		return
	}
	if err := s.dir.PutManifest(m); err != nil {
		s.log.Warn("keeping a version's new certification", "version", m.Name(), "err", err)
		return
	}
	s.log.Info("version certified again", "version", m.Name(), "voters", m.Cert.Voters.Seq())
}

// Publish keeps bundle b under the certified manifest m (this peer made it
// or already had its bytes), accepts m, and offers it.
func (s *Service) Publish(ctx context.Context, m *chunks.Manifest, b []byte) error {
	if err := s.check(m); err != nil {
		return err
	}
	if err := s.dir.Add(m, b); err != nil {
		return err
	}
	if err := s.Accept(m, Source{}); err != nil && !errors.Is(err, chunks.ErrStale) {
		return err
	}
	s.offer(ctx, m)
	return nil
}

// Sources are the peers known to hold bundle id's bytes, other than this
// one.
func (s *Service) Sources(m *chunks.Manifest) []Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sourcesLocked(m)
}

func (s *Service) sourcesLocked(m *chunks.Manifest) []Source {
	var out []Source
	for _, src := range s.sources[m.Bundle] {
		out = append(out, src)
	}
	slices.SortFunc(out, func(a, b Source) int {
		if a.Peer < b.Peer {
			return -1
		}
		return 1
	})
	return out
}

// Fetch fetches m's bundle from the peers that offered it (unless it is
// held already), and from those that offer it while it runs, keeps it, and
// offers it in turn.
func (s *Service) Fetch(ctx context.Context, m *chunks.Manifest, progress func(Progress)) error {
	if _, err := os.Stat(s.dir.manifestPath(m.BundleID())); err == nil {
		return nil
	}
	start := time.Now()
	err := s.dir.FetchFrom(ctx, s.fetcher, m, func() ([]Source, <-chan struct{}) {
		s.mu.Lock()
		defer s.mu.Unlock()
		w := s.watch[m.Bundle]
		if w == nil {
			w = make(chan struct{})
			s.watch[m.Bundle] = w
		}
		return s.sourcesLocked(m), w
	}, progress)
	s.cfg.Metrics.fetch(m.Size, time.Since(start), err)
	if err != nil {
		return err
	}
	// The version may have been certified again while it came.
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if last != nil && last.Bundle == m.Bundle && !sameVoters(last, m) {
		s.recertify(last)
		m = last
	}
	s.offer(ctx, m)
	return nil
}

// Close stops the QUIC server and the fetcher's connections.
func (s *Service) Close() error {
	s.cfg.Host.Handle(ProtocolID, nil)
	s.fetcher.Close()
	err := s.srv.Close()
	s.dir.Close()
	return err
}
