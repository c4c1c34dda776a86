package session

// node is one vertex of the prefix tree shared by every session. The path
// from the root to a node is a sequence of canonical message keys; a node
// holds the steps whose request, or whose request plus one reply, ends
// exactly there. Messages themselves are never stored: next states are cut
// from the call that reveals them.
type node struct {
	parent *node
	key    uint64

	// Children: a short slice while few (most nodes have one child), a map
	// beyond that (a shared system prompt may have thousands).
	few  []*node
	many map[uint64]*node

	reqs []*step // steps whose request (minus volatile messages) ends here
	hist []*step // completed steps whose request + one reply ends here
}

const fewKids = 8

func (n *node) child(k uint64) *node {
	if n.many != nil {
		return n.many[k]
	}
	for _, c := range n.few {
		if c.key == k {
			return c
		}
	}
	return nil
}

func (n *node) kids() int {
	if n.many != nil {
		return len(n.many)
	}
	return len(n.few)
}

func (n *node) addChild(c *node) {
	if n.many == nil && len(n.few) < fewKids {
		n.few = append(n.few, c)
		return
	}
	if n.many == nil {
		n.many = make(map[uint64]*node, 2*fewKids)
		for _, o := range n.few {
			n.many[o.key] = o
		}
		n.few = nil
	}
	n.many[c.key] = c
}

func (n *node) removeChild(c *node) {
	if n.many != nil {
		delete(n.many, c.key)
		return
	}
	for i, o := range n.few {
		if o == c {
			n.few = append(n.few[:i], n.few[i+1:]...)
			return
		}
	}
}

// unused reports whether nothing ends at or below n.
func (n *node) unused() bool {
	return n.kids() == 0 && len(n.reqs) == 0 && len(n.hist) == 0
}

// latest returns the most recently added step of list that ok accepts.
func latest(list []*step, ok func(*step) bool) *step {
	for i := len(list) - 1; i >= 0; i-- {
		if ok(list[i]) {
			return list[i]
		}
	}
	return nil
}

func removeStep(list []*step, s *step) []*step {
	for i, o := range list {
		if o == s {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// tree owns the root and counts nodes.
type tree struct {
	root  node
	nodes int
}

// extend follows or creates the path keys[from:] below n and returns its end.
func (t *tree) extend(n *node, keys []uint64) *node {
	for _, k := range keys {
		c := n.child(k)
		if c == nil {
			c = &node{parent: n, key: k}
			n.addChild(c)
			t.nodes++
		}
		n = c
	}
	return n
}

// prune removes n and its ancestors while nothing ends at or below them.
func (t *tree) prune(n *node) {
	for n != &t.root && n.unused() {
		p := n.parent
		p.removeChild(n)
		n.parent = nil
		t.nodes--
		n = p
	}
}
