package tokenizer

import (
	"container/heap"
	"sync"
)

// merge is one BPE rule: the pair (a, b) of ids becomes id at priority rank
// (lower merges first).
type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpe applies merges to a word given as its initial symbol ids (one per
// byte) and appends the result to out. Among the applicable pairs the one
// with the lowest rank merges first, the leftmost on ties, exactly as
// Hugging Face tokenizers does.
func (t *Tokenizer) bpe(out []int, word []int32) []int {
	if len(word) <= smallWord {
		return t.bpeSmall(out, word)
	}
	return t.bpeHeap(out, word)
}

// smallWord is the length up to which the quadratic scan beats the heap.
const smallWord = 48

func (t *Tokenizer) bpeSmall(out []int, word []int32) []int {
	var buf [smallWord]int32
	w := append(buf[:0], word...)
	for len(w) > 1 {
		best, bestRank, bestID := -1, int32(0), int32(0)
		for i := 0; i+1 < len(w); i++ {
			if m, ok := t.merges[pairKey(w[i], w[i+1])]; ok && (best < 0 || m.rank < bestRank) {
				best, bestRank, bestID = i, m.rank, m.id
			}
		}
		if best < 0 {
			break
		}
		w[best] = bestID
		w = append(w[:best+1], w[best+2:]...)
	}
	for _, id := range w {
		out = append(out, int(id))
	}
	return out
}

// pairItem is a candidate merge of the symbol at pos with its successor.
type pairItem struct {
	rank        int32
	pos         int32
	left, right int32 // ids expected at pos and at its successor
}

type pairHeap []pairItem

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairItem)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bpeHeap is the O(n log n) form for long words: symbols in a linked list,
// candidate pairs in a heap, stale candidates skipped when popped.
func (t *Tokenizer) bpeHeap(out []int, word []int32) []int {
	n := len(word)
	ids := append([]int32(nil), word...)
	next := make([]int32, n)
	prev := make([]int32, n)
	alive := make([]bool, n)
	for i := range n {
		next[i], prev[i], alive[i] = int32(i+1), int32(i-1), true
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	push := func(p int32) {
		if p < 0 || next[p] < 0 {
			return
		}
		q := next[p]
		if m, ok := t.merges[pairKey(ids[p], ids[q])]; ok {
			h = append(h, pairItem{rank: m.rank, pos: p, left: ids[p], right: ids[q]})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(int32(i))
	}
	heap.Init(&h)
	for h.Len() > 0 {
		it := heap.Pop(&h).(pairItem)
		p := it.pos
		q := next[p]
		if !alive[p] || q < 0 || ids[p] != it.left || ids[q] != it.right {
			continue
		}
		ids[p] = t.merges[pairKey(it.left, it.right)].id
		alive[q] = false
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if m, ok := t.merges[pairKey(ids[pp], ids[p])]; ok {
				heap.Push(&h, pairItem{rank: m.rank, pos: pp, left: ids[pp], right: ids[p]})
			}
		}
		if nq := next[p]; nq >= 0 {
			if m, ok := t.merges[pairKey(ids[p], ids[nq])]; ok {
				heap.Push(&h, pairItem{rank: m.rank, pos: p, left: ids[p], right: ids[nq]})
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, int(ids[i]))
	}
	return out
}

// wordCache memoizes the ids of pre-tokenized pieces. It stops admitting
// entries once full (Hugging Face does the same), which bounds memory
// without eviction bookkeeping on the hot path.
type wordCache struct {
	mu  sync.RWMutex
	m   map[string][]int
	max int
}

func (c *wordCache) get(k string) ([]int, bool) {
	if c.max <= 0 {
		return nil, false
	}
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

func (c *wordCache) put(k string, v []int) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	if len(c.m) < c.max {
		c.m[k] = v
	}
	c.mu.Unlock()
}
