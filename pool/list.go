package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Filter selects steps for List and Export. The zero value selects every
// live step.
type Filter struct {
	// Session, if set, selects that session's steps only.
	Session core.SessionID
	// State, if set, selects steps in that state only. 0 means any state
	// except dropped; StateDropped lists tombstones (id, session, state and
	// time only).
	State core.State
	// Since and Until bound the step time (Timings.Start): Since inclusive,
	// Until exclusive. Zero means unbounded.
	Since, Until time.Time
	// After is a cursor: only steps that sort after this step (by time, then
	// id) are selected. Pass the last id of the previous page.
	After core.StepID
	// Limit caps the number of steps returned; 0 means no limit.
	Limit int
}

// List returns the steps f selects, ordered by time then id. Steps are read
// from one consistent snapshot.
func (p *Pool) List(ctx context.Context, f Filter) ([]*core.Step, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []*core.Step
	err = p.each(ctx, in, f, func(s *core.Step) error {
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// each calls fn for every step f selects, in order, from one snapshot.
func (p *Pool) each(ctx context.Context, in *instance, f Filter, fn func(*core.Step) error) error {
	if f.Limit < 0 {
		return fmt.Errorf("pool: list: negative limit %d", f.Limit)
	}
	if f.State > core.MaxState {
		return fmt.Errorf("pool: list: invalid state %d", f.State)
	}
	snap := in.db.NewSnapshot()
	defer snap.Close()

	var cursor *cursorPos
	if f.After != "" {
		rec, err := getCopy(snap, stepKey(f.After))
		if errors.Is(err, pebble.ErrNotFound) {
			return fmt.Errorf("pool: list: cursor: %w: %s", ErrNotFound, f.After)
		}
		if err != nil {
			return fmt.Errorf("pool: list: %w", err)
		}
		h, _, err := decodeHeader(rec)
		if err != nil {
			return fmt.Errorf("pool: list: cursor %s: %w", f.After, err)
		}
		cursor = &cursorPos{t: h.t, id: f.After}
	}

	// Pick the index: the session index when a session is given (unless
	// listing tombstones, which only the state index holds), else the state
	// index when a state is given, else the time index. Conditions the index
	// does not cover are checked on the record.
	var prefix []byte
	switch {
	case f.Session != "" && f.State != core.StateDropped:
		prefix = sessionPrefix(f.Session)
	case f.State != core.StateUnknown:
		prefix = statePrefix(f.State)
	default:
		prefix = prefixTime
	}
	r := makeRange(prefix, f.Since, f.Until, cursor)
	if r.upper != nil && string(r.lower) >= string(r.upper) {
		return nil
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: r.lower, UpperBound: r.upper})
	if err != nil {
		return fmt.Errorf("pool: list: %w", err)
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, id, ok := splitIndexKey(it.Key(), r.prefixLen)
		if !ok {
			return fmt.Errorf("pool: list: %w: index key %q", errCorrupt, it.Key())
		}
		rec, err := getCopy(snap, stepKey(id))
		if err != nil {
			return fmt.Errorf("pool: list: step %s: %w", id, err)
		}
		d, err := decodeRecord(rec)
		if err != nil {
			return fmt.Errorf("pool: list: step %s: %w", id, err)
		}
		if f.State != core.StateUnknown && d.state != f.State {
			continue
		}
		if f.Session != "" && d.session != f.Session {
			continue
		}
		var s *core.Step
		if d.state == core.StateDropped {
			s = tombstoneStep(id, d.header)
		} else if s, err = d.materialize(snap, p.cache); err != nil {
			return fmt.Errorf("pool: list: step %s: %w", id, err)
		}
		if err := fn(s); err != nil {
			return err
		}
		if n++; f.Limit > 0 && n >= f.Limit {
			break
		}
	}
	return it.Error()
}

// Stats summarizes a pool.
type Stats struct {
	// Steps is the number of live (not dropped) steps.
	Steps int `json:"steps"`
	// ByState counts records per state, tombstones included (as "dropped").
	ByState map[core.State]int `json:"by_state"`
	// Sessions is the number of distinct sessions with live steps.
	Sessions int `json:"sessions"`
	// ByAdapter counts live steps per adapter version that served them
	// (steps that name none are not counted).
	ByAdapter map[string]int `json:"by_adapter,omitempty"`
	// MessagesStored is the number of distinct messages stored;
	// MessagesReferenced the number of message references live steps hold
	// (request, reply and next-state messages). Their ratio is the
	// deduplication factor.
	MessagesStored     int `json:"messages_stored"`
	MessagesReferenced int `json:"messages_referenced"`
	// ToolListsStored and ToolListsReferenced are the same for tools lists.
	ToolListsStored     int `json:"tool_lists_stored"`
	ToolListsReferenced int `json:"tool_lists_referenced"`
	// StepBytes is the size of the live step records, BlobBytes the size of
	// the stored blobs, Bytes their sum: the step data MaxBytes limits
	// (before Pebble's compression and overheads).
	StepBytes int64 `json:"step_bytes"`
	BlobBytes int64 `json:"blob_bytes"`
	Bytes     int64 `json:"bytes"`
	// DiskBytes is the space Pebble uses on disk (tables, WAL, manifest).
	DiskBytes int64 `json:"disk_bytes"`
	// Batches counts outbox batches, BatchesShipped those of them marked
	// shipped.
	Batches        int `json:"batches"`
	BatchesShipped int `json:"batches_shipped"`
	// Health says whether the pool records, and if not why. Stats fills it
	// in; a node whose store cannot be read answers with it alone.
	Health *Health `json:"health,omitempty"`
}

// Stats scans the pool and summarizes it.
func (p *Pool) Stats(ctx context.Context) (Stats, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return Stats{}, err
	}
	defer done()
	snap := in.db.NewSnapshot()
	defer snap.Close()

	st := Stats{ByState: make(map[core.State]int)}
	sessions := make(map[core.SessionID]struct{})
	err = scan(ctx, snap, prefixStep, prefixStepEnd, func(k, v []byte) error {
		d, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		st.ByState[d.state]++
		if d.state == core.StateDropped {
			return nil
		}
		st.Steps++
		st.StepBytes += int64(len(v))
		sessions[d.session] = struct{}{}
		if a := adapterOf(d.body); a != "" {
			if st.ByAdapter == nil {
				st.ByAdapter = map[string]int{}
			}
			st.ByAdapter[a]++
		}
		st.MessagesReferenced += len(d.msgs) + len(d.choice) + len(d.next)
		st.ToolListsReferenced += len(d.tools)
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("pool: stats: %w", err)
	}
	st.Sessions = len(sessions)
	for _, r := range []struct {
		lo, hi []byte
		n      *int
	}{{prefixMsg, prefixMsgEnd, &st.MessagesStored}, {prefixTools, prefixToolsEnd, &st.ToolListsStored}} {
		err := scan(ctx, snap, r.lo, r.hi, func(_, v []byte) error {
			*r.n++
			st.BlobBytes += int64(len(v))
			return nil
		})
		if err != nil {
			return Stats{}, fmt.Errorf("pool: stats: %w", err)
		}
	}
	err = scan(ctx, snap, prefixOutbox, prefixOutboxEnd, func(k, v []byte) error {
		var b Batch
		if err := json.Unmarshal(v, &b); err != nil {
			return fmt.Errorf("batch %q: %w: %v", k, errCorrupt, err)
		}
		st.Batches++
		if !b.Shipped.IsZero() {
			st.BatchesShipped++
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("pool: stats: %w", err)
	}
	st.Bytes = st.StepBytes + st.BlobBytes
	st.DiskBytes = int64(in.db.Metrics().DiskSpaceUsage())
	h := p.Health()
	st.Health = &h
	return st, nil
}

// Backlog counts the steps in state st that sort after the step after (all
// of them if after is ""), reading the state index only. If there are more
// than keep, skipTo is the newest of the oldest n-keep of them: listing
// with Filter{State: st, After: skipTo} then sees the newest keep. A
// caller that cannot keep up (the scorer) uses it to bound its lag.
func (p *Pool) Backlog(ctx context.Context, st core.State, after core.StepID, keep int) (n int, skipTo core.StepID, err error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return 0, "", err
	}
	defer done()
	snap := in.db.NewSnapshot()
	defer snap.Close()
	var cursor *cursorPos
	if after != "" {
		rec, err := getCopy(snap, stepKey(after))
		if err != nil {
			return 0, "", fmt.Errorf("pool: backlog: cursor %s: %w", after, err)
		}
		h, _, err := decodeHeader(rec)
		if err != nil {
			return 0, "", fmt.Errorf("pool: backlog: cursor %s: %w", after, err)
		}
		cursor = &cursorPos{t: h.t, id: after}
	}
	r := makeRange(statePrefix(st), time.Time{}, time.Time{}, cursor)
	count := func(stop int) (int, []byte, error) {
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: r.lower, UpperBound: r.upper})
		if err != nil {
			return 0, nil, err
		}
		defer it.Close()
		n := 0
		for valid := it.First(); valid; valid = it.Next() {
			if n++; n%4096 == 0 && ctx.Err() != nil {
				return 0, nil, ctx.Err()
			}
			if n == stop {
				return n, bytes.Clone(it.Key()), it.Error()
			}
		}
		return n, nil, it.Error()
	}
	n, _, err = count(-1)
	if err != nil || n <= keep {
		return n, "", err
	}
	_, key, err := count(n - keep)
	if err != nil {
		return n, "", err
	}
	_, id, ok := splitIndexKey(key, r.prefixLen)
	if !ok {
		return n, "", fmt.Errorf("pool: backlog: %w: index key %q", errCorrupt, key)
	}
	return n, id, nil
}

// adapterOf reads the adapter a step record's body names, without
// decoding the body: the step's only "adapter" member, a plain string.
func adapterOf(body []byte) string {
	const key = `"adapter":"`
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return ""
	}
	rest := body[i+len(key):]
	j := bytes.IndexAny(rest, `"\`)
	if j < 0 || rest[j] != '"' {
		var v struct {
			Adapter string `json:"adapter"`
		}
		json.Unmarshal(body, &v)
		return v.Adapter
	}
	return string(rest[:j])
}
