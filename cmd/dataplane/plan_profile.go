package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"dataplane/bench/loadgen"
	"dataplane/bench/plot"
	"dataplane/bench/synth"
	"dataplane/dataplane/planner"
)

// `dataplane plan profile`: Dynamo's SLA profiler (benchmarks/profiler/profile_sla.py) for one
// engine: TTFT over ISL at concurrency 1, ITL and output tokens/s over concurrency and context
// length, the fits, tables, plots and recommendations.

type profileConfig struct {
	endpoint, model, out         string
	isl, osl                     int
	ttft, itl                    float64
	prefillGPUs, decodeGPUs      int
	kvTokens                     int
	maxContext                   int
	prefillSteps, decodeContexts int
	concurrency                  []int
	repeats                      int
	timeout                      time.Duration
}

func planProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &profileConfig{}
	fs := flag.NewFlagSet("plan profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: dataplane plan profile --endpoint URL --isl N --osl N --ttft MS --itl MS [flags]

Sweeps one engine (an OpenAI-compatible /v1/completions: a mock engine's
http://HOST:PORT/engines/0, or a vLLM server) over ISL (TTFT at concurrency 1) and over
concurrency at a few context lengths (ITL, output tokens/s), fits TTFT(ISL) and ITL(KV use,
context), writes profile.json, prefill.csv, decode.csv, prefill_ttft.png and decode_itl.png
under --out, and prints the engine's throughput at the targets and the load-based planner's
thresholds, as Dynamo's profiler does. plan --sla reads profile.json.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.endpoint, "endpoint", "", "the engine's base URL (its /v1/completions and /metrics)")
	fs.StringVar(&c.model, "model", "", `the "model" field of the requests ("": left out)`)
	fs.StringVar(&c.out, "out", "profile", "directory for profile.json, the tables and the plots")
	fs.IntVar(&c.isl, "isl", 3000, "target input sequence length")
	fs.IntVar(&c.osl, "osl", 150, "target output sequence length")
	fs.Float64Var(&c.ttft, "ttft", 200, "target time to first token, ms")
	fs.Float64Var(&c.itl, "itl", 20, "target inter-token latency, ms")
	fs.IntVar(&c.prefillGPUs, "prefill-gpus", 1, "GPUs of the engine as a prefill worker (its parallelism)")
	fs.IntVar(&c.decodeGPUs, "decode-gpus", 1, "GPUs of the engine as a decode worker")
	fs.IntVar(&c.kvTokens, "kv-tokens", 0, "the engine's KV cache in tokens (0: vllm:cache_config_info of ENDPOINT/metrics)")
	fs.IntVar(&c.maxContext, "max-context-length", 8192, "the longest ISL profiled")
	fs.IntVar(&c.prefillSteps, "prefill-interpolation-granularity", 8, "ISLs profiled for TTFT")
	fs.IntVar(&c.decodeContexts, "decode-interpolation-granularity", 3, "context lengths profiled for ITL")
	conc := fs.String("concurrency", "1,4,16,64,256", "requests in flight at once for the decode sweep (those that fit the KV cache)")
	fs.IntVar(&c.repeats, "repeats", 3, "requests per prefill point (their mean TTFT)")
	fs.DurationVar(&c.timeout, "request-timeout", 5*time.Minute, "per request")
	if err := fs.Parse(args); err != nil {
		return parseFail(fs, err)
	}
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "plan profile: "+format+"\n", a...)
		return errUsage
	}
	if c.endpoint == "" || fs.NArg() > 0 {
		return usage("--endpoint URL is required (and nothing after the flags)")
	}
	for _, s := range splitList(*conc) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 4096 {
			return usage("--concurrency: %q is not a count from 1 to 4096", s)
		}
		c.concurrency = append(c.concurrency, n)
	}
	switch {
	case c.isl < 1 || c.osl < 2 || c.ttft <= 0 || c.itl <= 0:
		return usage("--isl, --osl (at least 2), --ttft and --itl must be positive")
	case c.prefillGPUs < 1 || c.decodeGPUs < 1:
		return usage("--prefill-gpus and --decode-gpus: at least 1")
	case c.maxContext < 200 || c.prefillSteps < 3 || c.decodeContexts < 2 || c.repeats < 1 || len(c.concurrency) < 2:
		return usage("--max-context-length at least 200, --prefill-interpolation-granularity at least 3, --decode-interpolation-granularity at least 2, --repeats at least 1, two --concurrency values")
	}
	c.endpoint = strings.TrimRight(c.endpoint, "/")
	if c.kvTokens == 0 {
		n, err := engineKVTokens(ctx, c.endpoint)
		if err != nil {
			return fmt.Errorf("plan profile: the KV cache size: %w (give --kv-tokens)", err)
		}
		c.kvTokens = n
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	p, err := runProfile(ctx, c, stderr)
	if err != nil {
		return err
	}
	if err := writeProfile(c, p); err != nil {
		return err
	}
	printRecommendation(stdout, c, p)
	return nil
}

// cacheConfigInfo is vLLM's vllm:cache_config_info gauge (vllm/v1/metrics/loggers.py: the
// CacheConfig as labels), which our mock engines serve too.
var (
	cacheConfigInfo = regexp.MustCompile(`(?m)^vllm:cache_config_info\{([^}]*)\}`)
	labelValue      = func(labels, name string) string {
		m := regexp.MustCompile(`(?:^|,)` + name + `="([^"]*)"`).FindStringSubmatch(labels)
		if m == nil {
			return ""
		}
		return m[1]
	}
)

func engineKVTokens(ctx context.Context, endpoint string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, err
	}
	m := cacheConfigInfo.FindSubmatch(b)
	if m == nil {
		return 0, errors.New("no vllm:cache_config_info in " + endpoint + "/metrics")
	}
	blocks, err1 := strconv.Atoi(labelValue(string(m[1]), "num_gpu_blocks"))
	size, err2 := strconv.Atoi(labelValue(string(m[1]), "block_size"))
	if err1 != nil || err2 != nil || blocks <= 0 || size <= 0 {
		return 0, fmt.Errorf("vllm:cache_config_info{%s}: no num_gpu_blocks and block_size", m[1])
	}
	return blocks * size, nil
}

// records makes n requests of isl prompt tokens (prompts that share nothing: distinct hash
// ids) and osl output tokens, all at time 0.
func records(n, isl, osl int, next *int64) []synth.Record {
	out := make([]synth.Record, n)
	for i := range out {
		out[i] = synth.Record{InputLength: isl, OutputLength: osl}
		for range (isl + 511) / 512 {
			*next++
			out[i].HashIDs = append(out[i].HashIDs, *next)
		}
	}
	return out
}

func runProfile(ctx context.Context, c *profileConfig, stderr io.Writer) (*planner.Profile, error) {
	p := &planner.Profile{Endpoint: c.endpoint, PrefillGPUs: c.prefillGPUs, DecodeGPUs: c.decodeGPUs, KVTokens: c.kvTokens}
	opts := loadgen.DefaultOptions()
	opts.Endpoints, opts.Model, opts.Timeout = []string{c.endpoint}, c.model, c.timeout
	next := time.Now().UnixNano() // hash ids no earlier run used: nothing is cached
	run := func(recs []synth.Record) (*loadgen.Report, error) {
		o := opts
		o.MaxInFlight = len(recs)
		rep, err := loadgen.Run(ctx, recs, o)
		if err != nil {
			return nil, err
		}
		for _, s := range rep.Samples {
			if s.Err != "" {
				return nil, fmt.Errorf("a request failed: %s", s.Err)
			}
		}
		return rep, ctx.Err()
	}
	step := max((c.maxContext-100)/(c.prefillSteps-1), 1)
	for isl := 100; isl <= c.maxContext && len(p.Prefill) < c.prefillSteps; isl += step {
		var sum time.Duration
		for range c.repeats {
			rep, err := run(records(1, isl, 2, &next))
			if err != nil {
				return nil, fmt.Errorf("prefill at ISL %d: %w", isl, err)
			}
			sum += rep.Samples[0].TTFT
		}
		ttft := float64(sum.Microseconds()) / 1000 / float64(c.repeats)
		p.Prefill = append(p.Prefill, planner.PrefillPoint{ISL: isl, TTFTms: ttft})
		fmt.Fprintf(stderr, "plan profile: prefill ISL %d: TTFT %.2f ms\n", isl, ttft)
	}
	maxISL := max(c.maxContext-c.osl, 100)
	cstep := max((maxISL-100)/(c.decodeContexts-1), 1)
	for isl := 100; isl <= maxISL && len(p.Decode) < c.decodeContexts*len(c.concurrency); isl += cstep {
		ctxLen := float64(isl) + float64(c.osl)/2
		for _, n := range c.concurrency {
			if n*(isl+c.osl) > c.kvTokens {
				break
			}
			rep, err := run(records(n, isl, c.osl, &next))
			if err != nil {
				return nil, fmt.Errorf("decode at ISL %d, concurrency %d: %w", isl, n, err)
			}
			var itl time.Duration
			var gaps, tokens int
			for _, s := range rep.Samples {
				for _, g := range s.ITL {
					itl += g
				}
				gaps += len(s.ITL)
				tokens += s.OutputTokens
			}
			if gaps == 0 {
				return nil, fmt.Errorf("decode at ISL %d: no inter-token gaps measured", isl)
			}
			pt := planner.DecodePoint{Concurrency: n, ISL: isl, OSL: c.osl, Context: ctxLen, KVUsage: float64(n) * ctxLen / float64(c.kvTokens),
				ITLms: float64(itl.Microseconds()) / 1000 / float64(gaps), TokensPerS: float64(tokens) / rep.Duration.Seconds()}
			p.Decode = append(p.Decode, pt)
			fmt.Fprintf(stderr, "plan profile: decode ISL %d, concurrency %d: ITL %.2f ms, %.0f tokens/s\n", isl, n, pt.ITLms, pt.TokensPerS)
		}
	}
	return p, p.Fit()
}

func writeProfile(c *profileConfig, p *planner.Profile) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "profile.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
	pre := [][]string{{"isl", "ttft_ms", "ttft_fit_ms", "tokens_per_s_per_gpu"}}
	ttft := plot.Series{Name: "measured"}
	for _, pt := range p.Prefill {
		pre = append(pre, []string{strconv.Itoa(pt.ISL), f(pt.TTFTms), f(p.TTFT(float64(pt.ISL))), f(p.PrefillThroughputPerGPU(float64(pt.ISL)))})
		ttft.X, ttft.Y = append(ttft.X, float64(pt.ISL)), append(ttft.Y, pt.TTFTms)
	}
	dec := [][]string{{"isl", "osl", "concurrency", "context", "kv_usage", "itl_ms", "itl_fit_ms", "tokens_per_s", "tokens_per_s_per_gpu"}}
	byContext := map[int]*plot.Series{}
	var order []int
	for _, pt := range p.Decode {
		dec = append(dec, []string{strconv.Itoa(pt.ISL), strconv.Itoa(pt.OSL), strconv.Itoa(pt.Concurrency), f(pt.Context), f(pt.KVUsage),
			f(pt.ITLms), f(p.ITL(pt.KVUsage, pt.Context)), f(pt.TokensPerS), f(pt.TokensPerS / float64(p.DecodeGPUs))})
		s := byContext[pt.ISL]
		if s == nil {
			s = &plot.Series{Name: fmt.Sprintf("ISL %d", pt.ISL)}
			byContext[pt.ISL] = s
			order = append(order, pt.ISL)
		}
		s.X, s.Y = append(s.X, pt.KVUsage), append(s.Y, pt.ITLms)
	}
	for name, rows := range map[string][][]string{"prefill.csv": pre, "decode.csv": dec} {
		fh, err := os.Create(filepath.Join(c.out, name))
		if err != nil {
			return err
		}
		w := csv.NewWriter(fh)
		_ = w.WriteAll(rows)
		if err := errors.Join(w.Error(), fh.Close()); err != nil {
			return err
		}
	}
	fit := plot.Series{Name: "quadratic fit"}
	for i := 0; i <= 50; i++ {
		x := float64(p.Prefill[0].ISL) + float64(i)/50*float64(p.Prefill[len(p.Prefill)-1].ISL-p.Prefill[0].ISL)
		fit.X, fit.Y = append(fit.X, x), append(fit.Y, p.TTFT(x))
	}
	if err := (plot.Chart{Title: "Prefill TTFT vs input sequence length", XLabel: "ISL (tokens)", YLabel: "TTFT (ms)",
		Series: []plot.Series{ttft, fit}}).SavePNG(filepath.Join(c.out, "prefill_ttft.png")); err != nil {
		return err
	}
	var series []plot.Series
	for _, isl := range order {
		series = append(series, *byContext[isl])
	}
	return plot.Chart{Title: "Decode ITL vs KV-cache use", XLabel: "active KV / KV cache", YLabel: "ITL (ms)",
		Series: series}.SavePNG(filepath.Join(c.out, "decode_itl.png"))
}

func printRecommendation(w io.Writer, c *profileConfig, p *planner.Profile) {
	r := p.Recommend(c.isl, c.osl, c.ttft, c.itl)
	if !r.TTFTMet {
		fmt.Fprintf(w, "No parallelism profiled meets the TTFT target %.2f ms at ISL %d (%.2f ms): try a smaller model, a larger --prefill-gpus engine, or a faster GPU\n", c.ttft, c.isl, r.TTFTms)
	}
	fmt.Fprintf(w, "Suggested prefill parallelism: %d GPUs (TTFT %.2f ms, throughput %.2f tokens/s/GPU)\n", p.PrefillGPUs, r.TTFTms, r.PrefillTokensPerGPU)
	fmt.Fprintf(w, "Suggested planner upper/lower bound for prefill queue size: %.2f/%.2f\n", r.PrefillQueueUp, r.PrefillQueueDown)
	if !r.ITLMet {
		fmt.Fprintf(w, "No load profiled meets the ITL target %.2f ms: try a smaller model, a larger --decode-gpus engine, or a faster GPU\n", c.itl)
	}
	fmt.Fprintf(w, "Suggested decode parallelism: %d GPUs (ITL %.2f ms, throughput %.2f tokens/s/GPU, at KV cache use %.2f)\n", p.DecodeGPUs, r.ITLms, r.DecodeTokensPerGPU, r.DecodeKV)
	fmt.Fprintf(w, "Suggested planner upper/lower bound for decode kv cache utilization: %.2f/%.2f\n", r.DecodeKVUp, r.DecodeKVDown)
	fmt.Fprintf(w, "Written: %s (profile.json, prefill.csv, decode.csv, prefill_ttft.png, decode_itl.png)\n", c.out)
}
