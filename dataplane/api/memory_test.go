package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/memory"
)

// withRequestBudget gives the daemon a request budget of that many bytes.
func withRequestBudget(requests int64) func(*dataplane.ServiceOptions) {
	return func(o *dataplane.ServiceOptions) { o.RequestMemoryBytes = requests }
}

// Connections that declare a 64 MiB body and send one byte hold what arrived, not what they
// declared: fasthttp used to allocate the declared length before calling the handler (100 such
// connections, 12 KB of traffic, took the daemon from 61 MB to 6.5 GB).
func TestDeclaredBodiesAreNotAllocated(t *testing.T) {
	d := startDaemon(t, withRequestBudget(256<<20))
	const conns = 20
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var open []net.Conn
	for range conns {
		c, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
		require.NoError(t, err)
		open = append(open, c)
		_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 64<<20-1)
		require.NoError(t, err)
	}
	peak := uint64(0)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapAlloc)
	}
	grew := int64(peak) - int64(before.HeapAlloc)
	require.Less(t, grew, int64(64<<20), "the heap grew by %d MiB for %d one-byte bodies", grew>>20, conns)
	used := d.svc.Memory().Stats().Used
	require.LessOrEqual(t, used, int64(conns*bodyChunk), "reserved more than the bodies' first chunks")
	for _, c := range open {
		c.Close()
	}
	require.Eventually(t, func() bool { return d.svc.Memory().Stats().Used == 0 }, 10*time.Second, 10*time.Millisecond,
		"bodies whose clients left still hold memory")
}

// Bodies that do not fit the request budget now are refused with 503 and Retry-After after a
// short wait; one that could never fit it is 413 at once.
func TestBodiesOverTheBudget(t *testing.T) {
	d := startDaemonWith(t, func(o *dataplane.ServiceOptions) {
		withRequestBudget(memory.MinRequests)(o)
		o.MemoryWait = 50 * time.Millisecond
	}, func(o *Options) { o.MaxBodyBytes = 256 << 20 })
	// Hold about 30 MiB of the budget with a body that is still arriving.
	c, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 30<<20)
	c.Write(bytes.Repeat([]byte(" "), 29<<20)) //nolint:errcheck
	require.Eventually(t, func() bool { return d.svc.Memory().Stats().Used >= 29<<20 }, 10*time.Second, 5*time.Millisecond)

	// 20 MiB, and as much again parsed, would fit an idle daemon: 503 and come back.
	raw, _ := json.Marshal(chatBody(1, imagePart("data:image/png;base64,"+strings.Repeat("A", 20<<20))))
	resp := postRaw(t, d.base+"/v1/chat/completions", raw)
	require.Equal(t, 503, resp.code, resp.body)
	require.Equal(t, "1", resp.retryAfter)
	require.Contains(t, resp.body, "the server's memory is busy")

	// 40 MiB never fits a 64 MiB budget: 413 as soon as the headers say so.
	c2, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	require.NoError(t, err)
	defer c2.Close()
	fmt.Fprintf(c2, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", 40<<20)
	r, err := http.ReadResponse(bufio.NewReader(c2), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(r.Body)
	require.Equal(t, 413, r.StatusCode, string(b))
	require.Empty(t, r.Header.Get("Retry-After"))
	require.Contains(t, string(b), "can never fit")
	c.Close()
	require.Eventually(t, func() bool { return d.svc.Memory().Stats().Used == 0 }, 10*time.Second, 10*time.Millisecond)
}

// A request whose features and merged sequence outgrow the whole feature store gets 413, not
// a 503 that asks the client to try again forever (each fits alone: the store cannot tell).
func TestRequestThatCanNeverFitIs413(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Features.Host.Capacity = 1 << 20 })
	var parts []any
	for i := range 4 { // 4 × 256 tokens × 256 wide × 2 bytes = 512 KiB, and the merged sequence as much again
		parts = append(parts, imagePart(randomPNG(t, uint64(900+i))))
	}
	for range 2 {
		code, out := d.post(t, "/v1/chat/completions", chatBody(1, parts...))
		require.Equal(t, 413, code, "%v", out)
		msg, _ := apiError(t, out)
		require.Contains(t, msg, "--feature-bytes")
	}
	d.requireNoFeatureBytes(t)
}

// A client that leaves while its media are being prepared is counted as 499 (client closed
// request), not as an error of the server or of a media server: here it leaves while the
// daemon fetches its picture from a server that never answers.
func TestClientLeavingDuringMediaIs499(t *testing.T) {
	stall := make(chan struct{})
	defer close(stall)
	media := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	defer media.Close()
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Fetch.HTTP, o.Fetch.AllowPrivateNetworks = true, true })
	raw, _ := json.Marshal(chatBody(1, imagePart(media.URL+"/cat.png")))
	c, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	require.NoError(t, err)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(raw), raw)
	time.Sleep(200 * time.Millisecond)
	c.Close()
	require.Eventually(t, func() bool {
		_, m := get(t, d.base+"/metrics")
		return strings.Contains(m, `dataplane_http_requests_total{code="499",route="/v1/chat/completions"} 1`)
	}, 10*time.Second, 20*time.Millisecond, "the request was not counted as 499")
	require.Equal(t, 1.0, d.metric(t, `dataplane_requests_total{endpoint="chat",outcome="cancelled"}`))
}

type rawResponse struct {
	code       int
	body       string
	retryAfter string
}

func postRaw(t *testing.T, url string, body []byte) rawResponse {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResponse{code: resp.StatusCode, body: string(b), retryAfter: resp.Header.Get("Retry-After")}
}

// A media item over --max-media-bytes is 413 however it comes: a data: URL, inline data.
func TestMediaOverTheLimitIs413(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.MaxMediaBytes = 1000 })
	big := randomPNG(t, 970) // 64x48 random pixels: about 9 KB
	code, out := d.post(t, "/v1/chat/completions", chatBody(1, imagePart(big)))
	require.Equal(t, 413, code, "%v", out)
	msg, param := apiError(t, out)
	require.Equal(t, "messages[0].content[0]", param)
	require.Contains(t, msg, "--max-media-bytes")
	code, out = d.post(t, "/v1/pretokenized", map[string]any{"token_ids": []int{1, 2}, "max_tokens": 1,
		"media": []any{map[string]any{"modality": "image", "data": strings.TrimPrefix(big, "data:image/png;base64,")}}})
	require.Equal(t, 413, code, "%v", out)
}
