// Package session owns session identity and next states: from the stream of
// LLM calls the gateway sees, it works out which calls belong together
// (session, chain, parent step) and, for every recorded step, what its next
// state was — the messages a continuation added after that step's reply.
//
// The Tracker is a pure state machine: no goroutines, no clock, no I/O, not
// safe for concurrent use. The caller passes the time on every call, holds a
// mutex around it, and calls Tick periodically so idle chains close.
//
// Matching works on a prefix tree of canonical message keys shared by all
// sessions (see RATIONALE.md). A step's history is its request messages plus
// its reply; a new call continues the step whose history is the longest
// prefix of the call's messages, and the messages beyond that prefix are the
// step's next state.
package session

import (
	"container/heap"
	"errors"
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ErrOptions is returned by New for invalid Options.
var ErrOptions = errors.New("session: invalid options")

// OpenClawMarker begins OpenClaw's per-call internal context message.
const OpenClawMarker = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"

// Options configures a Tracker. The zero value means defaults.
type Options struct {
	// IdleTimeout: a completed step whose chain sees no continuation for
	// this long (since its reply) closes without a next state. Default 30m.
	IdleTimeout time.Duration
	// MaxSessions bounds the sessions held in memory; the least recently
	// used one is evicted (its open steps close without a next state).
	// Default 10000.
	MaxSessions int
	// MaxSteps bounds the steps remembered per session; the oldest are
	// forgotten (closed without a next state if still open). Default 4096.
	MaxSteps int
	// VolatileMarkers: a user message containing one of these is per-call
	// context, not history: it is skipped when matching, wherever it sits,
	// and never part of a next state. Empty means the default,
	// []string{OpenClawMarker}.
	VolatileMarkers []string
	// NoVolatile turns volatile-message detection off.
	NoVolatile bool
}

func (o Options) withDefaults() (Options, error) {
	if o.IdleTimeout < 0 || o.MaxSessions < 0 || o.MaxSteps < 0 {
		return o, fmt.Errorf("%w: negative bound (idle %v, sessions %d, steps %d)", ErrOptions, o.IdleTimeout, o.MaxSessions, o.MaxSteps)
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 30 * time.Minute
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 10000
	}
	if o.MaxSteps == 0 {
		o.MaxSteps = 4096
	}
	if o.NoVolatile {
		o.VolatileMarkers = nil
	} else if len(o.VolatileMarkers) == 0 {
		o.VolatileMarkers = []string{OpenClawMarker}
	}
	for _, m := range o.VolatileMarkers {
		if m == "" {
			return o, fmt.Errorf("%w: empty volatile marker", ErrOptions)
		}
	}
	o.VolatileMarkers = append([]string(nil), o.VolatileMarkers...)
	return o, nil
}

// Source says where an explicit session id came from.
type Source uint8

const (
	SourceNone   Source = iota // no explicit id: matched by message prefix
	SourcePath                 // the /s/{session}/ URL prefix
	SourceHeader               // X-Session-Id
	SourceBody                 // metadata.user_id, prompt_cache_key or user
)

var sourceNames = [...]string{"none", "path", "header", "body"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Call is one LLM call as the gateway saw its request.
type Call struct {
	Now      time.Time
	StepID   core.StepID    // assigned by the caller, unique
	Session  core.SessionID // explicit id ("" = none: match by message prefix)
	Source   Source
	Turn     core.TurnType // main or side ("" counts as main)
	Done     bool          // X-Session-Done: the chain ends with this call
	TraceID  string        // W3C traceparent trace id, "" if none
	Messages []core.Message
}

// Closure says that a step's fate is known: it will get no other next state.
type Closure struct {
	StepID core.StepID
	// NextState is nil when the step closed without one (chain ended, idle,
	// evicted, forgotten, superseded by rewritten history).
	NextState *core.NextState
}

// Assignment is where a call belongs.
type Assignment struct {
	// Session is the explicit id, or the session of the matched step, or a
	// new id derived from the StepID ("s-"+id).
	Session core.SessionID
	// Chain is the parent's chain when this call is the parent's first main
	// continuation (or a retry of it), else a new one ("c-"+id).
	Chain core.ChainID
	// Parent is the step this call continues, "" if none.
	Parent core.StepID
	// Sibling: the call repeats an earlier step's request (a retry); it has
	// that step's parent and supplies no next state.
	Sibling bool
	// Segment counts history rewrites (compaction) inside the session.
	Segment int
	// Closures are the steps whose fate became known with this call.
	Closures []Closure
}

// Stats is a snapshot of what the Tracker holds.
type Stats struct {
	Sessions int // sessions in memory
	Steps    int // steps remembered (in flight, open or closed)
	InFlight int // begun, neither completed nor aborted (orphans included)
	Open     int // completed and not yet closed
	Nodes    int // prefix-tree nodes
}

type step struct {
	id      core.StepID
	sess    *session // nil: forgotten while in flight (an orphan)
	turn    core.TurnType
	trace   string
	chain   core.ChainID
	parent  *step // nil if none; may have been forgotten since
	parID   core.StepID
	sibling bool
	segment int

	done bool // close as soon as it completes
	// pending is a next state seen before the step completed (the client
	// continued before the gateway reported the reply); it applies if one
	// of the replies has key pendingKey.
	pending    *core.NextState
	pendingKey uint64
	completed  bool
	closed     bool
	counted    bool // counted in parent.mainKids
	mainKids   int  // live main continuations and their retries

	req  *node
	hist []*node

	prev, next *step // session's steps, oldest first

	deadline time.Time
	heapIdx  int // index in Tracker.idle, -1 when absent
}

func (s *step) main() bool { return s.turn != core.TurnSide }

// continues makes s a child of p. A main child takes p's chain if it is p's
// first main continuation, else starts its own; a side child takes p's chain
// without claiming it.
func (s *step) continues(p *step) {
	s.parent, s.parID, s.segment, s.chain = p, p.id, p.segment, p.chain
	if s.main() {
		if p.mainKids > 0 {
			s.chain = core.ChainID("c-" + s.id)
		}
		p.mainKids++
		s.counted = true
	}
}

func (s *step) assignment() Assignment {
	return Assignment{Session: s.sess.id, Chain: s.chain, Parent: s.parID, Sibling: s.sibling, Segment: s.segment}
}

type session struct {
	id            core.SessionID
	segment       int
	head, tail    *step
	n             int
	completedMain int         // remembered completed main steps
	last          core.StepID // latest completed main step
	// first is the key of the first history message (the system prompt) of
	// the session's first main call, if it had one.
	first    uint64
	hasFirst bool

	lruPrev, lruNext *session // lruPrev is more recent
}

type traceRef struct {
	sess *session
	n    int // remembered steps of sess carrying the trace
}

// Tracker assigns calls to sessions and chains and finds next states.
// It is not safe for concurrent use.
type Tracker struct {
	opts Options
	hs   *hasher
	tree tree

	sessions       map[core.SessionID]*session
	lruMRU, lruLRU *session
	steps          map[core.StepID]*step
	traces         map[string]*traceRef
	idle           idleHeap
	inflight       int

	keys []uint64 // scratch: canonical keys of the current call
	idx  []int    // scratch: index in Call.Messages of each key
}

// New returns a Tracker with opts (zero fields take defaults).
func New(opts Options) (*Tracker, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Tracker{
		opts:     o,
		hs:       newHasher(),
		sessions: make(map[core.SessionID]*session),
		steps:    make(map[core.StepID]*step),
		traces:   make(map[string]*traceRef),
	}, nil
}

// canon computes the keys of the call's history messages (volatile ones
// skipped), each message hashed once.
func (t *Tracker) canon(msgs []core.Message) {
	t.keys, t.idx = t.keys[:0], t.idx[:0]
	for i := range msgs {
		if volatile(&msgs[i], t.opts.VolatileMarkers) {
			continue
		}
		t.keys = append(t.keys, t.hs.sum(&msgs[i]))
		t.idx = append(t.idx, i)
	}
}

// Begin places a call: its session, chain and parent. Its Closures hold the
// parent's next state when the call is a main continuation, and any steps
// that closed for other reasons (idle at c.Now, evicted, superseded).
// Beginning a StepID already known returns its assignment again.
func (t *Tracker) Begin(c Call) Assignment {
	out := t.expire(c.Now, nil)
	if s, ok := t.steps[c.StepID]; ok {
		if s.sess == nil {
			return Assignment{Chain: s.chain, Parent: s.parID, Sibling: s.sibling, Segment: s.segment, Closures: out}
		}
		a := s.assignment()
		a.Closures = out
		return a
	}
	t.canon(c.Messages)
	keys := t.keys
	main := c.Turn != core.TurnSide

	explicit := c.Session != ""
	var sess *session
	if explicit {
		sess = t.sessions[c.Session]
	}
	eligible := func(s *step) bool { return !explicit || s.sess == sess }
	inFlight := func(s *step) bool { return !s.completed && (!explicit || s.sess == sess) }

	// Walk the call's messages down the tree: the deepest node where an
	// eligible step's history ends is the parent; if the walk consumes the
	// whole call, a step whose request ends there makes this a retry. A
	// step still in flight whose request is followed by an assistant
	// message may be the parent too: the client can see a reply before the
	// gateway reports it.
	n, depth := &t.tree.root, 0
	var best, sib, infl *step
	bestDepth, inflDepth := 0, 0
	if len(keys) > 0 && (!explicit || sess != nil) {
		for depth < len(keys) {
			k := n.child(keys[depth])
			if k == nil {
				break
			}
			n, depth = k, depth+1
			if s := latest(n.hist, eligible); s != nil {
				best, bestDepth = s, depth
			}
			if depth < len(keys) && c.Messages[t.idx[depth]].Role == core.RoleAssistant {
				if s := latest(n.reqs, inFlight); s != nil {
					infl, inflDepth = s, depth
				}
			}
		}
		if depth == len(keys) {
			sib = latest(n.reqs, eligible)
		}
	}

	st := &step{id: c.StepID, turn: c.Turn, trace: c.TraceID, done: c.Done, heapIdx: -1}
	switch {
	case sib != nil:
		sess = sib.sess
		st.parent, st.parID, st.chain, st.segment, st.sibling = sib.parent, sib.parID, sib.chain, sib.segment, true
		if main && st.parent != nil {
			st.parent.mainKids++
			st.counted = true
		}
	case infl != nil && inflDepth >= bestDepth:
		// A continuation of a reply not reported yet: the next state waits
		// for Complete, which checks the reply is the one continued.
		sess = infl.sess
		st.continues(infl)
		if main {
			if infl.pending == nil && inflDepth+1 < len(keys) {
				infl.pending = &core.NextState{Messages: t.cut(c.Messages, inflDepth+1), StepID: c.StepID}
				infl.pendingKey = keys[inflDepth]
			}
		}
	case best != nil:
		sess = best.sess
		st.continues(best)
		if main {
			if !best.closed && bestDepth < len(keys) {
				out = t.close(best, &core.NextState{Messages: t.cut(c.Messages, bestDepth), StepID: c.StepID}, out)
			}
		}
	default:
		switch {
		case explicit && sess == nil:
			sess = t.newSession(c.Session)
		case explicit:
			if main && sess.completedMain > 0 {
				// History was rewritten: a new segment; what the old one
				// left open will never be continued.
				sess.segment++
				out = t.closeOpen(sess, out)
			}
		case c.TraceID != "" && t.traces[c.TraceID] != nil:
			sess = t.traces[c.TraceID].sess
			if main && sess.completedMain > 0 && sess.hasFirst && len(keys) > 0 && keys[0] == sess.first {
				// The turn's own agent (its system prompt) with a history
				// that extends nothing: rewritten, as an explicit session's
				// would be. Other prompts in the trace (sub-agents, the
				// summariser) are new chains of the session.
				sess.segment++
				out = t.closeOpen(sess, out)
			}
		default:
			id := core.SessionID("s-" + c.StepID)
			if sess = t.sessions[id]; sess == nil {
				sess = t.newSession(id)
			}
		}
		st.chain, st.segment = core.ChainID("c-"+c.StepID), sess.segment
	}

	// Register the step: its request path, its session, its trace.
	st.sess = sess
	if main && !sess.hasFirst && len(keys) > 0 {
		sess.first, sess.hasFirst = keys[0], true
	}
	st.req = t.tree.extend(n, keys[depth:])
	t.register(st)
	a := st.assignment()
	a.Closures = t.bound(sess, out)
	return a
}

// register adds a placed step to the tables: its request path in the tree
// (st.req set), its session, its trace.
func (t *Tracker) register(st *step) {
	sess := st.sess
	st.req.reqs = append(st.req.reqs, st)
	t.steps[st.id] = st
	t.inflight++
	sess.push(st)
	if st.trace != "" {
		if r := t.traces[st.trace]; r != nil && r.sess == sess {
			r.n++
		} else {
			// The trace now leads to this session (rare: one trace in
			// several sessions); count its steps that carry it.
			r := &traceRef{sess: sess}
			for o := sess.head; o != nil; o = o.next {
				if o.trace == st.trace {
					r.n++
				}
			}
			t.traces[st.trace] = r
		}
	}
	t.touch(sess)
}

// bound enforces the bounds after sess grew: its oldest steps, then the
// least recently used sessions (never sess: it is the most recent).
func (t *Tracker) bound(sess *session, out []Closure) []Closure {
	for sess.n > t.opts.MaxSteps {
		out = t.forget(sess.head, out)
	}
	for len(t.sessions) > t.opts.MaxSessions {
		out = t.evict(t.lruLRU, out)
	}
	return out
}

// Restored is a step recorded by an earlier run and still open: what Restore
// needs to make it continuable again.
type Restored struct {
	StepID   core.StepID
	Session  core.SessionID
	Chain    core.ChainID
	Parent   core.StepID
	Turn     core.TurnType
	TraceID  string
	Messages []core.Message // the request's messages
	Actions  []core.Message // the reply, one per choice
	// Completed is when the reply completed; the idle timeout runs from it.
	Completed time.Time
}

// Restore re-registers an open step that an earlier run of the tracker
// (a node since restarted) knew, so that a call continuing it supplies its
// next state as if nothing had happened. Restore steps oldest first, before
// new calls are begun; a restored step's parent is linked if it was restored
// too. A step whose idle timeout has passed closes at the next Tick. Ids
// already known are ignored.
func (t *Tracker) Restore(r Restored) []Closure {
	if _, ok := t.steps[r.StepID]; ok {
		return nil
	}
	t.canon(r.Messages)
	sess := t.sessions[r.Session]
	if sess == nil {
		sess = t.newSession(r.Session)
	}
	st := &step{id: r.StepID, turn: r.Turn, trace: r.TraceID, chain: r.Chain, parID: r.Parent, segment: sess.segment, heapIdx: -1, sess: sess}
	if p := t.steps[r.Parent]; p != nil && p.sess == sess {
		st.parent = p
		if st.main() {
			p.mainKids++
			st.counted = true
		}
	}
	if st.main() && !sess.hasFirst && len(t.keys) > 0 {
		sess.first, sess.hasFirst = t.keys[0], true
	}
	st.req = t.tree.extend(&t.tree.root, t.keys)
	t.register(st)
	out := t.bound(sess, nil)
	return append(out, t.Complete(r.StepID, r.Actions, r.Completed)...)
}

// Complete records the reply (or replies, for n>1: any of them may be the one
// a continuation builds on) of a begun call. The step closes at once, and
// its Closure is returned, if the call was Begun with Done or its session
// ended or was evicted meanwhile (no next state), or if a call continuing
// one of these replies was begun already (with that call's next state).
// Unknown or already completed ids are ignored.
func (t *Tracker) Complete(id core.StepID, actions []core.Message, now time.Time) []Closure {
	out := t.expire(now, nil)
	st := t.steps[id]
	if st == nil || st.completed {
		return out
	}
	st.completed = true
	t.inflight--
	if st.sess == nil { // forgotten while in flight
		delete(t.steps, id)
		return t.close(st, nil, out)
	}
	add := func(n *node) {
		for _, h := range st.hist {
			if h == n {
				return
			}
		}
		n.hist = append(n.hist, st)
		st.hist = append(st.hist, n)
	}
	if len(actions) == 0 {
		add(st.req)
	}
	continued := false
	for i := range actions {
		if emptyAction(&actions[i]) {
			add(st.req)
			continue
		}
		k := t.hs.sum(&actions[i])
		continued = continued || (st.pending != nil && k == st.pendingKey)
		add(t.tree.extend(st.req, []uint64{k}))
	}
	if st.main() {
		st.sess.completedMain++
		st.sess.last = id
	}
	t.touch(st.sess)
	ns := st.pending
	st.pending = nil
	switch {
	case st.done:
		return t.close(st, nil, out)
	case continued:
		return t.close(st, ns, out)
	}
	st.deadline = now.Add(t.opts.IdleTimeout)
	heap.Push(&t.idle, st)
	return out
}

// Abort forgets a begun call that failed with no reply, as if it had never
// been made. Completed or unknown ids are ignored.
func (t *Tracker) Abort(id core.StepID) {
	st := t.steps[id]
	if st == nil || st.completed {
		return
	}
	delete(t.steps, id)
	t.inflight--
	if st.sess == nil {
		return
	}
	if st.counted && st.parent != nil {
		st.parent.mainKids--
	}
	t.detach(st)
}

// Tick closes, without a next state, every open step whose IdleTimeout has
// passed at now.
func (t *Tracker) Tick(now time.Time) []Closure {
	return t.expire(now, nil)
}

// End ends a session: its open steps close without a next state, and steps
// still in flight close as soon as they complete.
func (t *Tracker) End(s core.SessionID, now time.Time) []Closure {
	out := t.expire(now, nil)
	sess := t.sessions[s]
	if sess == nil {
		return out
	}
	for st := sess.head; st != nil; st = st.next {
		if !st.completed {
			st.done = true
		}
	}
	return t.closeOpen(sess, out)
}

// Last returns the latest completed main step of a session, "" if none is
// known. It stays known after the step is forgotten, until the session is.
func (t *Tracker) Last(s core.SessionID) core.StepID {
	if sess := t.sessions[s]; sess != nil {
		return sess.last
	}
	return ""
}

// Stats reports what the Tracker holds.
// IdleTimeout is how long a completed step waits for its continuation
// before it closes with no next state.
func (t *Tracker) IdleTimeout() time.Duration { return t.opts.IdleTimeout }

func (t *Tracker) Stats() Stats {
	st := Stats{Sessions: len(t.sessions), InFlight: t.inflight, Open: len(t.idle), Nodes: t.tree.nodes}
	for _, s := range t.sessions {
		st.Steps += s.n
	}
	return st
}

// cut returns the history messages of a call from the depth-th on (volatile
// ones left out), copied.
func (t *Tracker) cut(msgs []core.Message, depth int) []core.Message {
	next := make([]core.Message, 0, len(t.idx)-depth)
	for _, i := range t.idx[depth:] {
		next = append(next, msgs[i])
	}
	return next
}

// close marks st closed (once) and appends its closure.
func (t *Tracker) close(st *step, ns *core.NextState, out []Closure) []Closure {
	if st.closed {
		return out
	}
	st.closed = true
	if st.heapIdx >= 0 {
		heap.Remove(&t.idle, st.heapIdx)
	}
	return append(out, Closure{StepID: st.id, NextState: ns})
}

func (t *Tracker) expire(now time.Time, out []Closure) []Closure {
	for len(t.idle) > 0 && !t.idle[0].deadline.After(now) {
		out = t.close(t.idle[0], nil, out)
	}
	return out
}

// closeOpen closes every completed, open step of sess.
func (t *Tracker) closeOpen(sess *session, out []Closure) []Closure {
	for st := sess.head; st != nil; st = st.next {
		if st.completed {
			out = t.close(st, nil, out)
		}
	}
	return out
}

// forget drops st from memory: closed without a next state if open, kept as
// an orphan until it completes or aborts if in flight.
func (t *Tracker) forget(st *step, out []Closure) []Closure {
	if st.completed {
		out = t.close(st, nil, out)
		delete(t.steps, st.id)
	}
	t.detach(st)
	return out
}

// detach removes st from the tree, its session and the trace index.
func (t *Tracker) detach(st *step) {
	sess := st.sess
	st.req.reqs = removeStep(st.req.reqs, st)
	t.tree.prune(st.req)
	for _, h := range st.hist {
		h.hist = removeStep(h.hist, st)
		t.tree.prune(h)
	}
	st.req, st.hist = nil, nil
	sess.unlink(st)
	if st.completed && st.main() {
		sess.completedMain--
	}
	if st.trace != "" {
		if r := t.traces[st.trace]; r != nil && r.sess == sess {
			if r.n--; r.n == 0 {
				delete(t.traces, st.trace)
			}
		}
	}
	st.sess = nil
	st.parent = nil
}

func (t *Tracker) newSession(id core.SessionID) *session {
	s := &session{id: id}
	t.sessions[id] = s
	t.touch(s)
	return s
}

// evict forgets a whole session.
func (t *Tracker) evict(sess *session, out []Closure) []Closure {
	for sess.head != nil {
		out = t.forget(sess.head, out)
	}
	t.lruUnlink(sess)
	delete(t.sessions, sess.id)
	return out
}

// touch makes sess the most recently used session.
func (t *Tracker) touch(s *session) {
	if t.lruMRU == s {
		return
	}
	t.lruUnlink(s)
	s.lruNext = t.lruMRU
	if t.lruMRU != nil {
		t.lruMRU.lruPrev = s
	}
	t.lruMRU = s
	if t.lruLRU == nil {
		t.lruLRU = s
	}
}

func (t *Tracker) lruUnlink(s *session) {
	if s.lruPrev != nil {
		s.lruPrev.lruNext = s.lruNext
	} else if t.lruMRU == s {
		t.lruMRU = s.lruNext
	}
	if s.lruNext != nil {
		s.lruNext.lruPrev = s.lruPrev
	} else if t.lruLRU == s {
		t.lruLRU = s.lruPrev
	}
	s.lruPrev, s.lruNext = nil, nil
}

func (s *session) push(st *step) {
	st.prev = s.tail
	if s.tail != nil {
		s.tail.next = st
	} else {
		s.head = st
	}
	s.tail = st
	s.n++
}

func (s *session) unlink(st *step) {
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		s.head = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	} else {
		s.tail = st.prev
	}
	st.prev, st.next = nil, nil
	s.n--
}

// idleHeap orders open steps by deadline.
type idleHeap []*step

func (h idleHeap) Len() int { return len(h) }
func (h idleHeap) Less(i, j int) bool {
	if !h[i].deadline.Equal(h[j].deadline) {
		return h[i].deadline.Before(h[j].deadline)
	}
	return h[i].id < h[j].id
}
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *idleHeap) Push(x any) {
	st := x.(*step)
	st.heapIdx = len(*h)
	*h = append(*h, st)
}
func (h *idleHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	st.heapIdx = -1
	return st
}
