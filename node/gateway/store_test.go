package gateway

import (
	"testing"

	"github.com/clawmesh/clawmesh/node/gateway/storetest"
	"github.com/clawmesh/clawmesh/pool"
)

// TestStoreConformance runs the store suite against the test store the
// other gateway tests use and against the Pebble pool.
func TestStoreConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Store { return newMemStore() })
	})
	t.Run("pool", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Store {
			p, err := pool.Open(t.TempDir(), pool.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		})
	})
}

var (
	_ Applier = (*pool.Pool)(nil)
	_ Applier = (*memStore)(nil)
)
