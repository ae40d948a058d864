// Package api is the daemon's HTTP edge: the fasthttp server, the OpenAI-compatible endpoints,
// server-sent events, connection tracking for a prompt drain, and the one place where an error
// of the request path becomes an HTTP status (errors.go). Nothing below it imports fasthttp.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"dataplane/dataplane"
	"dataplane/native"
)

// Options configure `dataplane serve`. DefaultOptions has every default.
type Options struct {
	Listen          string        // HOST:PORT of the HTTP API
	ShutdownTimeout time.Duration // how long shutdown waits for requests in flight
	MaxBodyBytes    int           // request bodies above this get 413
	HeaderTimeout   time.Duration // a request's headers, from its first byte
	ReadTimeout     time.Duration // its body, from the end of its headers
	WriteTimeout    time.Duration // whole response
	IdleTimeout     time.Duration // keep-alive connections with no request
	MaxConns        int           // concurrent connections; more are refused
	Pprof           bool          // serve /debug/pprof/
}

// DefaultOptions are the embedded defaults `make run` uses.
func DefaultOptions() Options {
	return Options{
		Listen:          ":8000",
		ShutdownTimeout: 30 * time.Second,
		MaxBodyBytes:    64 << 20, // a few high-resolution images as data: URLs
		HeaderTimeout:   10 * time.Second,
		ReadTimeout:     60 * time.Second,
		WriteTimeout:    10 * time.Minute, // streamed completions run long
		IdleTimeout:     2 * time.Minute,
		MaxConns:        16 << 10,
	}
}

// Server is the daemon's HTTP front: /healthz and /metrics, and the API once a service is
// attached.
type Server struct {
	opts     Options
	log      *slog.Logger
	registry *prometheus.Registry
	http     *fasthttp.Server
	metrics  *httpMetrics
	promHTTP fasthttp.RequestHandler
	svc      *dataplane.Service // the API's request path (Attach); nil: /healthz and /metrics only
	started  time.Time

	// cut ends every request still in flight when the drain runs out of time (streams end with
	// an SSE error event); requests' contexts derive from it.
	cut       context.Context
	cutNow    context.CancelCauseFunc
	cutErr    *Error
	adminHTTP *fasthttp.Server
	drainMu   sync.Mutex
	drainEnds time.Time // when the drain must be over; zero before one started

	disconnects disconnectWatcher // cancels the requests whose client left
}

type httpMetrics struct {
	http     *prometheus.CounterVec   // route, code
	duration *prometheus.HistogramVec // route
	requests *prometheus.CounterVec   // endpoint, outcome: generation requests that reached the service
	latency  *prometheus.HistogramVec // endpoint: their arrival to the last token (or the failure)

	// Their children by label values, resolved once (labels.go).
	httpBy     *labelCache[prometheus.Counter]
	durationBy *labelCache[prometheus.Observer]
	requestsBy *labelCache[prometheus.Counter]
	latencyBy  *labelCache[prometheus.Observer]
}

// NewServer builds a server; Serve runs it.
func NewServer(opts Options, log *slog.Logger) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dataplane_build_info",
		Help: "Always 1; the labels say which build and native kernels are running.",
		ConstLabels: prometheus.Labels{
			"version": dataplane.Version, "goversion": runtime.Version(), "native_isa": native.BestISA().String(),
		},
	})
	build.Set(1)
	m := &httpMetrics{
		http: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dataplane_http_requests_total",
			Help: "HTTP requests answered, by route and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dataplane_http_request_duration_seconds",
			Help:    "Time from request read to response written, by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"route"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_requests_total",
			Help: "Requests by endpoint and outcome (ok, bad_request, rejected, cancelled, error)."}, []string{"endpoint", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_request_duration_seconds",
			Help: "Arrival to the last token (or the failure).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"endpoint"}),
	}
	reg.MustRegister(build, m.http, m.duration, m.requests, m.latency)
	m.httpBy = newLabelCache(func(route, code string) prometheus.Counter { return m.http.WithLabelValues(route, code) })
	m.durationBy = newLabelCache(func(route, _ string) prometheus.Observer { return m.duration.WithLabelValues(route) })
	m.requestsBy = newLabelCache(func(endpoint, outcome string) prometheus.Counter {
		return m.requests.WithLabelValues(endpoint, outcome)
	})
	m.latencyBy = newLabelCache(func(endpoint, _ string) prometheus.Observer { return m.latency.WithLabelValues(endpoint) })

	s := &Server{
		opts:     opts,
		log:      log,
		registry: reg,
		metrics:  m,
		promHTTP: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		started:  time.Now(),
		cutErr:   &Error{Status: http.StatusServiceUnavailable, Type: "overloaded_error", Message: "the server is shutting down", RetryAfter: time.Second},
	}
	s.cut, s.cutNow = context.WithCancelCause(context.Background())
	s.http = &fasthttp.Server{
		Handler: s.handle,
		Name:    "dataplane",
		// ReadTimeout bounds the headers; HeaderReceived then gives the body its own time.
		ReadTimeout: opts.HeaderTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: opts.ReadTimeout}
		},
		// Bodies are read by the endpoints as their bytes arrive, reserved on the memory budget
		// (readBody), which also enforces MaxBodyBytes. fasthttp reads min(its limit, 8 KiB)
		// of a body before calling the handler, and would wait for all of it before answering
		// a declared length over its limit; a limit of 1 byte hands every body over at once.
		StreamRequestBody:            true,
		MaxRequestBodySize:           1,
		DisablePreParseMultipartForm: true,
		WriteTimeout:                 opts.WriteTimeout,
		IdleTimeout:                  opts.IdleTimeout,
		Concurrency:                  opts.MaxConns,
		Logger:                       slogPrintf{log},
		ErrorHandler:                 s.handleMalformed,
	}
	s.adminHTTP = &fasthttp.Server{Handler: s.handleAdmin, Name: "dataplane-admin", ReadTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: opts.IdleTimeout, MaxRequestBodySize: 4 << 10, Concurrency: 256,
		Logger: slogPrintf{log}}
	return s
}

// Registry is where other parts of the daemon register their metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Serve answers on ln until ctx is done, then drains within ShutdownTimeout in all: it stops
// accepting, lets requests in flight finish, and when cutAfter (most of the timeout) has
// passed ends those still running (a stream with an SSE error event, others with a 503). It
// returns nil when every request ended within the timeout.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	tracked := trackUnused(ln, s.deadlineLate())
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(tracked) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	deadline := time.Now().Add(s.opts.ShutdownTimeout)
	s.drainMu.Lock()
	s.drainEnds = deadline
	s.drainMu.Unlock()
	s.log.Info("shutting down: draining requests in flight", "timeout", s.opts.ShutdownTimeout)
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cut := time.AfterFunc(cutAfter(s.opts.ShutdownTimeout), func() {
		s.log.Warn("shutting down: ending the requests still in flight", "left", s.opts.ShutdownTimeout-cutAfter(s.opts.ShutdownTimeout))
		s.cutNow(errShutdown)
	})
	defer cut.Stop()
	// fasthttp closes the listener, then idle keep-alive connections; connections that never
	// sent a byte are closed here, as often as new ones may still have slipped in.
	stopClosing := make(chan struct{})
	closing := make(chan struct{})
	go func() {
		defer close(closing)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			tracked.closeUnused()
			select {
			case <-stopClosing:
				return
			case <-tick.C:
			}
		}
	}()
	err := s.http.ShutdownWithContext(sctx)
	// fasthttp closes only the listeners its Serve has registered; a shutdown that came first
	// would leave Serve accepting forever, so the listener is closed here too.
	tracked.Close() //nolint:errcheck // closed already, as a rule
	close(stopClosing)
	<-closing
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}

// deadlineLate is how late a connection's deadlines may fire: an eighth of the shortest
// timeout (lazyDeadlines).
func (s *Server) deadlineLate() time.Duration {
	var shortest time.Duration
	for _, t := range []time.Duration{s.opts.HeaderTimeout, s.opts.ReadTimeout, s.opts.WriteTimeout, s.opts.IdleTimeout} {
		if t > 0 && (shortest == 0 || t < shortest) {
			shortest = t
		}
	}
	return shortest / 8
}

// DrainDeadline is when the drain Serve started on shutdown must be over (what is left of
// it is the rest of the process's shutdown); false before one started.
func (s *Server) DrainDeadline() (time.Time, bool) {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	return s.drainEnds, !s.drainEnds.IsZero()
}

// errShutdown is the cause of requests ended by a drain that ran out of time.
var errShutdown = errors.New("the server is shutting down")

// cutAfter is when a drain of timeout t ends what still runs: late enough for most requests
// to finish, early enough that the cut streams' last events and the service's own shutdown
// fit in what is left.
func cutAfter(t time.Duration) time.Duration {
	return t - min(t/5, 2*time.Second)
}

// ServeAdmin answers /healthz, /readyz and /metrics (and /debug/pprof/ when enabled) on ln,
// a listener of their own that a client holding every API connection cannot starve, until
// ctx is done.
func (s *Server) ServeAdmin(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.adminHTTP.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.adminHTTP.ShutdownWithContext(sctx) //nolint:errcheck // probes hold nothing worth waiting for
	return nil
}

func (s *Server) handleAdmin(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/healthz", "/metrics", "/readyz":
		s.handle(ctx)
	default:
		if s.opts.Pprof && bytes.HasPrefix(ctx.Path(), []byte("/debug/pprof")) {
			s.handle(ctx)
			return
		}
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "the admin listener serves /healthz, /readyz and /metrics")
	}
}

// requestStart is when the request arrived: fasthttp reads the clock as it starts each one
// (RequestCtx.Time), so the handler need not read it again; zero outside fasthttp's loop.
func requestStart(ctx *fasthttp.RequestCtx) time.Time {
	if t := ctx.Time(); !t.IsZero() {
		return t
	}
	return time.Now()
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := requestStart(ctx)
	route := "other" // unknown paths share one label value, so the label set stays bounded
	if ctx.Request.Header.ContentLength() > s.opts.MaxBodyBytes {
		ctx.SetConnectionClose() // the body is not read
		writeAPIError(ctx, s.bodyTooLarge())
		s.metrics.http.WithLabelValues("malformed", codeLabel(ctx.Response.StatusCode())).Inc()
		return
	}
	switch path := ctx.Path(); string(path) {
	case "/healthz":
		route = "/healthz"
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case "/metrics":
		route = "/metrics"
		s.promHTTP(ctx)
	default:
		if r, ok := s.apiRoute(ctx, path); ok {
			route = r
			break
		}
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no endpoint "+strconv.Quote(string(path)))
	}
	// A body nobody read would be taken for the next request. Content length -2 is a request
	// with neither Content-Length nor Transfer-Encoding: no body (RFC 9112 6.3), fasthttp's
	// GET and HEAD; closing after those ended keep-alive for every probe and scrape.
	if cl := ctx.Request.Header.ContentLength(); (cl > 0 || cl == -1) && !readsBody(route, ctx) {
		ctx.SetConnectionClose()
	}
	s.metrics.httpBy.get(route, codeLabel(ctx.Response.StatusCode())).Inc()
	s.metrics.durationBy.get(route, "").Observe(time.Since(start).Seconds())
}

// readsBody says whether the route read the request's body to its end (the generation
// endpoints do, or close the connection themselves).
func readsBody(route string, ctx *fasthttp.RequestCtx) bool {
	switch route {
	case "/v1/chat/completions", "/v1/completions", "/v1/pretokenized":
		return ctx.IsPost()
	}
	return false
}

// codeLabels are the status codes' metric labels, made once (strconv.Itoa allocates above 99).
var codeLabels = func() (l [600]string) {
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

func codeLabel(code int) string {
	if code >= 0 && code < len(codeLabels) {
		return codeLabels[code]
	}
	return strconv.Itoa(code)
}

// handleMalformed answers requests fasthttp could not read (no handler runs for them).
func (s *Server) handleMalformed(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request headers too large")
	case errors.As(err, &netErr) && netErr.Timeout():
		writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request not read in time (--header-timeout, --read-timeout)")
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "malformed HTTP request: "+err.Error())
	}
	s.metrics.http.WithLabelValues("malformed", codeLabel(ctx.Response.StatusCode())).Inc()
}

// writeError sets the JSON error of a request that reached no endpoint (no param field, unlike
// an endpoint's *Error).
func writeError(ctx *fasthttp.RequestCtx, code int, typ, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// slogPrintf routes fasthttp's own log lines to slog.
type slogPrintf struct{ log *slog.Logger }

func (l slogPrintf) Printf(format string, args ...any) { l.log.Warn(fmt.Sprintf(format, args...)) }
