package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/worker"
	"dataplane/dataplane/worker/workertest"
	"dataplane/router/kvevents"
)

// LLM workers that fail, through the real Service over loopback HTTP: fake vLLM engines
// (/v1/completions as SSE, /health) that can be stopped (a listener that accepts and never
// answers, as a SIGSTOPped process), killed (nothing listens) and brought back.

// fakeEngine is a vLLM API server stand-in: /health answers 200; /v1/completions streams "w0
// w1 ..." (max_tokens words), or answers failWith when it is set.
type fakeEngine struct {
	addr        string
	failWith    atomic.Int32
	embeds      atomic.Int64 // bytes of the last request's prompt_embeds (base64)
	truncate    atomic.Bool  // stream one word, then end without [DONE] (the engine died)
	completions atomic.Int64
	mu          sync.Mutex
	srv         *http.Server
}

func startEngine(t *testing.T, ln net.Listener) *fakeEngine {
	t.Helper()
	e := &fakeEngine{addr: ln.Addr().String()}
	e.serve(ln)
	t.Cleanup(e.kill)
	return e
}

func (e *fakeEngine) url() string { return "http://" + e.addr }

func (e *fakeEngine) serve(ln net.Listener) {
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
	e.mu.Lock()
	e.srv = srv
	e.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with kill
}

// kill stops the engine: its listener and connections close, connecting is refused.
func (e *fakeEngine) kill() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.srv.Close()
}

// restart serves again on the same address.
func (e *fakeEngine) restart(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", e.addr)
	require.NoError(t, err)
	e.serve(ln)
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		w.WriteHeader(http.StatusOK)
		return
	case "/v1/completions":
	default:
		http.NotFound(w, r)
		return
	}
	e.completions.Add(1)
	var body struct {
		MaxTokens    int    `json:"max_tokens"`
		PromptEmbeds string `json:"prompt_embeds"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.embeds.Store(int64(len(body.PromptEmbeds)))
	if code := int(e.failWith.Load()); code != 0 {
		http.Error(w, fmt.Sprintf(`{"error":"engine at %s: dial tcp 10.1.2.3:8000: connection refused"}`, e.addr), code)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	if e.truncate.Load() {
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"w0 \",\"finish_reason\":null}]}\n\n")
		return
	}
	for i := range body.MaxTokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"w%d \",\"finish_reason\":null}]}\n\n", i)
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
}

// listeners are n loopback listeners ordered by address, which is the order the router breaks
// ties in (worker names are their URLs): the first gets an idle daemon's first request.
func listeners(t *testing.T, n int) []net.Listener {
	t.Helper()
	lns := make([]net.Listener, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[i] = ln
	}
	for i := range lns { // by URL, as strings compare
		for j := i + 1; j < len(lns); j++ {
			if lns[j].Addr().String() < lns[i].Addr().String() {
				lns[i], lns[j] = lns[j], lns[i]
			}
		}
	}
	return lns
}

// startHTTPDaemon serves a Service whose LLM workers are HTTP engines at urls ("worker i" to
// clients), probed every 100 ms (two failures: out), with a first-byte timeout of fbt. It
// returns the workers' KV-event engines too.
func startHTTPDaemon(t *testing.T, fbt time.Duration, urls ...string) (*testDaemon, []*kvevents.Engine) {
	t.Helper()
	opts := dataplane.DefaultServiceOptions()
	opts.Features.Host.Capacity = 64 << 20
	opts.Log = slog.New(slog.DiscardHandler)
	opts.HealthInterval, opts.HealthTimeout, opts.HealthFailures = 100*time.Millisecond, 100*time.Millisecond, 2
	svc, err := dataplane.NewService(opts)
	require.NoError(t, err)
	var engines []*kvevents.Engine
	for i, url := range urls {
		w, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: url, Label: fmt.Sprintf("worker %d", i), FirstByteTimeout: fbt})
		require.NoError(t, err)
		e, err := svc.AddWorker(w)
		require.NoError(t, err)
		engines = append(engines, e)
	}
	return &testDaemon{svc: svc, base: serveService(t, svc, DefaultOptions())}, engines
}

// complete posts a text completion and returns the status, the headers and the raw body.
func (d *testDaemon) complete(t *testing.T, maxTokens int) (int, http.Header, string) {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"prompt": "Once upon a time there was a worker", "max_tokens": maxTokens})
	resp, err := http.Post(d.base+"/v1/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(body)
}

// routedTo is the worker the decision log says the request answered by body went to, and why
// the worker named other was not chosen ("" if it was eligible).
func (d *testDaemon) routedTo(t *testing.T, body, other string) (string, string) {
	t.Helper()
	var out struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &out), body)
	return d.routedID(t, out.ID, other)
}

func (d *testDaemon) routedID(t *testing.T, id, other string) (string, string) {
	t.Helper()
	ld, ok := d.svc.Decisions().Get(id)
	require.True(t, ok, id)
	sc := ld.Decision.Score(other)
	require.NotNil(t, sc, other)
	return ld.Decision.Worker, sc.Excluded
}

// requireNoLoad checks that the router counts nothing in flight on any worker: every Start
// of a retried request was matched by one Finish.
func (d *testDaemon) requireNoLoad(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, w := range d.svc.Router().Snapshot() {
			if w.Requests != 0 || w.ActiveBlocks != 0 || w.PrefillTokens != 0 {
				return false
			}
		}
		return d.svc.Router().Slots().InFlight() == 0
	}, 10*time.Second, 10*time.Millisecond, "%+v", d.svc.Router().Snapshot())
}

func (d *testDaemon) requireHealthy(t *testing.T, url string, healthy bool) {
	t.Helper()
	want := 0.0
	if healthy {
		want = 1
	}
	require.Eventually(t, func() bool {
		return d.metric(t, `dataplane_router_worker_healthy{worker="`+url+`"}`) == want
	}, 10*time.Second, 10*time.Millisecond, "%s healthy %v", url, healthy)
}

// A stopped worker (accepts, never answers) costs a request its first-byte timeout, not the
// generation timeout: the request is answered by the other worker; the stopped one leaves
// routing and its probes keep failing.
func TestStoppedWorkerFailsOver(t *testing.T) {
	const fbt = 300 * time.Millisecond
	lns := listeners(t, 2)
	stopped := workertest.Stopped(t, lns[0]) // first in the router's tie order
	live := startEngine(t, lns[1])
	d, _ := startHTTPDaemon(t, fbt, stopped, live.url())

	// A picture, so the merged sequence (prompt_embeds) must still be there for the retry.
	png := dataURL(t, "image/png", "image_200x150.png")
	start := time.Now()
	code, _, out := d.postResp(t, "/v1/chat/completions", chatBody(2, textPart("what is this?"), imagePart(png)))
	took := time.Since(start)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "w0 w1 ", out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])
	require.Less(t, took, fbt+3*time.Second, "the first-byte timeout, then the other worker")
	require.GreaterOrEqual(t, took, fbt)
	require.Positive(t, live.embeds.Load(), "the retry sent the merged sequence")
	to, why := d.routedID(t, out["id"].(string), stopped)
	require.Equal(t, live.url(), to)
	require.Equal(t, "failed: no first byte within 300ms", why, "the decision log shows the retry")
	t.Logf("answered in %v by the other worker (first-byte timeout %v)", took.Round(time.Millisecond), fbt)
	d.requireNoLoad(t)
	d.requireNoFeatureBytes(t)

	d.requireHealthy(t, stopped, false)
	require.Eventually(t, func() bool {
		return d.metric(t, `dataplane_worker_probes_total{result="failed",worker="`+stopped+`"}`) >= 2
	}, 10*time.Second, 10*time.Millisecond)
	require.Positive(t, d.metric(t, `dataplane_worker_probes_total{result="ok",worker="`+live.url()+`"}`))
	for range 5 {
		code, _, body := d.complete(t, 1)
		require.Equal(t, 200, code, body)
		to, why := d.routedTo(t, body, stopped)
		require.Equal(t, live.url(), to)
		require.Equal(t, "unhealthy", why)
	}
	code, _ = get(t, d.base+"/readyz")
	require.Equal(t, 200, code, "one worker is healthy")
}

// One of two workers killed: no client sees a 502 (the request that finds it dead is retried on
// the other; later ones never go there), and once the probes have failed no request is sent
// to it.
func TestKilledWorkerNo502(t *testing.T) {
	lns := listeners(t, 2)
	dead, live := startEngine(t, lns[0]), startEngine(t, lns[1])
	d, _ := startHTTPDaemon(t, 5*time.Second, dead.url(), live.url())
	code, _, body := d.complete(t, 1)
	require.Equal(t, 200, code, body)
	require.EqualValues(t, 1, dead.completions.Load(), "idle workers: the first in name order")

	dead.kill()
	statuses := map[int]int{}
	for range 200 {
		code, _, _ := d.complete(t, 1)
		statuses[code]++
	}
	require.Equal(t, map[int]int{200: 200}, statuses)
	require.EqualValues(t, 200, live.completions.Load())
	d.requireNoLoad(t)

	d.requireHealthy(t, dead.url(), false)
	require.Eventually(t, func() bool {
		return d.metric(t, `dataplane_worker_probes_total{result="failed",worker="`+dead.url()+`"}`) >= 2
	}, 10*time.Second, 10*time.Millisecond)
	for range 20 {
		code, _, body := d.complete(t, 1)
		require.Equal(t, 200, code, body)
		to, why := d.routedTo(t, body, dead.url())
		require.Equal(t, live.url(), to)
		require.Equal(t, "unhealthy", why, "never tried")
	}
	require.EqualValues(t, 220, live.completions.Load())
}

// storedBatch is a vLLM KV-event batch (msgpack, array layout) storing blocks of 16 tokens
// under engine hashes first, first+1, ..., chained after parent (0: none).
func storedBatch(first, parent uint64, blocks int) []byte {
	b := []byte{0x93} // [ts, events, dp rank]
	b = binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(1.5))
	b = append(b, 0x91, 0x97, 0xab) // one event, 7 fields, "BlockStored"
	b = append(b, "BlockStored"...)
	b = append(b, 0x90|byte(blocks))
	for i := range blocks {
		b = binary.BigEndian.AppendUint64(append(b, 0xcf), first+uint64(i))
	}
	if parent == 0 {
		b = append(b, 0xc0)
	} else {
		b = binary.BigEndian.AppendUint64(append(b, 0xcf), parent)
	}
	b = binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(blocks*16))
	for i := range blocks * 16 {
		b = append(b, byte(int(first)+i)&0x7f)
	}
	b = append(b, 16, 0xc0, 0xa3)
	return append(append(b, "GPU"...), 0)
}

// All workers dead: /readyz says so, requests get 503 with Retry-After, the workers' blocks
// leave the index; a worker that comes back is routable after one good probe, and its blocks
// come back by replay when it publishes again.
func TestAllWorkersDead(t *testing.T) {
	lns := listeners(t, 2)
	a, b := startEngine(t, lns[0]), startEngine(t, lns[1])
	d, engines := startHTTPDaemon(t, 5*time.Second, a.url(), b.url())
	batches := [][]byte{storedBatch(100, 0, 2), storedBatch(102, 101, 2)}
	engines[0].Live(0, batches[0], nil)
	engines[1].Live(0, batches[0], nil)
	held := func(url string) int64 {
		for _, w := range d.svc.Router().Snapshot() {
			if w.Worker == url {
				return w.Blocks[0]
			}
		}
		t.Fatalf("no worker %s", url)
		return 0
	}
	require.EqualValues(t, 2, held(a.url()))
	require.EqualValues(t, 2, held(b.url()))
	code, _ := get(t, d.base+"/readyz")
	require.Equal(t, 200, code)

	a.kill()
	b.kill()
	require.Eventually(t, func() bool {
		code, body := get(t, d.base+"/readyz")
		return code == 503 && body == "not ready: no healthy LLM worker\n"
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return held(a.url())+held(b.url()) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the dead workers' blocks left the index")
	require.Zero(t, d.svc.Router().Index().Entries())
	code, h, body := d.complete(t, 1)
	require.Equal(t, 503, code, body)
	require.Equal(t, "1", h.Get("Retry-After"))
	require.Contains(t, body, "no LLM worker can take the request")

	// a comes back: one good probe and it takes requests again.
	a.restart(t)
	d.requireHealthy(t, a.url(), true)
	code, _ = get(t, d.base+"/readyz")
	require.Equal(t, 200, code)
	code, _, body = d.complete(t, 2)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"text":"w0 w1 "`)
	// It publishes again (its next batch): the engine replays its history from 0.
	engines[0].Live(1, batches[1], func(from uint64, deliver func(uint64, []byte)) error {
		for seq := from; seq < uint64(len(batches)); seq++ {
			deliver(seq, batches[seq])
		}
		return nil
	})
	require.EqualValues(t, 4, held(a.url()), "its blocks are back")
	require.Zero(t, held(b.url()))
}

// A worker's failure reaches the client as its label and the kind of failure, never an
// address: a 500 (with an engine message full of addresses) and a stream that breaks off.
func TestWorkerFailureBodyHasNoAddress(t *testing.T) {
	lns := listeners(t, 1)
	e := startEngine(t, lns[0])
	e.failWith.Store(http.StatusInternalServerError)
	d, _ := startHTTPDaemon(t, 5*time.Second, e.url())
	_, port, err := net.SplitHostPort(e.addr)
	require.NoError(t, err)
	code, _, body := d.complete(t, 1)
	require.Equal(t, 502, code, body)
	require.NotContains(t, body, "127.0.0.1")
	require.NotContains(t, body, port)
	require.NotContains(t, body, "10.1.2.3")
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &out), body)
	msg, _ := apiError(t, out)
	require.Equal(t, "worker 0: answered 500 Internal Server Error", msg)

	// The worker was taken out of routing by that request; its probe brings it back. Now its
	// stream breaks off after a token: the SSE error event says so, without an address.
	e.failWith.Store(0)
	e.truncate.Store(true)
	d.requireHealthy(t, e.url(), true)
	raw, _ := json.Marshal(map[string]any{"prompt": "hi", "max_tokens": 4, "stream": true})
	resp, err := http.Post(d.base+"/v1/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	sse, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, string(sse), `"text":"w0 "`)
	require.Contains(t, string(sse), "the LLM worker failed: worker 0: stream ended early")
	require.False(t, strings.Contains(string(sse), "127.0.0.1") || strings.Contains(string(sse), port), string(sse))
}

// Workers come and go (serve --workers fleet): a removed worker leaves routing, the index and
// the service; its probe counters go; the service is not ready once none is left; a worker
// whose registration fails is not kept; a removed one can be added again.
func TestWorkersJoinAndLeave(t *testing.T) {
	lns := listeners(t, 2)
	a, b := startEngine(t, lns[0]), startEngine(t, lns[1])
	d, engines := startHTTPDaemon(t, 5*time.Second, a.url(), b.url())
	engines[0].Live(0, storedBatch(100, 0, 4), nil)
	require.Equal(t, int64(4), d.svc.Router().Index().Entries())
	require.Eventually(t, func() bool {
		return d.metric(t, `dataplane_worker_probes_total{result="ok",worker="`+a.url()+`"}`) > 0
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, d.svc.RemoveWorker(a.url(), d.svc.Feed().RemoveWorker))
	require.Zero(t, d.svc.Router().Index().Entries(), "its blocks left the index")
	for range 4 {
		code, _, body := d.complete(t, 1)
		require.Equal(t, 200, code, body)
		to, _ := d.routedTo(t, body, b.url())
		require.Equal(t, b.url(), to)
	}
	time.Sleep(250 * time.Millisecond) // probe rounds pass: none about the removed worker
	_, metrics := get(t, d.base+"/metrics")
	require.NotContains(t, metrics, `worker="`+a.url()+`"`)
	require.Error(t, d.svc.RemoveWorker(a.url(), d.svc.Feed().RemoveWorker), "removed already")
	code, _ := get(t, d.base+"/readyz")
	require.Equal(t, 200, code)

	require.NoError(t, d.svc.RemoveWorker(b.url(), d.svc.Feed().RemoveWorker))
	code, _ = get(t, d.base+"/readyz")
	require.Equal(t, 503, code, "no worker left")
	code, _, body := d.complete(t, 1)
	require.Equal(t, 503, code, body)

	wa, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: a.url(), Name: "engine-a", Label: "engine-a"})
	require.NoError(t, err)
	_, err = d.svc.AddWorkerVia(wa, func(string) (*kvevents.Engine, error) { return nil, errors.New("no slot") })
	require.ErrorContains(t, err, "no slot")
	code, _ = get(t, d.base+"/readyz")
	require.Equal(t, 503, code, "a worker the router refused is not kept")
	_, err = d.svc.AddWorkerVia(wa, d.svc.Feed().AddWorker)
	require.NoError(t, err)
	code, _ = get(t, d.base+"/readyz")
	require.Equal(t, 200, code)
	code, _, body = d.complete(t, 1)
	require.Equal(t, 200, code, body)
	to, _ := d.routedTo(t, body, "engine-a")
	require.Equal(t, "engine-a", to, "routed by its own name, not its address")
}
