package pool

import (
	"encoding/binary"
	"hash/maphash"
	"sync"

	"github.com/clawmesh/clawmesh/internal/core"
)

// knownBlobs remembers, for the messages and tools lists recently written,
// the address of the blob that holds them, and that the blob is stored. Every
// call of a conversation resends its system prompt (often tens of thousands
// of characters), its tools and its whole history; without this set each
// write would encode all of it to canonical JSON, hash it with sha256 and
// look the blob up, only to find it stored. With it, a write fingerprints
// what it references (a keyed 128-bit hash, an order of magnitude cheaper
// than encoding and sha256 together) and encodes only what is new.
//
// An entry means "stored": it is added only after the commit that wrote or
// found the blob, under gc's lock held shared, and the sweep clears the whole
// set, under that lock held exclusively, before it deletes any blob. The set
// is bounded; when full it starts over.
//
// A fingerprint covers every field that canonicalJSON encodes (a test checks
// that core's message and tool types have no field it does not know), so
// equal fingerprints mean equal canonical JSON, with the probability of a
// 128-bit keyed hash collision (seeds are random per process) against it.
type knownBlobs struct {
	seeds [2]maphash.Seed
	max   int

	mu sync.Mutex
	m  map[fingerprint]hash
}

// fingerprint is a keyed 128-bit hash of a message or a tools list.
type fingerprint [2]uint64

// knownBlobsMax bounds the set: about 100 bytes an entry.
const knownBlobsMax = 1 << 16

func newKnownBlobs(max int) *knownBlobs {
	return &knownBlobs{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, max: max, m: make(map[fingerprint]hash)}
}

func (k *knownBlobs) lookup(f fingerprint) (hash, bool) {
	k.mu.Lock()
	h, ok := k.m[f]
	k.mu.Unlock()
	return h, ok
}

// add remembers blobs that a commit just wrote or found stored.
func (k *knownBlobs) add(bs []blob) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range bs {
		if _, ok := k.m[b.fp]; ok {
			continue
		}
		if len(k.m) >= k.max {
			clear(k.m)
		}
		k.m[b.fp] = b.h
	}
}

// clear forgets everything: blobs are about to be deleted.
func (k *knownBlobs) clear() {
	k.mu.Lock()
	clear(k.m)
	k.mu.Unlock()
}

func (k *knownBlobs) fingerprinter() *fingerprinter {
	f := &fingerprinter{seeds: k.seeds}
	f.h[0].SetSeed(k.seeds[0])
	f.h[1].SetSeed(k.seeds[1])
	return f
}

// fingerprinter computes fingerprints; it is not safe for concurrent use.
type fingerprinter struct {
	seeds [2]maphash.Seed
	h     [2]maphash.Hash
}

// longString is the length from which a string is hashed on its own
// (maphash.String, in one pass over the whole string) and its hash written
// in the fingerprint's stream: a maphash.Hash takes a long string in
// 128-byte pieces, which made fingerprinting a 40,000-character system
// prompt three times slower.
const longString = 512

func (f *fingerprinter) reset(tag byte) {
	for i := range f.h {
		f.h[i].Reset()
		f.h[i].WriteByte(tag)
	}
}

func (f *fingerprinter) sum() fingerprint { return fingerprint{f.h[0].Sum64(), f.h[1].Sum64()} }

func (f *fingerprinter) num(n int) {
	var b [binary.MaxVarintLen64]byte
	w := binary.PutUvarint(b[:], uint64(n))
	for i := range f.h {
		f.h[i].Write(b[:w])
	}
}

func (f *fingerprinter) str(s string) {
	f.num(len(s))
	for i := range f.h {
		if len(s) >= longString {
			var sum [8]byte
			binary.LittleEndian.PutUint64(sum[:], maphash.String(f.seeds[i], s))
			f.h[i].Write(sum[:])
			continue
		}
		f.h[i].WriteString(s)
	}
}

func (f *fingerprinter) bytes(b []byte) {
	f.num(len(b))
	for i := range f.h {
		if len(b) >= longString {
			var sum [8]byte
			binary.LittleEndian.PutUint64(sum[:], maphash.Bytes(f.seeds[i], b))
			f.h[i].Write(sum[:])
			continue
		}
		f.h[i].Write(b)
	}
}

// nilOr distinguishes a nil slice from an empty one (JSON null and []).
func (f *fingerprinter) nilOr(isNil bool, n int) {
	if isNil {
		f.num(0)
	} else {
		f.num(n + 1)
	}
}

// message fingerprints every field of core.Message that its canonical JSON
// holds. Keep in step with core.Message (TestFingerprintCoversFields).
func (f *fingerprinter) message(m *core.Message) fingerprint {
	f.reset('m')
	f.str(m.Role)
	f.str(m.Content)
	f.nilOr(m.Parts == nil, len(m.Parts))
	for _, p := range m.Parts {
		f.str(p.Type)
		f.nilOr(p.Raw == nil, 0)
		f.bytes(p.Raw)
	}
	f.str(m.Reasoning)
	f.str(m.Name)
	f.nilOr(m.ToolCalls == nil, len(m.ToolCalls))
	for _, c := range m.ToolCalls {
		f.str(c.ID)
		f.str(c.Type)
		f.str(c.Name)
		f.str(c.Arguments)
	}
	f.str(m.ToolCallID)
	if m.IsError {
		f.num(1)
	} else {
		f.num(0)
	}
	return f.sum()
}

// tools fingerprints a tools list. Keep in step with core.Tool.
func (f *fingerprinter) tools(ts []core.Tool) fingerprint {
	f.reset('t')
	f.nilOr(ts == nil, len(ts))
	for _, t := range ts {
		f.str(t.Name)
		f.str(t.Description)
		f.nilOr(t.Parameters == nil, 0)
		f.bytes(t.Parameters)
	}
	return f.sum()
}
