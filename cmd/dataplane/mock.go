package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"dataplane/bench/mocker"
	"dataplane/dataplane"
	"dataplane/dataplane/openai"
	"dataplane/router"
	"dataplane/router/kvevents"
	"dataplane/router/topology"
)

func init() {
	register(command{"mock", "run a fleet of mock LLM engines with vLLM's KV events and an OpenAI API (dataplane mock -h)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return runMock(ctx, args, stderr)
	}})
}

// mockConfig is what dataplane mock's flags set.
type mockConfig struct {
	fleet      mocker.FleetOptions
	listen     string
	events     string // none, zmq, nats
	zmqHost    string
	zmqPort    int
	nats       natsConfig
	natsClient *natsClient // buildFleet's connection, with -kv-events nats
	streamPub  *kvevents.StreamPublisher
	model      string            // announced model
	role       string            // announced role
	labels     map[string]string // announced labels: --labels and the topology files
	topo       workerTopology
	layout     topology.Layout   // engines spread over zones and racks (their labels)
	transfer   mocker.KVTransfer // a decode step's KV move, by the engines' labels
	qos        string            // --kv-transfer-qos
	advertise  string            // announced base URL ("": from --listen)
	profile    string
	statsEvery time.Duration
	logLevel   slog.Level
	endpoints  [][2]string // engine i's bound KV-event endpoints (pub, replay), with -kv-events zmq
	ecDir      string      // the EC consumer's shared_storage_path ("": chat takes no media)
	tokenizer  dataplane.TokenizerOptions
}

// mockFlags declares the engine and fleet flags (shared with `dataplane bench fleet`); natsDef
// is --nats's default.
func mockFlags(fs *flag.FlagSet, c *mockConfig, natsDef string) {
	e := &c.fleet.Engine
	fs.IntVar(&c.fleet.Engines, "engines", 1, "mock engines in this process")
	fs.StringVar(&c.fleet.Prefix, "name-prefix", "mock-", "engine names: PREFIX0, PREFIX1, ...")
	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "KV block size in tokens")
	fs.IntVar(&e.Blocks, "kv-blocks", e.Blocks, "KV cache size per engine, in blocks")
	fs.IntVar(&e.MaxSeqs, "max-seqs", e.MaxSeqs, "most requests running at once per engine")
	fs.IntVar(&e.MaxBatchedTokens, "max-batched-tokens", e.MaxBatchedTokens, "token budget of one engine step")
	fs.Float64Var(&e.Watermark, "watermark", e.Watermark, "fraction of blocks a newly admitted request must leave free")
	fs.BoolVar(&e.ChunkedPrefill, "chunked-prefill", e.ChunkedPrefill, "split long prompts over steps")
	fs.IntVar(&e.MaxWaiting, "max-waiting", e.MaxWaiting, "requests queued per engine before it refuses more")
	fs.BoolVar(&e.MapEvents, "map-events", false, "KV events in vLLM's newer map layout (default: msgspec arrays)")
	fs.Uint64Var(&e.Seed, "seed", 0, "seed for generated tokens (0: random)")
	fs.Float64Var(&c.fleet.Clock.Speedup, "speedup", 1, "engine time runs this many times faster than wall time")
	fs.IntVar(&c.fleet.Loops, "loops", 0, "goroutines driving the engines (0: one per CPU)")
	fs.StringVar(&c.profile, "perf-profile", "", "perf profile .npz (Dynamo's format; default: Dynamo's polynomial)")
	fs.StringVar(&c.events, "kv-events", "none", "publish KV events: none, zmq (a PUB + replay ROUTER pair per engine) or nats")
	fs.StringVar(&c.zmqHost, "zmq-host", "127.0.0.1", "address the ZMQ sockets bind")
	fs.IntVar(&c.zmqPort, "zmq-port", 5557, "engine i publishes on PORT+2i and serves replay on PORT+2i+1 (0: any free ports)")
	natsFlags(fs, &c.nats, natsDef)
	fs.DurationVar(&c.statsEvery, "stats-every", 10*time.Second, "log fleet counters this often (0: never)")
}

const mockUsage = `Usage: dataplane mock [flags]

Runs --engines mock LLM engines in this process (Dynamo's mocker model: KV block manager with
prefix caching, vLLM-style scheduler with chunked prefill and preemption, a perf model for step
times) and serves them over an OpenAI-compatible API:

  POST /engines/<i>/v1/completions   engine i (its base URL: http://HOST:PORT/engines/<i>)
  POST /v1/completions               the engine named by "model", else round-robin
  POST .../v1/chat/completions       chats rendered with --tokenizer's template; media only from
                                     --ec-dir, as a vLLM EC consumer reads them (uuid = item)
  GET  /v1/models, /engines, /healthz

KV events go out in vLLM's wire format: --kv-events zmq (PUB + replay ROUTER per engine, as
vLLM's --kv-events-config would), or nats: into the JetStream stream (--kv-stream, subject
PREFIX.<engine>) of the NATS server --nats names (by default the one a "dataplane router" on
this machine embeds), where every engine is also announced (--fleet-bucket, refreshed every
--lease/3, endpoint http://ADVERTISE/engines/<i>) and reports its load (--load-prefix), so
"dataplane router" finds them with no worker list.

Disaggregated serving (--role prefill or decode, announced; every engine answers both steps as
vLLM's do with a KV connector): a completion with kv_transfer_params {"do_remote_decode": true}
is a prefill step, answered whole with the params of its decode step (remote_engine_id,
remote_block_ids, ...); a completion with those params is the decode step: it waits the KV
cache's move, latency + bytes / bandwidth of the link between the two engines' domains
(--kv-transfer-qos, --kv-bytes-per-token; domains from --labels, --topology, --zones, --racks),
then generates with the prompt received, not computed.

Flags:
`

func runMock(ctx context.Context, args []string, stderr io.Writer) error {
	c := &mockConfig{fleet: mocker.DefaultFleetOptions()}
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, mockUsage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, configUsage(fs))
	}
	mockFlags(fs, c, "nats://127.0.0.1:4222")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8200", `HOST:PORT of the OpenAI API ("" for none)`)
	fs.StringVar(&c.ecDir, "ec-dir", "", "serve chats as a vLLM EC consumer: media come only as items named by uuid in this directory (vLLM's shared_storage_path, serve --handoff ec --ec-dir)")
	fs.StringVar(&c.tokenizer.Dir, "tokenizer", "", "directory with tokenizer.json for chats (default: the daemon's embedded demo tokenizer)")
	fs.StringVar(&c.tokenizer.ChatTemplate, "chat-template", "", "built-in chat template for chats (as serve's)")
	fs.StringVar(&c.advertise, "advertise", "", "with -kv-events nats: the base URL announced for the engines (default: http:// and the --listen address)")
	fs.StringVar(&c.model, "model", "mock", "with -kv-events nats: the model announced")
	fs.StringVar(&c.role, "role", "aggregated", "with -kv-events nats: the role announced (aggregated, prefill, decode)")
	workerTopologyFlags(fs, &c.topo)
	fs.IntVar(&c.layout.Zones, "zones", 0, "spread the engines over this many zones: engine i in zone-(i mod N), labelled zone=... (0: none)")
	fs.IntVar(&c.layout.Racks, "racks", 0, "and over this many racks per zone, labelled rack=zone-Z-rack-R")
	fs.StringVar(&c.qos, "kv-transfer-qos", "", "disaggregated decode steps wait the KV cache's move from the prefill engine: per-level links as the router's flag (zone=2ms@5GB/s,...,local=...), or @FILE; \"\": instant")
	fs.Float64Var(&c.transfer.BytesPerToken, "kv-bytes-per-token", 131072, "the KV cache's bytes per token the move carries")
	drain := fs.Duration("drain-timeout", 30*time.Second, "on SIGTERM, how long requests in flight have to finish (the announcements go first)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.String("config", "", "YAML file of settings (keys are these flag names)")
	if err := loadConfig(fs, args, os.Getenv); err != nil {
		return configFailed("mock", err, stderr)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mock: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	if err := c.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "mock: -log-level: %v\n", err)
		return errUsage
	}
	if _, err := parseLabels(c.topo.flagsLabels); err != nil {
		fmt.Fprintf(stderr, "mock: --labels: %v\n", err)
		return errUsage
	}
	if err := c.nats.check(); err != nil && c.events == "nats" {
		fmt.Fprintf(stderr, "mock: %v\n", err)
		return errUsage
	}
	if c.layout.Zones < 0 || c.layout.Racks < 0 {
		fmt.Fprintf(stderr, "mock: --zones %d, --racks %d: want >= 0\n", c.layout.Zones, c.layout.Racks)
		return errUsage
	}
	if c.qos != "" {
		var rt routerTopology
		rt.qos = c.qos
		var o router.DisaggOptions
		o.KVBytesPerToken = c.transfer.BytesPerToken
		if err := rt.resolve(&o); err != nil {
			fmt.Fprintf(stderr, "mock: %v\n", err)
			return errUsage
		}
		c.transfer.QoS = o.QoS
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	var err error
	if c.labels, err = c.topo.labels(ctx, log); err != nil {
		return err
	}
	fleet, cleanup, err := buildFleet(c, log)
	if err != nil {
		return err
	}
	defer cleanup()

	// A stop drains: the announcements go at once (routers stop sending), the engines run on
	// until the requests in flight are answered (or --drain-timeout), then stop.
	engines, stopEngines := context.WithCancel(context.WithoutCancel(ctx))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopEngines()
	wg.Add(1)
	go func() { defer wg.Done(); _ = fleet.Run(engines) }()
	if c.statsEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); logFleetStats(ctx, fleet, c.statsEvery, log) }()
	}
	if c.listen == "" {
		<-ctx.Done()
		return nil
	}
	so := mocker.DefaultServerOptions()
	if so.Render, err = chatRenderer(c.tokenizer); err != nil {
		return err
	}
	so.ECDir = c.ecDir
	so.Labels, so.Transfer = c.engineLabels, c.transfer
	if c.events == "zmq" {
		so.Endpoints = func(i int) (string, string) { return c.endpoints[i][0], c.endpoints[i][1] }
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if c.natsClient != nil {
		if c.advertise == "" {
			c.advertise = "http://" + ln.Addr().String()
		}
		announceFleet(ctx, &wg, c, fleet, log)
	}
	srv := &http.Server{Handler: mocker.NewServer(fleet, so), ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", "listen", ln.Addr().String(), "first_engine", "http://"+ln.Addr().String()+"/engines/0")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shut, done := context.WithTimeout(context.Background(), *drain)
		defer done()
		if c.natsClient != nil {
			// Still accept for a moment: a router that chose an engine just before the
			// withdrawal reached it sends the request now, and it should be answered, not refused.
			select {
			case <-time.After(min(fleetLeaveLinger, *drain)):
			case err := <-errc:
				return err
			}
		}
		_ = srv.Shutdown(shut)
		return nil
	case err := <-errc:
		return err
	}
}

// fleetLeaveLinger is how long a stopping mock fleet still accepts requests after withdrawing
// its announcements: routers on loopback or a LAN see the withdrawal within milliseconds.
const fleetLeaveLinger = 500 * time.Millisecond

// buildFleet makes the fleet with its perf model and KV-event publishers; cleanup closes the
// publishers (after the fleet stopped).
func buildFleet(c *mockConfig, log *slog.Logger) (*mocker.Fleet, func(), error) {
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if c.profile != "" {
		raw, err := os.ReadFile(c.profile)
		if err != nil {
			return nil, cleanup, err
		}
		m, err := mocker.ReadProfile(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return nil, cleanup, fmt.Errorf("%s: %w", c.profile, err)
		}
		c.fleet.Engine.Perf = m
	}
	switch c.events {
	case "none":
	case "zmq":
		var pubs []*mocker.ZMQPublisher
		c.fleet.PublisherFor = func(i int, name string) (mocker.Publisher, error) {
			ep, replay := zmqEndpoints(c, i)
			p, err := mocker.NewZMQPublisher(mocker.DefaultZMQOptions(ep, replay))
			if err != nil {
				return nil, err
			}
			pubs = append(pubs, p)
			ep, replay = p.Endpoints()
			c.endpoints = append(c.endpoints, [2]string{ep, replay})
			log.Info("kv events", "engine", name, "pub", ep, "replay", replay)
			return p, nil
		}
		closers = append(closers, func() {
			for _, p := range pubs {
				_ = p.Close()
			}
		})
	case "nats":
		n, err := connectNATS(&c.nats, "dataplane-mock", log)
		if err != nil {
			return nil, cleanup, err
		}
		closers = append(closers, n.Close)
		if err := n.ensureStream(context.Background(), c.nats.stream); err != nil {
			cleanup()
			return nil, func() {}, err
		}
		po := kvevents.DefaultStreamPublisherOptions()
		po.Prefix = c.nats.stream.Prefix
		pub, err := kvevents.NewStreamPublisher(n.nc, po)
		if err != nil {
			cleanup()
			return nil, func() {}, err
		}
		closers = append(closers, func() { // what the engines published last, then stop
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := pub.Flush(ctx); err != nil {
				log.Warn("kv events not stored", "err", err)
			}
			pub.Close()
		})
		c.natsClient, c.streamPub = n, pub
		c.fleet.Publisher = pub
		log.Info("kv events over nats", "url", n.url, "stream", c.nats.stream.Name, "subjects", c.nats.stream.Prefix+".<engine>")
	default:
		return nil, cleanup, fmt.Errorf("-kv-events %q: want none, zmq or nats", c.events)
	}
	f, err := mocker.NewFleet(c.fleet)
	if err != nil {
		cleanup()
		return nil, func() {}, err
	}
	e := c.fleet.Engine
	log.Info("mock fleet", "engines", f.Len(), "loops", len(f.Loops()), "block_size", e.BlockSize, "kv_blocks", e.Blocks,
		"max_seqs", e.MaxSeqs, "max_batched_tokens", e.MaxBatchedTokens, "chunked_prefill", e.ChunkedPrefill,
		"speedup", c.fleet.Clock.Speedup, "perf", fmt.Sprintf("%T", e.Perf), "kv_events", c.events)
	return f, cleanup, nil
}

func zmqEndpoints(c *mockConfig, i int) (pub, replay string) {
	if c.zmqPort == 0 {
		return fmt.Sprintf("tcp://%s:0", c.zmqHost), fmt.Sprintf("tcp://%s:0", c.zmqHost)
	}
	return fmt.Sprintf("tcp://%s:%d", c.zmqHost, c.zmqPort+2*i), fmt.Sprintf("tcp://%s:%d", c.zmqHost, c.zmqPort+2*i+1)
}

// logFleetStats logs how the loops keep up, every period.
func logFleetStats(ctx context.Context, f *mocker.Fleet, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			var entries int64
			var mean, worst time.Duration
			for _, l := range f.Loops() {
				n, m, w := l.Lag()
				entries += n
				mean, worst = max(mean, m), max(worst, w)
			}
			log.Info("fleet", "entries", entries, "lag_mean", mean, "lag_worst", worst)
		}
	}
}

// chatRenderer renders chats as serve does (the same tokenizer and template), with the
// positions of the media placeholders.
func chatRenderer(o dataplane.TokenizerOptions) (func([]openai.Message) ([]int32, []int, error), error) {
	tok, err := dataplane.LoadTokenizer(o)
	if err != nil {
		return nil, err
	}
	ph := tok.Placeholders()
	return func(msgs []openai.Message) ([]int32, []int, error) {
		ids, err := tok.Chat(msgs)
		if err != nil {
			return nil, nil, err
		}
		var at []int
		for i, id := range ids {
			if ph.ModalityOf(id) != 0 {
				at = append(at, i)
			}
		}
		return ids, at, nil
	}, nil
}

// engineLabels are engine i's labels: --labels and the topology files', with its zone and rack
// from --zones and --racks.
func (c *mockConfig) engineLabels(i int) map[string]string {
	out := maps.Clone(c.labels)
	for k, v := range c.layout.Labels(i) {
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}
