package tokenizer

import (
	"sort"
	"strings"
)

// addedMatcher finds added tokens in text: the leftmost occurrence, and the
// longest token among those starting there (Hugging Face's LeftmostLongest).
type addedMatcher struct {
	first [256]bool
	byte0 map[byte][]string // candidates by first byte, longest first
	ids   map[string]int
}

func newAddedMatcher(tokens []AddedToken) *addedMatcher {
	m := &addedMatcher{byte0: map[byte][]string{}, ids: map[string]int{}}
	for _, a := range tokens {
		c := a.Content
		m.ids[c] = a.ID
		m.first[c[0]] = true
		m.byte0[c[0]] = append(m.byte0[c[0]], c)
	}
	for _, l := range m.byte0 {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i]) > len(l[j]) })
	}
	return m
}

// find returns the byte offset and length of the first added token in s and
// its id, or i = -1.
func (m *addedMatcher) find(s string) (i, n, id int) {
	if len(m.byte0) == 0 {
		return -1, 0, 0
	}
	for i = 0; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		for _, c := range m.byte0[s[i]] {
			if strings.HasPrefix(s[i:], c) {
				return i, len(c), m.ids[c]
			}
		}
	}
	return -1, 0, 0
}
