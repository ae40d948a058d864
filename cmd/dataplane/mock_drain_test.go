package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A stop (the planner's SIGTERM) lets the requests in flight finish: the engines run until
// the HTTP server has drained.
func TestMockDrainsOnStop(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var logs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"mock", "--listen", "127.0.0.1:0", "--stats-every", "0", "--drain-timeout", "20s"}, &bytes.Buffer{}, &logs)
	}()
	listen := regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)
	var addr string
	require.Eventually(t, func() bool {
		m := listen.FindStringSubmatch(logs.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond)

	type result struct {
		code   int
		tokens int
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"mock","prompt":"hello there","max_tokens":400}`))
		if err != nil {
			res <- result{}
			return
		}
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		res <- result{resp.StatusCode, out.Usage.CompletionTokens}
	}()
	time.Sleep(300 * time.Millisecond) // the request is being decoded
	stop()
	r := <-res
	require.Equal(t, result{200, 400}, r, "the request in flight finished")
	require.Equal(t, 0, <-done)
}
