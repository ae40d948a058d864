package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// result is what one client request got.
type result struct {
	status int // 0: no answer
	kind   string
	err    error
	took   time.Duration
	header http.Header
	body   []byte // the first 4 KiB
}

// key is the result's entry in a row's statuses: the code, "timeout" or "error".
func (r result) key() string {
	if r.status > 0 {
		return strconv.Itoa(r.status)
	}
	return r.kind
}

// message is the error message of an OpenAI-style error body, or the start of the body.
func (r result) message() string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(r.body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	if r.err != nil {
		return r.err.Error()
	}
	return strings.TrimSpace(string(r.body[:min(len(r.body), 200)]))
}

func newClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr}
}

// do sends one request and reads its whole answer (up to timeout); it does not count it.
func (t *trial) do(ctx context.Context, method, url string, body []byte, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return result{kind: "error", err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return classify(ctx, err, time.Since(start))
	}
	defer resp.Body.Close()
	head, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	res := result{status: resp.StatusCode, header: resp.Header, body: head, took: time.Since(start)}
	if err != nil { // the status came, the body did not: still an answer
		res.err = err
	}
	return res
}

func classify(ctx context.Context, err error, took time.Duration) result {
	kind := "error"
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
		kind = "timeout"
	}
	return result{kind: kind, err: err, took: took}
}

// post sends a JSON body to the daemon's path and counts the answer in the row.
func (t *trial) post(ctx context.Context, base, path string, body []byte, timeout time.Duration) result {
	r := t.do(ctx, http.MethodPost, base+path, body, timeout)
	t.count(r)
	return r
}

// probe sends a GET on a connection of its own (no pooled keep-alive connection, which a
// daemon out of connection slots would still serve) and does not count it.
func (t *trial) probe(ctx context.Context, url string, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return result{kind: "error", err: err}
	}
	req.Close = true
	tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: timeout}).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return classify(ctx, err, time.Since(start))
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return result{status: resp.StatusCode, header: resp.Header, body: head, took: time.Since(start)}
}

// get sends a GET and does not count it.
func (t *trial) get(ctx context.Context, url string, timeout time.Duration) result {
	return t.do(ctx, http.MethodGet, url, nil, timeout)
}

// stream is what a streamed chat completion delivered.
type stream struct {
	result
	events   int    // data events before the end
	last     string // the last data event
	done     bool   // it ended with data: [DONE]
	errEvent bool   // its last event was an error, {"error": ...}
	firstAt  time.Duration
	endedAt  time.Time // when the connection closed (or the request failed)
}

// openStream sends a streamed request; first is closed when the first data event arrived (or
// the request failed). The stream is read to its end, then returned on the channel.
func (t *trial) openStream(ctx context.Context, url string, body []byte, timeout time.Duration, first chan<- struct{}) <-chan stream {
	out := make(chan stream, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		start := time.Now()
		var s stream
		signalled := false
		signal := func() {
			if !signalled {
				signalled = true
				close(first)
			}
		}
		defer func() { s.endedAt = time.Now(); signal(); out <- s }()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			s.result = result{kind: "error", err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := t.client.Do(req)
		if err != nil {
			s.result = classify(ctx, err, time.Since(start))
			return
		}
		defer resp.Body.Close()
		s.status, s.header = resp.StatusCode, resp.Header
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data:")
			if !ok {
				continue
			}
			data = strings.TrimSpace(data)
			if s.events == 0 {
				s.firstAt = time.Since(start)
			}
			s.events++
			s.last = data
			signal()
			if data == "[DONE]" {
				s.done = true
			}
		}
		s.err = sc.Err()
		s.errEvent = strings.HasPrefix(s.last, `{"error"`)
		s.took = time.Since(start)
	}()
	return out
}

// Request bodies: OpenAI chat completions with content parts.

type part map[string]any

func textPart(s string) part { return part{"type": "text", "text": s} }

func imagePart(url string) part {
	return part{"type": "image_url", "image_url": map[string]string{"url": url}}
}

// videoPart is a video given as pictures (Qwen's form, `{"type":"video","video":[urls]}`).
func videoPart(urls []string) part { return part{"type": "video", "video": urls} }

// chatBody is a one-message chat completion request.
func chatBody(maxTokens int, stream bool, parts ...part) []byte {
	req := map[string]any{
		"max_tokens": maxTokens,
		"messages":   []map[string]any{{"role": "user", "content": parts}},
	}
	if stream {
		req["stream"] = true
	}
	b, err := json.Marshal(req)
	if err != nil {
		panic(err) // maps of strings and ints always marshal
	}
	return b
}

// rawConn opens a TCP connection to addr and writes head (nothing else); the caller owns it.
func rawConn(ctx context.Context, addr string, head []byte) (net.Conn, error) {
	d := net.Dialer{Timeout: 3 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if len(head) > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(head); err != nil {
			c.Close()
			return nil, err
		}
		_ = c.SetWriteDeadline(time.Time{})
	}
	return c, nil
}

// closedByPeer reports whether the server closed (or answered on) c, waiting at most wait.
func closedByPeer(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true // EOF, a reset, or bytes of an answer
}

// freePort returns a loopback address no one listens on now (for flags that take a fixed
// address; another process could take it before the child binds it, which is unlikely).
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// requestHead is an HTTP/1.1 request's head with a Content-Length.
func requestHead(addr, path string, contentLength int) []byte {
	return fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		path, addr, contentLength)
}
