package pool

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// Stats counts the steps each adapter version served.
func TestStatsByAdapter(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	for i, a := range []string{"v1", "v1", "v2", "", `v"odd`, "v2"} {
		s := simpleStep(core.StepID(string(rune('a'+i))), "s", t0.Add(time.Duration(i)*time.Second), core.StateClosed, "hi")
		s.Adapter = a
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	st, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"v1": 2, "v2": 2, `v"odd`: 1}; !maps.Equal(st.ByAdapter, want) {
		t.Fatalf("by adapter %v, want %v", st.ByAdapter, want)
	}
}
