package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"

	"dataplane/router"
	"dataplane/router/fleet"
	"dataplane/router/httpapi"
	"dataplane/router/kvevents"
)

func init() {
	register(command{"router", "run the KV-aware router alone for a fleet of vLLM engines (dataplane router -h)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return runRouter(ctx, args, stderr)
	}})
}

type routerConfig struct {
	opts            router.Options
	feed            kvevents.Options
	listen          string
	events, replays []string
	names           map[string]string // endpoint → worker name
	nats            natsConfig
	roles           map[fleet.Role]bool // announced workers routed to
	model           string              // "" : any
	topo            routerTopology
	maxBody         int
	shutdownTimeout time.Duration
	logLevel        slog.Level
}

func parseRouterFlags(args []string, stderr io.Writer) (*routerConfig, error) {
	c := &routerConfig{opts: router.DefaultOptions(), feed: kvevents.DefaultOptions(), names: map[string]string{}}
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", ":8100", "HOST:PORT of the router's HTTP API")
	events := fs.String("kv-events", "", "vLLM KV-event PUB endpoints, comma-separated (tcp://host:5557,...): one worker each")
	replays := fs.String("kv-replay", "", "their replay (ROUTER) endpoints, same order; empty entries for none")
	workers := fs.String("workers", "", "worker names: name=endpoint,... (default: the endpoint is the name)")
	fs.IntVar(&c.opts.BlockSize, "block-size", c.opts.BlockSize, "KV block size in tokens, as the engines use")
	fs.Float64Var(&c.opts.OverlapWeight, "overlap-weight", c.opts.OverlapWeight, "weight of prefill blocks against decode blocks")
	fs.Float64Var(&c.opts.Temperature, "temperature", c.opts.Temperature, "0: cheapest worker; > 0: softmax sampling over normalised costs")
	media := fs.String("media", "GPU", "event media tracked, fastest first (GPU,CPU): tier 0, 1, ...")
	fs.IntVar(&c.opts.Index.MaxWorkers, "max-workers", c.opts.Index.MaxWorkers, "most workers (rounded up to 64s)")
	fs.Int64Var(&c.opts.Capacity, "capacity", c.opts.Capacity, "per-worker cap on indexed blocks per tier (the engines' KV block count; 0: none)")
	fs.DurationVar(&c.opts.RequestTTL, "request-ttl", c.opts.RequestTTL, "tracked requests without a finish are dropped after this")
	natsFlags(fs, &c.nats, "embedded")
	roles := fs.String("roles", "aggregated,prefill,decode", "announced workers of these roles are routed to (aggregated, prefill, decode, encoder)")
	fs.StringVar(&c.model, "model", "", "route only to announced workers serving this model (default: any)")
	routerTopologyFlags(fs, &c.opts.Disagg, &c.topo)
	fs.IntVar(&c.maxBody, "max-body-bytes", 16<<20, "larger request bodies get 413")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown waits for requests in flight")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := loadConfig(fs, args, os.Getenv); err != nil {
		return nil, configFailed("router", err, stderr)
	}
	usage := func(format string, a ...any) (*routerConfig, error) {
		fmt.Fprintf(stderr, "router: "+format+"\n", a...)
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	if err := c.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return usage("-log-level: %v", err)
	}
	c.events = splitList(*events)
	c.replays = strings.Split(*replays, ",")
	if *replays == "" {
		c.replays = nil
	}
	if len(c.replays) > len(c.events) {
		return usage("-kv-replay has %d entries for %d -kv-events endpoints", len(c.replays), len(c.events))
	}
	for _, kv := range splitList(*workers) {
		name, ep, ok := strings.Cut(kv, "=")
		if !ok || name == "" || ep == "" {
			return usage("-workers: %q is not name=endpoint", kv)
		}
		c.names[ep] = name
	}
	c.feed.Media = map[string]int{}
	for i, m := range splitList(*media) {
		c.feed.Media[m] = i
	}
	c.opts.Index.Tiers = max(len(c.feed.Media), 1)
	if err := c.nats.check(); err != nil {
		return usage("%v", err)
	}
	if err := c.topo.resolve(&c.opts.Disagg); err != nil {
		return usage("%v", err)
	}
	if c.nats.url == "none" && len(c.events) == 0 && len(c.topo.static) == 0 {
		return usage("no workers: give --kv-events endpoints, --worker-labels, or NATS (--nats) to find the announced ones")
	}
	c.roles = map[fleet.Role]bool{}
	for _, r := range splitList(*roles) {
		w := fleet.Worker{Name: "x", Role: fleet.Role(r)}
		if err := w.Check(); err != nil {
			return usage("--roles: %v", err)
		}
		c.roles[w.Role] = true
	}
	return c, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func runRouter(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseRouterFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	r, err := router.New(c.opts)
	if err != nil {
		return err
	}
	c.feed.Log = log // the first drop per worker and reason
	feed, err := kvevents.NewFeed(r, c.feed)
	if err != nil {
		return err
	}
	var n *natsClient
	var js jetstream.JetStream
	if c.nats.url != "none" {
		if n, err = connectNATS(&c.nats, "dataplane-router", log); err != nil {
			return err
		}
		defer n.Close()
		js = n.js
	}
	sfo := kvevents.DefaultStreamFeedOptions()
	sfo.Stream = c.nats.stream
	sf := kvevents.NewStreamFeed(feed, js, sfo) // registration goes through it, so stream batches and workers stay in step
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("dataplane router starting", "listen", ln.Addr().String(), "block_size", c.opts.BlockSize,
		"overlap_weight", c.opts.OverlapWeight, "temperature", c.opts.Temperature, "media", c.feed.Media,
		"max_workers", c.opts.Index.MaxWorkers, "capacity", c.opts.Capacity, "request_ttl", c.opts.RequestTTL,
		"kv_events", c.events, "kv_replay", c.replays, "nats", c.nats.url, "kv_stream", c.nats.stream.Name,
		"kv_max_age", c.nats.stream.MaxAge, "kv_max_bytes", c.nats.stream.MaxBytes, "fleet_bucket", c.nats.bucket.Bucket,
		"lease", c.nats.bucket.Lease, "roles", rolesList(c.roles), "model", c.model,
		"kv_transfer_topology_level", c.opts.Disagg.Level, "kv_transfer_mismatch_policy", c.opts.Disagg.Policy,
		"kv_transfer_qos", c.topo.qos, "kv_transfer_weight", c.opts.Disagg.TransferWeight, "kv_bytes_per_token", c.opts.Disagg.KVBytesPerToken,
		"worker_labels", c.topo.workerLabels)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	errc := make(chan error, len(c.events)+2)

	for i, ep := range c.events {
		name := c.names[ep]
		if name == "" {
			name = ep
		}
		eng, err := sf.AddWorker(name)
		if err != nil {
			return err
		}
		replay := ""
		if i < len(c.replays) {
			replay = strings.TrimSpace(c.replays[i])
		}
		zo := kvevents.DefaultZMQOptions(ep, replay)
		zo.Log = log
		wg.Add(1)
		go func() {
			defer wg.Done()
			ranks := map[int]*kvevents.Engine{}
			err := kvevents.SubscribeZMQ(ctx, zo, feed.Stats(), func(rank int) (*kvevents.Engine, error) {
				if len(ranks) == 0 {
					ranks[rank] = eng
					return eng, nil
				}
				// More data-parallel ranks on one endpoint: each is its own KV cache.
				e, err := sf.AddWorker(fmt.Sprintf("%s#dp%d", name, rank))
				ranks[rank] = e
				return e, err
			})
			if err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("kv events from %s: %w", ep, err)
			}
		}()
		log.Info("worker", "name", name, "kv_events", ep, "replay", replay)
	}

	if err := addStaticWorkers(sf, c.topo.static, log); err != nil {
		return err
	}
	var rf *routerFleet
	if n != nil {
		if rf, err = startRouterFleet(ctx, &wg, n, fleetRouting{nats: &c.nats, roles: c.roles, model: c.model}, sf, log); err != nil {
			return err
		}
	}
	wg.Add(1)
	go func() { // the slot tracker's janitor
		defer wg.Done()
		t := time.NewTicker(max(c.opts.RequestTTL/10, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if n := r.Expire(now); n > 0 {
					log.Warn("expired requests without a finish", "count", n)
				}
			}
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		router.NewCollector(r), kvevents.NewCollector(feed))
	if rf != nil {
		reg.MustRegister(kvevents.NewStreamCollector(sf), rf)
	}
	h := httpapi.NewHandler(r, reg)
	h.SetLogger(log) // decisions at debug level: --log-level debug
	if rf != nil {
		h.SetReady(rf.ready)
		h.SetFleet(func() any { return rf.watcher.Workers() })
	}
	srv := &fasthttp.Server{Handler: h.Handle, Name: "dataplane-router", MaxRequestBodySize: c.maxBody,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err = <-errc:
		err = fmt.Errorf("router: %w", err)
	case <-ctx.Done():
		err = nil
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer scancel()
	if serr := srv.ShutdownWithContext(sctx); serr != nil && err == nil {
		err = fmt.Errorf("shutdown: %w", serr)
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}
