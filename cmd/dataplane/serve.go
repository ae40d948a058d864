package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"dataplane/bench/mocker"
	"dataplane/cuda"
	"dataplane/dataplane"
	"dataplane/dataplane/api"
	"dataplane/dataplane/media/hfproc"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/worker"
	"dataplane/features"
	"dataplane/native"
	"dataplane/router/fleet"
	"dataplane/router/kvevents"
	"dataplane/transfer/wire"

	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	register(command{"serve", "run the daemon (dataplane serve -h for flags)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return serve(ctx, args, stderr)
	}})
}

// serveFlags holds what serve's flags set beyond the server and service options.
type serveFlags struct {
	logLevel, cudaPlugin, dtype, workers, kvEvents, kvReplay, adminListen, handoff string
	nats                                                                           natsConfig
	fleetName, advertise, fleetModel                                               string
	transferListen                                                                 string
	transferCompress                                                               wire.Compress
	remoteEncoding                                                                 bool
	topo                                                                           workerTopology
	rtopo                                                                          routerTopology
	mockSpeedup                                                                    float64
	maxBodyBytes                                                                   int64
	firstByteTimeout                                                               time.Duration
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	opts := api.DefaultOptions()
	so := dataplane.DefaultServiceOptions()
	var sf serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The HTTP server.
	fs.StringVar(&opts.Listen, "listen", opts.Listen, "HOST:PORT to serve the HTTP API on")
	fs.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", opts.ShutdownTimeout, "how long shutdown waits for requests in flight")
	sf.maxBodyBytes = int64(opts.MaxBodyBytes)
	fs.Var(bytesVar(&sf.maxBodyBytes), "max-body-bytes", "largest request body accepted (larger: 413)")
	fs.DurationVar(&opts.HeaderTimeout, "header-timeout", opts.HeaderTimeout, "time allowed to read a request's headers")
	fs.DurationVar(&opts.ReadTimeout, "read-timeout", opts.ReadTimeout, "time allowed to read a request's body, after its headers")
	fs.DurationVar(&opts.WriteTimeout, "write-timeout", opts.WriteTimeout, "time allowed to write a whole response")
	fs.DurationVar(&opts.IdleTimeout, "idle-timeout", opts.IdleTimeout, "keep-alive connections idle this long are closed")
	fs.IntVar(&opts.MaxConns, "max-conns", opts.MaxConns, "most concurrent connections")
	fs.StringVar(&sf.adminListen, "admin-listen", "", "HOST:PORT of a listener of its own for /healthz, /readyz and /metrics (reachable when --max-conns is exhausted)")
	fs.Var(bytesVar(&so.MemoryBytes), "memory-bytes", "the process's memory budget (0: 90% of the cgroup limit or of physical memory); GOMEMLIMIT follows it")
	fs.BoolVar(&opts.Pprof, "pprof", false, "serve /debug/pprof/")
	fs.StringVar(&sf.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&sf.cudaPlugin, "cuda-plugin", "", "CUDA plugin file (default: beside the binary, then build/cuda/)")
	fs.String("config", "", "YAML file of settings (keys are these flag names)")
	// Models.
	mo := &so.Models
	fs.StringVar(&mo.Name, "model-name", mo.Name, "the model id clients ask for")
	fs.StringVar(&mo.VisionModel, "vision-model", "", "vision encoder checkpoint directory (CLIP, SigLIP, LLaVA; default: a random demo model)")
	fs.StringVar(&mo.VisionPreset, "vision-preset", "", "media preset for images and video frames (default: clip-N / siglip-N from the model)")
	fs.StringVar(&mo.AudioModel, "audio-model", "", "Whisper encoder checkpoint directory (default: a random demo model)")
	fs.StringVar(&mo.AudioPreset, "audio-preset", "", "media preset for audio (default: whisper-80 / whisper-128 from the model)")
	fs.BoolVar(&mo.NoAudio, "no-audio", false, "serve no audio encoder")
	fs.StringVar(&mo.Processor, "processor", "", "directory of Hugging Face processor files (preprocessor_config.json, processor_config.json, video_preprocessor_config.json, config.json) that set the presets (default: the vision model's, else the tokenizer's; the audio model's for audio; none: the built-in presets)")
	fs.StringVar(&mo.Embeddings, "embeddings", "", "safetensors file with the LLM's input embedding table (default: random)")
	fs.StringVar(&mo.EmbeddingTensor, "embedding-tensor", "", "the table's tensor name (default: model.embed_tokens.weight and the usual others)")
	fs.StringVar(&sf.dtype, "dtype", mo.DType.String(), "dtype of features and merged sequences: bf16, f16 or f32")
	fs.IntVar(&mo.DemoHidden, "demo-hidden", mo.DemoHidden, "the demo models' width (the demo LLM's hidden size)")
	fs.Uint64Var(&mo.Seed, "seed", mo.Seed, "seed of the demo models' random weights")
	fs.IntVar(&mo.Threads, "encoder-threads", 0, "threads an encoder batch uses (0: all CPUs, up to 8)")
	// Tokenizer.
	to := &so.Tokenizer
	fs.StringVar(&to.Dir, "tokenizer", "", "directory with tokenizer.json (default: the embedded demo tokenizer)")
	fs.StringVar(&to.ChatTemplate, "chat-template", "", "built-in chat template: chatml, llama3, qwen3, qwen2-vl, qwen2-audio, llava (default: the tokenizer's)")
	fs.StringVar(&to.ImageToken, "image-token", "", "image placeholder token (default: <|image_pad|>, <image>, ... whichever the tokenizer has)")
	fs.StringVar(&to.VideoToken, "video-token", "", "video placeholder token (default: <|video_pad|>, <video>)")
	fs.StringVar(&to.AudioToken, "audio-token", "", "audio placeholder token (default: <|AUDIO|>, <|audio_pad|>, <audio>)")
	// Workers and routing.
	fs.StringVar(&sf.workers, "workers", "mock:4", "LLM workers: mock:N (in-process mock engines), http://host:port,... (OpenAI-compatible engines such as vLLM), or fleet (the workers announced on --nats, their KV events from its stream; prefill and decode ones route in two steps); with --worker-labels: leave it out")
	fs.StringVar(&sf.fleetModel, "fleet-model", "", "with --workers fleet: route only to announced workers serving this model (default: any)")
	fs.Float64Var(&sf.mockSpeedup, "mock-speedup", 1, "mock engines' time runs this many times faster than wall time (--workers mock:N)")
	fs.StringVar(&sf.kvEvents, "kv-events", "", "the workers' vLLM KV-event publishers, same order: tcp://host:5557,...")
	fs.StringVar(&sf.kvReplay, "kv-replay", "", "their replay endpoints, same order: tcp://host:5558,...")
	fs.StringVar(&sf.handoff, "handoff", "", "how requests with media reach the http:// workers: embeds (prompt_embeds; vLLM --enable-prompt-embeds; the default), "+
		"ec (vLLM's encoder-cache connector reads the features from --ec-dir; the chat goes with the items' names), tokens (the engine encodes the media itself). README: vLLM")
	fs.StringVar(&so.ECDir, "ec-dir", "", "--handoff ec: the directory vLLM's EC connector reads (its shared_storage_path), owned by the daemon")
	fs.Var(bytesVar(&so.ECBytes), "ec-bytes", "--handoff ec: most bytes of files in --ec-dir (0: --feature-bytes); an item past it goes without a file and the engine encodes it")
	fs.DurationVar(&sf.firstByteTimeout, "worker-first-byte-timeout", 30*time.Second, "an http worker that sends no headers and first token within this long fails over to another")
	fs.DurationVar(&so.HealthInterval, "worker-health-interval", so.HealthInterval, "how often every worker's health is probed (GET /health)")
	fs.DurationVar(&so.HealthTimeout, "worker-health-timeout", so.HealthTimeout, "how long one health probe may take")
	fs.IntVar(&so.HealthFailures, "worker-health-failures", so.HealthFailures, "failed probes in a row that take a worker out of routing and its blocks out of the index")
	fs.IntVar(&so.Router.BlockSize, "block-size", so.Router.BlockSize, "the engines' KV block size")
	fs.Int64Var(&so.Router.Capacity, "kv-blocks", 0, "each worker's KV cache size in blocks: the router keeps at most that many of its blocks, the oldest stored evicted first (0: learn it from each http:// engine's /metrics; mock engines: their own)")
	fs.Float64Var(&so.Router.Temperature, "router-temperature", so.Router.Temperature, "0: the cheapest worker; > 0: softmax over costs")
	fs.Float64Var(&so.Router.OverlapWeight, "overlap-weight", so.Router.OverlapWeight, "weight of uncached prefill blocks against decode load")
	routerTopologyFlags(fs, &so.Router.Disagg, &sf.rtopo)
	// The fleet.
	natsFlags(fs, &sf.nats, "embedded")
	fs.StringVar(&sf.fleetName, "fleet-name", "", "this daemon's name in the fleet, where it is announced as an encoder (default: dataplane-HOST-PORT)")
	fs.StringVar(&sf.advertise, "advertise", "", "the base URL announced for this daemon (default: http:// and the --listen address)")
	fs.StringVar(&sf.transferListen, "transfer-listen", "", "HOST:PORT where other daemons send this one items to encode, over the feature transfer protocol (default: --listen's host, any port; none: do not offer); announced with --nats")
	fs.Func("transfer-compress", "none, s2 or zstd: compress what this daemon sends over the transfer protocol (features it encoded for others, inputs it sends to encode); pays only on links slower than ~0.5-1 Gb/s, for bf16 (transfer/wire README)", func(v string) (err error) {
		sf.transferCompress, err = wire.ParseCompress(v)
		return err
	})
	fs.BoolVar(&sf.remoteEncoding, "remote-encoding", true, "with --nats: send items to the fleet's other daemons' encoders when the router predicts they are done first")
	workerTopologyFlags(fs, &sf.topo)
	// Features and encoding.
	so.Features.Host.Capacity = 0
	fs.Var(bytesVar(&so.Features.Host.Capacity), "feature-bytes", "host memory for features and merged sequences, out of --memory-bytes (0: a quarter of it, at most 1GiB)")
	fs.StringVar(&so.CachePolicy, "cache-policy", "", "default reuse policy: discard, keep[:TTL], until-done")
	fs.IntVar(&so.Pool.Workers, "encoder-workers", so.Pool.Workers, "encoder worker loops")
	fs.IntVar(&so.Pool.MaxBatch, "batch-max", so.Pool.MaxBatch, "inputs per encoder batch")
	fs.DurationVar(&so.Pool.MaxWait, "batch-wait", so.Pool.MaxWait, "how long a batch waits for company")
	fs.IntVar(&so.Pool.MaxBatchTokens, "batch-tokens", so.Pool.MaxBatchTokens, "feature rows per encoder batch")
	fs.DurationVar(&so.ItemTimeout, "item-timeout", so.ItemTimeout, "how long a request waits for its media to be encoded")
	fs.IntVar(&so.Warmup.MinTokens, "warmup-min-tokens", so.Warmup.MinTokens, "while a request's media encode, send its worker the text before the first item (max_tokens 1) to fill its prefix cache, when that text is at least this many tokens and not cached there (0: never; not with --handoff embeds)")
	fs.IntVar(&so.Warmup.InFlight, "warmup-in-flight", so.Warmup.InFlight, "prefix warm-ups at once (more are dropped)")
	fs.DurationVar(&so.Warmup.Timeout, "warmup-timeout", so.Warmup.Timeout, "one prefix warm-up's limit")
	fs.IntVar(&so.MaxPromptTokens, "max-prompt-tokens", so.MaxPromptTokens, "longest merged prompt (the model's context)")
	fs.IntVar(&so.DefaultMaxTokens, "default-max-tokens", so.DefaultMaxTokens, "max_tokens when a request gives none")
	// Media sources.
	fs.StringVar(&so.Fetch.FileDir, "media-dir", "", "allow file:// media below this directory")
	fs.BoolVar(&so.Fetch.HTTP, "fetch-http", false, "allow http(s):// media URLs")
	fs.BoolVar(&so.Fetch.AllowPrivateNetworks, "fetch-private", false, "let http(s) fetches reach private and loopback addresses")
	fs.Var(bytesVar(&so.MaxMediaBytes), "max-media-bytes", "largest media item (data: URLs, inline data, fetches; larger: 413)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: dataplane serve [flags]\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(stderr, configUsage(fs))
	}
	if err := loadConfig(fs, args, os.Getenv); err != nil {
		return configFailed("serve", err, stderr)
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "serve: "+format+"\n", a...)
		return errUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(sf.logLevel)); err != nil {
		return usageErr("--log-level: %v", err)
	}
	var err error
	if mo.DType, err = native.ParseDType(sf.dtype); err != nil {
		return usageErr("--dtype: %v", err)
	}
	if err := sf.rtopo.resolve(&so.Router.Disagg); err != nil {
		return usageErr("%v", err)
	}
	plan, err := planWorkers(sf)
	if err != nil {
		return usageErr("%v", err)
	}
	if plan.mock > 0 && (sf.handoff != "" || so.ECDir != "") {
		return usageErr("--handoff and --ec-dir are for http:// workers; mock engines take the request in-process")
	}
	if plan.mock == 0 {
		if so.Handoff = sf.handoff; so.Handoff == "" {
			so.Handoff = worker.HandoffEmbeds.String()
		}
		if plan.handoff, err = worker.ParseHandoff(so.Handoff); err != nil {
			return usageErr("--handoff: %v", err)
		}
		if (plan.handoff == worker.HandoffEC) != (so.ECDir != "") {
			return usageErr("--ec-dir goes with --handoff ec, and --handoff ec needs it (vLLM's shared_storage_path)")
		}
	}
	if err := sf.nats.check(); err != nil {
		return usageErr("%v", err)
	}
	if _, err := parseLabels(sf.topo.flagsLabels); err != nil {
		return usageErr("--labels: %v", err)
	}
	if sf.fleetName != "" && !fleet.ValidName(sf.fleetName) {
		return usageErr("--fleet-name %q: want 1 to %d of A-Z a-z 0-9 _ -", sf.fleetName, fleet.MaxNameLen)
	}
	if so.HealthInterval <= 0 || so.HealthTimeout <= 0 || so.HealthFailures < 1 {
		return usageErr("--worker-health-interval %v, --worker-health-timeout %v, --worker-health-failures %d: want positive values",
			so.HealthInterval, so.HealthTimeout, so.HealthFailures)
	}
	so.Fetch.MaxBytes = so.MaxMediaBytes
	if sf.maxBodyBytes > math.MaxInt32 {
		return usageErr("--max-body-bytes: at most %d", math.MaxInt32)
	}
	opts.MaxBodyBytes = int(sf.maxBodyBytes)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	so.Log = log
	labels, err := sf.topo.labels(ctx, log)
	if err != nil {
		return err
	}
	if err := planMemory(&so, log); err != nil {
		return usageErr("%v", err)
	}

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	var adminLn net.Listener
	if sf.adminListen != "" {
		if adminLn, err = net.Listen("tcp", sf.adminListen); err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		defer adminLn.Close()
	}
	log.Info("dataplane starting", "version", dataplane.Version, "go", runtime.Version(),
		"listen", ln.Addr().String(), "admin_listen", addrOf(adminLn), "max_body_bytes", opts.MaxBodyBytes, "max_conns", opts.MaxConns,
		"header_timeout", opts.HeaderTimeout, "read_timeout", opts.ReadTimeout, "write_timeout", opts.WriteTimeout, "idle_timeout", opts.IdleTimeout,
		"shutdown_timeout", opts.ShutdownTimeout, "workers", sf.workers, "vision_model", mo.VisionModel,
		"audio_model", mo.AudioModel, "tokenizer", so.Tokenizer.Dir, "feature_bytes", so.Features.Host.Capacity,
		"dtype", mo.DType, "block_size", so.Router.BlockSize, "worker_first_byte_timeout", sf.firstByteTimeout,
		"worker_health_interval", so.HealthInterval, "worker_health_timeout", so.HealthTimeout, "worker_health_failures", so.HealthFailures,
		"handoff", so.Handoff, "ec_dir", so.ECDir)
	srv := api.NewServer(opts, log)
	backend := selectBackend(ctx, sf.cudaPlugin, log)
	log.Info("backends", "cpu", native.BestISA().String(), "cpu_supported", isaList(), "cuda", backend.cuda, "using", backend.name)
	if backend.nvml != nil {
		defer backend.nvml.Close()
		srv.Registry().MustRegister(backend.nvml.Collector())
	}

	svc, err := dataplane.NewService(so)
	if err != nil {
		return err
	}
	if p := svc.MemoryPlan(); p.Total > 0 {
		log.Info("memory", "memory_bytes", p.Total, "features", p.Features, "baseline", p.Baseline, "reserve", p.Reserve,
			"requests", p.Requests, "gomemlimit", debug.SetMemoryLimit(-1))
	}
	m := svc.Models()
	log.Info("models", "name", m.Name, "vision", m.Vision.Name, "vision_preset", m.VisionPreset.Name,
		"audio", audioName(m), "hidden", m.Hidden, "vocab", svc.Tokenizer().VocabSize())
	logProcessor(log, "vision", m.VisionProcessor, m.VisionPreset.Summary())
	if m.Audio != nil {
		logProcessor(log, "audio", m.AudioProcessor, m.AudioPreset.Summary())
	}
	subs, err := addWorkers(ctx, svc, plan, so.Router.BlockSize, log)
	if err != nil {
		svc.Close(context.Background()) //nolint:errcheck
		return err
	}
	srv.Attach(svc)
	if sf.nats.url != "none" {
		n, err := connectNATS(&sf.nats, "dataplane-serve", log)
		if err != nil {
			svc.Close(context.Background()) //nolint:errcheck
			return err
		}
		defer n.Close()
		if plan.fleet {
			stopFleet, err := serveFleet(ctx, svc, srv.Registry(), n, &sf, plan, log)
			if err != nil {
				svc.Close(context.Background()) //nolint:errcheck
				return err
			}
			defer stopFleet()
		}
		transfer := ""
		if sf.transferListen != "none" {
			addr, stopOffer, err := offerEncoders(svc, srv.Registry(), sf.transferListen, ln.Addr().String(), sf.advertise, sf.transferCompress, log)
			if err != nil {
				svc.Close(context.Background()) //nolint:errcheck
				return err
			}
			defer stopOffer()
			transfer = addr
		}
		if sf.remoteEncoding {
			stopRemote, err := useRemoteEncoders(ctx, svc, n, &sf, daemonName(&sf, ln.Addr()), labels, log)
			if err != nil {
				svc.Close(context.Background()) //nolint:errcheck
				return err
			}
			defer stopRemote()
		}
		stopAnnounce := announceDaemon(ctx, n, &sf, labels, ln.Addr(), m.Name, transfer, func() []fleet.EncoderModel { return encoderModels(svc) }, log)
		defer stopAnnounce()
	}
	if m.Vision != nil {
		fmt.Fprintf(stderr, "try it:\n%s\n", tryCurl(ln.Addr(), m.Name))
	}
	if adminLn != nil {
		adminDone := make(chan struct{})
		go func() { // owned: ends with ctx, waited for below
			defer close(adminDone)
			if err := srv.ServeAdmin(ctx, adminLn); err != nil {
				log.Error("admin listener", "err", err)
			}
		}()
		defer func() { <-adminDone }()
	}
	// One deadline for the whole drain: the HTTP server's, then the service's with what is left.
	err = srv.Serve(ctx, ln)
	drainEnds, ok := srv.DrainDeadline()
	if !ok { // the server failed before any drain
		drainEnds = time.Now().Add(opts.ShutdownTimeout)
	}
	subs()
	cctx, cancel := context.WithDeadline(context.Background(), drainEnds)
	defer cancel()
	if cerr := svc.Close(cctx); cerr != nil && err == nil {
		err = cerr
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// planMemory resolves --memory-bytes (the cgroup's limit or physical memory, 90% of it, when
// not given) and --feature-bytes (a quarter of it, at most 1 GiB, when not given), and sets the
// Go runtime's memory limit to what the feature store leaves (GOMEMLIMIT wins when set).
func planMemory(so *dataplane.ServiceOptions, log *slog.Logger) error {
	if so.MemoryBytes == 0 {
		limit, source, err := memory.Limit()
		if err != nil {
			return fmt.Errorf("--memory-bytes not given and %v", err)
		}
		so.MemoryBytes = limit / 10 * 9
		log.Info("memory budget from the machine", "limit", limit, "source", source, "memory_bytes", so.MemoryBytes)
	}
	if so.Features.Host.Capacity == 0 {
		so.Features.Host.Capacity = min(features.DefaultOptions().Host.Capacity, so.MemoryBytes/4/(64<<10)*(64<<10))
	}
	if so.Features.Host.Capacity >= so.MemoryBytes {
		return fmt.Errorf("--feature-bytes %d is not below --memory-bytes %d", so.Features.Host.Capacity, so.MemoryBytes)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(so.MemoryBytes - so.Features.Host.Capacity) // the store's arena is not Go heap
	}
	return nil
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// logProcessor says where a modality's preprocessing came from: the processor files read (and
// what in them was set aside), or the built-in preset.
func logProcessor(log *slog.Logger, modality string, s *hfproc.Settings, summary string) {
	if s == nil {
		log.Info("preprocessing", "modality", modality, "from", "built-in preset", "settings", summary)
		return
	}
	class := s.Class
	if modality == "audio" {
		class = s.AudioClass
	}
	log.Info("preprocessing", "modality", modality, "from", s.Dir, "files", strings.Join(s.Files, ","), "class", class, "settings", summary)
	for _, n := range s.Notes {
		log.Info("preprocessing note", "modality", modality, "note", n)
	}
}

func audioName(m *dataplane.Models) string {
	if m.Audio == nil {
		return "none"
	}
	return m.Audio.Name + " (" + m.AudioPreset.Name + ")"
}

// workerPlan is what --workers, --kv-events and --kv-replay ask for, checked before any
// model loads.
type workerPlan struct {
	mock             int            // in-process mock engines (mock:N); 0: none
	fleet            bool           // the aggregated workers announced on NATS (--workers fleet)
	mockSpeedup      float64        // their clock
	urls             []string       // OpenAI-compatible engines
	static           []fleet.Worker // their names, roles and labels, from --worker-labels (else none)
	events, replays  []string       // the engines' KV-event and replay endpoints, same order
	firstByteTimeout time.Duration
	handoff          worker.Handoff // how requests with media reach them
}

func planWorkers(sf serveFlags) (workerPlan, error) {
	p := workerPlan{urls: splitList(sf.workers), events: splitList(sf.kvEvents), replays: splitList(sf.kvReplay), mockSpeedup: sf.mockSpeedup,
		firstByteTimeout: sf.firstByteTimeout}
	if p.firstByteTimeout <= 0 {
		return p, fmt.Errorf("--worker-first-byte-timeout: %v (want > 0)", p.firstByteTimeout)
	}
	if len(p.urls) == 0 {
		return p, fmt.Errorf("--workers: none given (want mock:N, http://host:port,... or fleet)")
	}
	if len(sf.rtopo.static) > 0 { // a static fleet replaces the default mock:4
		if sf.workers != "mock:4" && sf.workers != "labels" {
			return p, fmt.Errorf("--worker-labels lists the workers: leave --workers out (or say labels), not %q", sf.workers)
		}
		p.urls, p.static = nil, sf.rtopo.static
		for _, w := range p.static {
			p.urls = append(p.urls, w.Endpoint)
		}
	}
	if p.urls[0] == "fleet" {
		switch {
		case len(p.urls) > 1:
			return p, fmt.Errorf("--workers: fleet stands alone (got %q)", sf.workers)
		case sf.nats.url == "none":
			return p, fmt.Errorf("--workers fleet: the fleet is on NATS, and --nats is none")
		case len(p.events) > 0 || len(p.replays) > 0:
			return p, fmt.Errorf("--kv-events, --kv-replay: a fleet's KV events come from its stream on --nats")
		}
		p.fleet, p.urls = true, nil
		return p, nil
	}
	if sf.fleetModel != "" {
		return p, fmt.Errorf("--fleet-model goes with --workers fleet")
	}
	if n, ok := strings.CutPrefix(p.urls[0], "mock:"); ok {
		count, err := strconv.Atoi(n)
		switch {
		case len(p.urls) > 1:
			return p, fmt.Errorf("--workers: mock:N stands alone (got %q)", sf.workers)
		case err != nil || count < 1 || count > 100000:
			return p, fmt.Errorf("--workers: %q (want mock:N with 1 <= N <= 100000)", p.urls[0])
		case sf.mockSpeedup <= 0:
			return p, fmt.Errorf("--mock-speedup: %v (want > 0)", sf.mockSpeedup)
		case len(p.events) > 0:
			return p, fmt.Errorf("--kv-events: mock engines feed the router in-process; the flag is for http:// workers")
		}
		p.mock, p.urls = count, nil
		return p, nil
	}
	for _, u := range p.urls {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return p, fmt.Errorf("--workers: %q (want mock:N or http://host:port)", u)
		}
	}
	if len(p.events) > 0 && len(p.events) != len(p.urls) {
		return p, fmt.Errorf("--kv-events lists %d endpoints for %d workers", len(p.events), len(p.urls))
	}
	if len(p.replays) > 0 && len(p.replays) != len(p.events) {
		return p, fmt.Errorf("--kv-replay lists %d endpoints for %d --kv-events", len(p.replays), len(p.events))
	}
	return p, nil
}

// serveFleet routes to the fleet's aggregated workers: each announced one becomes an HTTP
// worker of the service at its announced endpoint, under its announced name (the one its KV
// events carry), fed from the stream; a worker whose lease ends leaves routing, the index and
// the service. The returned function stops it all.
func serveFleet(ctx context.Context, svc *dataplane.Service, reg *prometheus.Registry, n *natsClient, sf *serveFlags, p workerPlan, log *slog.Logger) (func(), error) {
	sfo := kvevents.DefaultStreamFeedOptions()
	sfo.Stream = sf.nats.stream
	stream := kvevents.NewStreamFeed(svc.Feed(), n.js, sfo)
	add := func(w fleet.Worker) error {
		hw, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: w.Endpoint, Name: w.Name, Label: w.Name,
			FirstByteTimeout: p.firstByteTimeout, Handoff: p.handoff})
		if err != nil {
			return err
		}
		_, err = svc.AddWorkerVia(hw, stream.AddWorker)
		return err
	}
	remove := func(name string) error { return svc.RemoveWorker(name, stream.RemoveWorker) }
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait() }
	rf, err := startRouterFleet(ctx, &wg, n, fleetRouting{nats: &sf.nats, roles: map[fleet.Role]bool{fleet.Aggregated: true, fleet.Prefill: true, fleet.Decode: true},
		model: sf.fleetModel, add: add, remove: remove}, stream, log)
	if err != nil {
		stop()
		return nil, err
	}
	if err := reg.Register(kvevents.NewStreamCollector(stream)); err != nil {
		stop()
		return nil, err
	}
	if err := reg.Register(rf); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// addWorkers builds the LLM workers and subscribes to their KV events; the returned function
// stops the subscriptions (and the mock fleet).
func addWorkers(ctx context.Context, svc *dataplane.Service, p workerPlan, blockSize int, log *slog.Logger) (func(), error) {
	subCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait() }
	if p.fleet {
		return stop, nil // serveFleet adds them as they are announced
	}
	if p.mock > 0 {
		if err := addMockFleet(subCtx, &wg, svc, p.mock, blockSize, p.mockSpeedup, log); err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	}
	for i, url := range p.urls {
		// Clients read "worker i" (its place in --workers, from 0 as mock engines count), or its
		// name in --worker-labels; the logs name its address.
		ho := worker.HTTPOptions{BaseURL: url, Label: fmt.Sprintf("worker %d", i), FirstByteTimeout: p.firstByteTimeout, Handoff: p.handoff}
		if p.static != nil {
			ho.Name, ho.Label = p.static[i].Name, p.static[i].Name
		}
		w, err := worker.NewHTTP(ho)
		if err != nil {
			stop()
			return nil, err
		}
		engine, err := svc.AddWorker(w)
		if err != nil {
			stop()
			return nil, err
		}
		if p.static != nil {
			if err := svc.Router().SetWorkerInfo(w.Name(), workerInfo(p.static[i])); err != nil {
				stop()
				return nil, err
			}
			if kb := p.static[i].KVBlocks; kb > 0 {
				engine.SetCapacity(kb)
			}
			log.Info("LLM worker", "worker", w.Name(), "role", p.static[i].Role, "labels", p.static[i].Labels, "endpoint", url)
		} else {
			log.Info("LLM worker", "worker", w.Name(), "label", w.Label())
		}
		if i >= len(p.events) {
			log.Warn("no KV events for a worker: routing sees its load but not its cache", "worker", w.Name())
			continue
		}
		if svc.Router().Options().Capacity == 0 { // no --kv-blocks: ask the engine
			wg.Add(1)
			go func() {
				defer wg.Done()
				learnKVCapacity(subCtx, svc.Feed(), w.Name(), url, 5*time.Second, log)
			}()
		}
		zo := kvevents.DefaultZMQOptions(p.events[i], "")
		zo.Log = log
		if i < len(p.replays) {
			zo.Replay = p.replays[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := kvevents.SubscribeZMQ(subCtx, zo, svc.Feed().Stats(), func(rank int) (*kvevents.Engine, error) {
				if rank != 0 {
					return nil, fmt.Errorf("worker %s publishes data-parallel rank %d: give each rank its own --workers entry", w.Name(), rank)
				}
				return engine, nil
			})
			if err != nil && subCtx.Err() == nil {
				log.Error("KV events", "worker", w.Name(), "endpoint", zo.Endpoint, "err", err)
			}
		}()
	}
	return stop, nil
}

// backendChoice is the backend serve runs on and what to log about CUDA.
type backendChoice struct {
	b    *native.Backend
	name string
	cuda string // one line: where the plugin is and what it drives, or why it is off
	nvml *cuda.NVML
}

// selectBackend probes the GPUs in a child process (a driver crash takes only the child down)
// and loads the CUDA plugin when it found one that drives a GPU; otherwise the CPU backend.
func selectBackend(ctx context.Context, explicit string, log *slog.Logger) backendChoice {
	choice := backendChoice{b: native.CPU(), name: "cpu"}
	exe, err := os.Executable()
	if err != nil {
		choice.cuda = "off: cannot find this executable to run the GPU probe: " + err.Error()
		return choice
	}
	report := cuda.Probe(ctx, exe, explicit, 20*time.Second)
	choice.cuda = report.Summary()
	if report.Usable() {
		if b, err := cuda.Open(report.Plugin); err != nil {
			choice.cuda = "off: " + err.Error() + "; running on the CPU backend"
		} else {
			choice.b, choice.name = b, b.Name()
		}
	}
	if n, err := cuda.OpenNVML(); err == nil {
		choice.nvml = n
	} else {
		log.Debug("no GPU metrics", "reason", err)
	}
	return choice
}

// addMockFleet runs n in-process mock engines (bench/mocker, Dynamo's perf model, real time)
// as the daemon's LLM workers; their KV events, in vLLM's wire format, go straight to the
// router's engines.
func addMockFleet(ctx context.Context, wg *sync.WaitGroup, svc *dataplane.Service, n, blockSize int, speedup float64, log *slog.Logger) error {
	feeds := map[string]*kvevents.Engine{}
	fo := mocker.DefaultFleetOptions()
	fo.Engines = n
	fo.Engine.BlockSize = blockSize
	fo.Engine.Vocab = svc.Tokenizer().VocabSize()
	fo.Clock.Speedup = speedup
	fo.Publisher = mocker.FeedRouter(feeds)
	fleet, err := mocker.NewFleet(fo)
	if err != nil {
		return err
	}
	for _, w := range fleet.Workers() {
		engine, err := svc.AddWorker(w)
		if err != nil {
			return err
		}
		feeds[w.Name()] = engine
		engine.SetCapacity(int64(fo.Engine.Blocks)) // the index never holds more than the engine
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := fleet.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("mock fleet stopped", "err", err)
		}
	}()
	log.Warn("LLM workers: in-process mock engines (Dynamo's mocker model): completions are placeholder words, not a model's; give --workers http://... for real engines",
		"engines", n, "block_size", blockSize, "speedup", speedup)
	return nil
}
