package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The daemon routes a media request while its items encode, so the decision carries when the
// features will be ready (router.Request.ReadyIn): every idle worker is charged the encoder's
// ETA as a wait (router's TestEncodeWaitHidesBacklog shows how a backlog hides it). A
// text-only request, or one whose media all hit the reuse cache, has none.
func TestRoutingCarriesEncodeWait(t *testing.T) {
	d := startDaemon(t, nil)
	_, err := d.svc.AddWorker(&echoWorker{name: "echo-1"})
	require.NoError(t, err)

	lastWaits := func() []float64 {
		t.Helper()
		code, body := get(t, d.base+"/debug/route")
		require.Equal(t, 200, code, body)
		var got struct {
			Decision struct {
				Scores []struct {
					Worker     string  `json:"worker"`
					EncodeWait float64 `json:"encode_wait"`
				} `json:"scores"`
			} `json:"decision"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &got), body)
		require.Len(t, got.Decision.Scores, 2)
		var waits []float64
		for _, s := range got.Decision.Scores {
			waits = append(waits, s.EncodeWait)
		}
		return waits
	}
	chat := func(parts ...any) {
		t.Helper()
		code, out := d.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 1, "cache_policy": "keep:1m",
			"messages": []any{map[string]any{"role": "user", "content": parts}}})
		require.Equal(t, 200, code, "%v", out)
	}
	text := map[string]any{"type": "text", "text": "What is in this picture?"}
	image := map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}}

	chat(text)
	require.Equal(t, []float64{0, 0}, lastWaits(), "text-only: nothing to wait for")
	chat(image, text)
	for _, w := range lastWaits() {
		require.Greater(t, w, 0.0, "an image to encode: idle workers wait for it")
	}
	chat(image, text)
	require.Equal(t, []float64{0, 0}, lastWaits(), "the image comes from the reuse cache")
}
