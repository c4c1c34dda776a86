package session

import (
	"fmt"
)

// check verifies the Tracker's internal invariants: tree shape and node
// count, step registrations, session lists and bounds, LRU list, idle heap,
// counters and the trace index.
func (t *Tracker) check() error {
	// Tree.
	nodes := 0
	var walk func(n *node) error
	walk = func(n *node) error {
		if n != &t.tree.root {
			nodes++
			if n.unused() {
				return fmt.Errorf("unused node left in tree")
			}
		}
		if n.many != nil && len(n.few) != 0 {
			return fmt.Errorf("node has both few and many children")
		}
		for _, s := range n.reqs {
			if s.req != n || s.sess == nil || t.steps[s.id] != s {
				return fmt.Errorf("step %s: bad request registration", s.id)
			}
		}
		for _, s := range n.hist {
			if !s.completed || s.sess == nil || t.steps[s.id] != s {
				return fmt.Errorf("step %s: bad history registration", s.id)
			}
			found := false
			for _, h := range s.hist {
				found = found || h == n
			}
			if !found {
				return fmt.Errorf("step %s: history node not listed", s.id)
			}
		}
		kids := n.few
		for _, c := range n.many {
			kids = append(kids, c)
		}
		seen := map[uint64]bool{}
		for _, c := range kids {
			if c.parent != n {
				return fmt.Errorf("child with wrong parent")
			}
			if seen[c.key] {
				return fmt.Errorf("duplicate child key")
			}
			seen[c.key] = true
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(&t.tree.root); err != nil {
		return err
	}
	if nodes != t.tree.nodes {
		return fmt.Errorf("tree has %d nodes, counted %d", nodes, t.tree.nodes)
	}

	// Sessions and their steps.
	if len(t.sessions) > t.opts.MaxSessions {
		return fmt.Errorf("%d sessions > MaxSessions %d", len(t.sessions), t.opts.MaxSessions)
	}
	remembered := 0
	traces := map[string]int{}
	for id, s := range t.sessions {
		if s.id != id {
			return fmt.Errorf("session %s filed under %s", s.id, id)
		}
		n, cm := 0, 0
		var prev *step
		for st := s.head; st != nil; st = st.next {
			n++
			if st.sess != s || st.prev != prev || t.steps[st.id] != st {
				return fmt.Errorf("session %s: step %s badly linked", id, st.id)
			}
			if st.req == nil {
				return fmt.Errorf("step %s has no request node", st.id)
			}
			if st.completed && st.main() {
				cm++
			}
			if st.completed && !st.closed && (st.heapIdx < 0 || t.idle[st.heapIdx] != st) {
				return fmt.Errorf("open step %s not in idle heap", st.id)
			}
			if st.trace != "" {
				if r := t.traces[st.trace]; r != nil && r.sess == s {
					traces[st.trace]++
				}
			}
			prev = st
		}
		if s.tail != prev {
			return fmt.Errorf("session %s: bad tail", id)
		}
		if n != s.n || n > t.opts.MaxSteps {
			return fmt.Errorf("session %s: %d steps, counted %d, MaxSteps %d", id, n, s.n, t.opts.MaxSteps)
		}
		if cm != s.completedMain {
			return fmt.Errorf("session %s: %d completed main steps, counted %d", id, cm, s.completedMain)
		}
		remembered += n
	}
	for tr, r := range t.traces {
		if t.sessions[r.sess.id] != r.sess {
			return fmt.Errorf("trace %s points to a forgotten session", tr)
		}
		if traces[tr] != r.n || r.n <= 0 {
			return fmt.Errorf("trace %s: %d steps, counted %d", tr, traces[tr], r.n)
		}
	}

	// LRU list holds exactly the sessions.
	n := 0
	var prev *session
	for s := t.lruMRU; s != nil; s = s.lruNext {
		n++
		if s.lruPrev != prev || t.sessions[s.id] != s || n > len(t.sessions) {
			return fmt.Errorf("LRU list broken at %s", s.id)
		}
		prev = s
	}
	if n != len(t.sessions) || t.lruLRU != prev {
		return fmt.Errorf("LRU list has %d of %d sessions", n, len(t.sessions))
	}

	// Steps map: remembered steps plus orphans in flight.
	inflight := 0
	for id, st := range t.steps {
		if st.id != id {
			return fmt.Errorf("step %s filed under %s", st.id, id)
		}
		if !st.completed {
			inflight++
		}
		if st.sess == nil {
			remembered++ // orphan: counted to match len(t.steps)
			if st.completed {
				return fmt.Errorf("completed orphan %s kept", id)
			}
		}
	}
	if remembered != len(t.steps) {
		return fmt.Errorf("steps map holds %d, sessions and orphans %d", len(t.steps), remembered)
	}
	if inflight != t.inflight {
		return fmt.Errorf("in flight %d, counted %d", inflight, t.inflight)
	}

	// Idle heap.
	for i, st := range t.idle {
		if st.heapIdx != i || !st.completed || st.closed || st.sess == nil {
			return fmt.Errorf("idle heap entry %d (%s) invalid", i, st.id)
		}
		if i > 0 && t.idle.Less(i, (i-1)/2) {
			return fmt.Errorf("idle heap order broken at %d", i)
		}
	}
	return nil
}
