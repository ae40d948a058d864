package chaos

// Scenarios about memory: bodies that never arrive, pictures that decode huge, overload of
// large pictures, requests that can never fit the feature budget.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

const chatPath = "/v1/chat/completions"

// smallImageBody is the "normal" request: a 64 x 64 picture and a question, 8 tokens back.
func smallImageBody(seed uint64) []byte {
	return chatBody(8, false, imagePart(dataURL(smallPNG(seed))), textPart("What is in this picture?"))
}

// unexpected formats the statuses not in allowed ("500×3 timeout×1"); "" when there are none.
func unexpected(m map[string]int, allowed ...string) string {
	rest := map[string]int{}
	for k, n := range m {
		if !slices.Contains(allowed, k) {
			rest[k] = n
		}
	}
	if len(rest) == 0 {
		return ""
	}
	return formatStatuses(rest)
}

// sleep waits d or until ctx ends; it reports whether the whole d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// bodyFlood: 100 connections each announce a body of 64 MiB - 1 and send one byte of it, then
// hold; meanwhile a client sends small requests. The daemon must not reserve what bodies
// announce, only what arrives, and must keep answering.
func bodyFlood(ctx context.Context, t *trial) {
	d, err := t.startServe(ctx)
	if err != nil {
		t.setup(err)
		return
	}
	const conns, announced = 100, 64<<20 - 1
	var held []net.Conn
	t.onCleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	head := append(requestHead(d.addr, chatPath, announced), '{')
	for range conns {
		c, err := rawConn(ctx, d.addr, head)
		if err != nil {
			t.note("flood connection %d: %v", len(held)+1, err)
			break
		}
		held = append(held, c)
	}
	const clientTimeout = 10 * time.Second
	t.timeout("client", clientTimeout)
	body := smallImageBody(1)
	end := time.Now().Add(5 * time.Second)
	for n := 0; time.Now().Before(end) && ctx.Err() == nil && !d.exited(); n++ {
		t.post(ctx, d.base, chatPath, body, clientTimeout)
		sleep(ctx, 100*time.Millisecond)
	}
	closed := 0
	for _, c := range held {
		if closedByPeer(c, 10*time.Millisecond) {
			closed++
		}
	}
	t.note("%d flood connections held %d MiB announced; %d closed or answered by the daemon", len(held), len(held)*announced>>20, closed)
	st := t.statuses()
	if st["200"] == 0 {
		t.fail("no small request answered 200")
	}
	if bad := unexpected(st, "200", "429", "503"); bad != "" {
		t.fail("small requests got %s", bad)
	}
}

// hugeFrames: one request with a video given as 16 pictures, 15 of them zero-filled
// 9400 x 9400 PNGs (~5 MB on the wire, ~4 GB decoded). Expect an answer (200, a 4xx, or 503)
// with the resident set within the budget.
func hugeFrames(ctx context.Context, t *trial) {
	huge := t.h.pics.hugePNG() // before serve starts: its cost is not the daemon's
	const itemTimeout = 30 * time.Second
	d, err := t.startServe(ctx, fmt.Sprintf("--item-timeout=%v", itemTimeout))
	if err != nil {
		t.setup(err)
		return
	}
	frames := make([]string, 16)
	hugeURL := dataURL(huge)
	for i := range 15 {
		frames[i] = hugeURL
	}
	frames[15] = dataURL(smallPNG(2))
	body := chatBody(8, false, videoPart(frames), textPart("What happens in this video?"))
	t.note("15 pictures of %dx%d, %.1f MB of PNG, body %.1f MB", hugeSide, hugeSide, float64(15*len(huge))/1e6, float64(len(body))/1e6)
	t.timeout("item-timeout", itemTimeout)
	r := t.post(ctx, d.base, chatPath, body, itemTimeout+15*time.Second)
	if r.status == 200 {
		t.note("answer 200 in %s", formatDuration(r.took))
	} else if r.status != 0 {
		t.note("answer %d in %s: %.120s", r.status, formatDuration(r.took), r.message())
	}
	switch {
	case r.status == 200, r.status >= 400 && r.status < 500, r.status == 503:
	default:
		t.fail("got %s: %.120s", r.key(), r.message())
	}
}

// imageOverload: 400 clients send 4 MB noise pictures for 20 s against a 64 MiB feature
// budget. Expect 200, 429 or 503 (with Retry-After) and the resident set within the budget.
func imageOverload(ctx context.Context, t *trial) {
	pics := t.h.pics.noisePNGs(16)
	bodies := make([][]byte, len(pics))
	for i, p := range pics {
		bodies[i] = chatBody(8, false, imagePart(dataURL(p)), textPart("Describe the noise."))
	}
	const itemTimeout, clientTimeout = 10 * time.Second, 25 * time.Second
	d, err := t.startServe(ctx, fmt.Sprintf("--feature-bytes=%d", 64<<20), fmt.Sprintf("--item-timeout=%v", itemTimeout))
	if err != nil {
		t.setup(err)
		return
	}
	t.timeout("item-timeout", itemTimeout)
	t.note("%d clients, pictures of %.1f MB (bodies %.1f MB)", 400, float64(len(pics[0]))/1e6, float64(len(bodies[0]))/1e6)
	end := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	noRetry, overloaded := 0, 0
	for i := range 400 {
		wg.Go(func() {
			for k := i; time.Now().Before(end) && ctx.Err() == nil && !d.exited(); k++ {
				r := t.post(ctx, d.base, chatPath, bodies[k%len(bodies)], clientTimeout)
				if r.status == 429 || r.status == 503 {
					mu.Lock()
					overloaded++
					if r.header.Get("Retry-After") == "" {
						noRetry++
					}
					mu.Unlock()
				}
				if r.status != 200 {
					sleep(ctx, 200*time.Millisecond) // a client backs off; no hot loop of refusals
				}
			}
		})
	}
	wg.Wait()
	st := t.statuses()
	if bad := unexpected(st, "200", "429", "503"); bad != "" {
		t.fail("unexpected %s", bad)
	}
	if overloaded > 0 {
		t.note("Retry-After on %d of %d 429/503", overloaded-noRetry, overloaded)
		if noRetry > 0 {
			t.fail("%d of %d 429/503 without Retry-After", noRetry, overloaded)
		}
	}
}

// neverFits: with an 8 MiB feature budget, 24 pictures of 256 tokens at width 1024 (512 KiB of
// bf16 features each, 12 MiB in all, and as much again merged) can never fit: expect 413.
func neverFits(ctx context.Context, t *trial) {
	d, err := t.startServe(ctx, fmt.Sprintf("--feature-bytes=%d", 8<<20), "--demo-hidden=1024", "--item-timeout=10s")
	if err != nil {
		t.setup(err)
		return
	}
	parts := []part{textPart("Compare these pictures.")}
	for i := range 24 {
		parts = append(parts, imagePart(dataURL(squarePNG(32, uint64(100+i)))))
	}
	t.timeout("item-timeout", 10*time.Second)
	r := t.post(ctx, d.base, chatPath, chatBody(8, false, parts...), 20*time.Second)
	t.note("24 pictures x 256 tokens x 1024 x bf16 = 12 MiB of features vs --feature-bytes 8 MiB; answer %s: %.120s", r.key(), r.message())
	if r.status != 413 {
		t.fail("want 413, got %s", r.key())
	}
}

// durations formats a list of results as "504 in 5.0s, timeout in 15.0s".
func durations(rs []result) string {
	sort.Slice(rs, func(i, j int) bool { return rs[i].took < rs[j].took })
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.key() + " in " + formatDuration(r.took)
	}
	return strings.Join(parts, ", ")
}
