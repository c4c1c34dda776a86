package weights

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
)

// TestMetricsAcceptedOnce: a version is counted accepted once, however
// often peers offer it again; a stale one and an uncertified one are
// counted refused, each under its reason.
func TestMetricsAcceptedOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for v := 0; v < 4; v++ {
		m.accept(nil, true)
		for range 7 {
			m.accept(nil, false) // offered again
		}
	}
	m.accept(chunks.ErrStale, false)
	m.accept(fmt.Errorf("%w: v9 carries no votes", chunks.ErrUncertified), false)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, x := range f.GetMetric() {
			name := f.GetName()
			for _, l := range x.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = x.GetCounter().GetValue()
		}
	}
	if v := got["clawmesh_weights_versions_accepted_total"]; v != 4 {
		t.Errorf("accepted %v after 4 versions, want 4", v)
	}
	for _, r := range []string{"stale", "uncertified"} {
		if v := got["clawmesh_weights_versions_refused_total/"+r]; v != 1 {
			t.Errorf("refused %s %v, want 1 (%v)", r, v, got)
		}
	}
}
