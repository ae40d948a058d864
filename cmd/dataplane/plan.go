package main

import (
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"context"
	"dataplane/router/fleet"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"dataplane/dataplane/planner"
)

func init() {
	register(command{"plan", "scale prefill and decode pools by load or SLA; replay recorded loads (dataplane plan -h)", planCommand})
}

const planUsage = `Usage:
  dataplane plan [flags]                     watch the fleet and scale its pools (live)
  dataplane plan replay --observations FILE.jsonl --initial-prefill N --initial-decode M [rules]
  dataplane plan profile --endpoint URL --isl N --osl N --ttft MS --itl MS   (plan profile -h)
  dataplane plan --sla profile.json --isl N --osl N --ttft MS --itl MS [flags]   SLA mode

replay runs the planner's rules over recorded metric pulls, one JSON object a line
({"t": seconds, "prefill_queue": waiting requests per prefill worker, "decode_kv": mean KV use
of decode workers}), changes completing at once, and prints one JSON line per adjustment
interval: {"t", "prefill", "decode", "action", "samples", "avg_prefill_queue", "avg_decode_kv"}.

Flags:
`

func planCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "replay":
			return planReplay(args[1:], stdout, stderr)
		case "profile":
			return planProfile(ctx, args[1:], stdout, stderr)
		}
	}
	return planLive(ctx, args, stdout, stderr)
}

// ruleFlags declares the rules' flags, named as Dynamo's planner names them.
func ruleFlags(fs *flag.FlagSet, r *planner.Rules) {
	*r = planner.DefaultRules()
	fs.Var((*secondsVar)(&r.PullInterval), "metric-pulling-interval", "how often the load is read (seconds, or a duration: 500ms)")
	fs.Var((*secondsVar)(&r.AdjustInterval), "adjustment-interval", "how often the pools are adjusted, by at most one worker each (seconds, or a duration)")
	fs.Float64Var(&r.DecodeKVUp, "decode-kv-scale-up-threshold", r.DecodeKVUp, "add a decode worker when the interval's mean KV-cache use of decode workers is above this")
	fs.Float64Var(&r.DecodeKVDown, "decode-kv-scale-down-threshold", r.DecodeKVDown, "remove one when it is below this")
	fs.Float64Var(&r.PrefillQueueUp, "prefill-queue-scale-up-threshold", r.PrefillQueueUp, "add a prefill worker when the interval's mean of requests waiting for prefill per prefill worker is above this")
	fs.Float64Var(&r.PrefillQueueDown, "prefill-queue-scale-down-threshold", r.PrefillQueueDown, "remove one when it is below this")
	fs.IntVar(&r.MinGPU, "min-gpu-budget", r.MinGPU, "never scale down under this many GPUs (both pools)")
	fs.IntVar(&r.MaxGPU, "max-gpu-budget", r.MaxGPU, "never scale up over this many GPUs (both pools)")
	fs.IntVar(&r.PrefillGPUs, "prefill-engine-num-gpu", r.PrefillGPUs, "GPUs per prefill worker")
	fs.IntVar(&r.DecodeGPUs, "decode-engine-num-gpu", r.DecodeGPUs, "GPUs per decode (or aggregated) worker")
	fs.IntVar(&r.MinEndpoint, "min-endpoint", r.MinEndpoint, "the fewest workers a pool keeps")
}

// secondsVar is a duration flag that also takes bare seconds, as Dynamo's planner flags are.
type secondsVar time.Duration

func (s *secondsVar) String() string { return time.Duration(*s).String() }

func (s *secondsVar) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || f > 1e6 {
			return fmt.Errorf("%v seconds: out of range", f)
		}
		*s = secondsVar(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	*s = secondsVar(d)
	return err
}

func parseFail(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return errUsage
}

func planReplay(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, planUsage); fs.PrintDefaults() }
	var r planner.Rules
	ruleFlags(fs, &r)
	obs := fs.String("observations", "", "recorded metric pulls (JSONL; - for stdin)")
	var start planner.Pools
	fs.IntVar(&start.Prefill, "initial-prefill", 1, "prefill workers at the start (0: an aggregated fleet)")
	fs.IntVar(&start.Decode, "initial-decode", 1, "decode workers at the start")
	if err := fs.Parse(args); err != nil {
		return parseFail(fs, err)
	}
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "plan replay: "+format+"\n", a...)
		return errUsage
	}
	if *obs == "" || fs.NArg() > 0 {
		return usage("--observations FILE is required (and nothing after the flags)")
	}
	if err := r.Check(); err != nil {
		return usage("%v", err)
	}
	if start.Prefill < 0 || start.Decode < 0 {
		return usage("--initial-prefill %d, --initial-decode %d: at least 0", start.Prefill, start.Decode)
	}
	in := io.Reader(os.Stdin)
	if *obs != "-" {
		f, err := os.Open(*obs)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	enc := json.NewEncoder(stdout)
	return planner.Replay(in, r, start, func(s planner.ReplayStep) error { return enc.Encode(s) })
}

// planConfig is what the live planner's flags set.
type planConfig struct {
	rules           planner.Rules
	noOperation     bool
	backend         string // local, kubernetes, none
	stateFile       string
	workerOutput    string
	startTimeout    time.Duration
	stopTimeout     time.Duration
	stopWorkersExit bool
	listen          string
	model           string
	nats            natsConfig
	logLevel        slog.Level
	kube            kubeFlags
	record          string // observations file
	sla             string // profile.json: SLA mode
	target          planner.SLATarget
}

func parsePlanFlags(args []string, stderr io.Writer) (*planConfig, error) {
	c := &planConfig{}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, planUsage); fs.PrintDefaults() }
	ruleFlags(fs, &c.rules)
	fs.BoolVar(&c.noOperation, "no-operation", false, "only observe: decisions are logged and counted in the metrics, never applied")
	fs.StringVar(&c.backend, "backend", "local", "how workers are added and removed: local (processes from --statefile), kubernetes (replicas of a Deployment or DynamoGraphDeployment)")
	fs.StringVar(&c.stateFile, "statefile", "", "local: the JSON statefile of worker processes (README of dataplane/planner)")
	fs.StringVar(&c.workerOutput, "worker-output", "", "local: append the workers' stdout and stderr to this file (default: discarded)")
	fs.DurationVar(&c.startTimeout, "start-timeout", 5*time.Minute, "local: a new worker must be announced in the fleet within this")
	fs.DurationVar(&c.stopTimeout, "stop-timeout", 2*time.Minute, "local: a stopped worker must exit within this (its drain), then it is killed")
	fs.BoolVar(&c.stopWorkersExit, "stop-workers-on-exit", false, "local: stop the workers when the planner stops (default: they keep running and the next planner adopts them)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8300", `HOST:PORT of /metrics ("" for none)`)
	fs.StringVar(&c.model, "model", "", "scale only the workers announced with this model (default: any)")
	fs.StringVar(&c.record, "record", "", "append every pull to this file as an observation line (what plan replay reads)")
	kubeFlagSet(fs, &c.kube)
	fs.StringVar(&c.sla, "sla", "", "SLA mode: size the pools by this profile (plan profile's profile.json) for --isl, --osl, --ttft, --itl")
	fs.IntVar(&c.target.ISL, "isl", 3000, "SLA mode: the input sequence length")
	fs.IntVar(&c.target.OSL, "osl", 150, "SLA mode: the output sequence length")
	fs.Float64Var(&c.target.TTFT, "ttft", 200, "SLA mode: the TTFT target, ms")
	fs.Float64Var(&c.target.ITL, "itl", 20, "SLA mode: the ITL target, ms")
	natsFlags(fs, &c.nats, "nats://127.0.0.1:4222")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, parseFail(fs, err)
	}
	usage := func(format string, a ...any) (*planConfig, error) {
		fmt.Fprintf(stderr, "plan: "+format+"\n", a...)
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	if err := c.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return usage("--log-level: %v", err)
	}
	if err := c.rules.Check(); err != nil {
		return usage("%v", err)
	}
	if err := c.nats.check(); err != nil {
		return usage("%v", err)
	}
	if c.sla != "" {
		if c.target.ISL < 1 || c.target.OSL < 1 || !(c.target.TTFT > 0) || !(c.target.ITL > 0) {
			return usage("--isl, --osl, --ttft and --itl must be positive")
		}
		p, err := planner.LoadProfile(c.sla)
		if err != nil {
			return usage("--sla: %v", err)
		}
		c.target.Profile, c.target.MinWorkers = p, c.rules.MinEndpoint
	}
	if c.nats.url == "none" {
		return usage("--nats none: the planner reads the fleet's load over NATS")
	}
	switch c.backend {
	case "local":
		if c.stateFile == "" && !c.noOperation {
			return usage("--backend local needs --statefile (or --no-operation)")
		}
	case "kubernetes":
		if err := c.kube.check(); err != nil && !c.noOperation {
			return usage("%v", err)
		}
	default:
		return usage("--backend %q: want local or kubernetes", c.backend)
	}
	return c, nil
}

func planLive(ctx context.Context, args []string, _, stderr io.Writer) error {
	c, err := parsePlanFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	n, err := connectNATS(&c.nats, "dataplane-planner", log)
	if err != nil {
		return err
	}
	defer n.Close()
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := fleet.OpenBucket(octx, n.js, c.nats.bucket)
	cancel()
	if err != nil {
		return err
	}
	src := planner.NewFleetSource()
	src.Model = c.model
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	w := fleet.NewWatcher(b, n.nc, src)
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	var loadStats fleet.LoadStats
	sub, err := fleet.SubscribeLoad(n.nc, c.nats.load, &loadStats, src.OnLoad)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	select {
	case <-w.Ready():
	case <-ctx.Done():
		return nil
	}

	p := &planner.Planner{Rules: c.rules, Source: src, NoOperation: c.noOperation, Log: log, Metrics: planner.NewMetrics()}
	if c.record != "" {
		f, err := os.OpenFile(c.record, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		p.Record = f
	}
	if c.sla != "" {
		p.SLA = &c.target
		r := c.target.Profile.Recommend(c.target.ISL, c.target.OSL, c.target.TTFT, c.target.ITL)
		log.Info("planner: SLA mode", "profile", c.sla, "ttft_ms", r.TTFTms, "ttft_met", r.TTFTMet, "itl_ms", r.ITLms, "itl_met", r.ITLMet, "decode_kv", r.DecodeKV)
	}
	if !c.noOperation {
		switch c.backend {
		case "local":
			out := io.Discard
			if c.workerOutput != "" {
				f, err := os.OpenFile(c.workerOutput, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					return err
				}
				defer f.Close()
				out = f
			}
			l, err := planner.NewLocal(planner.LocalOptions{StateFile: c.stateFile, Fleet: bucketFleet{src, b}, PrefillGPUs: c.rules.PrefillGPUs,
				DecodeGPUs: c.rules.DecodeGPUs, StartTimeout: c.startTimeout, StopTimeout: c.stopTimeout, Output: out, Log: log})
			if err != nil {
				return err
			}
			if c.stopWorkersExit {
				defer l.StopAll()
			}
			if err := l.Start(ctx); err != nil {
				return err
			}
			p.Backend = l
		case "kubernetes":
			k, err := c.kube.backend(log)
			if err != nil {
				return err
			}
			p.Backend = k
		}
	}
	if c.listen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(p.Metrics.Collectors()...)
		ln, err := net.Listen("tcp", c.listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("planner: metrics", "listen", ln.Addr().String())
	}
	log.Info("planner: running", "backend", c.backend, "no_operation", c.noOperation, "rules", fmt.Sprintf("%+v", c.rules))
	return p.Run(ctx)
}

// bucketFleet is the fleet as the local backend sees it: the source's workers, and revoking a
// lease by deleting the worker's key (watchers see the delete: the worker leaves routing at
// once, before its drain).
type bucketFleet struct {
	*planner.FleetSource
	b *fleet.Bucket
}

func (f bucketFleet) Revoke(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return f.b.KV.Delete(ctx, name)
}

// kubeFlags are the kubernetes backend's flags.
type kubeFlags struct {
	kind, server, kubeconfig, namespace string
	prefill, decode, graph              string
	readyTimeout                        time.Duration
}

func kubeFlagSet(fs *flag.FlagSet, k *kubeFlags) {
	fs.StringVar(&k.kind, "kube-kind", "deployment", "kubernetes: what is scaled: deployment (one per pool) or dynamographdeployment (a service per pool)")
	fs.StringVar(&k.server, "kube-server", "", "kubernetes: the API server (default: in-cluster, or --kubeconfig's)")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes: a kubeconfig file (its current context; default: in-cluster config)")
	fs.StringVar(&k.namespace, "kube-namespace", "", "kubernetes: the namespace (default: the pod's, or the kubeconfig context's)")
	fs.StringVar(&k.prefill, "kube-prefill", "", "kubernetes: the prefill pool's Deployment, or its service in the graph (empty: not scaled)")
	fs.StringVar(&k.decode, "kube-decode", "", "kubernetes: the decode pool's Deployment, or its service in the graph")
	fs.StringVar(&k.graph, "kube-graph", "", "kubernetes: the DynamoGraphDeployment's name (--kube-kind dynamographdeployment)")
	fs.DurationVar(&k.readyTimeout, "kube-ready-timeout", 10*time.Minute, "kubernetes: a change must be rolled out within this")
}

func (k *kubeFlags) check() error {
	if k.prefill == "" && k.decode == "" {
		return errors.New("--backend kubernetes needs --kube-prefill or --kube-decode")
	}
	if k.kind == "dynamographdeployment" && k.graph == "" {
		return errors.New("--kube-kind dynamographdeployment needs --kube-graph")
	}
	return nil
}

func (k *kubeFlags) backend(log *slog.Logger) (*planner.Kube, error) {
	o := planner.KubeOptions{Kind: k.kind, Graph: k.graph, ReadyTimeout: k.readyTimeout, Log: log, Targets: map[planner.Pool]string{}}
	if k.prefill != "" {
		o.Targets[planner.PoolPrefill] = k.prefill
	}
	if k.decode != "" {
		o.Targets[planner.PoolDecode] = k.decode
	}
	switch {
	case k.kubeconfig != "":
		kc, err := planner.LoadKubeconfig(k.kubeconfig)
		if err != nil {
			return nil, err
		}
		o.Server, o.Token, o.CA, o.CertPEM, o.KeyPEM, o.Namespace = kc.Server, kc.Token, kc.CA, kc.CertPEM, kc.KeyPEM, kc.Namespace
	case k.server == "":
		server, token, ca, ns, err := planner.InClusterServer()
		if err != nil {
			return nil, err
		}
		o.Server, o.Token, o.CA, o.Namespace = server, token, ca, ns
	}
	if k.server != "" {
		o.Server = k.server
	}
	if k.namespace != "" {
		o.Namespace = k.namespace
	}
	return planner.NewKube(o)
}
