// Package plot draws the harness's charts as PNG through gonum.org/v1/plot: line charts and
// scatter plots over a linear or log-scaled x axis, and CDFs. It only chooses, once for every
// bench chart, what gonum leaves open: size, colours, ticks, grid and where the legend goes.
package plot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line (or set of points) of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Scale is how the x axis maps values.
type Scale int

const (
	Linear Scale = iota
	Log2         // log-scaled, ticks at powers of two (batch sizes)
	Log10        // log-scaled, ticks at 1, 2 and 5 × 10ⁿ (latencies, whose tails span decades)
)

// Chart describes a chart. Width and Height are pixels, 900 × 540 when either is not positive.
// Non-finite values are skipped, and so are values ≤ 0 on a log-scaled axis.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	XScale                Scale
	Points                bool // draw points, not lines
	Width, Height         int
}

// Palette is the series colours, in order (Okabe–Ito, colour-blind safe).
var Palette = []color.RGBA{
	{0, 114, 178, 255}, {213, 94, 0, 255}, {0, 158, 115, 255}, {204, 121, 167, 255},
	{230, 159, 0, 255}, {86, 180, 233, 255}, {0, 0, 0, 255}, {240, 228, 66, 255},
}

const (
	dpi    = 96           // 12 pt text is 16 pixels high
	margin = vg.Length(9) // points around the chart; gonum draws up to the edges
	// Lines with at most this many points mark them (a sweep's measurements); more (a CDF)
	// would blur into a thick line.
	markUpTo = 64
)

// sans is the text face: Liberation Sans (compiled in with gonum's fonts).
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// CDF turns samples into a cumulative distribution series (x: value, y: fraction ≤ x).
func CDF(name string, values []float64) Series {
	v := slices.Clone(values)
	v = slices.DeleteFunc(v, func(x float64) bool { return !finite(x) })
	slices.Sort(v)
	s := Series{Name: name}
	for i, x := range v {
		s.X = append(s.X, x)
		s.Y = append(s.Y, float64(i+1)/float64(len(v)))
	}
	return s
}

// SavePNG writes the chart to path.
func (c Chart) SavePNG(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// WritePNG writes the chart to w as PNG.
func (c Chart) WritePNG(w io.Writer) error {
	img, err := c.draw()
	if err != nil {
		return err
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// draw renders the chart onto a new canvas.
func (c Chart) draw() (*vgimg.Canvas, error) {
	w, h := c.Width, c.Height
	if w <= 0 || h <= 0 {
		w, h = 900, 540
	}
	p := gplot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.Title, c.XLabel, c.YLabel
	p.Title.Padding = vg.Points(6)
	p.Title.TextStyle.Font = font.From(sans, 13)
	for _, a := range []*gplot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 11)
		a.Tick.Label.Font = font.From(sans, 10)
	}
	p.Legend.TextStyle.Font = font.From(sans, 11)
	p.Add(plotter.NewGrid())
	for i, s := range c.Series {
		xys := c.points(s)
		if len(xys) == 0 {
			continue
		}
		col := Palette[i%len(Palette)]
		var thumb gplot.Thumbnailer
		if c.Points {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, fmt.Errorf("series %q: %w", s.Name, err)
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(1.5), Shape: draw.CircleGlyph{}}
			p.Add(sc)
			thumb = sc
		} else {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("series %q: %w", s.Name, err)
			}
			l.LineStyle = draw.LineStyle{Color: col, Width: vg.Points(1.5)}
			p.Add(l)
			thumb = l
			if len(xys) <= markUpTo {
				sc, _ := plotter.NewScatter(xys) // the same points: cannot fail
				sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
				p.Add(sc)
			}
		}
		// One series is named by the axis label; a legend would only hide data.
		if len(c.Series) > 1 {
			p.Legend.Add(s.Name, thumb)
		}
	}
	c.axes(p)
	// Rising lines (CDFs, throughput from 0) leave the lower right empty.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), vg.Points(8)
	img := vgimg.NewWith(vgimg.UseWH(vg.Length(w)*vg.Inch/dpi, vg.Length(h)*vg.Inch/dpi), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	dc.SetColor(color.White) // the margin; gonum fills only what it draws in
	dc.Fill(dc.Rectangle.Path())
	p.Draw(draw.Crop(dc, margin, -margin, margin, -margin))
	return img, nil
}

// points are a series' finite (and, on a log axis, positive) points.
func (c Chart) points(s Series) plotter.XYs {
	var xys plotter.XYs
	for j := range min(len(s.X), len(s.Y)) {
		x, y := s.X[j], s.Y[j]
		if !finite(x) || !finite(y) || (c.XScale != Linear && x <= 0) {
			continue
		}
		xys = append(xys, plotter.XY{X: x, Y: y})
	}
	return xys
}

// axes sets the ranges, the x scale and both tickers. y starts at 0 when all values are
// positive, so heights compare.
func (c Chart) axes(p *gplot.Plot) {
	if math.IsInf(p.X.Min, 1) { // no data
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
		if c.XScale != Linear {
			p.X.Min, p.X.Max = 1, 10
		}
	}
	p.Y.Min = min(p.Y.Min, 0)
	if p.Y.Max == p.Y.Min {
		p.Y.Max = p.Y.Min + 1
	}
	if p.X.Max == p.X.Min {
		p.X.Max = p.X.Min * 2
		if p.X.Min == 0 {
			p.X.Max = 1
		}
	}
	p.Y.Tick.Marker = linearTicks{}
	switch c.XScale {
	case Log2:
		p.X.Scale, p.X.Tick.Marker = gplot.LogScale{}, logTicks{base: 2}
	case Log10:
		p.X.Scale, p.X.Tick.Marker = gplot.LogScale{}, logTicks{base: 10}
	default:
		p.X.Tick.Marker = linearTicks{}
	}
}

// linearTicks are about 6 round values (1, 2 or 5 × 10ⁿ apart) covering [lo, hi]: gonum's
// DefaultTicks aim at 3, too few to read a value off a 900-pixel chart.
type linearTicks struct{}

func (linearTicks) Ticks(lo, hi float64) []gplot.Tick {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/6)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 7 {
			step *= m
			break
		}
	}
	var ts []gplot.Tick
	for i := math.Ceil(lo / step); i*step <= hi+step*1e-9; i++ {
		v := i*step + 0 // not -0
		ts = append(ts, gplot.Tick{Value: v, Label: format(v)})
	}
	return ts
}

// logTicks label powers of two (base 2), or 1, 2 and 5 × 10ⁿ (base 10; only 10ⁿ when the
// range spans more than three decades), with unlabelled minor ticks at the other multiples
// of 10ⁿ. A range too narrow for two labels gets linear ticks.
type logTicks struct{ base int }

func (t logTicks) Ticks(lo, hi float64) []gplot.Tick {
	var ts []gplot.Tick
	labels := 0
	add := func(v float64, label bool) {
		if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
			return
		}
		tk := gplot.Tick{Value: v}
		if label {
			tk.Label = format(v)
			labels++
		}
		ts = append(ts, tk)
	}
	if t.base == 2 {
		for v := math.Exp2(math.Floor(math.Log2(lo))); v <= hi*2; v *= 2 {
			add(v, true)
		}
	} else {
		wide := hi/lo > 1e3
		for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
			for m := 1.0; m < 10; m++ {
				add(m*d, m == 1 || (!wide && (m == 2 || m == 5)))
			}
		}
	}
	if labels < 2 {
		return linearTicks{}.Ticks(lo, hi)
	}
	return ts
}

func format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
