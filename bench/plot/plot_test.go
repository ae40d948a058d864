package plot

import (
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A chart is a PNG of the asked size, with each series drawn in its colour where its points
// are, and a CDF ends at 1.
func TestChart(t *testing.T) {
	c := Chart{Title: "items/s by batch size", XLabel: "batch", YLabel: "items/s", LogX: true, Series: []Series{
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
	// The first series' first point: x = left edge, y = 10 of [0, 42] up from the bottom.
	frac := 10 / 42.0 // y runs 0..40 padded by 5 %
	y := 540 - bottom - int(math.Round(frac*float64(540-top-bottom)))
	r, g, b, _ := img.At(left, y).RGBA()
	want := Palette[0]
	require.Equal(t, [3]uint32{uint32(want.R) * 0x101, uint32(want.G) * 0x101, uint32(want.B) * 0x101}, [3]uint32{r, g, b})

	cdf := CDF("x", []float64{3, 1, 2, 0 / zero()})
	require.Equal(t, []float64{1, 2, 3}, cdf.X)
	require.Equal(t, 1.0, cdf.Y[2])
	empty := Chart{}.Draw() // no data: still a valid image
	require.Equal(t, 900, empty.Bounds().Dx())
}

func zero() float64 { return 0 }
