package dashboard

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
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
