package chaos

// Scenarios about media sources and clients: a FIFO that never delivers, an HTTP server that
// trickles, clients that leave while their pictures are prepared.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// baseline is the median latency of n small-picture requests (counted in the row), and whether
// they all got 200.
func (t *trial) baseline(ctx context.Context, d *daemon, n int) (time.Duration, bool) {
	var took []time.Duration
	ok := true
	for i := range n {
		r := t.post(ctx, d.base, chatPath, smallImageBody(uint64(10+i)), 15*time.Second)
		ok = ok && r.status == http.StatusOK
		took = append(took, r.took)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	return took[len(took)/2], ok
}

// fastBound is how long an unrelated request may take next to stuck ones: 3x the baseline
// and half a second (two shared cores are noisy).
func fastBound(base time.Duration) time.Duration { return 3*base + 500*time.Millisecond }

// stuckThenUnrelated sends two requests for url at once, then, after pause, an unrelated
// small-picture request; it returns the two and the unrelated one.
func (t *trial) stuckThenUnrelated(ctx context.Context, d *daemon, url string, pause, timeout time.Duration) ([]result, result) {
	body := chatBody(8, false, imagePart(url), textPart("What is in this picture?"))
	stuck := make(chan result, 2)
	for range 2 {
		go func() { stuck <- t.post(ctx, d.base, chatPath, body, timeout) }()
	}
	sleep(ctx, pause)
	un := t.post(ctx, d.base, chatPath, smallImageBody(99), timeout)
	return []result{<-stuck, <-stuck}, un
}

// judgeUnrelated fails the row when the unrelated request was not a quick 200.
func (t *trial) judgeUnrelated(un result, base time.Duration) {
	t.note("unrelated request %s in %s (baseline %s)", un.key(), formatDuration(un.took), formatDuration(base))
	if un.status != http.StatusOK {
		t.fail("unrelated request got %s", un.key())
	} else if un.took > fastBound(base) {
		t.fail("unrelated request took %s vs baseline %s", formatDuration(un.took), formatDuration(base))
	}
}

// fifoMedia: --media-dir holds a FIFO nobody writes to; two requests name it by file:// URL.
// Opening or reading it blocks for ever: both must be answered within --item-timeout, and an
// unrelated request meanwhile must not wait behind them.
func fifoMedia(ctx context.Context, t *trial) {
	dir := filepath.Join(t.dir, "media")
	fifo := filepath.Join(dir, "stuck.png")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.setup(err)
		return
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.setup(fmt.Errorf("mkfifo %s: %w", fifo, err))
		return
	}
	const itemTimeout = 5 * time.Second
	d, err := t.startServe(ctx, "--media-dir="+dir, fmt.Sprintf("--item-timeout=%v", itemTimeout))
	if err != nil {
		t.setup(err)
		return
	}
	t.timeout("item-timeout", itemTimeout)
	base, ok := t.baseline(ctx, d, 3)
	if !ok {
		t.fail("baseline requests not all 200")
	}
	stuck, un := t.stuckThenUnrelated(ctx, d, "file://"+fifo, 500*time.Millisecond, 3*itemTimeout)
	t.note("FIFO requests: %s", durations(stuck))
	for _, r := range stuck {
		if r.status == 0 || r.took > itemTimeout+time.Second {
			t.fail("a FIFO request waited %s (%s) > item-timeout %s", formatDuration(r.took), r.key(), formatDuration(itemTimeout))
			break
		}
	}
	t.judgeUnrelated(un, base)
}

// slowMedia: with --fetch-http --fetch-private, two requests name a loopback server that
// sends its answer 1 byte a second. An unrelated request must stay near the baseline, and the
// slow ones must end by --item-timeout.
func slowMedia(ctx context.Context, t *trial) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.setup(err)
		return
	}
	trickle := &trickler{stop: make(chan struct{})}
	srv := &http.Server{Handler: trickle, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.onCleanup(func() { close(trickle.stop); srv.Close() })

	const itemTimeout = 5 * time.Second
	d, err := t.startServe(ctx, "--fetch-http", "--fetch-private", fmt.Sprintf("--item-timeout=%v", itemTimeout))
	if err != nil {
		t.setup(err)
		return
	}
	t.timeout("item-timeout", itemTimeout)
	base, ok := t.baseline(ctx, d, 3)
	if !ok {
		t.fail("baseline requests not all 200")
	}
	url := "http://" + ln.Addr().String() + "/slow.png"
	stuck, un := t.stuckThenUnrelated(ctx, d, url, time.Second, 3*itemTimeout)
	t.note("slow-fetch requests: %s; the server sent %d bytes on %d connections", durations(stuck), trickle.sent(), trickle.conns())
	for _, r := range stuck {
		if r.status == 0 || r.took > itemTimeout+2*time.Second {
			t.fail("a slow fetch held its client %s (%s) > item-timeout %s", formatDuration(r.took), r.key(), formatDuration(itemTimeout))
			break
		}
	}
	t.judgeUnrelated(un, base)
}

// trickler answers every request with a 1 MiB image/png body, one byte a second.
type trickler struct {
	stop chan struct{}
	mu   sync.Mutex
	n, c int
}

func (tr *trickler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tr.mu.Lock()
	tr.c++
	tr.mu.Unlock()
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", strconv.Itoa(1<<20))
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	sig := []byte("\x89PNG\r\n\x1a\n")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		b := byte(0)
		if i < len(sig) {
			b = sig[i]
		}
		if _, err := w.Write([]byte{b}); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		tr.mu.Lock()
		tr.n++
		tr.mu.Unlock()
		select {
		case <-tick.C:
		case <-r.Context().Done():
			return
		case <-tr.stop:
			return
		}
	}
}

func (tr *trickler) sent() int  { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.n }
func (tr *trickler) conns() int { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.c }

// clientLeaves: 16 clients send a 4 MB noise picture each and close the socket as soon as it
// is written, while the daemon prepares the pictures. The daemon's own counters must show them
// as 499 / cancelled, never 500 / error.
func clientLeaves(ctx context.Context, t *trial) {
	pics := t.h.pics.noisePNGs(16)
	d, err := t.startServe(ctx)
	if err != nil {
		t.setup(err)
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for i, p := range pics {
		body := chatBody(8, false, imagePart(dataURL(p)), textPart(fmt.Sprintf("Picture %d: what is in it?", i)))
		msg := append(requestHead(d.addr, chatPath, len(body)), body...)
		wg.Go(func() {
			c, err := rawConn(ctx, d.addr, msg)
			if err != nil {
				t.note("client %d: %v", i, err)
				return
			}
			c.Close()
			mu.Lock()
			sent++
			mu.Unlock()
		})
	}
	wg.Wait()
	// Wait for the daemon to count every request (or 15 s).
	var codes, outcomes map[string]float64
	deadline := time.Now().Add(15 * time.Second)
	for {
		m, err := t.scrape(ctx, d)
		if err == nil {
			codes = m.by("dataplane_http_requests_total", "code", "route", chatPath)
			outcomes = m.by("dataplane_requests_total", "outcome")
		}
		total := 0.0
		for _, n := range codes {
			total += n
		}
		if int(total) >= sent || time.Now().After(deadline) || !sleep(ctx, 250*time.Millisecond) {
			break
		}
	}
	t.mu.Lock()
	t.row.StatusSource = "daemon's counters"
	for code, n := range codes {
		t.row.Statuses[code] += int(n)
	}
	t.mu.Unlock()
	t.note("%d requests sent and abandoned; dataplane_requests_total by outcome: %s", sent, formatFloats(outcomes))
	server := map[string]float64{}
	for code, n := range codes {
		if len(code) == 3 && code[0] == '5' {
			server[code] = n
		}
	}
	if len(server) > 0 || outcomes["error"] > 0 {
		t.fail("departed clients counted as %s / outcome error×%.0f", formatFloats(server), outcomes["error"])
	}
	if codes["499"] == 0 {
		t.fail("no departed client counted as 499")
	}
	if outcomes["cancelled"] == 0 {
		t.fail("no request counted as cancelled")
	}
}

// formatFloats writes counts as formatStatuses does.
func formatFloats(m map[string]float64) string {
	im := map[string]int{}
	for k, v := range m {
		im[k] = int(v)
	}
	return formatStatuses(im)
}
