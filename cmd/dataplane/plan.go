package main

import (
	"context"
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

func planLive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("plan: live mode not built yet")
}
