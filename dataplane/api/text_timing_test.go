package api

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkTextOnlyHTTP: BenchmarkTextOnlyPath (cmd/dataplane) without the mock fleet. The API
// server, over loopback, in front of BenchmarkTextRequest's worker that answers at once, beside
// a fasthttp hello-world answering as many bytes, driven by the same 32 clients, rounds
// alternating. It separates the daemon's own cost per request from the in-process engines':
// x-hello-cpu is hello-world's CPU per request (client and server) over the daemon's.
func BenchmarkTextOnlyHTTP(b *testing.B) {
	srv, _ := textServer(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	daemon := listen(b)
	go srv.Serve(ctx, daemon)   //nolint:errcheck
	answer := make([]byte, 320) // about the daemon's answer's length
	hello := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(answer)
	}}
	helloLn := listen(b)
	go hello.Serve(helloLn) //nolint:errcheck
	defer hello.Shutdown()  //nolint:errcheck

	body := []byte(textRequest)
	client := &fasthttp.Client{MaxConnsPerHost: 32}
	const perRound, clients = 4000, 32
	round := func(url string) time.Duration {
		c0 := cpuTime()
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for i := c; i < perRound; i += clients {
					req.SetRequestURI(url)
					req.Header.SetMethod("POST")
					req.SetBody(body)
					if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Errorf("%s: %v %d %s", url, err, resp.StatusCode(), resp.Body())
						return
					}
				}
			})
		}
		wg.Wait()
		return cpuTime() - c0
	}
	var daemonCPU, helloCPU time.Duration
	for b.Loop() {
		daemonCPU += round("http://" + daemon.Addr().String() + "/v1/completions")
		helloCPU += round("http://" + helloLn.Addr().String() + "/")
	}
	n := float64(b.N * perRound)
	b.ReportMetric(daemonCPU.Seconds()*1e6/n, "cpu-us/req")
	b.ReportMetric(helloCPU.Seconds()*1e6/n, "hello-cpu-us/req")
	b.ReportMetric(helloCPU.Seconds()/daemonCPU.Seconds(), "x-hello-cpu")
}

func listen(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}

// cpuTime is the process's CPU time, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
