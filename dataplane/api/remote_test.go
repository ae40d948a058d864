package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/encoder"
	"dataplane/dataplane/remote"
	"dataplane/router/fleet"
	"dataplane/transfer/wire"
)

// peerEncoder serves d's encoders to other daemons on a loopback port (the transfer protocol)
// and returns the server and its announcement.
func peerEncoder(t *testing.T, d *testDaemon, name string, secondsPerToken float64) (*remote.Server, fleet.Worker) {
	t.Helper()
	srv := remote.NewServer(d.svc.PeerBackend(), remote.ServerOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close() //nolint:errcheck
		require.ErrorIs(t, <-done, wire.ErrServerClosed)
	})
	w := fleet.Worker{Name: name, Role: fleet.Encoder, Transfer: "tcp://" + ln.Addr().String(),
		Encodes: []fleet.EncoderModel{{Model: d.svc.Models().Name, Modality: "image", SecondsPerToken: secondsPerToken}}}
	return srv, w
}

// An image sent to daemon A is encoded on daemon B when B would be done first (A's encoders are
// slow by their estimate, B's fast): B's server counts it, A's worker gets the merged sequence
// that B's own worker gets for the same request encoded at B, and the decision names B with
// every encoder's terms. A second request for the same image is a reuse hit at A: nothing is
// sent. When B is gone, A encodes the next image itself.
func TestRemoteEncoding(t *testing.T) {
	b := startDaemon(t, nil)
	srv, ann := peerEncoder(t, b, "daemon-b", 1e-6)
	a := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Pool.SecondsPerToken = 0.05 }) // 50 ms a row, by its estimate
	cat := remote.NewCatalog("daemon-a")
	require.True(t, cat.Join(ann))
	client := remote.NewClient(remote.ClientOptions{})
	t.Cleanup(client.Close)
	a.svc.SetRemote(dataplane.RemoteOptions{Client: client, Catalog: cat})

	msg := func(fixture string) map[string]any {
		return map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "What is in this picture?"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", fixture)}},
		}}}, "max_tokens": 2}
	}
	code, out := a.post(t, "/v1/chat/completions", msg("image_200x150.png"))
	require.Equal(t, 200, code, "%v", out)
	require.Eventually(t, func() bool { return srv.Stats.Items.Load() == 1 }, 5*time.Second, time.Millisecond, "encoded at B")
	sent, fellBack, failed := a.svc.RemoteStats()
	require.Equal(t, [3]int64{1, 0, 0}, [3]int64{sent, fellBack, failed})

	code, out = b.post(t, "/v1/chat/completions", msg("image_200x150.png"))
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, b.w.embeds[0], a.w.embeds[0], "the merged sequence A sent equals B's own")
	require.NotEmpty(t, a.w.embeds[0])

	_, body := get(t, a.base+"/debug/route")
	require.Contains(t, body, `"encoder":"daemon-b"`)
	require.Contains(t, body, `"encoder":"local"`)
	require.Contains(t, body, `"ready_blocks"`)

	// The same image again (A keeps nothing after prefill by default): B answers it from its
	// cache, where items encoded for others stay (PeerCachePolicy), without encoding it.
	code, out = a.post(t, "/v1/chat/completions", msg("image_200x150.png"))
	require.Equal(t, 200, code, "%v", out)
	require.Eventually(t, func() bool { return srv.Stats.Items.Load() == 2 }, 5*time.Second, time.Millisecond)
	_, metrics := get(t, b.base+"/metrics")
	require.Contains(t, metrics, `dataplane_media_items_total{cache="miss",modality="image"} 1`+"\n", "B encoded it once")
	require.Contains(t, metrics, `dataplane_media_items_total{cache="hit",modality="image"} 2`+"\n", "for A's second request and B's own")

	// B goes away: the next image is encoded at A after the failed call.
	require.NoError(t, srv.Close())
	code, out = a.post(t, "/v1/chat/completions", msg("image_200x150.jpg"))
	require.Equal(t, 200, code, "%v", out)
	sent, fellBack, _ = a.svc.RemoteStats()
	require.Equal(t, int64(3), sent)
	require.Equal(t, int64(1), fellBack)
}

// The encoder's refusals come back as error frames naming the reason, the connection stays
// usable: another model, or features of another width.
func TestPeerBackendRefuses(t *testing.T) {
	b := startDaemon(t, nil)
	_, ann := peerEncoder(t, b, "daemon-b", 1e-6)
	client := remote.NewClient(remote.ClientOptions{})
	t.Cleanup(client.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := b.svc.Models()
	it := remote.Item{Model: "other", Modality: "image", Tokens: 4, Hidden: m.Hidden, DType: wire.DTypeBF16}
	in := testInputs(t, b)
	err := client.Encode(ctx, ann.Transfer, it, in, make([]byte, it.Bytes()))
	require.ErrorIs(t, err, wire.ErrRemote)
	require.ErrorContains(t, err, `model "other"`)
	it.Model, it.Hidden = m.Name, m.Hidden+1
	err = client.Encode(ctx, ann.Transfer, it, in, make([]byte, it.Bytes()))
	require.ErrorContains(t, err, "features of width")
	it.Hidden, it.Tokens = m.Hidden, 3
	err = client.Encode(ctx, ann.Transfer, it, in, make([]byte, it.Bytes()))
	require.ErrorContains(t, err, "feature rows here")
	var re *wire.RemoteError
	require.True(t, errors.As(err, &re))
}

// testInputs is one input of the right shape for d's vision encoder.
func testInputs(t *testing.T, d *testDaemon) []encoder.Input {
	t.Helper()
	n := 1
	for _, x := range d.svc.Models().Vision.InputShape(0) {
		n *= x
	}
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(i%97) / 97
	}
	return []encoder.Input{{Data: data}}
}

// Encoders in the fleet that run another model are no option: the item is encoded here, and the
// route still counts this daemon's encode time (the items were held back for a choice that did
// not come).
func TestRemoteEncodersOfAnotherModel(t *testing.T) {
	b := startDaemon(t, nil)
	srv, ann := peerEncoder(t, b, "daemon-b", 1e-6)
	ann.Encodes[0].Model = "another-model"
	a := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Pool.SecondsPerToken = 0.05 })
	cat := remote.NewCatalog("daemon-a")
	require.True(t, cat.Join(ann))
	client := remote.NewClient(remote.ClientOptions{})
	t.Cleanup(client.Close)
	a.svc.SetRemote(dataplane.RemoteOptions{Client: client, Catalog: cat})
	code, out := a.post(t, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "What is in this picture?"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}},
	}}}, "max_tokens": 2})
	require.Equal(t, 200, code, "%v", out)
	require.Zero(t, srv.Stats.Items.Load())
	var last struct {
		Decision struct {
			Encoder string `json:"encoder"`
			Scores  []struct {
				EncodeWait float64 `json:"encode_wait"`
			} `json:"scores"`
		} `json:"decision"`
	}
	_, body := get(t, a.base+"/debug/route")
	require.NoError(t, json.Unmarshal([]byte(body), &last))
	require.Empty(t, last.Decision.Encoder)
	require.Greater(t, last.Decision.Scores[0].EncodeWait, 0.0, "this daemon's encode time is in the cost")
}
