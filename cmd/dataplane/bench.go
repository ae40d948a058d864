package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"dataplane/bench/ab"
	"dataplane/bench/loadgen"
	"dataplane/bench/mocker"
	"dataplane/bench/sweep"
	"dataplane/bench/synth"
	"dataplane/cuda"
	"dataplane/dataplane/encoder"
	"dataplane/native"
	"dataplane/router"
	"dataplane/router/kvevents"
)

func init() {
	register(command{"bench", "measure: load (HTTP replay), ab (routing A/B), fleet (N engines in real time), sweep (encoder batch sizes), chaos (serve under hostile scenarios)", benchCommand})
}

const benchUsage = `Usage: dataplane bench <load|ab|fleet|sweep|chaos> [flags]   (dataplane bench <sub> -h)

  load   replay a trace open-loop against OpenAI-compatible endpoints: TTFT, ITL, E2E; CSV, PNG
  ab     the same trace under routing policies (round-robin, random, kv, kv-modality) and encoding modes,
         on a mock fleet in virtual time: one table
  fleet  N mock engines in real time fed a trace in-process (no sockets): do they keep up?
  sweep  encoder latency and throughput for batch sizes 1..64 on the host or a backend plugin
  chaos  a real serve (and mock workers) as children under hostile scenarios: one table, exit 1 on a failed row
`

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchUsage)
		return errUsage
	}
	sub := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"load": benchLoad, "ab": benchAB, "fleet": benchFleet, "sweep": benchSweep, "chaos": benchChaos,
	}[args[0]]
	if sub == nil {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Fprint(stdout, benchUsage)
			return nil
		}
		fmt.Fprintf(stderr, "bench: unknown %q\n\n%s", args[0], benchUsage)
		return errUsage
	}
	return sub(ctx, args[1:], stdout, stderr)
}

// terminal returns w if it is a terminal (for progress lines rewritten in place), else nil.
func terminal(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			return w
		}
	}
	return nil
}

func randSeed() uint64 { return rand.Uint64()%1_000_000_000 + 1 }

// parseBench parses a subcommand's flags; usageErr reports a bad combination.
func parseBench(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}

func readTrace(path string, limit int, blockSize int) ([]synth.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lim := synth.DefaultLimits()
	lim.BlockSize = blockSize
	recs, err := synth.ReadTrace(f, lim)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if limit > 0 && limit < len(recs) {
		recs = recs[:limit]
	}
	return recs, nil
}

func outDir(dir string) error {
	if dir == "" {
		return nil
	}
	return os.MkdirAll(dir, 0o755)
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func benchLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := loadgen.DefaultOptions()
	endpoints := fs.String("endpoints", "", "base URLs, comma-separated (http://host:port or http://host:port/engines/3); round-robin")
	routers := fs.String("router", "", "instead of --endpoints: standalone routers' base URLs (dataplane router), comma-separated, asked round-robin where each request goes")
	trace := fs.String("trace", "", "trace to replay (JSONL)")
	limit := fs.Int("limit", 0, "replay only the first N requests (0: all)")
	out := fs.String("out", "", "directory for requests.csv, ttft_cdf.png, latency_over_time.png")
	fs.StringVar(&o.Model, "model", "", `"model" field of each request`)
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per trace hash id")
	fs.IntVar(&o.Vocab, "vocab", o.Vocab, "prompt token ids are drawn below this (the served model's regular vocabulary: 10256 for serve's demo tokenizer)")
	fs.Float64Var(&o.Speedup, "speedup", o.Speedup, "replay this many times faster than the trace")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", o.MaxInFlight, "requests in flight; beyond, requests are skipped (and counted)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "per request")
	if err := parseBench(fs, args, stderr); err != nil {
		return err
	}
	if (*endpoints == "") == (*routers == "") || *trace == "" {
		fmt.Fprintln(stderr, "bench load: --trace and one of --endpoints and --router are required")
		return errUsage
	}
	o.Endpoints, o.Routers = splitList(*endpoints), splitList(*routers)
	o.Progress = terminal(stderr)
	recs, err := readTrace(*trace, *limit, o.BlockSize)
	if err != nil {
		return err
	}
	rep, err := loadgen.Run(ctx, recs, o)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, rep.Summarize().String())
	return writeReport(rep, *out, "load")
}

func writeReport(rep *loadgen.Report, dir, title string) error {
	if dir == "" {
		return nil
	}
	if err := outDir(dir); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "requests.csv"), rep.WriteCSV); err != nil {
		return err
	}
	return rep.WriteCharts(dir, title)
}

func benchAB(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := ab.DefaultOptions()
	trace := fs.String("trace", "", "trace to replay (JSONL; e.g. from dataplane synth)")
	limit := fs.Int("limit", 0, "replay only the first N requests (0: all)")
	out := fs.String("out", "", "directory for ab.csv and ab_ttft.png")
	policies := fs.String("policies", strings.Join(o.Policies, ","), "routing policies: round-robin, random, kv, kv-modality (kv with the encode wait in the cost); "+
		"on --prefill and --decode engines: disagg-random, disagg (topology-unaware), disagg-topology (decode in the prefill engine's zone), disagg-soft (the KV move in the decode cost), disagg-topology-soft")
	encodings := fs.String("encodings", strings.Join(o.Encodings, ","), "encoding modes: none, sync, async")
	fs.IntVar(&o.Engines, "engines", o.Engines, "mock engines")
	fs.IntVar(&o.Engine.BlockSize, "block-size", o.Engine.BlockSize, "KV block size = tokens per trace hash id")
	fs.IntVar(&o.Engine.Blocks, "kv-blocks", o.Engine.Blocks, "KV cache per engine, in blocks")
	fs.IntVar(&o.Engine.MaxBatchedTokens, "max-batched-tokens", o.Engine.MaxBatchedTokens, "engine step token budget")
	fs.Uint64Var(&o.Seed, "seed", 0, "engines' and random policy's seed (0: random)")
	encodeMS := fs.Float64("encode-ms-per-1k-tokens", float64(ab.DefaultSimEncoder().PerToken*1000)/1e6, "the simulated encoder's cost")
	encodeSlots := fs.Int("encode-slots", ab.DefaultSimEncoder().Workers, "the simulated encoder's parallel slots (async)")
	encodeFrameMS := fs.Float64("encode-ms-per-frame", float64(ab.DefaultSimEncoder().PerFrame)/1e6, "the simulated encoder's cost per video frame (videos that say their frames; 0: by tokens)")
	overlap := fs.String("overlap", "off", "encode/prefill overlap with kv-modality (a media request's engine gets its text before the first item as a 1-token warm-up while it encodes): off, on, both")
	fs.IntVar(&o.OverlapMinTokens, "overlap-min-tokens", o.OverlapMinTokens, "the least text before the first item worth a warm-up")
	fs.BoolVar(&o.Baseline, "without-media", false, "also run each policy on the trace with its media taken out, and report the text-only requests' TTFT p99 against it")
	var topo abTopology
	abTopologyFlags(fs, &o, &topo)
	calibrate := fs.String("encoder-preset", "", "measure the encoder's cost on this machine instead: a sweep preset (vit-tiny, clip-b16, clip-l14-336, whisper-tiny, whisper-base) run at batch 1 on the CPU kernels")
	if err := parseBench(fs, args, stderr); err != nil {
		return err
	}
	if *trace == "" {
		fmt.Fprintln(stderr, "bench ab: --trace is required")
		return errUsage
	}
	o.Policies, o.Encodings = splitList(*policies), splitList(*encodings)
	o.Router.BlockSize = o.Engine.BlockSize
	switch *overlap {
	case "off":
	case "on":
		o.Overlaps = []bool{true}
	case "both":
		o.Overlaps = []bool{false, true}
	default:
		fmt.Fprintf(stderr, "bench ab: --overlap %q (want off, on or both)\n", *overlap)
		return errUsage
	}
	if err := topo.resolve(&o); err != nil {
		fmt.Fprintf(stderr, "bench ab: %v\n", err)
		return errUsage
	}
	o.Encoder = ab.SimEncoder{PerToken: time.Duration(*encodeMS * 1e6 / 1000), PerFrame: time.Duration(*encodeFrameMS * 1e6), Workers: *encodeSlots}
	if *calibrate != "" {
		h, err := sweep.NewPreset(*calibrate, 0)
		if err != nil {
			return err
		}
		enc, err := ab.Calibrate(func() error { return h.Run(1) }, h.Tokens(), 3, *encodeSlots)
		h.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "encoder %s on this machine: %.3f ms per 1k media tokens, %.3f ms per frame, %d slots\n", *calibrate,
			float64(enc.PerToken*1000)/1e6, float64(enc.PerFrame)/1e6, enc.Workers)
		o.Encoder = enc
	}
	if o.Seed == 0 {
		o.Seed = randSeed()
	}
	recs, err := readTrace(*trace, *limit, o.Engine.BlockSize)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := ab.Run(ctx, recs, o)
	if err != nil {
		return err
	}
	engines := fmt.Sprint(o.Engines)
	if o.Prefill > 0 {
		engines = fmt.Sprintf("%d (or %d prefill + %d decode over %d zones)", o.Engines, o.Prefill, o.Decode, o.Layout.Zones)
	}
	fmt.Fprintf(stdout, "%d requests, %s engines (%d blocks of %d tokens each), seed %d, %.1fs to simulate\n\n",
		len(recs), engines, o.Engine.Blocks, o.Engine.BlockSize, o.Seed, time.Since(start).Seconds())
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tencoding\tTTFT p50\tTTFT p99\tITL p50\tE2E p50\tE2E p99\tcache hit\ttokens/s\tpreempted\trejected\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%s\t%.0f ms\t%.0f ms\t%.1f ms\t%.0f ms\t%.0f ms\t%.3f\t%.0f\t%d\t%d\t\n", r.Policy, encodingName(r),
			r.TTFT.P50, r.TTFT.P99, r.ITL.P50, r.E2E.P50, r.E2E.P99, r.CacheHit, r.OutputTokensPerS, r.Preemptions, r.Rejected)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printDisagg(stdout, res); err != nil {
		return err
	}
	if err := printClasses(stdout, res); err != nil {
		return err
	}
	if len(res) > 1 {
		base := res[0]
		for _, r := range res[1:] {
			fmt.Fprintf(stdout, "%s/%s vs %s/%s: TTFT p50 %.2fx, p99 %.2fx better\n", r.Policy, encodingName(r), base.Policy, encodingName(base),
				base.TTFT.P50/r.TTFT.P50, base.TTFT.P99/r.TTFT.P99)
		}
	}
	if *out == "" {
		return nil
	}
	if err := outDir(*out); err != nil {
		return err
	}
	err = writeFile(filepath.Join(*out, "ab.csv"), func(w io.Writer) error {
		// One row per run (class "all"), then one per class present with its TTFT only.
		fmt.Fprintln(w, "policy,encoding,class,requests,rejected,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms,cache_hit,output_tokens_per_s,preemptions,text_p99_vs_without_media")
		for _, r := range res {
			fmt.Fprintf(w, "%s,%s,all,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.1f,%d,%.4f\n", r.Policy, encodingName(r), r.Requests, r.Rejected,
				r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.ITL.P50, r.ITL.P99, r.E2E.P50, r.E2E.P99, r.CacheHit, r.OutputTokensPerS, r.Preemptions, r.TextVsBaseline)
			for _, c := range r.ByClass {
				fmt.Fprintf(w, "%s,%s,%s,%d,,%.3f,%.3f,%.3f,,,,,,,,\n", r.Policy, encodingName(r), c.Class, c.Requests, c.TTFT.P50, c.TTFT.P90, c.TTFT.P99)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return ab.Chart(res).SavePNG(filepath.Join(*out, "ab_ttft.png"))
}

// printClasses prints each run's TTFT per request class and, with --without-media, the
// text-only requests' p99 against the same requests without the trace's media.
func printClasses(stdout io.Writer, res []ab.Result) error {
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tencoding\tclass\trequests\tTTFT p50\tTTFT p99\ttext p99 vs without media\t")
	for _, r := range res {
		for _, c := range r.ByClass {
			vs := ""
			if c.Class == synth.ClassText && r.TextVsBaseline > 0 {
				vs = fmt.Sprintf("%.3fx", r.TextVsBaseline)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f ms\t%.0f ms\t%s\t\n", r.Policy, encodingName(r), c.Class, c.Requests, c.TTFT.P50, c.TTFT.P99, vs)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !slices.ContainsFunc(res, func(r ab.Result) bool { return r.Overlap }) {
		return nil
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tencoding\tmedia requests' text prefix\trequests\tTTFT p50\tTTFT p99\twarm-ups sent / too short / cached\t")
	for _, r := range res {
		if r.Policy != ab.ModalityAware {
			continue
		}
		for _, b := range r.ByPrefix {
			span := fmt.Sprintf("%d-%d tokens", b.Min, b.Max)
			if b.Max == 0 {
				span = fmt.Sprintf(">= %d tokens", b.Min)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f ms\t%.0f ms\t%d / %d / %d\t\n", r.Policy, encodingName(r), span, b.Requests, b.TTFT.P50, b.TTFT.P99,
				r.Warmups, r.WarmupsShort, r.WarmupsCached)
		}
	}
	return tw.Flush()
}

// encodingName is a run's encoding mode, "+overlap" when it warmed prefixes.
func encodingName(r ab.Result) string {
	if r.Overlap {
		return r.Encoding + "+overlap"
	}
	return r.Encoding
}

func benchFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &mockConfig{fleet: mocker.DefaultFleetOptions()}
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mockFlags(fs, c, "embedded")
	trace := fs.String("trace", "", "trace to replay (JSONL)")
	limit := fs.Int("limit", 0, "replay only the first N requests (0: all)")
	tokenBlock := fs.Int("trace-block-size", 512, "tokens per trace hash id")
	loadSpeedup := fs.Float64("load-speedup", 1, "send the trace this many times faster than its timestamps")
	out := fs.String("out", "", "directory for requests.csv and the charts")
	heapProfile := fs.String("heap-profile", "", "write a heap profile (go tool pprof) here at the end, the router still live")
	routing := fs.String("route", "round-robin", "round-robin (request i to engine i mod N) or kv (the router, fed by the engines' KV events; needs --kv-events nats)")
	if err := parseBench(fs, args, stderr); err != nil {
		return err
	}
	if *trace == "" {
		fmt.Fprintln(stderr, "bench fleet: --trace is required")
		return errUsage
	}
	if *routing != "round-robin" && (*routing != "kv" || c.events != "nats") {
		fmt.Fprintf(stderr, "bench fleet: --route %q: want round-robin, or kv with --kv-events nats\n", *routing)
		return errUsage
	}
	recs, err := readTrace(*trace, *limit, *tokenBlock)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if c.events == "nats" && c.nats.url == "embedded" && c.nats.stateDir == "" { // a run's events are not worth keeping
		dir, err := os.MkdirTemp("", "dataplane-bench-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		c.nats.stateDir = dir
	}
	fleet, cleanup, err := buildFleet(c, log)
	if err != nil {
		return err
	}
	defer cleanup()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = fleet.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	o := loadgen.DefaultOptions()
	o.BlockSize, o.Speedup, o.Progress = *tokenBlock, *loadSpeedup, terminal(stderr)
	o.MaxInFlight = 1 << 30
	var kv *fleetRouter
	if *routing == "kv" {
		if kv, err = newFleetRouter(c, fleet); err != nil {
			return err
		}
		defer kv.close()
		o.Route = kv
	}
	cpu0 := processCPU()
	rep, err := loadgen.RunInProcess(ctx, fleet, recs, o)
	if err != nil {
		return err
	}
	cpu := processCPU() - cpu0
	var entries int64
	var mean, worst time.Duration
	for _, l := range fleet.Loops() {
		n, m, w := l.Lag()
		entries += n
		mean, worst = max(mean, m), max(worst, w)
	}
	sum := rep.Summarize()
	offered := 0.0
	if n := len(recs); n > 1 {
		offered = float64(n-1) / ((recs[n-1].Timestamp - recs[0].Timestamp) / 1000 / *loadSpeedup)
	}
	fmt.Fprintf(stdout, "%d engines on %d loops, engine time x%g: %d requests in %.1f s (offered %.1f req/s)\n", fleet.Len(), len(fleet.Loops()),
		c.fleet.Clock.Speedup, len(recs), rep.Duration.Seconds(), offered)
	fmt.Fprint(stdout, sum.String())
	fmt.Fprintf(stdout, "loop entries %d (engine steps and timers); lag behind schedule: mean %v, worst %v\n", entries, mean, worst)
	fmt.Fprintf(stdout, "process CPU %.1f s over %.1f s: %.2f cores\n", cpu.Seconds(), rep.Duration.Seconds(), cpu.Seconds()/rep.Duration.Seconds())
	if kv != nil {
		kv.report(stdout)
	}
	fmt.Fprintf(stdout, "live heap after a GC %.1f MiB\n", float64(heapAfterGC())/(1<<20))
	if *heapProfile != "" {
		f, err := os.Create(*heapProfile)
		if err != nil {
			return err
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return writeReport(rep, *out, "fleet")
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapAfterGC is the live heap after a full collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// fleetRouter routes a bench fleet's requests as serve does: the router package over an index
// fed by every engine's KV events, which it reads from NATS like any subscriber. It times each
// decision.
type fleetRouter struct {
	*loadgen.KVRouter
	r      *router.Router
	feed   *kvevents.Feed
	nc     *nats.Conn
	sub    *nats.Subscription
	stats  kvevents.NATSStats
	tookMS []float64 // per decision; Pick is called from one goroutine
}

func (k *fleetRouter) Pick(id string, r *mocker.Request) (int, error) {
	t0 := time.Now()
	eng, err := k.KVRouter.Pick(id, r)
	k.tookMS = append(k.tookMS, float64(time.Since(t0).Nanoseconds())/1e6)
	return eng, err
}

func newFleetRouter(c *mockConfig, fleet *mocker.Fleet) (*fleetRouter, error) {
	opts := router.DefaultOptions()
	opts.BlockSize = c.fleet.Engine.BlockSize
	opts.Index.MaxWorkers = fleet.Len()
	opts.Capacity = int64(c.fleet.Engine.Blocks) // an engine holds no more than its cache
	r, err := router.New(opts)
	if err != nil {
		return nil, err
	}
	feed, err := kvevents.NewFeed(r, kvevents.DefaultOptions())
	if err != nil {
		return nil, err
	}
	for i := range fleet.Len() {
		if _, err := feed.AddWorker(fleet.Engine(i).Name()); err != nil {
			return nil, err
		}
	}
	k := &fleetRouter{r: r, feed: feed}
	if k.KVRouter, err = loadgen.NewKVRouter(r, fleet); err != nil {
		return nil, err
	}
	if k.nc, err = nats.Connect(c.natsClient.url); err != nil {
		return nil, fmt.Errorf("nats %s: %w", c.natsClient.url, err)
	}
	if k.sub, err = kvevents.StartNATS(k.nc, c.nats.stream.Prefix, feed, &k.stats); err != nil {
		k.nc.Close()
		return nil, err
	}
	// A fleet publishes in bursts; a slow-consumer drop would show as gaps, not go unseen.
	if err := k.sub.SetPendingLimits(1<<20, 1<<30); err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

func (k *fleetRouter) close() {
	closed := make(chan struct{})
	k.nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if k.nc.Drain() != nil { // delivers what was received, then closes
		k.nc.Close()
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
	}
}

func (k *fleetRouter) report(w io.Writer) {
	st := k.feed.Stats()
	dropped, _ := k.sub.Dropped()
	took := synth.Summarize(k.tookMS)
	ix := k.r.Index()
	fmt.Fprintf(w, "router: %d decisions over %d workers (p50 %.3f ms, p99 %.3f ms each); index %d blocks, %d entries, %.1f MiB\n",
		k.r.Decisions(), len(k.r.Workers()), took.P50, took.P99, ix.Blocks(), ix.Entries(), float64(ix.Bytes())/(1<<20))
	fmt.Fprintf(w, "kv events: %d batches, %d blocks stored, %d removed, %d gaps, %d unknown parents; nats dropped %d\n",
		st.Batches.Load(), st.BlocksStored.Load(), st.BlocksRemoved.Load(), st.Gaps.Load(), st.UnknownParent.Load(), dropped)
}

func benchSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := sweep.DefaultOptions()
	encoders := fs.String("encoders", "vit-tiny,whisper-tiny", "presets (random weights): vit-tiny, clip-b16, clip-l14-336, whisper-tiny, whisper-base")
	model := fs.String("model", "", "a checkpoint directory to sweep instead of presets")
	frames := fs.Int("frames", 3000, "Whisper input frames for --model")
	backend := fs.String("backend", "host", "host (the CPU kernels), or plugin:PATH (a backend plugin: build/libdataplane_cpu_plugin.so, the CUDA plugin); plugins need --model")
	batches := fs.String("batches", "1,2,4,8,16,32,64", "batch sizes")
	fs.IntVar(&o.Iterations, "iterations", o.Iterations, "timed runs per batch size (median reported)")
	fs.DurationVar(&o.MaxTime, "max-time", o.MaxTime, "time per batch size after which no more runs start")
	threads := fs.Int("threads", 0, "kernel threads (0: all CPUs, up to 8)")
	out := fs.String("out", "", "directory for sweep.csv and sweep.png")
	if err := parseBench(fs, args, stderr); err != nil {
		return err
	}
	o.Batches = nil
	for _, s := range splitList(*batches) {
		b, err := strconv.Atoi(s)
		if err != nil || b <= 0 {
			fmt.Fprintf(stderr, "bench sweep: batch size %q\n", s)
			return errUsage
		}
		o.Batches = append(o.Batches, b)
	}
	var encs []sweep.Encoder
	defer func() {
		for _, e := range encs {
			e.Close()
		}
	}()
	maxBatch := 0
	for _, b := range o.Batches {
		maxBatch = max(maxBatch, b)
	}
	switch {
	case strings.HasPrefix(*backend, "plugin:"):
		if *model == "" {
			fmt.Fprintln(stderr, "bench sweep: a plugin backend needs --model")
			return errUsage
		}
		b, err := cuda.Open(strings.TrimPrefix(*backend, "plugin:"))
		if err != nil {
			return err
		}
		m, err := encoder.Load(*model, encoder.Options{})
		if err != nil {
			return err
		}
		sel := m.Select()
		m.Close()
		spec, weights, closeFiles, err := encoder.LoadWeights(*model)
		if err != nil {
			return err
		}
		d, err := sweep.NewDevice(filepath.Base(*model)+"@"+b.Name(), b, spec.Config, weights, sel, *frames, maxBatch)
		closeFiles()
		if err != nil {
			return err
		}
		encs = append(encs, d)
	case *backend != "host":
		fmt.Fprintf(stderr, "bench sweep: --backend %q: want host or plugin:PATH\n", *backend)
		return errUsage
	case *model != "":
		m, err := encoder.Load(*model, encoder.Options{Threads: *threads})
		if err != nil {
			return err
		}
		h, err := sweep.NewHost(filepath.Base(*model), m, *frames)
		if err != nil {
			m.Close()
			return err
		}
		encs = append(encs, h)
	default:
		for _, name := range splitList(*encoders) {
			h, err := sweep.NewPreset(name, *threads)
			if err != nil {
				return err
			}
			encs = append(encs, h)
		}
	}
	rows, err := sweep.Run(ctx, encs, o)
	if err != nil {
		return err
	}
	name := *backend
	if name == "host" {
		name = fmt.Sprintf("host CPU, %s, %d threads", native.BestISA(), max(*threads, native.DefaultThreads()))
	}
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(stdout, "backend: %s\n", name)
	fmt.Fprintln(tw, "encoder\tbatch\tms/batch\tms/item\titems/s\tvs batch 1\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.1f\t%.2fx\t\n", r.Encoder, r.Batch, r.BatchMS, r.ItemMS, r.ItemsPerS, r.SpeedupVs1)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if *out == "" {
		return nil
	}
	if err := outDir(*out); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(*out, "sweep.csv"), func(w io.Writer) error { return sweep.WriteCSV(w, rows) }); err != nil {
		return err
	}
	return sweep.Chart(rows, name).SavePNG(filepath.Join(*out, "sweep.png"))
}
