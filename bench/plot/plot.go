// Package plot draws the harness's charts as PNG with the standard library's image packages:
// line charts (optionally log-scaled x), scatter plots and CDFs, with axes, ticks, labels and
// a legend in a fixed 7×13 bitmap font.
package plot

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"slices"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line (or set of points) of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart describes a chart. Width and Height default to 900 × 540.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	LogX                  bool // x axis in powers of two (batch sizes)
	Points                bool // draw points, not lines
	Width, Height         int
}

// Palette is the series colours, in order (Okabe–Ito, colour-blind safe).
var Palette = []color.RGBA{
	{0, 114, 178, 255}, {213, 94, 0, 255}, {0, 158, 115, 255}, {204, 121, 167, 255},
	{230, 159, 0, 255}, {86, 180, 233, 255}, {0, 0, 0, 255}, {240, 228, 66, 255},
}

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grid  = color.RGBA{225, 225, 225, 255}
)

const (
	left, right, top, bottom = 80, 20, 58, 55
)

// Draw renders the chart.
func (c Chart) Draw() *image.RGBA {
	w, h := c.Width, c.Height
	if w <= 0 || h <= 0 {
		w, h = 900, 540
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fill(img, img.Bounds(), white)
	xmin, xmax, ymin, ymax := c.bounds()
	tx := func(x float64) float64 { return x }
	if c.LogX {
		tx = math.Log2
	}
	px := func(x float64) int {
		return left + int(math.Round((tx(x)-tx(xmin))/(tx(xmax)-tx(xmin))*float64(w-left-right)))
	}
	py := func(y float64) int {
		return h - bottom - int(math.Round((y-ymin)/(ymax-ymin)*float64(h-top-bottom)))
	}
	// Grid and ticks.
	for _, y := range ticks(ymin, ymax) {
		hline(img, left, w-right, py(y), grid)
		label(img, left-6-7*len(format(y)), py(y)+4, format(y))
	}
	var xs []float64
	if c.LogX {
		for x := math.Exp2(math.Floor(math.Log2(xmin))); x <= xmax*1.0001; x *= 2 {
			if x >= xmin*0.9999 {
				xs = append(xs, x)
			}
		}
	} else {
		xs = ticks(xmin, xmax)
	}
	for _, x := range xs {
		vline(img, px(x), top, h-bottom, grid)
		s := format(x)
		label(img, px(x)-7*len(s)/2, h-bottom+16, s)
	}
	hline(img, left, w-right, h-bottom, black)
	vline(img, left, top, h-bottom, black)
	label(img, (w-7*len(c.Title))/2, 22, c.Title)
	label(img, (w-7*len(c.XLabel))/2, h-12, c.XLabel)
	label(img, 8, top-4, c.YLabel)
	// Data.
	for i, s := range c.Series {
		col := Palette[i%len(Palette)]
		for j := range s.X {
			if !finite(s.X[j]) || !finite(s.Y[j]) || (c.LogX && s.X[j] <= 0) {
				continue
			}
			x, y := px(s.X[j]), py(s.Y[j])
			if c.Points {
				fill(img, image.Rect(x-1, y-1, x+2, y+2), col)
			} else if j > 0 && finite(s.X[j-1]) && finite(s.Y[j-1]) {
				line(img, px(s.X[j-1]), py(s.Y[j-1]), x, y, col)
				fill(img, image.Rect(x-2, y-2, x+3, y+3), col)
			} else {
				fill(img, image.Rect(x-2, y-2, x+3, y+3), col)
			}
		}
	}
	// The legend: one row under the title.
	lx := left
	for i, s := range c.Series {
		fill(img, image.Rect(lx, 34, lx+14, 40), Palette[i%len(Palette)])
		label(img, lx+20, 41, s.Name)
		lx += 20 + 7*len(s.Name) + 24
	}
	return img
}

// bounds are the data's extent, padded; y starts at 0 when all values are positive.
func (c Chart) bounds() (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, s := range c.Series {
		for j := range s.X {
			if !finite(s.X[j]) || !finite(s.Y[j]) || (c.LogX && s.X[j] <= 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[j]), math.Max(xmax, s.X[j])
			ymin, ymax = math.Min(ymin, s.Y[j]), math.Max(ymax, s.Y[j])
		}
	}
	if math.IsInf(xmin, 1) {
		return 0, 1, 0, 1
	}
	if ymin > 0 {
		ymin = 0
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax = ymin + 1
	}
	ymax += (ymax - ymin) * 0.05
	return xmin, xmax, ymin, ymax
}

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
	if err := png.Encode(f, c.Draw()); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// ticks are about 6 round values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/6)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 7 {
			step *= m
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
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

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) { fill(img, image.Rect(x0, y, x1+1, y+1), c) }
func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) { fill(img, image.Rect(x, y0, x+1, y1+1), c) }

// line draws a 2-pixel-wide line (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for {
		fill(img, image.Rect(x0, y0, x0+2, y0+2), c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(x int) int { return max(x, -x) }

func sign(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

func label(img *image.RGBA, x, y int, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(black), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
