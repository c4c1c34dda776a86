package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/clawmesh/clawmesh/sim/live"
)

// plotDemo draws the score per round of every recipe to a PNG file. It is
// the demo's presentation, as sim_plot.go is the simulator's: it stays
// beside the command, and keeps the plotting library out of sim/live.
func plotDemo(rep *live.Report, path string) error {
	p, err := demoPlot(rep)
	if err != nil {
		return err
	}
	// The legend goes right of the plot, where no line can run under it.
	const w, h = 10 * vg.Inch, 5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	legend := p.Legend
	lw := legend.Rectangle(dc).Size().X + 2*legendPad
	p.Legend = plot.NewLegend() // drawn apart, below
	p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
	legend.Draw(draw.Crop(dc, w-lw+legendPad, 0, 0, -4*legendPad))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// legendPad is the room around the legend.
const legendPad = vg.Length(10)

// demoPlot is the plot of rep's score per round, its legend to be drawn
// beside it.
func demoPlot(rep *live.Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "clawmesh demo: personalization score per round"
	p.X.Label.Text = "round (users talk, trainers train, nodes swap)"
	p.Y.Label.Text = "score (share of held-back replies accepted)"
	// A margin around [0, 1] and the rounds, so that points at 0 and 1
	// and at the first and last round show whole; ticks on 0..1 only.
	p.Y.Min, p.Y.Max = -0.04, 1.04
	p.Y.Tick.Marker = plot.ConstantTicks(scoreTicks())
	rounds := 1
	for _, run := range rep.Runs {
		rounds = max(rounds, len(run.Rounds)-1)
	}
	p.X.Min, p.X.Max = -0.3, float64(rounds)+0.3
	p.X.Tick.Marker = plot.ConstantTicks(roundTicks(rounds))
	p.Add(plotter.NewGrid())
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}}
	if rep.Conflict {
		p.Title.Text = "clawmesh demo --conflict: each user's score, shared alone (dashed) and shared + personal"
		return p, conflictLines(p, rep, colors)
	}
	for i, run := range rep.Runs {
		pts := make(plotter.XYs, len(run.Rounds))
		for j, r := range run.Rounds {
			pts[j].X, pts[j].Y = float64(r.Round), r.Score
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := colors[i%len(colors)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(2)
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(fmt.Sprintf("%s (%.2f → %.2f)", run.Recipe, run.Before, run.After), line, points)
		if f := run.Failover; f != nil && i == 0 {
			v, err := plotter.NewLine(plotter.XYs{{X: float64(f.AfterRound) + 0.5, Y: p.Y.Min}, {X: float64(f.AfterRound) + 0.5, Y: p.Y.Max}})
			if err != nil {
				return nil, err
			}
			v.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
			v.Color = color.Gray{Y: 0x80}
			p.Add(v)
			p.Legend.Add("trainers' leader stopped", v)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p, nil
}

// scoreTicks marks 0, 0.2, ... 1 on the score axis.
func scoreTicks() []plot.Tick {
	var ts []plot.Tick
	for i := 0; i <= 10; i++ {
		t := plot.Tick{Value: float64(i) / 10}
		if i%2 == 0 {
			t.Label = fmt.Sprintf("%.1f", t.Value)
		}
		ts = append(ts, t)
	}
	return ts
}

// roundTicks marks every round, labelling at most about ten.
func roundTicks(rounds int) []plot.Tick {
	step := max(1, (rounds+9)/10)
	var ts []plot.Tick
	for r := 0; r <= rounds; r++ {
		t := plot.Tick{Value: float64(r)}
		if r%step == 0 {
			t.Label = fmt.Sprint(r)
		}
		ts = append(ts, t)
	}
	return ts
}

// conflictLines adds, for the first recipe run of a --conflict demo, two
// lines per user: the shared version alone (dashed) and shared + personal
// (solid), in the user's colour.
func conflictLines(p *plot.Plot, rep *live.Report, colors []color.Color) error {
	if len(rep.Runs) == 0 {
		return nil
	}
	run := rep.Runs[0]
	for u, info := range rep.Users {
		var shared, pers plotter.XYs
		for _, r := range run.Rounds {
			if r.SharedOnly != nil && u < len(r.SharedOnly.PerUser) {
				shared = append(shared, plotter.XY{X: float64(r.Round), Y: r.SharedOnly.PerUser[u]})
			}
			if u < len(r.PerUser) {
				pers = append(pers, plotter.XY{X: float64(r.Round), Y: r.PerUser[u]})
			}
		}
		c := colors[u%len(colors)]
		for _, l := range []struct {
			pts    plotter.XYs
			dashed bool
			label  string
		}{{shared, true, "shared alone"}, {pers, false, "shared + personal"}} {
			if len(l.pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(l.pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = c, c
			line.Width = vg.Points(2)
			points.Shape = draw.CircleGlyph{}
			if l.dashed {
				line.Dashes = []vg.Length{vg.Points(5), vg.Points(4)}
				points.Shape = draw.BoxGlyph{}
			}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s, %s (%.2f)", info.Name, l.label, l.pts[len(l.pts)-1].Y), line, points)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return nil
}
