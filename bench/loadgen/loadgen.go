// Package loadgen replays a trace open-loop against OpenAI-compatible completion endpoints
// (mock engines, vLLM, or the daemon) and measures every request: time to first token,
// inter-token latencies, end-to-end latency. Requests go out at their trace times whatever
// happens to earlier ones; a bound on requests in flight turns overload into counted skips,
// never into a slower send rate.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/bench/synth"
)

// Options configure a run. DefaultOptions has the defaults.
type Options struct {
	Endpoints   []string      // base URLs (http://host:port or http://host:port/engines/3); requests go round-robin
	Model       string        // the "model" field; "" leaves it out
	BlockSize   int           // tokens per trace hash id; 512 (Mooncake)
	Vocab       int           // prompt token ids are drawn below this; 32,000
	Speedup     float64       // trace time runs this much faster; 1
	MaxInFlight int           // requests in flight at once; beyond, a request is skipped; 1,024
	Timeout     time.Duration // per request; 5m
	Progress    io.Writer     // a progress line, rewritten in place; nil: none
	// Route picks each request's engine in RunInProcess (nil: request i goes to engine i mod N).
	Route Picker
	// Routers, instead of Endpoints: standalone routers' base URLs (`dataplane router`), asked
	// round-robin where each request goes (routed.go); the worker's endpoint comes from the
	// router's fleet, and the router hears the request's first token and end.
	Routers []string

	onToken func() // send's: called at the first token (routed runs)
}

// DefaultOptions are the defaults above (no endpoints).
func DefaultOptions() Options {
	return Options{BlockSize: 512, Vocab: 32000, Speedup: 1, MaxInFlight: 1024, Timeout: 5 * time.Minute}
}

// Sample is one request's measurements (times from the start of the run).
type Sample struct {
	Index        int
	Class        string // synth.Class of its record
	Endpoint     string
	Scheduled    time.Duration // its trace time, scaled
	Sent         time.Duration
	TTFT, E2E    time.Duration // from Sent
	ITL          []time.Duration
	PromptTokens int // as the trace says
	OutputTokens int // tokens received
	CachedTokens int // as the engine's usage says
	Err          string
	Skipped      bool // not sent: MaxInFlight reached
}

// Report is a run's samples and summaries.
type Report struct {
	Samples  []Sample
	Duration time.Duration
}

// ErrOptions names an unusable option.
type ErrOptions struct{ Field, Problem string }

func (e *ErrOptions) Error() string { return "loadgen: " + e.Field + " " + e.Problem }

// Run replays recs. It returns when every sent request has finished (or ctx ends: requests in
// flight are cancelled and recorded with the error).
func Run(ctx context.Context, recs []synth.Record, opts Options) (*Report, error) {
	switch {
	case len(opts.Endpoints) == 0 && len(opts.Routers) == 0:
		return nil, &ErrOptions{"Endpoints", "none given (nor Routers)"}
	case len(opts.Endpoints) > 0 && len(opts.Routers) > 0:
		return nil, &ErrOptions{"Routers", "given with Endpoints: one or the other"}
	case !(opts.Speedup > 0):
		return nil, &ErrOptions{"Speedup", fmt.Sprintf("%v: must be positive", opts.Speedup)}
	case opts.MaxInFlight <= 0:
		return nil, &ErrOptions{"MaxInFlight", fmt.Sprintf("%d: must be positive", opts.MaxInFlight)}
	}
	for _, list := range []struct {
		name string
		urls []string
	}{{"Endpoints", opts.Endpoints}, {"Routers", opts.Routers}} {
		for i, ep := range list.urls {
			if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
				return nil, &ErrOptions{list.name, fmt.Sprintf("%d: %q is not an http(s) URL", i, ep)}
			}
			list.urls[i] = strings.TrimRight(ep, "/")
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = opts.MaxInFlight
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	var rt *routed
	if len(opts.Routers) > 0 {
		rt = newRouted(client, opts.Routers, strconv.FormatInt(time.Now().UnixNano(), 36))
	}
	rep := &Report{Samples: make([]Sample, len(recs))}
	sem := make(chan struct{}, opts.MaxInFlight)
	var wg sync.WaitGroup
	var done, failed atomic.Int64
	start := time.Now()
	prog := newProgress(opts.Progress, len(recs))
	stopProgress := prog.run(start, &done, &failed, func() int { return len(sem) })
	var t0 float64
	if len(recs) > 0 {
		t0 = recs[0].Timestamp
	}
	for i := range recs {
		s := &rep.Samples[i]
		s.Index = i
		if rt == nil {
			s.Endpoint = opts.Endpoints[i%len(opts.Endpoints)]
		}
		s.PromptTokens, s.Class = recs[i].InputLength, synth.Class(&recs[i])
		if !s.waitTurn(ctx, start, recs[i].Timestamp-t0, opts.Speedup) {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			s.Skipped = true
			done.Add(1)
			continue
		}
		s.Sent = time.Since(start)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			send(ctx, client, &recs[i], s, opts, rt)
			if s.Err != "" {
				failed.Add(1)
			}
			done.Add(1)
		}()
	}
	wg.Wait()
	stopProgress()
	rep.Duration = time.Since(start)
	return rep, nil
}

// waitTurn sets the sample's scheduled time (trace ms since the first request, ÷ speedup) and
// sleeps until then; false (with the error recorded) if ctx ended.
func (s *Sample) waitTurn(ctx context.Context, start time.Time, traceMS, speedup float64) bool {
	s.Scheduled = time.Duration(traceMS / speedup * float64(time.Millisecond))
	if wait := s.Scheduled - time.Since(start); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		s.Err = ctx.Err().Error()
		return false
	}
	return true
}

// send runs one streamed completion and fills s; with routers (rt), asks one first and tells it
// about the request's first token and end.
func send(ctx context.Context, client *http.Client, rec *synth.Record, s *Sample, opts Options, rt *routed) {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	toks, spans := synth.PromptTokens(rec, opts.BlockSize, opts.Vocab)
	sent := time.Now() // TTFT counts a disaggregated request's prefill step
	var prefillEP, router, id string
	if rt != nil {
		var ep string
		var err error
		router, ep, prefillEP, id, err = rt.route(ctx, s.Index, toks, spans)
		if err != nil {
			s.Err = "route: " + err.Error()
			return
		}
		s.Endpoint = ep
		var told sync.WaitGroup // the first-token report, off the stream's path
		defer func() {
			told.Wait()
			if s.Err != "" {
				rt.lifecycle(router, id, "cancel")
			} else {
				rt.lifecycle(router, id, "finish")
			}
		}()
		opts.onToken = func() {
			told.Add(1)
			go func() { defer told.Done(); rt.lifecycle(router, id, "first_token") }()
		}
	}
	body := map[string]any{"prompt": toks, "max_tokens": max(rec.OutputLength, 1), "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true}
	if opts.Model != "" {
		body["model"] = opts.Model
	}
	if len(spans) > 0 {
		var media []map[string]any
		for _, m := range spans {
			media = append(media, map[string]any{"start": m.Start, "end": m.End, "id": m.ID})
		}
		body["media"] = media
	}
	if prefillEP != "" {
		kv, err := rt.prefillStep(ctx, router, prefillEP, body)
		if err != nil {
			s.Err = err.Error()
			return
		}
		rt.lifecycle(router, id, "prefill_done")
		body["kv_transfer_params"] = kv
	}
	raw, err := json.Marshal(body)
	if err != nil {
		s.Err = err.Error()
		return
	}
	post := func(ep string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep+"/v1/completions", bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return client.Do(req)
	}
	if prefillEP == "" {
		sent = time.Now()
	}
	resp, err := post(s.Endpoint)
	if rt != nil {
		if fresh, ok := rt.stale(ctx, router, s.Endpoint, err); ok { // a worker name the fleet reused
			s.Endpoint = fresh
			resp, err = post(fresh)
		}
	}
	if err != nil {
		s.Err = err.Error()
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.Err = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	last := sent
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			s.E2E = time.Since(sent)
			return
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			s.Err = "bad chunk: " + err.Error()
			return
		}
		if c.Error != nil {
			s.Err = c.Error.Message
			return
		}
		if c.Usage != nil && c.Usage.PromptTokensDetails != nil {
			s.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
		}
		for _, ch := range c.Choices {
			if ch.Text == "" {
				continue
			}
			now := time.Now()
			if s.OutputTokens == 0 {
				s.TTFT = now.Sub(sent)
				if opts.onToken != nil {
					opts.onToken()
				}
			} else {
				s.ITL = append(s.ITL, now.Sub(last))
			}
			last = now
			s.OutputTokens++
		}
	}
	if err := sc.Err(); err != nil {
		s.Err = err.Error()
	} else {
		s.Err = "stream ended without [DONE]"
	}
}

// progress prints "loadgen [====      ] 120/2000  3 failed  15 in flight  3.2 req/s".
type progress struct {
	w     io.Writer
	total int
}

func newProgress(w io.Writer, total int) *progress { return &progress{w: w, total: total} }

// run redraws the line every 200 ms until the returned stop is called.
func (p *progress) run(start time.Time, done, failed *atomic.Int64, inFlight func() int) (stop func()) {
	if p.w == nil || p.total == 0 {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	draw := func() {
		n := int(done.Load())
		const width = 30
		bar := strings.Repeat("=", width*n/p.total) + strings.Repeat(" ", width-width*n/p.total)
		fmt.Fprintf(p.w, "\rloadgen [%s] %d/%d  %d failed  %d in flight  %.1f req/s ", bar, n, p.total, failed.Load(), inFlight(),
			float64(n)/time.Since(start).Seconds())
	}
	go func() {
		defer close(finished)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				draw()
			case <-quit:
				draw()
				fmt.Fprintln(p.w)
				return
			}
		}
	}()
	return func() { close(quit); <-finished }
}
