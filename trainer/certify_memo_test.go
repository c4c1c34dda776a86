package trainer

import (
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// What a trainer remembers of versions' checks and votes stays bounded,
// and keeps the newest version's.
func TestCertMemoPruned(t *testing.T) {
	var c certState
	c.init()
	keep := versionKey(group.Version{Version: 90, Hash: "h90", Index: 900})
	for v := range 100 {
		k := versionKey(group.Version{Version: uint64(v), Hash: fmt.Sprint("h", v), Index: uint64(v * 10)})
		c.mu.Lock()
		c.checked[k] = &chunks.Manifest{}
		c.sent[k+"/set"] = "leader"
		c.votes[k+"/set"] = map[mesh.PeerID][]byte{"a": nil}
		c.lastCheck[k] = time.Now()
		c.prune(keep)
		c.mu.Unlock()
	}
	if n := len(c.checked) + len(c.sent) + len(c.votes) + len(c.lastCheck); n > maxCertMemo+4 {
		t.Fatalf("%d entries remembered", n)
	}
	c.mu.Lock()
	c.prune(keep)
	c.mu.Unlock()
	if c.checked[keep] == nil || c.sent[keep+"/set"] == "" || c.votes[keep+"/set"] == nil {
		t.Fatal("the newest version's memory was dropped")
	}
}
