// Package api is the daemon's HTTP edge: the fasthttp server, the OpenAI-compatible endpoints,
// server-sent events, connection tracking for a prompt drain, and the one place where an error
// of the request path becomes an HTTP status (errors.go). Nothing below it imports fasthttp.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
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
	ReadTimeout     time.Duration // whole request, headers and body
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
}

type httpMetrics struct {
	http     *prometheus.CounterVec   // route, code
	duration *prometheus.HistogramVec // route
	requests *prometheus.CounterVec   // endpoint, outcome: generation requests that reached the service
	latency  *prometheus.HistogramVec // endpoint: their arrival to the last token (or the failure)
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

	s := &Server{
		opts:     opts,
		log:      log,
		registry: reg,
		metrics:  m,
		promHTTP: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		started:  time.Now(),
	}
	s.http = &fasthttp.Server{
		Handler:            s.handle,
		Name:               "dataplane",
		ReadTimeout:        opts.ReadTimeout,
		WriteTimeout:       opts.WriteTimeout,
		IdleTimeout:        opts.IdleTimeout,
		MaxRequestBodySize: opts.MaxBodyBytes,
		Concurrency:        opts.MaxConns,
		Logger:             slogPrintf{log},
		ErrorHandler:       s.handleMalformed,
	}
	return s
}

// Registry is where other parts of the daemon register their metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Serve answers on ln until ctx is done, then stops accepting and waits up to
// ShutdownTimeout for requests in flight. It returns nil after a clean drain.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	tracked := trackUnused(ln)
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(tracked) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down: draining requests in flight", "timeout", s.opts.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
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

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	route := "other" // unknown paths share one label value, so the label set stays bounded
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
	s.metrics.http.WithLabelValues(route, codeLabel(ctx.Response.StatusCode())).Inc()
	s.metrics.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
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
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error",
			fmt.Sprintf("request body larger than %d bytes (--max-body-bytes)", s.opts.MaxBodyBytes))
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request headers too large")
	case errors.As(err, &netErr) && netErr.Timeout():
		writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request not read within --read-timeout")
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
