package p2p

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// Bounds of the peer cache: a stranger who connects many times under new
// identities must not grow the file without end, nor push the mesh's peers
// out of it (admitted peers are kept first).
const (
	maxCachedPeers = 256
	maxCachedAddrs = 16
)

// peerBook caches the addresses of the peers this host was connected to,
// in DataDir/peers.json, so that a restarted node can reconnect by peer id.
type peerBook struct {
	path string

	mu    sync.Mutex
	peers map[peer.ID]*bookEntry
	seq   uint64 // orders entries by when they were last seen
	dirty bool
}

type bookEntry struct {
	addrs []ma.Multiaddr
	seen  uint64
}

// peersFile is the JSON form of the cache: most recently seen first.
type peersFile struct {
	Version int         `json:"version"`
	Peers   []peerEntry `json:"peers"`
}

type peerEntry struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs"`
}

const peersFileVersion = 1

// loadPeerBook reads the cache at path. A missing file is an empty cache;
// a damaged one is reported (the caller logs it) and replaced by the next
// save, since it is only a cache.
func loadPeerBook(path string) (*peerBook, error) {
	b := &peerBook{path: path, peers: make(map[peer.ID]*bookEntry)}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return b, fmt.Errorf("read peer cache: %w", err)
	}
	var f peersFile
	if err := json.Unmarshal(data, &f); err != nil {
		return b, fmt.Errorf("peer cache %s is damaged, starting without it: %w", path, err)
	}
	if f.Version != peersFileVersion {
		return b, fmt.Errorf("peer cache %s has version %d, not %d: starting without it", path, f.Version, peersFileVersion)
	}
	var bad int
	entries := f.Peers[:min(len(f.Peers), maxCachedPeers)]
	for i := len(entries) - 1; i >= 0; i-- { // oldest first
		e := entries[i]
		id, err := peer.Decode(e.ID)
		if err != nil {
			bad++
			continue
		}
		var addrs []ma.Multiaddr
		for _, s := range e.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil && len(addrs) < maxCachedAddrs {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			bad++
			continue
		}
		b.seq++
		b.peers[id] = &bookEntry{addrs: addrs, seen: b.seq}
	}
	if bad > 0 {
		return b, fmt.Errorf("peer cache %s: skipped %d unreadable entries", path, bad)
	}
	return b, nil
}

// seen records that p is connected now.
func (b *peerBook) seen(p peer.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e := b.peers[p]
	if e == nil {
		e = &bookEntry{}
		b.peers[p] = e
	}
	e.seen = b.seq
	b.dirty = true
}

// setAddrs records p's addresses, if any (an empty list keeps the old one:
// the peerstore forgets a peer's addresses a while after it disconnects).
func (b *peerBook) setAddrs(p peer.ID, addrs []ma.Multiaddr) {
	if len(addrs) == 0 {
		return
	}
	addrs = slices.Clone(addrs[:min(len(addrs), maxCachedAddrs)])
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.peers[p]
	if e == nil {
		return // only peers we were connected to
	}
	if !slices.EqualFunc(e.addrs, addrs, ma.Multiaddr.Equal) {
		e.addrs = addrs
		b.dirty = true
	}
}

// forget drops p (a blocked peer).
func (b *peerBook) forget(p peer.ID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.peers[p]; ok {
		delete(b.peers, p)
		b.dirty = true
	}
}

// addrs returns p's cached addresses.
func (b *peerBook) addrs(p peer.ID) []ma.Multiaddr {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.peers[p]; e != nil {
		return slices.Clone(e.addrs)
	}
	return nil
}

// list returns the cached peers with addresses, most recently seen first.
func (b *peerBook) list() []peer.AddrInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	type seenInfo struct {
		peer.AddrInfo
		seen uint64
	}
	var l []seenInfo
	for id, e := range b.peers {
		if len(e.addrs) > 0 {
			l = append(l, seenInfo{peer.AddrInfo{ID: id, Addrs: slices.Clone(e.addrs)}, e.seen})
		}
	}
	slices.SortFunc(l, func(x, y seenInfo) int { return cmp.Compare(y.seen, x.seen) })
	infos := make([]peer.AddrInfo, len(l))
	for i, x := range l {
		infos[i] = x.AddrInfo
	}
	return infos
}

// save writes the cache if it changed since the last save, leaving out the
// blocked peers and keeping the admitted ones first, then the most recently
// seen, up to maxCachedPeers. It writes a temporary file and renames it
// into place.
func (b *peerBook) save(blocked, admitted func(peer.ID) bool) error {
	b.mu.Lock()
	if !b.dirty {
		b.mu.Unlock()
		return nil
	}
	b.dirty = false
	type ranked struct {
		id       peer.ID
		e        peerEntry
		admitted bool
		seen     uint64
	}
	var l []ranked
	for id, e := range b.peers {
		if len(e.addrs) == 0 {
			continue
		}
		r := ranked{id: id, e: peerEntry{ID: id.String()}, seen: e.seen}
		for _, a := range e.addrs {
			r.e.Addrs = append(r.e.Addrs, a.String())
		}
		l = append(l, r)
	}
	b.mu.Unlock()

	l = slices.DeleteFunc(l, func(r ranked) bool { return blocked(r.id) })
	for i := range l {
		l[i].admitted = admitted(l[i].id)
	}
	slices.SortFunc(l, func(x, y ranked) int {
		if x.admitted != y.admitted {
			if x.admitted {
				return -1
			}
			return 1
		}
		return cmp.Compare(y.seen, x.seen)
	})
	f := peersFile{Version: peersFileVersion, Peers: []peerEntry{}}
	for _, r := range l[:min(len(l), maxCachedPeers)] {
		f.Peers = append(f.Peers, r.e)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(b.path, append(data, '\n'), 0o600); err != nil {
		b.mu.Lock()
		b.dirty = true // try again next time
		b.mu.Unlock()
		return err
	}
	return nil
}
