package worker

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/worker/workertest"
)

// stoppedEngine is an engine whose process was stopped (SIGSTOP): the kernel still accepts
// connections, nothing ever answers. Its URL is http://127.0.0.1:port.
func stoppedEngine(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return workertest.Stopped(t, ln)
}

// A stopped engine fails a generation within the first-byte timeout, not the generation's, as
// unavailable; the class a client reads names no address.
func TestHTTPWorkerFirstByteTimeout(t *testing.T) {
	url := stoppedEngine(t)
	w, err := NewHTTP(HTTPOptions{BaseURL: url, FirstByteTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer w.Close()
	start := time.Now()
	_, err = w.Generate(context.Background(), &Request{Prompt: "hi"})
	took := time.Since(start)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, "no first byte within 200ms", Public(err))
	require.ErrorContains(t, err, url, "the logs keep the address")
	require.Less(t, took, 5*time.Second)
	require.GreaterOrEqual(t, took, 200*time.Millisecond)

	// Headers, then nothing: the stream fails before its first token, unavailable.
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	w2, err := NewHTTP(HTTPOptions{BaseURL: srv.URL, FirstByteTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer w2.Close()
	ch, err := w2.Generate(context.Background(), &Request{Prompt: "hi"})
	require.NoError(t, err)
	text, done := drain(t, ch)
	require.Empty(t, text)
	require.ErrorIs(t, done.Err, ErrUnavailable)
	require.Equal(t, "no first byte within 200ms", Public(done.Err))

	// A stream whose tokens come slower than the first-byte timeout in all, but the first one
	// in time, runs to its end: the timeouts are separate.
	slow := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		for i := range 6 {
			fmt.Fprintf(rw, "data: {\"choices\":[{\"text\":\"t%d \"}]}\n\n", i)
			rw.(http.Flusher).Flush()
			time.Sleep(60 * time.Millisecond)
		}
		fmt.Fprint(rw, "data: [DONE]\n\n")
	}))
	defer slow.Close()
	w3, err := NewHTTP(HTTPOptions{BaseURL: slow.URL, FirstByteTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer w3.Close()
	ch, err = w3.Generate(context.Background(), &Request{Prompt: "hi"})
	require.NoError(t, err)
	text, done = drain(t, ch)
	require.NoError(t, done.Err)
	require.Equal(t, "t0 t1 t2 t3 t4 t5 ", text)
}

// Failures a client reads by class only: refused, a 500, a stream that breaks off.
func TestHTTPWorkerErrorClasses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	w, err := NewHTTP(HTTPOptions{BaseURL: url, Label: "worker 3"})
	require.NoError(t, err)
	require.Equal(t, "worker 3", Label(w))
	_, err = w.Generate(context.Background(), &Request{Prompt: "hi"})
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, "connection refused", Public(err))
	require.ErrorContains(t, err, ln.Addr().String())

	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		http.Error(rw, "engine at 10.0.0.7:8000 fell over", http.StatusInternalServerError)
	}))
	defer srv.Close()
	w, err = NewHTTP(HTTPOptions{BaseURL: srv.URL})
	require.NoError(t, err)
	require.Equal(t, "worker", Label(w), "never the address")
	_, err = w.Generate(context.Background(), &Request{Prompt: "hi"})
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, "answered 500 Internal Server Error", Public(err))
	require.ErrorContains(t, err, "fell over", "the logs keep the engine's message")

	broken := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
	}))
	defer broken.Close()
	w, err = NewHTTP(HTTPOptions{BaseURL: broken.URL})
	require.NoError(t, err)
	ch, err := w.Generate(context.Background(), &Request{Prompt: "hi"})
	require.NoError(t, err)
	text, done := drain(t, ch)
	require.Equal(t, "a", text)
	require.ErrorIs(t, done.Err, ErrUnavailable)
	require.Equal(t, "stream ended early", Public(done.Err))
	require.False(t, strings.Contains(Public(done.Err), "127.0.0.1"))
}

// Health is vLLM's GET /health: 200 while its engine runs, 503 once it is dead (vLLM
// vllm/entrypoints/serve/instrumentator/health.py at commit
// 98b137c61dcf8be6fac463c982053db8c1417cfb: `@router.get("/health")` answers
// Response(status_code=200) after engine_client.check_health(), 503 on EngineDeadError). A
// stopped engine fails within the probe's context.
func TestHTTPWorkerHealth(t *testing.T) {
	status := http.StatusOK
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/health" {
			http.NotFound(rw, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		rw.WriteHeader(status)
	}))
	defer srv.Close()
	w, err := NewHTTP(HTTPOptions{BaseURL: srv.URL})
	require.NoError(t, err)
	defer w.Close()
	var p Prober = w
	require.NoError(t, p.Health(context.Background()))
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	err = p.Health(context.Background())
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, "health check answered 503 Service Unavailable", Public(err))

	stopped, err := NewHTTP(HTTPOptions{BaseURL: stoppedEngine(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = stopped.Health(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, "timed out", Public(err))
}
