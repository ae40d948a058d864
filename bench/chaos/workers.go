package chaos

// Scenarios about LLM workers: two `dataplane mock` processes behind serve's --workers; one
// stopped, both killed, one killed.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	firstByteTimeout = 2 * time.Second // --worker-first-byte-timeout
	healthInterval   = time.Second     // --worker-health-interval
)

// textBody is a text-only request: the worker gets token ids, no media path involved.
func textBody(i int) []byte {
	return chatBody(8, false, textPart(fmt.Sprintf("Request %d: say something short.", i)))
}

// startWorkers runs n mock worker processes and serve in front of them (HTTP workers, KV
// events off), and checks that a text request goes through.
func (t *trial) startWorkers(ctx context.Context, n int) ([]*proc, *daemon, error) {
	var mocks []*proc
	var urls []string
	for i := range n {
		p, url, err := t.startMock(ctx, fmt.Sprintf("mock%d", i), "--speedup=10")
		if err != nil {
			return nil, nil, err
		}
		mocks, urls = append(mocks, p), append(urls, url)
	}
	d, err := t.startServe(ctx, "--workers="+strings.Join(urls, ","),
		fmt.Sprintf("--worker-first-byte-timeout=%v", firstByteTimeout), fmt.Sprintf("--worker-health-interval=%v", healthInterval))
	if err != nil {
		return nil, nil, err
	}
	for i := range 2 * n {
		if r := t.do(ctx, http.MethodPost, d.base+chatPath, textBody(i), 10*time.Second); r.status != http.StatusOK {
			return nil, nil, fmt.Errorf("warm-up request: %s: %.120s", r.key(), r.message())
		}
	}
	return mocks, d, nil
}

// workerStopped: SIGSTOP one of two workers (its socket still accepts; nothing answers) and
// send requests for 10 s from 4 clients (200 ms back-off after a refusal). No client should
// wait much past the first-byte timeout, and the running worker should answer most of them.
func workerStopped(ctx context.Context, t *trial) {
	mocks, d, err := t.startWorkers(ctx, 2)
	if err != nil {
		t.setup(err)
		return
	}
	const clientTimeout = 8 * time.Second
	t.timeout("worker-first-byte-timeout", firstByteTimeout)
	if !t.stopGroup(mocks[0], syscall.SIGSTOP) {
		return
	}
	t.onCleanup(func() { _ = mocks[0].signalGroup(syscall.SIGCONT) })
	end := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := c; time.Now().Before(end) && ctx.Err() == nil && !d.exited(); i += 4 {
				if r := t.post(ctx, d.base, chatPath, textBody(i), clientTimeout); r.status != http.StatusOK {
					sleep(ctx, 200*time.Millisecond) // a client backs off; no hot loop of refusals
				}
			}
		})
	}
	sleep(ctx, 5*time.Second)
	ready := t.get(ctx, d.base+"/readyz", 2*time.Second)
	wg.Wait()
	_ = mocks[0].signalGroup(syscall.SIGCONT)
	t.note("/readyz with one worker stopped: %s; client timeout %s", ready.key(), formatDuration(clientTimeout))
	st := t.statuses()
	answered := 0
	for _, n := range st {
		answered += n
	}
	if st["200"]*2 < answered {
		t.fail("%d of %d requests answered 200 with one worker running", st["200"], answered)
	}
	t.mu.Lock()
	longest := t.row.LongestWait
	t.mu.Unlock()
	if limit := firstByteTimeout + 2*time.Second; longest > limit {
		t.fail("a client waited %s > first-byte timeout %s + 2s", formatDuration(longest), formatDuration(firstByteTimeout))
	}
}

// workersKilled: kill both workers. /readyz must turn 503 and requests get 503 with
// Retry-After.
func workersKilled(ctx context.Context, t *trial) {
	mocks, d, err := t.startWorkers(ctx, 2)
	if err != nil {
		t.setup(err)
		return
	}
	for _, m := range mocks {
		m.kill()
	}
	killed := time.Now()
	ready, readyAfter := result{}, time.Duration(0)
	for time.Since(killed) < 5*time.Second && ctx.Err() == nil {
		ready = t.get(ctx, d.base+"/readyz", 2*time.Second)
		if ready.status == http.StatusServiceUnavailable {
			readyAfter = time.Since(killed)
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	if readyAfter > 0 {
		t.note("/readyz 503 %s after the kill", formatDuration(readyAfter))
	} else {
		t.fail("/readyz %s 5s after both workers died", ready.key())
	}
	const clientTimeout = 10 * time.Second
	t.timeout("client", clientTimeout)
	retry, n503 := 0, 0
	for i := range 10 {
		r := t.post(ctx, d.base, chatPath, textBody(i), clientTimeout)
		if r.status == http.StatusServiceUnavailable {
			n503++
			if r.header.Get("Retry-After") != "" {
				retry++
			}
		}
	}
	t.note("Retry-After on %d of %d 503", retry, n503)
	if bad := unexpected(t.statuses(), "503"); bad != "" {
		t.fail("want 503, got %s", bad)
	}
	if retry < n503 {
		t.fail("%d of %d 503 without Retry-After", n503-retry, n503)
	}
}

// oneWorkerKilled: kill one of two workers and send 200 requests, 8 at a time: the other
// worker must answer all of them (a dead worker is retried elsewhere, then avoided).
func oneWorkerKilled(ctx context.Context, t *trial) {
	mocks, d, err := t.startWorkers(ctx, 2)
	if err != nil {
		t.setup(err)
		return
	}
	mocks[0].kill()
	const clientTimeout = 10 * time.Second
	t.timeout("client", clientTimeout)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				t.post(ctx, d.base, chatPath, textBody(i), clientTimeout)
			}
		})
	}
	for i := range 200 {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	st := t.statuses()
	t.note("502 on %d of 200", st["502"])
	if bad := unexpected(st, "200"); bad != "" {
		t.fail("with one worker left: %s", bad)
	}
}
