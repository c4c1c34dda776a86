package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/clawmesh/clawmesh/sim/live"
)

// plotDemo draws the score per round of every recipe to a PNG file. It is
// the demo's presentation, as sim_plot.go is the simulator's: it stays
// beside the command, and keeps the plotting library out of sim/live.
func plotDemo(rep *live.Report, path string) error {
	p := plot.New()
	p.Title.Text = "clawmesh demo: personalization score per round"
	p.X.Label.Text = "round (users talk, trainers train, nodes swap)"
	p.Y.Label.Text = "score (share of held-back replies accepted)"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}}
	for i, run := range rep.Runs {
		pts := make(plotter.XYs, len(run.Rounds))
		for j, r := range run.Rounds {
			pts[j].X, pts[j].Y = float64(r.Round), r.Score
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		c := colors[i%len(colors)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(2)
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(fmt.Sprintf("%s (%.2f → %.2f)", run.Recipe, run.Before, run.After), line, points)
		if f := run.Failover; f != nil && i == 0 {
			v, err := plotter.NewLine(plotter.XYs{{X: float64(f.AfterRound) + 0.5, Y: 0}, {X: float64(f.AfterRound) + 0.5, Y: 1}})
			if err != nil {
				return err
			}
			v.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
			v.Color = color.Gray{Y: 0x80}
			p.Add(v)
			p.Legend.Add("trainers' leader stopped", v)
		}
	}
	p.Legend.Top = false
	p.Legend.Left = false
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
