package dashboard

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/pool"
)

func TestNewChart(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	since := now.Add(-24 * time.Hour)
	for _, c := range []struct {
		name    string
		rewards []Reward
		dots    int
		levels  int // points in the line / 2
		from    time.Time
	}{
		{"none", nil, 0, 0, since},
		{"one", []Reward{{At: now.Add(-time.Hour), Value: 0.5}}, 1, 1, now.Add(-time.Hour)},
		{"two spans", []Reward{{At: now.Add(-2 * time.Hour), Value: -1}, {At: now.Add(-2 * time.Hour), Value: 1}, {At: now.Add(-time.Second), Value: 1}}, 3, 2, now.Add(-2 * time.Hour)},
		{"just now", []Reward{{At: now, Value: 0}}, 1, 1, now.Add(-time.Minute)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch := NewChart(c.rewards, since, now)
			if len(ch.Dots) != c.dots {
				t.Fatalf("%d dots", len(ch.Dots))
			}
			pts := strings.Fields(ch.Line)
			if len(pts) != 2*c.levels {
				t.Fatalf("line %q", ch.Line)
			}
			if !ch.From.Equal(c.from) {
				t.Fatalf("from %v, want %v", ch.From, c.from)
			}
			for _, d := range ch.Dots {
				if d.X < padL || d.X > chartW-padR || d.Y < padT || d.Y > chartH-padB {
					t.Fatalf("dot %+v off the plot", d)
				}
			}
		})
	}
	// The mean of a span is its level: -1 and +1 in one span are 0.
	ch := NewChart([]Reward{{At: now.Add(-time.Hour), Value: -1}, {At: now.Add(-time.Hour), Value: 1}}, since, now)
	if !strings.HasSuffix(strings.Fields(ch.Line)[0], ","+ftoa(ch.Zero)) {
		t.Fatalf("line %q, zero at %v", ch.Line, ch.Zero)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TestRenderEscapes checks that what a page shows from the pool is
// escaped: a batch id or an error that held markup would not run.
func TestRenderEscapes(t *testing.T) {
	now := time.Now()
	d := &Data{Now: now, Since: now.Add(-time.Hour), Stats: pool.Stats{Steps: 1, ByState: map[core.State]int{core.StateScored: 1}},
		Errors:  []string{`<script>alert(1)</script>`},
		Batches: []*pool.Batch{{ID: core.BatchID(`"><img src=x>`), Created: now}}}
	var buf bytes.Buffer
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, "<script>") || strings.Contains(out, "<img") {
		t.Fatalf("markup from data reached the page:\n%s", out)
	}
	if !strings.Contains(out, `id="steps-total">1<`) || !strings.Contains(out, `data-state="scored">1<`) {
		t.Fatal("figures missing")
	}
}

// TestRenderMeshNode renders what a node in a mesh shows: the version
// serving, the lineage with each version's held-out pass@1, the peers,
// when each version first served.
func TestRenderMeshNode(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	lineage := []Version{
		{Number: 3, Name: "v3", Parent: "v2", Term: 3, Index: 52, Created: now.Add(-30 * time.Minute), Evals: []adapters.Eval{
			{Task: "0123456789abcdef", Prompts: 4, Passed: 4, PassAt1: 1, MeanReward: 1}, {Task: "fedcba9876543210", Prompts: 10, Passed: 1, PassAt1: 0.1}}},
		{Number: 2, Name: "v2", Parent: "v1", Term: 3, Index: 41, Created: now.Add(-90 * time.Minute), Evals: []adapters.Eval{{Task: "0123456789abcdef", Prompts: 4, Passed: 3, PassAt1: 0.75, MeanReward: 0.5}}},
		{Number: 1, Name: "v1", Parent: "base", Term: 2, Index: 20},
	}
	d := &Data{Now: now, Since: now.Add(-24 * time.Hour),
		Stats:       pool.Stats{Steps: 5, ByState: map[core.State]int{core.StateShipped: 4, core.StateOpen: 1}},
		Rewards:     []Reward{{At: now.Add(-2 * time.Hour), Value: -0.5}, {At: now.Add(-time.Hour), Value: 0.75, Adapter: "v2"}},
		Batches:     []*pool.Batch{{ID: "b2", Steps: []core.StepID{"s3", "s4"}, Created: now.Add(-time.Minute), Shipped: now}},
		Mesh:        &peer.Status{MeshID: "mesh-1", PeerID: "12D3KooWnode", Role: "node", Connected: 3},
		Peers:       []peer.PeerInfo{{PeerID: "12D3KooWtrainerA", Role: "trainer", Since: now.Add(-time.Hour)}},
		Weights:     &adapters.Status{Serving: "v2", Latest: "v2", Versions: []adapters.Version{{Version: "v2", State: "serving", Term: 3, Index: 41}, {Version: "v1", State: "installed", Term: 2, Index: 20}}},
		Lineage:     lineage,
		FirstServed: map[string]time.Time{"v2": now.Add(-time.Hour), "base": now.Add(-3 * time.Hour)},
		ServedSteps: map[string]int{"v2": 1, "base": 4},
	}
	var buf bytes.Buffer
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		`id="serving">v2<`, `id="peers-connected">3<`, `id="peers-admitted">1<`, `<td>v2</td><td>v1</td><td>3 / 41</td>`,
		`<td>v1</td><td>base</td>`, `href="/clawmesh/v1/mesh/batches/b2"`, `id="batches-shipped">1<`, `id="mean-reward">&#43;0.12<`,
		`<td>v2</td><td>2026-11-25 11:00:00Z</td><td>1</td>`,
		`<th>held-out pass@1</th></tr>`,
		// pass@1 per version: one task set, several, none.
		`<td>v2</td><td>v1</td><td>3 / 41</td><td>2026-11-25 10:30:00Z</td><td>0.75 (3/4)</td></tr>`,
		`<td>v3</td><td>v2</td><td>3 / 52</td><td>2026-11-25 11:30:00Z</td><td>01234567 1.00 (4/4), fedcba98 0.10 (1/10)</td></tr>`,
		`<td>v1</td><td>base</td><td>2 / 20</td><td>0001-01-01 00:00:00Z</td><td></td></tr>`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(out, `id="revoked"`) {
		t.Error("a member's page says it was removed")
	}
	// A device removed from the mesh says so, by whom and why.
	d.Mesh.Revoked, d.Mesh.RevokedBy, d.Mesh.RevokedReason = true, "the mesh admin", "sold <b>"
	buf.Reset()
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, `id="revoked">This device was removed from the mesh by the mesh admin (sold &lt;b&gt;)`) {
		t.Errorf("the page of a revoked device:\n%s", out)
	}
}

// TestRenderPersonal: the personal adapter's section shows its mode, the
// version serving, the steps learned, the score and each version; with none
// the page says how to turn it on.
func TestRenderPersonal(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	d := &Data{Now: now, Since: now.Add(-24 * time.Hour), Stats: pool.Stats{ByState: map[core.State]int{}},
		Personal: &personal.Status{Mode: personal.ModeLocal, Enabled: true, Current: "p2", Learned: 48, Score: 0.81,
			Versions: []personal.Record{{Version: "p1", Shared: "v3", Trained: 20, HeldBack: 5, ScoreBefore: 0.5, ScoreAfter: 0.62, At: now.Add(-time.Hour)},
				{Version: "p2", Shared: "v4", Trained: 28, HeldBack: 7, ScoreBefore: 0.62, ScoreAfter: 0.81, At: now}}}}
	var buf bytes.Buffer
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{`id="personal-mode">local<`, `id="personal-current">p2<`, `id="personal-learned">48<`, `id="personal-score">0.81<`,
		`<td>p2</td><td>v4</td><td>28</td><td>7</td><td>0.62 → 0.81</td>`} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	d.Personal = nil
	buf.Reset()
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `No personal adapter: set [personal] mode`) {
		t.Error("a page with no personal adapter does not say how to turn it on")
	}
}
