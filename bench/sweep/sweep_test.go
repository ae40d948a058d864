package sweep

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/encoder"
	"dataplane/native"
	"dataplane/native/fixtures"
)

func checkpoint(t *testing.T, name string) string {
	dir := t.TempDir()
	require.NoError(t, os.Symlink(fixtures.Path(t, name+"_config.json"), filepath.Join(dir, "config.json")))
	require.NoError(t, os.Symlink(fixtures.Path(t, name+".safetensors"), filepath.Join(dir, "model.safetensors")))
	return dir
}

// The tiny CLIP and Whisper fixture checkpoints swept on the host kernels and through the CPU
// backend table (the path a CUDA plugin takes): one row per batch size, consistent numbers,
// a CSV and a chart.
func TestSweep(t *testing.T) {
	clip := checkpoint(t, "clip_vit_tiny_random")
	m, err := encoder.Load(clip, encoder.Options{})
	require.NoError(t, err)
	host, err := NewHost("clip-host", m, 0)
	require.NoError(t, err)
	spec, weights, closeFiles, err := encoder.LoadWeights(clip)
	require.NoError(t, err)
	dev, err := NewDevice("clip-cpu-backend", native.CPU(), spec.Config, weights, m.Select(), 0, 4)
	closeFiles()
	require.NoError(t, err)
	wm, err := encoder.Load(checkpoint(t, "whisper_enc_tiny_random"), encoder.Options{})
	require.NoError(t, err)
	whisper, err := NewHost("whisper-host", wm, 200)
	require.NoError(t, err)
	encs := []Encoder{host, dev, whisper}
	defer func() {
		for _, e := range encs {
			e.Close()
		}
	}()
	opts := Options{Batches: []int{1, 2, 4}, Iterations: 3, Warmup: 1, MaxTime: time.Second}
	rows, err := Run(context.Background(), encs, opts)
	require.NoError(t, err)
	require.Len(t, rows, 9)
	for _, r := range rows {
		require.Positive(t, r.BatchMS)
		require.InDelta(t, r.BatchMS/float64(r.Batch), r.ItemMS, 1e-9)
		require.InDelta(t, 1e3/r.ItemMS, r.ItemsPerS, 1e-6*r.ItemsPerS)
	}
	require.Equal(t, 1.0, rows[0].SpeedupVs1)
	var buf bytes.Buffer
	require.NoError(t, WriteCSV(&buf, rows))
	recs, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 10)
	require.NoError(t, Chart(rows, "cpu").SavePNG(filepath.Join(t.TempDir(), "sweep.png")))
	_, err = Run(context.Background(), []Encoder{dev}, Options{Batches: []int{8}, Iterations: 1})
	require.ErrorContains(t, err, "over the 4 allocated")
}
