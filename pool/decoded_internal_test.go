package pool

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// mapGetter serves blobs from a map.
type mapGetter map[string][]byte

func (g mapGetter) Get(key []byte) ([]byte, io.Closer, error) {
	v, ok := g[string(key)]
	if !ok {
		return nil, nil, pebble.ErrNotFound
	}
	return v, io.NopCloser(nil), nil
}

// TestDecodedCacheCountsEntries: a cache of short messages stays within
// its budget counting what each entry holds, not only its JSON bytes
// (which let it grow to several times the budget), and a cache that starts
// over gives back what it held.
func TestDecodedCacheCountsEntries(t *testing.T) {
	g := mapGetter{}
	var hs []hash
	for i := range 10000 {
		b, _ := json.Marshal(core.Message{Role: "user", Content: fmt.Sprintf("hi %d", i)})
		h := hash(sha256.Sum256(b))
		g[string(blobKey(prefixMsg, h))] = b
		hs = append(hs, h)
	}
	const budget = 64 << 10
	c := newDecodedCache(budget)
	most := 0
	for i, h := range hs {
		m, err := c.message(g, h)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("hi %d", i); m.Content != want {
			t.Fatalf("message %d: %q", i, m.Content)
		}
		most = max(most, len(c.msgs))
		if c.size > budget {
			t.Fatalf("size %d over the budget %d", c.size, budget)
		}
	}
	// Each entry is charged at least the overhead: no more entries than
	// the budget pays for.
	if most > budget/decodedEntryOverhead {
		t.Errorf("the cache held %d short messages at once, more than %d the budget pays for", most, budget/decodedEntryOverhead)
	}
	if most < budget/(4*decodedEntryOverhead) {
		t.Errorf("the cache held only %d messages at once", most)
	}
	// A hit is served from the cache (the blob is gone from the store).
	last := hs[len(hs)-1]
	delete(g, string(blobKey(prefixMsg, last)))
	if _, err := c.message(g, last); err != nil {
		t.Errorf("a cached message was read again: %v", err)
	}
}
