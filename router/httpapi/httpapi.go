// Package httpapi is the standalone router's HTTP API on fasthttp: routing decisions, the
// request lifecycle, worker state, the last decisions explained, and /metrics. The router
// itself knows nothing of HTTP. README.md is its map.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"dataplane/router"
)

// The API (the standalone `dataplane router`):
//
//	POST /v1/route      {"token_ids": [...], "media": [...], "salt", "lora", "allow": [...], "request_id",
//	                     "encoders": [{"name", "link", "queue_ms", "encode_ms", "return_ms"}]}
//	                    → {"worker", "blocks", "tokens", "scores": [per worker: overlap, load, cost, ...]}
//	                    and with encoders (joint routing, router/encoders.go) "encoder", "encoders".
//	                    and, for a disaggregated fleet, "prefill", "decode" (= "worker"),
//	                    "prefill_scores", "topology" (router/disagg.go).
//	                    With a request_id the request is tracked against the chosen worker(s) until
//	POST /v1/lifecycle  {"request_id", "event": "prefill_done" | "first_token" | "finish" | "cancel"}
//	GET  /v1/workers    every worker's cached blocks, active blocks, prefill tokens, health
//	GET  /debug/route   the last routing decision, or ?request_id= one of the last 256:
//	                    {"request_id", "decision"}, as the daemon's /debug/route
//	GET  /v1/fleet      the announced workers (SetFleet), 404 without a fleet
//	GET  /healthz, GET /metrics
//	GET  /readyz        200 once the index is as current as its source (SetReady), else 503

// RouteRequest is the body of POST /v1/route.
type RouteRequest struct {
	TokenIDs  []uint32     `json:"token_ids"`
	Media     []RouteMedia `json:"media,omitempty"`
	Salt      string       `json:"salt,omitempty"`
	LoRA      string       `json:"lora,omitempty"`
	Allow     []string     `json:"allow,omitempty"`
	RequestID string       `json:"request_id,omitempty"`
	// Encoders are where the media can be encoded (joint routing): times in milliseconds.
	Encoders []RouteEncoder `json:"encoders,omitempty"`
}

// RouteEncoder is an encoder option of POST /v1/route: work queued there, this request's items
// there and the features' move back, in milliseconds.
type RouteEncoder struct {
	Name     string  `json:"name"`
	Link     string  `json:"link,omitempty"`
	QueueMS  float64 `json:"queue_ms"`
	EncodeMS float64 `json:"encode_ms"`
	ReturnMS float64 `json:"return_ms"`
}

// RouteMedia is a media item: its hash (a number, or a string holding a decimal or 0x-hex
// number) or its identifier (vLLM's mm_hash / uuid, mapped with router.MediaHash), and its placeholder
// tokens' position.
type RouteMedia struct {
	Hash   json.RawMessage `json:"hash,omitempty"`
	ID     string          `json:"id,omitempty"`
	Offset int             `json:"offset"`
	Length int             `json:"length"`
}

func (m RouteMedia) toMedia(i int) (router.Media, error) {
	out := router.Media{Offset: m.Offset, Length: m.Length}
	switch {
	case m.ID != "" && len(m.Hash) == 0:
		out.Hash = router.MediaHash(m.ID)
	case m.ID == "" && len(m.Hash) > 0:
		s := strings.Trim(string(m.Hash), `"`)
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return out, fmt.Errorf("media[%d].hash %s: not a 64-bit unsigned number", i, m.Hash)
		}
		out.Hash = v
	default:
		return out, fmt.Errorf("media[%d]: give exactly one of hash and id", i)
	}
	return out, nil
}

// LifecycleRequest is the body of POST /v1/lifecycle.
type LifecycleRequest struct {
	RequestID string `json:"request_id"`
	Event     string `json:"event"`
}

// Handler serves the router's API on fasthttp. Registry is where /metrics reads from (the
// router's Collector must be registered there by the caller).
type Handler struct {
	r        *router.Router
	metrics  fasthttp.RequestHandler
	latency  prometheus.Histogram
	requests *prometheus.CounterVec
	now      func() time.Time

	log    *slog.Logger // nil: decisions are not logged
	recent *router.DecisionLog

	ready func() error // nil: always ready
	fleet func() any   // nil: no /v1/fleet
}

// SetReady makes /readyz answer 503 with ready's error until it returns nil (a router
// replaying the KV-event stream is not ready until it has caught up). Call it before serving.
func (h *Handler) SetReady(ready func() error) { h.ready = ready }

// SetFleet serves GET /v1/fleet: what fleet returns, as JSON (the announced workers). Call it
// before serving.
func (h *Handler) SetFleet(fleet func() any) { h.fleet = fleet }

// NewHandler builds the handler and registers its own request metrics on reg.
func NewHandler(r *router.Router, reg *prometheus.Registry) *Handler {
	h := &Handler{
		r:       r,
		recent:  router.NewDecisionLog(router.RecentDecisions),
		metrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dataplane_router_route_duration_seconds",
			Help:    "Time to answer POST /v1/route: parse, hash, match, score.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16),
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dataplane_router_http_requests_total",
			Help: "Router HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		now: time.Now,
	}
	reg.MustRegister(h.latency, h.requests)
	return h
}

// SetLogger makes the handler log each routing decision on l at debug level: the chosen worker
// and, per worker, overlap, load and cost in one line (see CompactScores). Call it before
// serving; when l does not log at debug level, nothing is formatted.
func (h *Handler) SetLogger(l *slog.Logger) { h.log = l }

// CompactScores writes a decision's explanation in one short line, a worker after another:
// "name[ov=cached blocks act=active blocks pf=prefill tokens cost=C]", with p= when the worker
// was drawn at a temperature, or "name[excluded: why]".
func CompactScores(scores []router.WorkerScore) string {
	var b strings.Builder
	for i, s := range scores {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s.Worker)
		if !s.Eligible {
			b.WriteString("[excluded: ")
			b.WriteString(s.Excluded)
			b.WriteByte(']')
			continue
		}
		fmt.Fprintf(&b, "[ov=%d act=%d pf=%d cost=%.4g", s.Overlap, s.ActiveBlocks, s.PrefillTokens, s.Cost)
		if s.Probability > 0 && s.Probability < 1 {
			fmt.Fprintf(&b, " p=%.3g", s.Probability)
		}
		b.WriteByte(']')
	}
	return b.String()
}

func (h *Handler) logDecision(id string, d *router.Decision, err error) {
	if h.log == nil || !h.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	if err != nil {
		h.log.Debug("route failed", "request_id", id, "tokens", d.Tokens, "err", err, "scores", CompactScores(d.Scores),
			"prefill_scores", CompactScores(d.PrefillScores))
		return
	}
	if d.Prefill != "" {
		h.log.Debug("route", "request_id", id, "prefill", d.Prefill, "decode", d.Decode, "blocks", d.Blocks, "tokens", d.Tokens,
			"prefill_scores", CompactScores(d.PrefillScores), "decode_scores", CompactScores(d.Scores))
		return
	}
	h.log.Debug("route", "request_id", id, "worker", d.Worker, "blocks", d.Blocks, "tokens", d.Tokens,
		"scores", CompactScores(d.Scores))
}

func (h *Handler) debugRoute(ctx *fasthttp.RequestCtx) {
	id := string(ctx.QueryArgs().Peek("request_id"))
	d, ok := h.recent.Get(id)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, "not_found",
			fmt.Sprintf("no routing decision for %q among the last %d", id, h.recent.Len()))
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, d)
}

// Handle is the fasthttp handler.
func (h *Handler) Handle(ctx *fasthttp.RequestCtx) {
	route := "other"
	switch path, post := string(ctx.Path()), ctx.IsPost(); {
	case path == "/v1/route" && post:
		route = "/v1/route"
		start := h.now()
		h.route(ctx)
		h.latency.Observe(h.now().Sub(start).Seconds())
	case path == "/v1/lifecycle" && post:
		route = "/v1/lifecycle"
		h.lifecycle(ctx)
	case path == "/v1/workers":
		route = "/v1/workers"
		writeJSON(ctx, fasthttp.StatusOK, h.r.Snapshot())
	case path == "/debug/route":
		route = "/debug/route"
		h.debugRoute(ctx)
	case path == "/healthz":
		route = "/healthz"
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case path == "/readyz":
		route = "/readyz"
		ctx.SetContentType("text/plain; charset=utf-8")
		if h.ready != nil {
			if err := h.ready(); err != nil {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
				ctx.SetBodyString("not ready: " + err.Error() + "\n")
				break
			}
		}
		ctx.SetBodyString("ok\n")
	case path == "/v1/fleet" && h.fleet != nil:
		route = "/v1/fleet"
		writeJSON(ctx, fasthttp.StatusOK, h.fleet())
	case path == "/metrics":
		route = "/metrics"
		h.metrics(ctx)
	case path == "/v1/route" || path == "/v1/lifecycle":
		route = path
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", path+" takes POST")
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no endpoint "+strconv.Quote(path))
	}
	h.requests.WithLabelValues(route, strconv.Itoa(ctx.Response.StatusCode())).Inc()
}

func (h *Handler) route(ctx *fasthttp.RequestCtx) {
	var req RouteRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "body: "+err.Error())
		return
	}
	if len(req.TokenIDs) == 0 {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "token_ids: empty")
		return
	}
	if err := checkRequestID(req.RequestID); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	media := make([]router.Media, 0, len(req.Media))
	for i, m := range req.Media {
		mm, err := m.toMedia(i)
		if err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		media = append(media, mm)
	}
	if len(req.Encoders) > router.MaxEncoderOptions {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", fmt.Sprintf("encoders: %d, at most %d", len(req.Encoders), router.MaxEncoderOptions))
		return
	}
	encs := make([]router.EncoderOption, len(req.Encoders))
	for i, e := range req.Encoders {
		if !(e.QueueMS >= 0 && e.EncodeMS >= 0 && e.ReturnMS >= 0) || math.IsInf(e.QueueMS+e.EncodeMS+e.ReturnMS, 0) {
			writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", fmt.Sprintf("encoders[%d]: queue_ms, encode_ms and return_ms must be finite and not negative", i))
			return
		}
		encs[i] = router.EncoderOption{Name: e.Name, Link: e.Link, Queue: h.r.BlocksIn(e.QueueMS / 1e3),
			Encode: h.r.BlocksIn(e.EncodeMS / 1e3), Return: h.r.BlocksIn(e.ReturnMS / 1e3)}
	}
	var d router.Decision
	err := h.r.Route(router.Request{Tokens: req.TokenIDs, Media: media, LoRA: req.LoRA, Salt: req.Salt, Allow: req.Allow, Encoders: encs}, &d)
	h.logDecision(req.RequestID, &d, err)
	var bad *router.ErrBadMedia
	var none *router.ErrNoWorker
	var mismatch *router.ErrNoDecodeInDomain
	switch {
	case errors.As(err, &bad):
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error())
		return
	case errors.As(err, &none):
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no_worker", err.Error())
		return
	case errors.As(err, &mismatch): // seed 004's fail policy: the client learns which domain
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no_worker_in_domain", err.Error())
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	if d.Topology != nil && d.Topology.Fallback && h.log != nil {
		h.log.Warn("no decode worker in the prefill worker's domain: routed to another (mismatch policy fallback)",
			"request_id", req.RequestID, "level", d.Topology.Level, "domain", d.Topology.Domain, "prefill", d.Prefill, "decode", d.Decode)
	}
	if req.RequestID != "" {
		if err := h.r.Start(req.RequestID, d, d.Worker, h.now()); err != nil {
			code := fasthttp.StatusConflict
			if _, long := errors.AsType[*router.ErrTooLong](err); long {
				code = fasthttp.StatusRequestEntityTooLarge
			}
			writeError(ctx, code, "invalid_request_error", err.Error())
			return
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, d)
	h.recent.Add(req.RequestID, d)
}

// maxRequestID bounds a tracked request's id: the router keeps up to MaxRequests of them for up
// to the request TTL, so their length is memory it holds.
const maxRequestID = 256

func checkRequestID(id string) error {
	if len(id) > maxRequestID {
		return fmt.Errorf("request_id: %d bytes, at most %d", len(id), maxRequestID)
	}
	if strings.IndexByte(id, 0) >= 0 {
		return errors.New("request_id: contains a NUL character")
	}
	return nil
}

func (h *Handler) lifecycle(ctx *fasthttp.RequestCtx) {
	var req LifecycleRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "body: "+err.Error())
		return
	}
	if err := checkRequestID(req.RequestID); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	switch req.Event {
	case "prefill_done": // a disaggregated request's prefill worker answered
		h.r.PrefillDone(req.RequestID)
	case "first_token":
		h.r.FirstToken(req.RequestID)
	case "finish", "cancel":
		if !h.r.Finish(req.RequestID) {
			writeError(ctx, fasthttp.StatusNotFound, "not_found", "request "+strconv.Quote(req.RequestID)+" is not tracked (finished or expired)")
			return
		}
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error",
			"event "+strconv.Quote(req.Event)+": want prefill_done, first_token, finish or cancel")
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]string{"request_id": req.RequestID, "event": req.Event})
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// writeError sets an OpenAI-style JSON error, as the daemon's own API does.
func writeError(ctx *fasthttp.RequestCtx, code int, typ, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
