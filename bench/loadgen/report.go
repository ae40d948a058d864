package loadgen

import (
	"encoding/csv"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"dataplane/bench/plot"
	"dataplane/bench/synth"
)

// Summary is a run's result in numbers (latencies in ms).
type Summary struct {
	Requests, Completed, Failed, Skipped int
	TTFT, ITL, E2E                       synth.Summary
	OutputTokensPerS, RequestsPerS       float64
	CacheHit                             float64 // cached prompt tokens / prompt tokens (as engines report)
	ByClass                              []ClassSummary
}

// ClassSummary is the TTFT of one request class's completed requests (synth.Class).
type ClassSummary struct {
	Class     string
	Completed int
	TTFT      synth.Summary
}

// Summarize computes the summary of the completed requests.
func (r *Report) Summarize() Summary {
	s := Summary{Requests: len(r.Samples)}
	var ttft, itl, e2e []float64
	tokens, cached, prompt := 0, 0, 0
	perClass := map[string][]float64{}
	for i := range r.Samples {
		x := &r.Samples[i]
		switch {
		case x.Skipped:
			s.Skipped++
		case x.Err != "":
			s.Failed++
		default:
			s.Completed++
			ttft = append(ttft, ms(x.TTFT))
			perClass[x.Class] = append(perClass[x.Class], ms(x.TTFT))
			e2e = append(e2e, ms(x.E2E))
			for _, d := range x.ITL {
				itl = append(itl, ms(d))
			}
			tokens += x.OutputTokens
			cached += x.CachedTokens
			prompt += x.PromptTokens
		}
	}
	s.TTFT, s.ITL, s.E2E = synth.Summarize(ttft), synth.Summarize(itl), synth.Summarize(e2e)
	for _, c := range synth.Classes {
		if v := perClass[c]; len(v) > 0 {
			s.ByClass = append(s.ByClass, ClassSummary{Class: c, Completed: len(v), TTFT: synth.Summarize(v)})
		}
	}
	if sec := r.Duration.Seconds(); sec > 0 {
		s.OutputTokensPerS, s.RequestsPerS = float64(tokens)/sec, float64(s.Completed)/sec
	}
	if prompt > 0 {
		s.CacheHit = float64(cached) / float64(prompt)
	}
	return s
}

// String is the summary as a few aligned lines.
func (s Summary) String() string {
	line := func(name string, d synth.Summary) string {
		return fmt.Sprintf("%-5s p50 %9.1f  p90 %9.1f  p99 %9.1f  mean %9.1f ms\n", name, d.P50, d.P90, d.P99, d.Mean)
	}
	out := fmt.Sprintf("requests %d: %d completed, %d failed, %d skipped (in-flight limit)\n", s.Requests, s.Completed, s.Failed, s.Skipped) +
		line("TTFT", s.TTFT) + line("ITL", s.ITL) + line("E2E", s.E2E) +
		fmt.Sprintf("throughput %.1f req/s, %.0f output tokens/s; prefix cache hit %.3f\n", s.RequestsPerS, s.OutputTokensPerS, s.CacheHit)
	for _, c := range s.ByClass {
		out += fmt.Sprintf("TTFT %-9s p50 %9.1f  p99 %9.1f ms  (%d completed)\n", c.Class, c.TTFT.P50, c.TTFT.P99, c.Completed)
	}
	return out
}

func ms(d interface{ Nanoseconds() int64 }) float64 { return float64(d.Nanoseconds()) / 1e6 }

// WriteCSV writes one row per request.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"index", "class", "endpoint", "scheduled_ms", "sent_ms", "ttft_ms", "e2e_ms", "mean_itl_ms", "prompt_tokens", "output_tokens", "cached_tokens", "skipped", "error"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for i := range r.Samples {
		x := &r.Samples[i]
		itl := 0.0
		for _, d := range x.ITL {
			itl += ms(d)
		}
		if len(x.ITL) > 0 {
			itl /= float64(len(x.ITL))
		}
		_ = cw.Write([]string{strconv.Itoa(x.Index), x.Class, x.Endpoint, f(ms(x.Scheduled)), f(ms(x.Sent)), f(ms(x.TTFT)), f(ms(x.E2E)), f(itl),
			strconv.Itoa(x.PromptTokens), strconv.Itoa(x.OutputTokens), strconv.Itoa(x.CachedTokens), strconv.FormatBool(x.Skipped), x.Err})
	}
	cw.Flush()
	return cw.Error()
}

// WriteCharts writes ttft_cdf.png (TTFT and E2E distributions) and latency_over_time.png
// (each request's TTFT at its send time) into dir.
func (r *Report) WriteCharts(dir, title string) error {
	var ttft, e2e []float64
	over := plot.Series{Name: "TTFT"}
	for i := range r.Samples {
		x := &r.Samples[i]
		if x.Skipped || x.Err != "" {
			continue
		}
		ttft = append(ttft, ms(x.TTFT))
		e2e = append(e2e, ms(x.E2E))
		over.X = append(over.X, x.Sent.Seconds())
		over.Y = append(over.Y, ms(x.TTFT))
	}
	cdf := plot.Chart{Title: title + ": latency CDF", XLabel: "ms (log scale)", YLabel: "fraction of requests",
		Series: []plot.Series{plot.CDF("TTFT", ttft), plot.CDF("end to end", e2e)}, XScale: plot.Log10}
	if err := cdf.SavePNG(filepath.Join(dir, "ttft_cdf.png")); err != nil {
		return err
	}
	ot := plot.Chart{Title: title + ": time to first token over the run", XLabel: "s since start", YLabel: "TTFT ms",
		Series: []plot.Series{over}, Points: true}
	return ot.SavePNG(filepath.Join(dir, "latency_over_time.png"))
}
