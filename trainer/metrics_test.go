package trainer_test

import (
	"context"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// TestMetricsScrape scrapes a real trainer's /metrics over its admin
// listener after a round trained a batch, and checks the named series
// against its status.
func TestMetricsScrape(t *testing.T) {
	ctx := context.Background()
	c, err := harness.NewCluster(ctx, harness.ClusterOptions{Trainers: 1, Timing: testTiming, Group: testGroup, Dir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := c.Trainer(0)
	p, err := harness.SyntheticBatch(7, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	c.Ship(p)
	if err := c.WaitUntil(ctx, clusterWait, "a version trained", func() bool { return tr.Status().Versions >= 2 && tr.Addr() != nil }); err != nil {
		t.Fatal(err)
	}
	token, err := adminapi.LoadOrCreateToken(c.DataDir(0))
	if err != nil {
		t.Fatal(err)
	}
	get := func(tok string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+tr.Addr().String()+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := get(""); resp.StatusCode != http.StatusUnauthorized {
		resp.Body.Close()
		t.Fatalf("/metrics without the admin token: %s", resp.Status)
	}
	resp := get(token)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p2 := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p2.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("not Prometheus text: %v", err)
	}
	st := tr.Status()
	one := func(name string, labels ...string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Fatalf("no series %s", name)
		}
	next:
		for _, m := range f.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			if m.Histogram != nil {
				return float64(m.Histogram.GetSampleCount())
			}
			return m.Gauge.GetValue()
		}
		t.Fatalf("no series %s%v", name, labels)
		return 0
	}
	if one("clawmesh_trainer_leader") != 1 {
		t.Error("a lone trainer does not say it leads")
	}
	if got := one("clawmesh_trainer_rounds_total"); got < 1 || got > float64(st.Rounds) {
		t.Errorf("rounds %v, status says %d", got, st.Rounds)
	}
	if got := one("clawmesh_trainer_adapter_version"); got < 1 {
		t.Errorf("adapter version %v after a round", got)
	}
	if got := one("clawmesh_trainer_batches", "status", "trained"); got != 1 {
		t.Errorf("trained batches %v, want 1", got)
	}
	if got := one("clawmesh_trainer_batches_refused_total", "reason", "stale"); got != 0 {
		t.Errorf("stale refusals %v", got)
	}
	for _, name := range []string{"clawmesh_trainer_raft_term", "clawmesh_trainer_raft_applied_index", "clawmesh_trainer_max_lag_versions",
		"clawmesh_trainer_round_open", "clawmesh_trainer_versions", "clawmesh_weights_served_bytes_total", "clawmesh_weights_fetch_seconds"} {
		one(name)
	}
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
