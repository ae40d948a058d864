package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startServer serves on a loopback port; it returns the base URL and a stop function that
// cancels Serve and checks it drained cleanly (also run when the test ends).
func startServer(t *testing.T, opts Options) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(opts, slog.New(slog.DiscardHandler)).Serve(ctx, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestServerEndpoints(t *testing.T) {
	base, _ := startServer(t, DefaultOptions())

	code, body := get(t, base+"/healthz")
	require.Equal(t, 200, code)
	require.Equal(t, "ok\n", body)

	code, body = get(t, base+"/nope")
	require.Equal(t, 404, code)
	require.JSONEq(t, `{"error":{"message":"no endpoint \"/nope\"","type":"not_found","code":404}}`, body)

	code, body = get(t, base+"/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, `dataplane_build_info{goversion="go`)
	require.Contains(t, body, `dataplane_http_requests_total{code="200",route="/healthz"} 1`)
	require.Contains(t, body, `dataplane_http_requests_total{code="404",route="other"} 1`)
	require.Contains(t, body, `dataplane_http_request_duration_seconds_bucket{route="/healthz"`)
	require.Contains(t, body, "go_goroutines")
}

func TestServerBodyLimit(t *testing.T) {
	opts := DefaultOptions()
	opts.MaxBodyBytes = 1 << 10
	base, _ := startServer(t, opts)
	// A raw connection: the server may answer as soon as it has read the headers.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n%s", strings.Repeat("x", 4096))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Contains(t, string(body), "request body larger than 1024 bytes (--max-body-bytes)")

	code, _ := get(t, base+"/healthz")
	require.Equal(t, 200, code, "the server keeps serving after refusing a body")
	_, metrics := get(t, base+"/metrics")
	require.Contains(t, metrics, `dataplane_http_requests_total{code="413",route="malformed"} 1`)
}

func TestServerStopsOnCancel(t *testing.T) {
	base, stop := startServer(t, DefaultOptions())
	code, _ := get(t, base+"/healthz")
	require.Equal(t, 200, code)
	stop()
	_, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
	require.Error(t, err, "listener still open after shutdown")
}

// A client's spare connection that never sent a byte holds no request: shutdown closes it
// at once instead of waiting for ReadTimeout (Go's http.Transport dials such connections
// when many requests start together).
func TestServerShutdownClosesUnusedConnections(t *testing.T) {
	opts := DefaultOptions()
	opts.ShutdownTimeout = 5 * time.Second
	base, stop := startServer(t, opts)
	addr := strings.TrimPrefix(base, "http://")
	spare, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer spare.Close()
	// A connection in the middle of a request is not cut: its response still arrives.
	busy, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer busy.Close()
	_, err = fmt.Fprint(busy, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	require.NoError(t, err)
	code, _ := get(t, base+"/healthz") // both connections are accepted by now
	require.Equal(t, 200, code)

	start := time.Now()
	stopped := make(chan struct{})
	go func() { defer close(stopped); stop() }()
	time.Sleep(300 * time.Millisecond)
	_, err = fmt.Fprint(busy, "\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return")
	}
	require.Less(t, time.Since(start), 3*time.Second, "shutdown waited on a connection with no request")
	_, err = spare.Read(make([]byte, 1))
	require.Error(t, err, "the unused connection was closed")
}

// A shutdown that comes before the HTTP server has taken its listener still ends Serve (it
// used to wait forever in Accept: fasthttp's Shutdown closes only the listeners Serve has
// registered by then, and a test's cleanup, or an early SIGTERM, can come first).
func TestServeEndsWhenShutDownAtOnce(t *testing.T) {
	for range 50 {
		srv := NewServer(DefaultOptions(), slog.New(slog.DiscardHandler))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Serve still running 10 s after a shutdown that came at once")
		}
	}
}

// A connection is kept alive after a request whose body was read or that had none, and closed
// after one with a body nobody read (its bytes would be taken for the next request). GETs
// carry no Content-Length: fasthttp gives them -2, which once closed every probe's connection.
func TestKeepAliveUnlessABodyWasLeft(t *testing.T) {
	base := startDaemon(t, nil).base
	for _, c := range []struct {
		name, request string
		close         bool
	}{
		{"GET, no body", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"HEAD", "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"GET, empty body", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", false},
		{"GET, unread body", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", true},
		{"GET, unread chunked body", "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", true},
		{"POST to an endpoint that reads it", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n{\"prompt\":\"hi\",\"max_tokens\":1}", false},
		{"POST to one that does not", "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer conn.Close()
			_, err = fmt.Fprint(conn, c.request)
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: strings.Fields(c.request)[0]})
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, c.close, resp.Close, "Connection: close (%d)", resp.StatusCode)
		})
	}
}
