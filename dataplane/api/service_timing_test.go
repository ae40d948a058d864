package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"dataplane/dataplane"
	"dataplane/native"
)

// BenchmarkMultimodalPath: requests with one image each (distinct pictures, so no reuse)
// through a ViT-S/14-sized random vision tower, with encoder batches of 1 and of up to 8;
// x-batch1 is batched throughput over batch-1 throughput, measured in the same run.
func BenchmarkMultimodalPath(b *testing.B) {
	vit := native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 384, Intermediate: 1536, Layers: 6, Heads: 6,
		Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 14, Channels: 3}
	daemon := func(batch int) *testDaemon {
		return startDaemon(b, func(o *dataplane.ServiceOptions) {
			o.Models.DemoVision = &vit
			o.Models.NoAudio = true
			o.Models.Threads = 2
			o.Pool.MaxBatch, o.Pool.MaxWait = batch, 10*time.Millisecond
			o.Features.Host.Capacity = 256 << 20
		})
	}
	single, batched := daemon(1), daemon(8)
	pictures := make([]string, 64)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range pictures {
		img := image.NewRGBA(image.Rect(0, 0, 256, 192))
		for k := range img.Pix {
			img.Pix[k] = byte(r.Uint32())
		}
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			b.Fatal(err)
		}
		pictures[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
	}
	next := 0
	run := func(d *testDaemon) time.Duration {
		const clients = 16
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			pic := pictures[next%len(pictures)]
			next++
			wg.Add(1)
			go func() {
				defer wg.Done()
				raw, _ := json.Marshal(map[string]any{"max_tokens": 1, "cache_policy": "discard", "messages": []any{map[string]any{"role": "user",
					"content": []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": pic}}, map[string]any{"type": "text", "text": "?"}}}}})
				resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
				if err != nil {
					panic(err)
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
				if resp.StatusCode != 200 {
					panic(resp.Status)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	var t1, t8 time.Duration
	for b.Loop() {
		t1 += run(single)
		t8 += run(batched)
	}
	n := float64(b.N * 16)
	b.ReportMetric(n/t1.Seconds(), "req/s-batch1")
	b.ReportMetric(n/t8.Seconds(), "req/s-batch8")
	b.ReportMetric(t1.Seconds()/t8.Seconds(), "x-batch1")
}
