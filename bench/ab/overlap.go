package ab

import (
	"math"
	"strconv"
	"time"

	"dataplane/bench/mocker"
	"dataplane/router"
)

// warmer sends prefix warm-ups (encode/prefill overlap): when a media request has been routed
// and waits for its encoder, its engine gets the prompt's text before the first item as a
// 1-token request, so by the time the features are ready that prefix is in the engine's prefix
// cache and the request prefills only the rest. Only a prefix of at least minTokens is worth a
// request, and only blocks the engine lacks (the router's overlap for it says which). The
// warm-up's output is discarded and the router does not track it as a request (its blocks
// reach the router through the engine's KV events, as any other's).
type warmer struct {
	prompts              []prompt
	fleet                *mocker.Fleet
	decision             *router.Decision // the decision that routed the request
	minTokens, blockSize int
	sent, short, cached  int
}

// maybe warms engine eng (named name) for request i at the loop's time now.
func (w *warmer) maybe(i, eng int, name string, now time.Duration) {
	p := &w.prompts[i]
	n := prefixTokens(p)
	blocks := n / w.blockSize // only full blocks are cached
	if n < w.minTokens || blocks == 0 {
		w.short++
		return
	}
	if sc := w.decision.Score(name); sc != nil && sc.Overlap >= blocks {
		w.cached++
		return
	}
	req := &mocker.Request{ID: "warm-" + strconv.Itoa(i), Tokens: p.tokens[:n], MaxTokens: 1, Sink: func(mocker.Output) {}}
	if w.fleet.SubmitAt(eng, req, now) == nil {
		w.sent++
	}
}

// prefixTokens is the length of a prompt's text before its first media item.
func prefixTokens(p *prompt) int {
	n := len(p.tokens)
	for _, m := range p.media {
		n = min(n, m.Offset)
	}
	return n
}

// PrefixBuckets bound the text-prefix lengths (tokens) media requests are reported by.
var PrefixBuckets = []int{1024, 4096, 16384}

// PrefixTTFT is the TTFT of media requests whose text before the first item falls in
// [Min, Max) tokens (Max 0: no bound).
type PrefixTTFT struct {
	Min, Max int
	Requests int
	TTFT     Latency
}

func byPrefix(prompts []prompt, ttft []float64) []PrefixTTFT {
	out := make([]PrefixTTFT, len(PrefixBuckets)+1)
	per := make([][]float64, len(out))
	for b := range out {
		if b > 0 {
			out[b].Min = PrefixBuckets[b-1]
		}
		if b < len(PrefixBuckets) {
			out[b].Max = PrefixBuckets[b]
		}
	}
	for i := range prompts {
		if len(prompts[i].media) == 0 {
			continue
		}
		n, b := prefixTokens(&prompts[i]), 0
		for b < len(PrefixBuckets) && n >= PrefixBuckets[b] {
			b++
		}
		out[b].Requests++
		if !math.IsNaN(ttft[i]) {
			per[b] = append(per[b], ttft[i])
		}
	}
	var res []PrefixTTFT
	for b := range out {
		if out[b].Requests > 0 {
			out[b].TTFT = summarize(per[b])
			res = append(res, out[b])
		}
	}
	return res
}
