package api

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
)

// Nothing wedges: a FIFO in the media directory is refused before it is opened (the open used
// to block forever while holding a CPU slot, and every later media request hung); media
// servers that send a byte a second hold fetch slots, not CPU slots, so an unrelated request
// with an inline picture is not delayed; --item-timeout covers the fetch and answers 504
// naming the item.
func TestNothingWedges(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe.png")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	stop := make(chan struct{})
	var slowWG sync.WaitGroup
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowWG.Add(1)
		defer slowWG.Done()
		w.Header().Set("Content-Length", "100000")
		for {
			w.Write([]byte{0x89}) //nolint:errcheck
			w.(http.Flusher).Flush()
			select {
			case <-stop:
				return
			case <-r.Context().Done():
				return
			case <-time.After(time.Second):
			}
		}
	}))
	defer slow.Close()
	defer close(stop)
	d := startDaemon(t, func(o *dataplane.ServiceOptions) {
		o.Fetch.FileDir = dir
		o.Fetch.HTTP, o.Fetch.AllowPrivateNetworks = true, true
		o.ItemTimeout = 2 * time.Second
	})

	type answer struct {
		code int
		out  map[string]any
		took time.Duration
	}
	post := func(body map[string]any) answer {
		t0 := time.Now()
		code, out := d.post(t, "/v1/chat/completions", body)
		return answer{code, out, time.Since(t0)}
	}
	for range 2 {
		a := post(chatBody(1, imagePart("file://"+fifo)))
		require.Equal(t, 400, a.code, "%v", a.out)
		require.Less(t, a.took, time.Second, "a FIFO blocked the request")
		msg, param := apiError(t, a.out)
		require.Equal(t, "messages[0].content[0]", param)
		require.Contains(t, msg, "not a regular file")
	}

	// More slow fetches than CPU slots, then a picture given inline.
	slowDone := make(chan answer, runtime.GOMAXPROCS(0)+1)
	for range cap(slowDone) {
		go func() { slowDone <- post(chatBody(1, textPart("look"), imagePart(slow.URL+"/cat.png"))) }()
	}
	require.Eventually(t, func() bool { return len(slowDone) == 0 }, time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // the fetches are under way
	a := post(chatBody(1, imagePart(randomPNG(t, 960))))
	require.Equal(t, 200, a.code, "%v", a.out)
	require.Less(t, a.took, 1500*time.Millisecond, "an inline picture waited behind slow media servers")
	for range cap(slowDone) {
		s := <-slowDone
		require.Equal(t, 504, s.code, "%v", s.out)
		require.Less(t, s.took, 4*time.Second, "--item-timeout 2s did not cover the fetch")
		_, param := apiError(t, s.out)
		require.Equal(t, "messages[0].content[1]", param)
	}
	// The FIFO still exists and nothing holds it open.
	_, err := os.Stat(fifo)
	require.NoError(t, err)
	d.requireNoFeatureBytes(t)
}
