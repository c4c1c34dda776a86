// Package dashboard renders a node's page for its owner, served by the
// gateway at /clawmesh/: the steps the node recorded and scored, the
// rewards over time (an SVG chart drawn on the server), the batches that
// left the device (with a link to preview the next one, scrubbed), the
// adapter versions the trainers published and when each first answered a
// call here, the mesh's peers, and the trainers' progress as far as a node
// can know it: the versions' lineage from their signed manifests, with
// each version's held-out pass@1 on the mesh's task sets.
//
// The page is one server-rendered HTML document (html/template, embedded):
// no script, no build step, nothing fetched from elsewhere, so it works
// offline. The node gathers the figures (a Data) from the same sources its
// admin API answers from.
package dashboard

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/pool"
)

// Path is where the gateway serves the page.
const Path = "/clawmesh/"

// Data is what the page shows.
type Data struct {
	// Now is when the figures were gathered; Since the start of the window
	// the rewards chart covers.
	Now, Since time.Time
	// Stats are the pool's (as GET /clawmesh/v1/pool/stats answers).
	Stats pool.Stats
	// Rewards are the scored steps in the window, oldest first.
	Rewards []Reward
	// Batches are the outbox batches, newest first.
	Batches []*pool.Batch
	// Preview is the next batch to leave, if any steps wait: its steps
	// and sessions counts.
	PreviewSteps int
	// Mesh is the peer's status and Peers the peers admitted (nil outside
	// a mesh).
	Mesh  *peer.Status
	Peers []peer.PeerInfo
	// Weights are the adapter versions the node follows (nil when it
	// follows none), Lineage what their manifests say, newest first.
	Weights *adapters.Status
	Lineage []Version
	// FirstServed is, per adapter version ("base" for none), the first
	// recorded call it answered in the window, and ServedSteps how many
	// steps it answered there.
	FirstServed map[string]time.Time
	ServedSteps map[string]int
	// Personal is the device's personal adapter (nil when it has none).
	Personal *personal.Status
	// Errors are the parts that could not be read, with why.
	Errors []string
}

// Reward is one scored step on the chart.
type Reward struct {
	At      time.Time
	Value   float64
	Adapter string
}

// Version is an adapter version as its signed manifest describes it.
type Version struct {
	Number  uint64
	Name    string
	Parent  string // "base" for the first
	Term    uint64
	Index   uint64
	Created time.Time // when the trainers' leader signed it
	Bytes   uint64
	// Evals are its held-out evaluations on the task sets, as signed in
	// its manifest (none: not evaluated, or no task set).
	Evals []adapters.Eval
}

// Source gathers the page's figures.
type Source func(ctx context.Context) (*Data, error)

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"ago":   ago,
	"short": short,
	"state": func(st pool.Stats, s string) int {
		x, _ := core.ParseState(s)
		return st.ByState[x]
	},
	"bytes": humanBytes,
	"evals": adapters.FormatEvals,
	"utc":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"int64": func(u uint64) int64 { return int64(u) },
}).Parse(pageHTML))

// view is Data with what the template derives from it.
type view struct {
	*Data
	States  []string
	Chart   Chart
	Scored  int
	Mean    string
	Shipped int
	Served  []served
	Window  string
}

type served struct {
	Version string
	At      time.Time
	Steps   int
}

// Handler serves the page at Path from src; other paths under it are not
// found.
func Handler(src Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path && r.URL.Path != "/clawmesh" {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == "/clawmesh" {
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
			return
		}
		d, err := src(r.Context())
		if err != nil {
			http.Error(w, "the node's figures could not be read: "+err.Error(), http.StatusInternalServerError)
			return
		}
		var buf bytes.Buffer
		if err := Render(&buf, d); err != nil {
			http.Error(w, "the page could not be drawn: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		// Nothing on the page comes from elsewhere, and nothing runs.
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		w.Write(buf.Bytes())
	})
}

// Render writes the page for d.
func Render(w interface{ Write([]byte) (int, error) }, d *Data) error {
	v := view{Data: d}
	for _, s := range core.States {
		v.States = append(v.States, s.String())
	}
	v.Chart = NewChart(d.Rewards, d.Since, d.Now)
	v.Window = d.Now.Sub(d.Since).Round(time.Minute).String()
	if h := d.Now.Sub(d.Since).Hours(); h >= 1 && h == math.Trunc(h) {
		v.Window = fmt.Sprintf("%.0f hours", h)
	}
	sum := 0.0
	for _, r := range d.Rewards {
		sum += r.Value
	}
	v.Scored = len(d.Rewards)
	if v.Scored > 0 {
		v.Mean = fmt.Sprintf("%+.2f", sum/float64(v.Scored))
	}
	for _, b := range d.Batches {
		if !b.Shipped.IsZero() {
			v.Shipped++
		}
	}
	for ver, at := range d.FirstServed {
		v.Served = append(v.Served, served{Version: ver, At: at, Steps: d.ServedSteps[ver]})
	}
	sort.Slice(v.Served, func(i, j int) bool { return v.Served[i].At.After(v.Served[j].At) })
	return page.Execute(w, v)
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(max(d, 0)/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func humanBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}

// Chart is the rewards chart: each scored step a dot, and the mean of each
// of Bins spans of time a level of a step line, in an SVG viewBox of
// Width × Height. The time axis runs from the first reward in the window
// (or the window's start, when there is none) to now.
type Chart struct {
	Width, Height float64
	Dots          []Dot
	// Line is the means' polyline ("x,y x,y ..."): a level across each
	// span that has steps; "" with no step.
	Line string
	// Zero is the y of reward 0; Ticks the y axis' labels.
	Zero  float64
	Ticks []Tick
	// From and To label the x axis.
	From, To time.Time
}

// Dot is one step on the chart.
type Dot struct {
	X, Y  float64
	Title string
}

// Tick is a y axis label.
type Tick struct {
	Y     float64
	Label string
}

// Chart geometry.
const (
	chartW, chartH = 720.0, 240.0
	padL, padR     = 40.0, 10.0
	padT, padB     = 10.0, 24.0
	// Bins is how many spans of time the mean line has at most.
	Bins = 24
)

// NewChart lays rewards (oldest first) out between since and now.
func NewChart(rewards []Reward, since, now time.Time) Chart {
	if len(rewards) > 0 && rewards[0].At.After(since) && !rewards[0].At.After(now) {
		since = rewards[0].At
	}
	if now.Sub(since) < time.Minute {
		since = now.Add(-time.Minute)
	}
	c := Chart{Width: chartW, Height: chartH, From: since, To: now}
	y := func(v float64) float64 {
		v = math.Max(-1, math.Min(1, v))
		return round(padT + (1-v)/2*(chartH-padT-padB))
	}
	c.Zero = y(0)
	for _, v := range []float64{1, 0.5, 0, -0.5, -1} {
		c.Ticks = append(c.Ticks, Tick{Y: y(v), Label: fmt.Sprintf("%+.1f", v)})
	}
	span := now.Sub(since)
	if span <= 0 {
		span = time.Second
	}
	x := func(t time.Time) float64 {
		f := float64(t.Sub(since)) / float64(span)
		return round(padL + math.Max(0, math.Min(1, f))*(chartW-padL-padR))
	}
	var sums [Bins]float64
	var counts [Bins]int
	for _, r := range rewards {
		c.Dots = append(c.Dots, Dot{X: x(r.At), Y: y(r.Value), Title: fmt.Sprintf("%+.2f at %s (%s)", r.Value, r.At.UTC().Format("15:04:05"), adapterName(r.Adapter))})
		b := int(float64(r.At.Sub(since)) / float64(span) * Bins)
		b = max(0, min(Bins-1, b))
		sums[b] += r.Value
		counts[b]++
	}
	var line bytes.Buffer
	for b := range Bins {
		if counts[b] == 0 {
			continue
		}
		from := since.Add(time.Duration(float64(b) / Bins * float64(span)))
		to := since.Add(time.Duration(float64(b+1) / Bins * float64(span)))
		if line.Len() > 0 {
			line.WriteByte(' ')
		}
		mean := y(sums[b] / float64(counts[b]))
		fmt.Fprintf(&line, "%g,%g %g,%g", x(from), mean, x(to), mean)
	}
	c.Line = line.String()
	return c
}

func adapterName(a string) string {
	if a == "" {
		return "base"
	}
	return a
}

func round(f float64) float64 { return math.Round(f*10) / 10 }
