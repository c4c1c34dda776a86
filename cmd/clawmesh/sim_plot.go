package main

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/clawmesh/clawmesh/sim"
)

var simColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

// plotSim draws the run's figures into dir: the propagation of each
// version (over the devices live at its publication, and over those that
// stayed up until they held it) against its bound, and for the poison scenario the learning
// curves; with personal adapters, the share keeping up by mode and device
// class. It returns the files written.
func plotSim(r *sim.Report, dir string) ([]string, error) {
	var out []string
	p := plot.New()
	p.Title.Text = fmt.Sprintf("clawmesh sim %s (seed %d): time for a version to reach the devices", r.Scenario, r.Seed)
	p.X.Label.Text = "version"
	p.Y.Label.Text = "seconds after publication"
	p.Add(plotter.NewGrid())
	series := []struct {
		name string
		get  func(v sim.VersionReport) float64
	}{
		{"50%", func(v sim.VersionReport) float64 { return v.Reach50 }},
		{"95%", func(v sim.VersionReport) float64 { return v.Reach95 }},
		{"99%", func(v sim.VersionReport) float64 { return v.Reach99 }},
		{"99% of those that stayed up", func(v sim.VersionReport) float64 { return v.AwakeReach99 }},
		{"bound 99%", func(v sim.VersionReport) float64 { return v.Bound99 }},
		{"2x bound 99%", func(v sim.VersionReport) float64 { return 2 * v.Bound99 }},
	}
	for i, s := range series {
		var pts plotter.XYs
		for _, v := range r.Versions {
			if y := s.get(v); y >= 0 {
				pts = append(pts, plotter.XY{X: float64(v.Version), Y: y})
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := simColors[i%len(simColors)]
		line.Color, points.Color = c, c
		points.Shape = draw.CircleGlyph{}
		if i >= 4 {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		}
		p.Add(line, points)
		p.Legend.Add(s.name, line, points)
	}
	p.Y.Min = 0
	p.Legend.Top = false
	path := filepath.Join(dir, "sim-"+r.Scenario+"-propagation.png")
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return nil, err
	}
	out = append(out, path)

	if len(r.Poison) > 0 || len(r.Learning) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("clawmesh sim %s (seed %d): learning curve", r.Scenario, r.Seed)
		p.X.Label.Text = "version"
		p.Y.Label.Text = "score (1 = the target adapter)"
		p.Y.Min, p.Y.Max = 0, 1
		p.Add(plotter.NewGrid())
		curves := r.Poison
		if len(curves) == 0 {
			curves = []sim.PoisonRun{{Defences: "this run", Scores: r.Learning, Final: last(r.Learning)}}
		}
		if t := r.Trust; t != nil {
			curves = append(curves, sim.PoisonRun{Defences: "clean", Scores: t.CleanScores, Final: last(t.CleanScores)})
		}
		for i, c := range curves {
			pts := make(plotter.XYs, len(c.Scores))
			for j, s := range c.Scores {
				pts[j] = plotter.XY{X: float64(j + 1), Y: s}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			col := simColors[i%len(simColors)]
			line.Color, points.Color = col, col
			line.Width = vg.Points(1.5)
			points.Shape = draw.CircleGlyph{}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s (%.2f)", c.Defences, c.Final), line, points)
		}
		p.Legend.Top = false
		p.Legend.Left = false
		path := filepath.Join(dir, "sim-"+r.Scenario+"-learning.png")
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	if len(r.Sweep) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("clawmesh sim relays (seed %d): 99%% of the devices, median over versions", r.Seed)
		p.X.Label.Text = "NAT share, relays"
		p.Y.Label.Text = "seconds after publication"
		p.Add(plotter.NewGrid())
		vals := make(plotter.Values, len(r.Sweep))
		names := make([]string, len(r.Sweep))
		p.Y.Min = 0
		for i, s := range r.Sweep {
			vals[i] = max(s.MedianReach99, 0)
			p.Y.Max = max(p.Y.Max, 1.1*vals[i])
			names[i] = fmt.Sprintf("%.0f%%, %d", 100*s.NATShare, s.Relays)
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(30))
		if err != nil {
			return nil, err
		}
		bars.Color = simColors[0]
		p.Add(bars)
		p.NominalX(names...)
		path := filepath.Join(dir, "sim-relays-sweep.png")
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	if t := r.Trust; t != nil && len(t.Sweep) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("clawmesh sim trust (seed %d): rogue volunteers absorbed up to %.0f%%", r.Seed, 100*t.Absorbed)
		p.X.Label.Text = "rogue volunteers among the trainers (%)"
		p.Y.Label.Text = "worst seed's final and area / clean"
		p.Y.Min, p.Y.Max = 0, 1.05
		p.Add(plotter.NewGrid())
		pts := make(plotter.XYs, len(t.Sweep))
		for i, s := range t.Sweep {
			pts[i] = plotter.XY{X: 100 * s.Share, Y: max(s.WorstRatio, 0)}
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = simColors[0], simColors[0]
		points.Shape = draw.CircleGlyph{}
		limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0.9}, {X: 100 * t.Sweep[len(t.Sweep)-1].Share, Y: 0.9}})
		if err != nil {
			return nil, err
		}
		limit.Color = simColors[1%len(simColors)]
		limit.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(line, points, limit)
		p.Legend.Add("worst ratio to clean", line, points)
		p.Legend.Add("within 10%", limit)
		p.Legend.Top, p.Legend.Left = false, true
		path := filepath.Join(dir, "sim-trust-absorbed.png")
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	if pr := r.Personal; pr != nil && len(pr.Groups) > 0 {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("clawmesh sim (seed %d): personal adapters keeping up over %.0f h", r.Seed, pr.Hours)
		p.X.Label.Text = "mode, device class"
		p.Y.Label.Text = fmt.Sprintf("share keeping up (oldest untrained step at most %.0f h old)", pr.KeepUpH)
		p.Y.Min, p.Y.Max = 0, 1.05
		p.Add(plotter.NewGrid())
		vals := make(plotter.Values, len(pr.Groups))
		names := make([]string, len(pr.Groups))
		for i, g := range pr.Groups {
			vals[i] = g.KeepUp
			names[i] = fmt.Sprintf("%s, %s (%d)", g.Mode, g.Class, g.Devices)
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(30))
		if err != nil {
			return nil, err
		}
		bars.Color = simColors[2]
		p.Add(bars)
		p.NominalX(names...)
		path := filepath.Join(dir, "sim-"+r.Scenario+"-personal.png")
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	return out, nil
}

// last is the last of xs, 0 if none.
func last(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}
