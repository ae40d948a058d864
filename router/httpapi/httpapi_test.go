package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"dataplane/router"
	"dataplane/router/index"
	"dataplane/router/internal/testrand"
	"dataplane/router/topology"
)

// twoWorkers is a router with workers w1 and w2, and their index slots.
func twoWorkers(t *testing.T) (r *router.Router, w1, w2 index.Worker) {
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	w1, err = r.AddWorker("w1")
	require.NoError(t, err)
	w2, err = r.AddWorker("w2")
	require.NoError(t, err)
	return r, w1, w2
}

func TestHTTPAPI(t *testing.T) {
	rnd := testrand.New(t)
	r, _, w2 := twoWorkers(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(router.NewCollector(r))
	h := NewHandler(r, reg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: h.Handle, MaxRequestBodySize: 1 << 20}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown()
	base := "http://" + ln.Addr().String()

	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	prompt := testrand.Tokens(rnd, 100)
	h2, _ := router.NewHasher(16)
	hashes, _ := h2.Sequence(nil, prompt, router.SeedFor("", "t1"), []router.Media{{Hash: router.MediaHash("cat.png"), Offset: 10, Length: 20}})
	r.Index().Store(w2, 0, 0, hashes[:5], nil)

	ids, _ := json.Marshal(prompt)
	body := fmt.Sprintf(`{"token_ids": %s, "salt": "t1", "media": [{"id": "cat.png", "offset": 10, "length": 20}], "request_id": "req-1"}`, ids)
	code, out := call("POST", "/v1/route", body)
	require.Equal(t, 200, code, out)
	var d router.Decision
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, "w2", d.Worker)
	require.Equal(t, 6, d.Blocks)
	require.Equal(t, 5, d.Score("w2").Overlap)
	_, _, reqs := r.Slots().Load(w2)
	require.Equal(t, int64(1), reqs)

	// The same media given by hash, as a string; the id already tracked is a conflict.
	body = fmt.Sprintf(`{"token_ids": %s, "salt": "t1", "media": [{"hash": "%d", "offset": 10, "length": 20}], "request_id": "req-1"}`, ids, router.MediaHash("cat.png"))
	code, out = call("POST", "/v1/route", body)
	require.Equal(t, 409, code, out)

	code, out = call("POST", "/v1/lifecycle", `{"request_id": "req-1", "event": "first_token"}`)
	require.Equal(t, 200, code, out)
	code, _ = call("POST", "/v1/lifecycle", `{"request_id": "req-1", "event": "finish"}`)
	require.Equal(t, 200, code)
	code, out = call("POST", "/v1/lifecycle", `{"request_id": "req-1", "event": "finish"}`)
	require.Equal(t, 404, code, out)

	bad := func(method, path, body string, want int, contains string) {
		t.Helper()
		code, out := call(method, path, body)
		require.Equal(t, want, code, out)
		require.Contains(t, out, contains)
	}
	bad("POST", "/v1/route", `{"token_ids": [1, -2]}`, 400, "body:")
	bad("POST", "/v1/route", `{"token_ids": []}`, 400, "token_ids: empty")
	bad("POST", "/v1/route", `{"token_ids": [1], "media": [{"id": "x", "hash": 1, "offset": 0, "length": 1}]}`, 400, "media[0]")
	bad("POST", "/v1/route", `{"token_ids": [1], "media": [{"hash": "nope", "offset": 0, "length": 1}]}`, 400, "media[0].hash")
	bad("POST", "/v1/route", `{"token_ids": [1], "media": [{"id": "x", "offset": 0, "length": 9}]}`, 400, "media item 0")
	bad("POST", "/v1/route", `{"token_ids": [1], "allow": ["w9"]}`, 503, "no eligible worker")
	bad("GET", "/v1/route", ``, 405, "takes POST")
	bad("POST", "/v1/lifecycle", `{"request_id": "x", "event": "explode"}`, 400, "want prefill_done, first_token")
	long := strings.Repeat("r", 257) // ids are kept while tracked: their length is bounded
	bad("POST", "/v1/route", `{"token_ids": [1], "request_id": "`+long+`"}`, 400, "request_id: 257 bytes, at most 256")
	bad("POST", "/v1/lifecycle", `{"request_id": "`+long+`", "event": "finish"}`, 400, "request_id: 257 bytes")
	bad("POST", "/v1/route", `{"token_ids": [1], "request_id": "a\u0000b"}`, 400, "NUL")
	bad("GET", "/nowhere", ``, 404, "no endpoint")
	bad("GET", "/v1/fleet", ``, 404, "no endpoint")
	code, out = call("GET", "/readyz", "")
	require.Equal(t, 200, code, out)
	// A router still replaying its events is not ready; a fleet's workers are listed.
	var replaying atomic.Bool
	replaying.Store(true)
	h.SetReady(func() error {
		if replaying.Load() {
			return fmt.Errorf("replaying: 10 of 20")
		}
		return nil
	})
	h.SetFleet(func() any { return []map[string]string{{"name": "w1"}} })
	bad("GET", "/readyz", ``, 503, "not ready: replaying: 10 of 20")
	replaying.Store(false)
	code, _ = call("GET", "/readyz", "")
	require.Equal(t, 200, code)
	code, out = call("GET", "/v1/fleet", "")
	require.Equal(t, 200, code)
	require.JSONEq(t, `[{"name": "w1"}]`, out)

	code, out = call("GET", "/v1/workers", "")
	require.Equal(t, 200, code)
	require.Contains(t, out, `"worker":"w2"`)
	code, out = call("GET", "/metrics", "")
	require.Equal(t, 200, code)
	for _, m := range []string{"dataplane_router_index_blocks 5", `dataplane_router_worker_cached_blocks{tier="0",worker="w2"} 5`,
		"dataplane_router_decisions_total 2", `dataplane_router_http_requests_total{code="200",route="/v1/route"} 1`} {
		require.Contains(t, out, m)
	}
	require.True(t, bytes.Contains([]byte(out), []byte("dataplane_router_route_duration_seconds_bucket")))

	// Joint routing: encoder options in milliseconds become blocks of prefill (0.24 ms each by
	// default); the earliest ready one is chosen and every option explained.
	body = fmt.Sprintf(`{"token_ids": %s, "encoders": [{"name": "local", "link": "local", "queue_ms": 4.8, "encode_ms": 2.4},
		{"name": "peer", "link": "rack", "queue_ms": 0, "encode_ms": 2.4, "return_ms": 0.48}]}`, ids)
	code, out = call("POST", "/v1/route", body)
	require.Equal(t, 200, code, out)
	d = router.Decision{}
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, "peer", d.Encoder)
	require.InDelta(t, 30, d.Encoders[0].Ready, 1e-9)
	require.InDelta(t, 12, d.Encoders[1].Ready, 1e-9)
	require.InDelta(t, 12, d.Score("w1").EncodeWait, 1e-9)
	bad("POST", "/v1/route", `{"token_ids": [1], "encoders": [{"name": "x", "encode_ms": -1}]}`, 400, "encoders[0]")
}

// GET /debug/route explains the last decision or one by request id, and each decision is logged
// in one line at debug level.
func TestHTTPDebugRouteAndLog(t *testing.T) {
	r, w1, _ := twoWorkers(t)
	h := NewHandler(r, prometheus.NewRegistry())
	var logs bytes.Buffer
	h.SetLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: h.Handle}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, router.LoggedDecision, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var d router.LoggedDecision
		if resp.StatusCode == 200 {
			require.NoError(t, json.Unmarshal(b, &d), string(b))
		}
		return resp.StatusCode, d, string(b)
	}
	code, _, out := get("/debug/route")
	require.Equal(t, 404, code, out)

	prompt := testrand.Tokens(testrand.New(t), 64)
	h2, _ := router.NewHasher(16)
	hashes, _ := h2.Sequence(nil, prompt, router.SeedFor("", ""), nil)
	r.Index().Store(w1, 0, 0, hashes[:3], nil)
	ids, _ := json.Marshal(prompt)
	for _, id := range []string{"a", "b"} {
		resp, err := http.Post(base+"/v1/route", "application/json",
			strings.NewReader(fmt.Sprintf(`{"token_ids": %s, "request_id": %q}`, ids, id)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	code, last, out := get("/debug/route")
	require.Equal(t, 200, code, out)
	require.Equal(t, "b", last.RequestID)
	code, first, out := get("/debug/route?request_id=a")
	require.Equal(t, 200, code, out)
	require.Equal(t, "a", first.RequestID)
	require.Equal(t, "w1", first.Decision.Worker)
	require.Equal(t, 3, first.Decision.Score("w1").Overlap)
	require.Empty(t, first.Decision.Hashes)
	code, _, out = get("/debug/route?request_id=zzz")
	require.Equal(t, 404, code)
	require.Contains(t, out, `no routing decision for \"zzz\"`)

	require.Contains(t, logs.String(), "request_id=a worker=w1")
	require.Contains(t, logs.String(), "w1[ov=3 ")
}

// A disaggregated fleet's answer names both workers; a fail mismatch is a 503 naming the
// domain; a fallback is logged as a warning; prefill_done ends the prefill step.
func TestHTTPAPIDisaggregated(t *testing.T) {
	for _, policy := range []string{"fail", "fallback"} {
		opts := router.DefaultOptions()
		opts.Disagg.Level, opts.Disagg.Policy = "zone", topology.Policy(policy)
		r, err := router.New(opts)
		require.NoError(t, err)
		for _, w := range []struct{ name, role, zone string }{{"p0", "prefill", "z0"}, {"p1", "prefill", "z1"}, {"d0", "decode", "z0"}} {
			_, err := r.AddWorker(w.name)
			require.NoError(t, err)
			require.NoError(t, r.SetWorkerInfo(w.name, router.WorkerInfo{Role: router.Role(w.role), Labels: map[string]string{"zone": w.zone}}))
		}
		var logs bytes.Buffer
		h := NewHandler(r, prometheus.NewRegistry())
		h.SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
		post := func(path, body string) (int, string) {
			t.Helper()
			ctx := &fasthttp.RequestCtx{}
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI(path)
			ctx.Request.SetBodyString(body)
			h.Handle(ctx)
			return ctx.Response.StatusCode(), string(ctx.Response.Body())
		}
		code, out := post("/v1/route", `{"token_ids": [1, 2, 3], "request_id": "a"}`)
		require.Equal(t, 200, code, out)
		var d router.Decision
		require.NoError(t, json.Unmarshal([]byte(out), &d))
		require.Equal(t, [3]string{"p0", "d0", "d0"}, [3]string{d.Prefill, d.Decode, d.Worker}, out)
		require.Len(t, d.PrefillScores, 2)
		code, out = post("/v1/lifecycle", `{"request_id": "a", "event": "prefill_done"}`)
		require.Equal(t, 200, code, out)
		_, _, q := r.Slots().Load(0) // p0
		require.Zero(t, q)
		code, _ = post("/v1/lifecycle", `{"request_id": "a", "event": "finish"}`)
		require.Equal(t, 200, code)

		// Only p1 (zone z1, no decode worker there) left healthy.
		require.NoError(t, r.SetHealthy("p0", false))
		code, out = post("/v1/route", `{"token_ids": [1, 2, 3], "request_id": "b"}`)
		if policy == "fail" {
			require.Equal(t, 503, code, out)
			require.Contains(t, out, `no decode worker in zone \"z1\"`)
			require.Contains(t, out, "no_worker_in_domain")
			continue
		}
		require.Equal(t, 200, code, out)
		require.Contains(t, out, `"fallback":true`)
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "domain=z1")

		code, out = post("/v1/route", "{\"token_ids\": [1], \"request_id\": \"x\\u0000y\"}")
		require.Equal(t, 400, code, out)
	}
}

// A request with more prompt blocks than the router tracks in all is routed but not tracked:
// 413, naming the bound.
func TestRouteTooLongToTrack(t *testing.T) {
	o := router.DefaultOptions()
	o.MaxTrackedBlocks = 4
	r, err := router.New(o)
	require.NoError(t, err)
	_, err = r.AddWorker("w1")
	require.NoError(t, err)
	h := NewHandler(r, prometheus.NewRegistry())
	route := func(tokens int) (int, string) {
		ids := make([]string, tokens)
		for i := range ids {
			ids[i] = strconv.Itoa(i + 1)
		}
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/v1/route")
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetBodyString(`{"request_id":"r` + strconv.Itoa(tokens) + `","token_ids":[` + strings.Join(ids, ",") + `]}`)
		h.Handle(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	code, body := route(64) // 4 blocks of 16
	require.Equal(t, 200, code, body)
	code, body = route(80)
	require.Equal(t, 413, code, body)
	require.Contains(t, body, "5 blocks, more than the 4 tracked in all")
}
