package plot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	gplot "gonum.org/v1/plot"
)

func render(c Chart) (image.Image, error) {
	img, err := c.draw()
	if err != nil {
		return nil, err
	}
	return img.Image(), nil
}

// pixels of colour c in img, and their mean x.
func pixels(img image.Image, c color.RGBA) (n int, meanX float64) {
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if color.RGBAModel.Convert(img.At(x, y)) == c {
				n++
				meanX += float64(x)
			}
		}
	}
	if n > 0 {
		meanX /= float64(n)
	}
	return n, meanX
}

// A chart is a PNG of the asked size on white, with each series drawn in its own colour.
func TestChart(t *testing.T) {
	c := Chart{Title: "items/s by batch size", XLabel: "batch", YLabel: "items/s", XScale: Log2, Series: []Series{
		{Name: "clip", X: []float64{1, 2, 4, 8}, Y: []float64{10, 18, 30, 40}},
		{Name: "whisper", X: []float64{1, 2, 4, 8}, Y: []float64{5, 9, 15, 20}},
	}}
	path := filepath.Join(t.TempDir(), "c.png")
	require.NoError(t, c.SavePNG(path))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, image.Rect(0, 0, 900, 540), img.Bounds())
	white := color.RGBA{255, 255, 255, 255}
	require.Equal(t, white, color.RGBAModel.Convert(img.At(0, 0)))
	require.Equal(t, white, color.RGBAModel.Convert(img.At(899, 539)))
	for i := range c.Series {
		n, _ := pixels(img, Palette[i])
		require.Greater(t, n, 500, "series %d", i) // a 2-pixel line across the chart
	}

	small := c
	small.Width, small.Height = 400, 300
	simg, err := render(small)
	require.NoError(t, err)
	require.Equal(t, image.Rect(0, 0, 400, 300), simg.Bounds())
}

// Points evenly spaced in log₁₀ sit evenly across a Log10 chart (their mean x mid-chart),
// and bunch up at the left of a linear one.
func TestLogScale(t *testing.T) {
	s := Series{Name: "x", X: []float64{1, 10, 100, 1000, 10000}, Y: []float64{1, 1, 1, 1, 1}}
	meanX := func(scale Scale) float64 {
		img, err := render(Chart{Series: []Series{s}, XScale: scale, Points: true})
		require.NoError(t, err)
		n, x := pixels(img, Palette[0])
		require.GreaterOrEqual(t, n, 5) // each dot has a solid core
		return x / float64(img.Bounds().Dx())
	}
	require.InDelta(t, 0.5, meanX(Log10), 0.05)
	require.Less(t, meanX(Linear), 0.4)
}

// Charts render whatever the data: none, one point, non-finite values, values ≤ 0 on a log
// axis (skipped), and the same chart twice is the same PNG.
func TestChartEdges(t *testing.T) {
	png := func(c Chart) []byte {
		var b bytes.Buffer
		require.NoError(t, c.WritePNG(&b))
		return b.Bytes()
	}
	png(Chart{})
	png(Chart{XScale: Log10})
	png(Chart{XScale: Log2, Series: []Series{{Name: "one", X: []float64{4}, Y: []float64{2}}}})
	inf := math.Inf(1)
	odd := Chart{XScale: Log10, Series: []Series{
		{Name: "a", X: []float64{0, -1, 1, 2, math.NaN(), 8}, Y: []float64{1, 1, 1, inf, 3, 4}},
		{Name: "b", X: []float64{0}, Y: []float64{1}},
	}}
	require.Equal(t, png(odd), png(odd))

	cdf := CDF("x", []float64{3, 1, 2, math.NaN()})
	require.Equal(t, []float64{1, 2, 3}, cdf.X)
	require.Equal(t, []float64{1. / 3, 2. / 3, 1}, cdf.Y)
}

func labels(ts []gplot.Tick) []string {
	var out []string
	for _, tk := range ts {
		if tk.Label != "" {
			out = append(out, tk.Label)
		}
	}
	return out
}

func TestTicks(t *testing.T) {
	f := func(tk gplot.Ticker, lo, hi float64, want ...string) {
		t.Helper()
		require.Equal(t, want, labels(tk.Ticks(lo, hi)))
	}
	f(logTicks{2}, 1, 64, "1", "2", "4", "8", "16", "32", "64")
	f(logTicks{2}, 3, 40, "4", "8", "16", "32")
	f(logTicks{10}, 18, 600, "20", "50", "100", "200", "500")
	f(logTicks{10}, 4, 5800, "10", "100", "1000") // more than three decades: powers of ten only
	f(logTicks{10}, 120, 180, "120", "130", "140", "150", "160", "170", "180")
	f(linearTicks{}, 0, 42, "0", "10", "20", "30", "40")
	f(linearTicks{}, 0, 1, "0", "0.2", "0.4", "0.6", "0.8", "1")
	f(linearTicks{}, 0, 25000, "0", "5000", "10k", "15k", "20k", "25k")
	f(linearTicks{}, -0.5, 10, "0", "2", "4", "6", "8", "10")
}
