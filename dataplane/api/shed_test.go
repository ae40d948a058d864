package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/encoder"
	"dataplane/dataplane/encoderpool"
	"dataplane/native"
)

// slowModel takes d more per batch: encoders that cannot keep up with the traffic.
type slowModel struct {
	encoderpool.Model
	d time.Duration
}

func (m slowModel) Run(in []encoder.Input, out []native.Matrix) error {
	time.Sleep(m.d)
	return m.Model.Run(in, out)
}

// Items the encoders could not finish before --item-timeout, by their own estimate, are
// refused at once with 503 and Retry-After, instead of queueing until a 504 cuts them.
func TestBusyEncodersShedWith503(t *testing.T) {
	const perItem, itemTimeout = 300 * time.Millisecond, 1500 * time.Millisecond
	d := startDaemon(t, func(o *dataplane.ServiceOptions) {
		o.ItemTimeout = itemTimeout
		o.Pool.MaxBatch = 1
		o.Pool.SecondsPerToken = perItem.Seconds() / 256 // calibrated: the demo CLIP-224 item is 256 tokens
	})
	d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model { return slowModel{m, perItem} })

	type answer struct {
		code       int
		retryAfter string
		took       time.Duration
		msg        string
	}
	answers := make([]answer, 10)
	var wg sync.WaitGroup
	for i := range answers {
		raw, err := json.Marshal(chatBody(1, imagePart(randomPNG(t, uint64(900+i)))))
		require.NoError(t, err)
		wg.Go(func() {
			start := time.Now()
			resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = answer{resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(start), string(b)}
		})
	}
	wg.Wait()
	ok, shed := 0, 0
	for _, a := range answers {
		switch a.code {
		case 200:
			ok++
		case 503:
			shed++
			require.Contains(t, a.msg, "the encoders are busy")
			require.NotEmpty(t, a.retryAfter, "503 without Retry-After")
			require.Less(t, a.took, itemTimeout, "shed at once, not at the deadline: %s", a.msg)
		default:
			t.Errorf("status %d: %s", a.code, a.msg)
		}
	}
	// About itemTimeout/perItem fit; the rest would have been cut with a 504.
	require.GreaterOrEqual(t, ok, 2, "%+v", answers)
	require.GreaterOrEqual(t, shed, 3, "%+v", answers)
	d.requireNoFeatureBytes(t)
}
