package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"dataplane/dataplane/worker"
	"dataplane/router/fleet"
	"dataplane/router/kvevents"
)

func init() {
	register(command{"relay", "put a vLLM engine into the fleet: its KV events into the NATS stream, its announcement and load (dataplane relay -h)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return runRelay(ctx, args, stderr)
	}})
}

const relayUsage = `Usage: dataplane relay --kv-events tcp://HOST:5557 --worker NAME [flags]

Puts one vLLM engine (one data-parallel rank) into the fleet: subscribes to its KV-event
publisher (vLLM's --kv-events-config endpoint, with its replay_endpoint as --kv-replay), and
republishes every batch, in the engine's numbering with gaps filled from replay, to the NATS
stream the routers read (--kv-stream, subject PREFIX.NAME); announces the engine in the fleet's
bucket (--endpoint, --model, --role, --labels, its KV capacity) and refreshes it every --lease/3;
publishes its load from the engine's /metrics (requests running and waiting, KV cache usage).
A relay that restarts resumes after the last batch the stream has for NAME.

Flags:
`

type relayConfig struct {
	events, replay, name, endpoint string
	model, role                    string
	labels                         map[string]string // resolved at start: --labels and the topology files
	topo                           workerTopology
	kvBlocks                       int64
	blockSize                      int
	scrapeEvery                    time.Duration
	nats                           natsConfig
	logLevel                       slog.Level
}

func parseRelayFlags(args []string, stderr io.Writer) (*relayConfig, error) {
	c := &relayConfig{}
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, relayUsage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, configUsage(fs))
	}
	fs.StringVar(&c.events, "kv-events", "", "the engine's KV-event PUB endpoint, tcp://HOST:PORT")
	fs.StringVar(&c.replay, "kv-replay", "", "its replay (ROUTER) endpoint; empty: none (a gap is then a hole)")
	fs.StringVar(&c.name, "worker", "", "the worker's name in the fleet: 1 to 128 of A-Z a-z 0-9 _ -")
	fs.StringVar(&c.endpoint, "endpoint", "", "the engine's HTTP base URL, announced, and where its /metrics are read (KV capacity, load)")
	fs.StringVar(&c.model, "model", "", "the model announced")
	fs.StringVar(&c.role, "role", "aggregated", "the role announced: aggregated, prefill or decode")
	workerTopologyFlags(fs, &c.topo)
	fs.Int64Var(&c.kvBlocks, "kv-blocks", 0, "the engine's KV cache size in blocks (0: learn it from its /metrics)")
	fs.IntVar(&c.blockSize, "block-size", 16, "the engine's KV block size, announced")
	fs.DurationVar(&c.scrapeEvery, "metrics-every", time.Second, "how often the engine's /metrics are read for its load")
	natsFlags(fs, &c.nats, "nats://127.0.0.1:4222")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.String("config", "", "YAML file of settings (keys are these flag names)")
	if err := loadConfig(fs, args, os.Getenv); err != nil {
		return nil, configFailed("relay", err, stderr)
	}
	usage := func(format string, a ...any) (*relayConfig, error) {
		fmt.Fprintf(stderr, "relay: "+format+"\n", a...)
		return nil, errUsage
	}
	var err error
	switch {
	case fs.NArg() > 0:
		return usage("unexpected arguments %q", fs.Args())
	case c.logLevel.UnmarshalText([]byte(*logLevel)) != nil:
		return usage("--log-level %q", *logLevel)
	case !strings.HasPrefix(c.events, "tcp://") && !strings.HasPrefix(c.events, "ipc://"):
		return usage("--kv-events %q: want tcp://HOST:PORT", c.events)
	case !fleet.ValidName(c.name):
		return usage("--worker %q: want 1 to %d of A-Z a-z 0-9 _ -", c.name, fleet.MaxNameLen)
	case c.endpoint != "" && !strings.HasPrefix(c.endpoint, "http://") && !strings.HasPrefix(c.endpoint, "https://"):
		return usage("--endpoint %q: want http(s)://HOST:PORT", c.endpoint)
	case c.role == string(fleet.Encoder):
		return usage("--role encoder: a relay is for LLM engines")
	case c.kvBlocks < 0 || c.blockSize <= 0 || c.scrapeEvery <= 0:
		return usage("--kv-blocks %d, --block-size %d, --metrics-every %v: want >= 0, > 0, > 0", c.kvBlocks, c.blockSize, c.scrapeEvery)
	case c.nats.url == "none":
		return usage("--nats none: a relay relays to NATS")
	}
	labels, err := parseLabels(c.topo.flagsLabels)
	if err != nil {
		return usage("--labels: %v", err)
	}
	w := fleet.Worker{Name: c.name, Role: fleet.Role(c.role), Labels: labels}
	if err := w.Check(); err != nil {
		return usage("%v", err)
	}
	if err := c.nats.check(); err != nil {
		return usage("%v", err)
	}
	return c, nil
}

func runRelay(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseRelayFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	if c.labels, err = c.topo.labels(ctx, log); err != nil {
		return err
	}
	n, err := connectNATS(&c.nats, "dataplane-relay-"+c.name, log)
	if err != nil {
		return err
	}
	defer n.Close()
	if err := n.ensureStream(ctx, c.nats.stream); err != nil {
		return err
	}
	last, have, err := lastStreamSeq(ctx, n.js, c.nats.stream, c.name)
	if err != nil {
		return err
	}
	po := kvevents.DefaultStreamPublisherOptions()
	po.Prefix = c.nats.stream.Prefix
	pub, err := kvevents.NewStreamPublisher(n.nc, po)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := pub.Flush(fctx); err != nil {
			log.Warn("kv events not stored", "err", err)
		}
		pub.Close()
	}()
	relay := kvevents.NewRelay(func(seq uint64, payload []byte) error {
		pub.Publish(c.name, seq, payload)
		return nil
	}, last, have)
	log.Info("dataplane relay starting", "worker", c.name, "kv_events", c.events, "kv_replay", c.replay, "endpoint", c.endpoint,
		"nats", n.url, "stream", c.nats.stream.Name, "subject", c.nats.stream.Prefix+"."+c.name, "resume_after", map[bool]any{true: last, false: "none"}[have])

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	errc := make(chan error, 1)
	var stats kvevents.Stats
	zo := kvevents.DefaultZMQOptions(c.events, c.replay)
	if c.replay != "" { // what the engine published while no relay ran
		relay.Resume(func(from uint64, deliver func(uint64, []byte)) error {
			return kvevents.ReplayZMQ(ctx, c.replay, zo.ReplayTimeout, from, deliver)
		})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := kvevents.SubscribeZMQTo(ctx, zo, &stats, func(rank int) (kvevents.Sink, error) {
			if rank != 0 {
				return nil, fmt.Errorf("the engine publishes data-parallel rank %d: run a relay per rank, each on its rank's endpoint", rank)
			}
			return relay, nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			errc <- err
		}
	}()

	// The engine's capacity and load, from its /metrics.
	var load atomic.Pointer[fleet.Load]
	blocks := atomic.Int64{}
	blocks.Store(c.kvBlocks)
	if c.endpoint != "" {
		wg.Add(1)
		go func() { defer wg.Done(); scrapeEngine(ctx, c, &blocks, &load, log) }()
	}
	started := time.Now().UTC()
	a := fleet.NewAnnouncer(n.js, c.nats.bucket, func() []fleet.Worker {
		return []fleet.Worker{{Name: c.name, Model: c.model, Role: fleet.Role(c.role), Endpoint: c.endpoint,
			KVBlocks: blocks.Load(), BlockSize: c.blockSize, Labels: c.labels, Load: load.Load(), Started: started}}
	})
	a.OnError = func(err error) { log.Warn("announce", "err", err) }
	a.KeepOnStop = true // the engine goes on: a relay restarted within the lease keeps it routed
	lp := fleet.NewLoadPublisher(n.nc, c.nats.load, func() []fleet.WorkerLoad {
		if l := load.Load(); l != nil {
			return []fleet.WorkerLoad{{Name: c.name, Load: *l}}
		}
		return nil
	})
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := a.Run(ctx); err != nil {
			errc <- err
		}
	}()
	go func() { defer wg.Done(); _ = lp.Run(ctx) }()

	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return fmt.Errorf("relay %s: %w", c.name, err)
		case <-t.C:
			st := &relay.Stats
			log.Info("relayed", "worker", c.name, "forwarded", st.Forwarded.Load(), "replayed", st.Replayed.Load(), "gaps", st.Gaps.Load(),
				"unrecoverable", st.Unrecoverable.Load(), "restarts", st.Restarts.Load(), "bad_payloads", stats.BadPayloads.Load(),
				"stored", pub.Stats.Stored.Load(), "dropped", pub.Stats.Dropped.Load(), "queued", pub.Queued())
		}
	}
}

// lastStreamSeq is the engine sequence of the worker's last batch in the stream, if it has one.
func lastStreamSeq(ctx context.Context, js jetstream.JetStream, o kvevents.StreamOptions, name string) (uint64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, o.Name)
	if err != nil {
		return 0, false, fmt.Errorf("kv event stream %s: %w", o.Name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, o.Prefix+"."+name)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("kv event stream %s: the last batch of %s: %w", o.Name, name, err)
	case len(m.Data) < 8:
		return 0, false, nil
	}
	var seq uint64
	for _, b := range m.Data[:8] {
		seq = seq<<8 | uint64(b)
	}
	return seq, true, nil
}

// scrapeEngine reads the engine's /metrics every c.scrapeEvery: its KV capacity until known
// (worker.KVCapacity) and its load (engineLoad).
func scrapeEngine(ctx context.Context, c *relayConfig, blocks *atomic.Int64, load *atomic.Pointer[fleet.Load], log *slog.Logger) {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	t := time.NewTicker(c.scrapeEvery)
	defer t.Stop()
	warned := false
	for {
		if blocks.Load() == 0 {
			if b, err := worker.KVCapacity(ctx, client, c.endpoint); err == nil {
				blocks.Store(b)
				log.Info("engine KV capacity", "worker", c.name, "kv_blocks", b)
			}
		}
		l, err := engineLoad(ctx, client, c.endpoint, blocks.Load())
		if err != nil && !warned && ctx.Err() == nil {
			log.Warn("engine load not readable (retrying)", "worker", c.name, "err", err)
			warned = true
		}
		if err == nil {
			load.Store(l)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// engineLoad reads a vLLM engine's load from its /metrics: vllm:num_requests_running,
// vllm:num_requests_waiting and vllm:kv_cache_usage_perc (vLLM's v1 PrometheusStatLogger,
// vllm/v1/metrics/loggers.py at 005a810b; vllm:gpu_cache_usage_perc on older versions), summed
// over the engines (DP ranks) the page lists. KV usage becomes blocks with the capacity when it
// is known; prompt tokens still to compute are not exported: -1.
func engineLoad(ctx context.Context, client *http.Client, baseURL string, kvBlocks int64) (*fleet.Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", baseURL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, worker.MaxMetricsBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > worker.MaxMetricsBytes {
		return nil, fmt.Errorf("GET %s/metrics: larger than %d bytes", baseURL, worker.MaxMetricsBytes)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", baseURL, err)
	}
	// sum adds up the first of the gauges the page has, over its series (engines).
	sum := func(names ...string) (v float64, series int) {
		for _, name := range names {
			if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
				for _, m := range f.GetMetric() {
					v += m.GetGauge().GetValue()
				}
				return v, len(f.GetMetric())
			}
		}
		return 0, 0
	}
	running, n1 := sum("vllm:num_requests_running")
	waiting, n2 := sum("vllm:num_requests_waiting")
	if n1 == 0 || n2 == 0 {
		return nil, fmt.Errorf("%s/metrics has no vllm:num_requests_running / _waiting (not a vLLM engine?)", baseURL)
	}
	l := &fleet.Load{Running: int64(running), Waiting: int64(waiting), ActiveBlocks: -1, PrefillTokens: -1, KVBlocks: kvBlocks,
		At: time.Now()}
	if usage, n := sum("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"); n > 0 && kvBlocks > 0 {
		l.ActiveBlocks = int64(math.Round(usage / float64(n) * float64(kvBlocks))) // the mean fraction of the ranks
	}
	return l, nil
}
