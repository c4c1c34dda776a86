package pool

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// A step record (the value under s/<id>) is
//
//	version:1 state:1 time:8 uvarint(len(session)) session
//
// followed, for a live step (state != dropped), by
//
//	uvarint(len(body)) body
//	hashes(request messages) hashes(tools) hashes(choice messages) hashes(next-state messages)
//
// body is the step's JSON with the deduplicated parts left out (request
// messages and tools, each choice's message, the next state's messages); the
// hashes name the blobs that hold them, in order. hashes(x) is uvarint(n+1)
// followed by n 32-byte hashes, with uvarint 0 meaning "nil" so that nil and
// empty survive the round trip. The tools list is one blob, so its hashes
// list holds at most one entry. A tombstone (state dropped) ends after the
// session.
const recordVersion = 1

var errCorrupt = errors.New("pool: corrupt record")

// header is what every record carries, live or tombstone.
type header struct {
	state   core.State
	t       time.Time
	session core.SessionID
}

// blob is one content-addressed piece of a step, ready to store. data is nil
// for a blob known to be stored already (see knownBlobs).
type blob struct {
	prefix []byte // the blob's key is blobKey(prefix, h)
	data   []byte // nil when known to be stored
	fp     fingerprint
	h      hash
}

func (b *blob) key() []byte { return blobKey(b.prefix, b.h) }

// encoded is a step split into its record and the blobs it references.
type encoded struct {
	hdr    header
	record []byte
	blobs  []blob
}

// canonicalJSON is the bytes a blob is addressed by: encoding/json output
// (struct field order, compacted raw JSON) without HTML escaping.
func canonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func appendHeader(dst []byte, h header) []byte {
	dst = append(dst, recordVersion, byte(h.state))
	dst = encodeTime(dst, h.t)
	dst = binary.AppendUvarint(dst, uint64(len(h.session)))
	return append(dst, h.session...)
}

// encodeStep splits s into its record and blobs. s is not modified. Blobs
// the known set names are addressed without being encoded again; the caller
// holds gc's lock shared, as for the existence checks.
func (p *Pool) encodeStep(s *core.Step) (*encoded, error) {
	n := len(s.Request.Messages) + len(s.Response.Choices) + 1
	if s.NextState != nil {
		n += len(s.NextState.Messages)
	}
	e := &encoded{hdr: header{state: s.State, t: s.Timings.Start, session: s.SessionID}, blobs: make([]blob, 0, n)}
	seen := make(map[hash]bool, n)
	fp := p.known.fingerprinter()
	addMsgs := func(dst []byte, msgs []core.Message) ([]byte, error) {
		if msgs == nil {
			return binary.AppendUvarint(dst, 0), nil
		}
		dst = binary.AppendUvarint(dst, uint64(len(msgs))+1)
		for i := range msgs {
			h, err := e.addBlob(prefixMsg, &msgs[i], fp.message(&msgs[i]), p.known, seen)
			if err != nil {
				return nil, err
			}
			dst = append(dst, h[:]...)
		}
		return dst, nil
	}

	// The body: a shallow copy with the deduplicated parts cleared.
	body := *s
	body.Request.Messages = nil
	body.Request.Tools = nil
	if s.Response.Choices != nil {
		body.Response.Choices = make([]core.Choice, len(s.Response.Choices))
		for i, c := range s.Response.Choices {
			c.Message = core.Message{}
			body.Response.Choices[i] = c
		}
	}
	if s.NextState != nil {
		ns := *s.NextState
		ns.Messages = nil
		body.NextState = &ns
	}
	bodyJSON, err := json.Marshal(&body)
	if err != nil {
		return nil, fmt.Errorf("pool: encode step %s: %w", s.ID, err)
	}

	rec := appendHeader(nil, e.hdr)
	rec = binary.AppendUvarint(rec, uint64(len(bodyJSON)))
	rec = append(rec, bodyJSON...)
	if rec, err = addMsgs(rec, s.Request.Messages); err != nil {
		return nil, err
	}
	if s.Request.Tools == nil {
		rec = binary.AppendUvarint(rec, 0)
	} else {
		h, err := e.addBlob(prefixTools, s.Request.Tools, fp.tools(s.Request.Tools), p.known, seen)
		if err != nil {
			return nil, err
		}
		rec = binary.AppendUvarint(rec, 2)
		rec = append(rec, h[:]...)
	}
	var choiceMsgs []core.Message
	if s.Response.Choices != nil {
		choiceMsgs = make([]core.Message, len(s.Response.Choices))
		for i := range s.Response.Choices {
			choiceMsgs[i] = s.Response.Choices[i].Message
		}
	}
	if rec, err = addMsgs(rec, choiceMsgs); err != nil {
		return nil, err
	}
	var next []core.Message
	if s.NextState != nil {
		next = s.NextState.Messages
	}
	if rec, err = addMsgs(rec, next); err != nil {
		return nil, err
	}
	e.record = rec
	return e, nil
}

// addBlob adds the blob holding v, whose fingerprint is f, and returns its
// address.
func (e *encoded) addBlob(prefix []byte, v any, f fingerprint, known *knownBlobs, seen map[hash]bool) (hash, error) {
	if h, ok := known.lookup(f); ok {
		if !seen[h] {
			seen[h] = true
			e.blobs = append(e.blobs, blob{prefix: prefix, fp: f, h: h})
		}
		return h, nil
	}
	data, err := canonicalJSON(v)
	if err != nil {
		return hash{}, fmt.Errorf("pool: encode blob: %w", err)
	}
	h := hash(sha256.Sum256(data))
	if !seen[h] {
		seen[h] = true
		e.blobs = append(e.blobs, blob{prefix: prefix, data: data, fp: f, h: h})
	}
	return h, nil
}

// tombstoneRecord is the record left for a dropped step.
func tombstoneRecord(h header) []byte {
	h.state = core.StateDropped
	return appendHeader(nil, h)
}

// decodedRecord is a parsed record; body and hash lists are set for live
// steps only.
type decodedRecord struct {
	header
	body                      []byte
	msgs, tools, choice, next []hash
	msgsNil, toolsNil         bool
	choiceNil, nextNil        bool
}

func decodeHeader(rec []byte) (header, []byte, error) {
	if len(rec) < 10 || rec[0] != recordVersion {
		return header{}, nil, errCorrupt
	}
	h := header{state: core.State(rec[1])}
	h.t = ordTime(binary.BigEndian.Uint64(rec[2:10]))
	rest := rec[10:]
	n, w := binary.Uvarint(rest)
	if w <= 0 || uint64(len(rest)-w) < n {
		return header{}, nil, errCorrupt
	}
	h.session = core.SessionID(rest[w : w+int(n)])
	return h, rest[w+int(n):], nil
}

func decodeRecord(rec []byte) (*decodedRecord, error) {
	h, rest, err := decodeHeader(rec)
	if err != nil {
		return nil, err
	}
	d := &decodedRecord{header: h}
	if h.state == core.StateDropped {
		return d, nil
	}
	n, w := binary.Uvarint(rest)
	if w <= 0 || uint64(len(rest)-w) < n {
		return nil, errCorrupt
	}
	d.body, rest = rest[w:w+int(n)], rest[w+int(n):]
	readHashes := func() ([]hash, bool, error) {
		n, w := binary.Uvarint(rest)
		if w <= 0 {
			return nil, false, errCorrupt
		}
		rest = rest[w:]
		if n == 0 {
			return nil, true, nil
		}
		n--
		if uint64(len(rest))/sha256.Size < n {
			return nil, false, errCorrupt
		}
		hs := make([]hash, n)
		for i := range hs {
			copy(hs[i][:], rest[i*sha256.Size:])
		}
		rest = rest[int(n)*sha256.Size:]
		return hs, false, nil
	}
	if d.msgs, d.msgsNil, err = readHashes(); err != nil {
		return nil, err
	}
	if d.tools, d.toolsNil, err = readHashes(); err != nil {
		return nil, err
	}
	if d.choice, d.choiceNil, err = readHashes(); err != nil {
		return nil, err
	}
	if d.next, d.nextNil, err = readHashes(); err != nil {
		return nil, err
	}
	if len(rest) != 0 || len(d.tools) > 1 {
		return nil, errCorrupt
	}
	return d, nil
}

// refs calls fn for every blob key the record references.
func (d *decodedRecord) refs(fn func(key []byte)) {
	for _, h := range d.msgs {
		fn(blobKey(prefixMsg, h))
	}
	for _, h := range d.tools {
		fn(blobKey(prefixTools, h))
	}
	for _, h := range d.choice {
		fn(blobKey(prefixMsg, h))
	}
	for _, h := range d.next {
		fn(blobKey(prefixMsg, h))
	}
}

// getter is what both *pebble.DB and *pebble.Snapshot offer.
type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

// decodedCache keeps decoded blobs, by content hash, for the reads of the
// whole pool: consecutive steps of a conversation share most of their
// messages, and decoding a long system prompt costs more than the rest of a
// read. A hash names immutable content, so entries never go stale. Callers
// get deep copies. When the cache outgrows its budget it starts over.
type decodedCache struct {
	mu    sync.Mutex
	size  int64
	max   int64
	msgs  map[hash]core.Message
	tools map[hash][]core.Tool
}

const decodedCacheBytes = 32 << 20

func newDecodedCache(max int64) *decodedCache {
	return &decodedCache{max: max, msgs: make(map[hash]core.Message), tools: make(map[hash][]core.Tool)}
}

// decodedEntryOverhead is what an entry costs beyond its bytes: the map's
// slot, the decoded struct and its strings' headers. Counting the JSON bytes
// alone let a cache of short messages grow to five times its budget.
const decodedEntryOverhead = 256

// cost is what an entry decoded from n bytes of JSON holds in memory: its
// strings (about the JSON's size) and their structure, and the entry.
func decodedCost(n int) int64 { return 2*int64(n) + decodedEntryOverhead }

// add accounts for an entry decoded from n bytes, starting over first if it
// would not fit. Starting over makes new maps: clear keeps a map's buckets,
// and the memory with them. The caller holds mu.
func (c *decodedCache) add(n int) {
	cost := decodedCost(n)
	if c.size+cost > c.max {
		c.msgs = make(map[hash]core.Message)
		c.tools = make(map[hash][]core.Tool)
		c.size = 0
	}
	c.size += cost
}

func (c *decodedCache) message(r getter, h hash) (core.Message, error) {
	c.mu.Lock()
	m, ok := c.msgs[h]
	c.mu.Unlock()
	if ok {
		return cloneMessage(m), nil
	}
	data, err := getBlob(r, blobKey(prefixMsg, h))
	if err != nil {
		return core.Message{}, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return core.Message{}, fmt.Errorf("%w: message blob: %v", errCorrupt, err)
	}
	c.mu.Lock()
	c.add(len(data))
	c.msgs[h] = m
	c.mu.Unlock()
	return cloneMessage(m), nil
}

func (c *decodedCache) toolList(r getter, h hash) ([]core.Tool, error) {
	c.mu.Lock()
	ts, ok := c.tools[h]
	c.mu.Unlock()
	if ok {
		return cloneTools(ts), nil
	}
	data, err := getBlob(r, blobKey(prefixTools, h))
	if err != nil {
		return nil, err
	}
	ts = []core.Tool{}
	if err := json.Unmarshal(data, &ts); err != nil {
		return nil, fmt.Errorf("%w: tools blob: %v", errCorrupt, err)
	}
	c.mu.Lock()
	c.add(len(data))
	c.tools[h] = ts
	c.mu.Unlock()
	return cloneTools(ts), nil
}

func cloneMessage(m core.Message) core.Message {
	if m.Parts != nil {
		parts := make([]core.Part, len(m.Parts))
		for i, p := range m.Parts {
			p.Raw = bytes.Clone(p.Raw)
			parts[i] = p
		}
		m.Parts = parts
	}
	m.ToolCalls = slices.Clone(m.ToolCalls)
	return m
}

func cloneTools(ts []core.Tool) []core.Tool {
	out := make([]core.Tool, len(ts))
	for i, t := range ts {
		t.Parameters = bytes.Clone(t.Parameters)
		out[i] = t
	}
	return out
}

func getBlob(r getter, key []byte) ([]byte, error) {
	v, err := getCopy(r, key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: missing blob %x", errCorrupt, key)
	}
	return v, err
}

func getCopy(r getter, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if err != nil {
		return nil, err
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	return out, closer.Close()
}

// materialize rebuilds the full step from a decoded live record.
func (d *decodedRecord) materialize(r getter, cache *decodedCache) (*core.Step, error) {
	s := new(core.Step)
	if err := json.Unmarshal(d.body, s); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	loadMsgs := func(hs []hash, isNil bool) ([]core.Message, error) {
		if isNil {
			return nil, nil
		}
		msgs := make([]core.Message, len(hs))
		for i, h := range hs {
			m, err := cache.message(r, h)
			if err != nil {
				return nil, err
			}
			msgs[i] = m
		}
		return msgs, nil
	}
	var err error
	if s.Request.Messages, err = loadMsgs(d.msgs, d.msgsNil); err != nil {
		return nil, err
	}
	if !d.toolsNil {
		s.Request.Tools = []core.Tool{}
		for _, h := range d.tools {
			if s.Request.Tools, err = cache.toolList(r, h); err != nil {
				return nil, err
			}
		}
	}
	choiceMsgs, err := loadMsgs(d.choice, d.choiceNil)
	if err != nil {
		return nil, err
	}
	if len(choiceMsgs) != len(s.Response.Choices) {
		return nil, fmt.Errorf("%w: %d choice messages for %d choices", errCorrupt, len(choiceMsgs), len(s.Response.Choices))
	}
	for i := range choiceMsgs {
		s.Response.Choices[i].Message = choiceMsgs[i]
	}
	if s.NextState != nil {
		if s.NextState.Messages, err = loadMsgs(d.next, d.nextNil); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// tombstoneStep is the minimal step List reports for a dropped one.
func tombstoneStep(id core.StepID, h header) *core.Step {
	return &core.Step{ID: id, SessionID: h.session, State: core.StateDropped, Timings: core.Timings{Start: h.t}}
}
