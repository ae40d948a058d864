package router

import (
	"fmt"
	"math"
)

// Joint routing: where a request's media are encoded and which LLM worker prefills it, chosen
// together by predicted time to first token (the seed's model):
//
//	TTFT(encoder e, worker w) = max(ready(e), backlog(w)) + uncached prefill(w) + hand-off(w)
//	ready(e)                  = queue(e) + encode(e) + return(e)
//
// queue and encode are the encoder's work ahead and this request's items at its calibrated
// cost; return is the features' move from e to the daemon that merges them (link latency +
// bytes / bandwidth, by topology); hand-off is Request.Transfer, the merged prompt's move to w.
// Every pair is a candidate. Because the features come back to the merging daemon, e enters the
// cost only through ready(e), and max(ready − backlog, 0) never falls as ready grows: the pair
// with the lowest cost always has the encoder with the earliest ready time, whatever the worker.
// So the router picks that encoder once (ties: the earlier option, the caller lists the local
// encoder first) and scores the workers with its ready time, which is the pairs' minimum for
// every worker; the decision lists every encoder's terms (Decision.Encoders).

// MaxEncoderOptions bounds a request's encoder candidates (the caller keeps the best few).
const MaxEncoderOptions = 64

// EncoderOption is one place the request's media can be encoded, its terms in blocks of
// prefill time (Router.BlocksIn).
type EncoderOption struct {
	Name     string  `json:"encoder"`
	Link     string  `json:"link,omitempty"` // the link the features cross back: "local", or the topology level where the two differ
	Queue    float64 `json:"queue_blocks"`   // work ahead of this request there
	Encode   float64 `json:"encode_blocks"`  // this request's items there
	Return   float64 `json:"return_blocks"`  // the features' move back
	Ready    float64 `json:"ready_blocks"`   // Queue + Encode + Return (the router sets it)
	Chosen   bool    `json:"chosen,omitempty"`
	Excluded string  `json:"excluded,omitempty"` // why not a candidate (a bad term)
}

// ErrNoEncoder means none of a request's encoder options could be used.
type ErrNoEncoder struct{ Options int }

func (e *ErrNoEncoder) Error() string {
	return fmt.Sprintf("no usable encoder among %d options", e.Options)
}

// chooseEncoder fills in each option's ready time in d.Encoders (reusing its slice), marks the
// earliest, names it in d.Encoder and returns its ready time. With no options it returns
// req.ReadyIn and clears both.
func (r *Router) chooseEncoder(req Request, d *Decision) (float64, error) {
	d.Encoder, d.Encoders = "", d.Encoders[:0]
	if len(req.Encoders) == 0 {
		return req.ReadyIn, nil
	}
	if len(req.Encoders) > MaxEncoderOptions {
		return 0, fmt.Errorf("router: %d encoder options, at most %d", len(req.Encoders), MaxEncoderOptions)
	}
	d.Encoders = append(d.Encoders, req.Encoders...)
	best := -1
	for i := range d.Encoders {
		e := &d.Encoders[i]
		e.Chosen, e.Excluded = false, ""
		e.Ready = e.Queue + e.Encode + e.Return
		if !(e.Queue >= 0 && e.Encode >= 0 && e.Return >= 0) || math.IsInf(e.Ready, 0) {
			e.Excluded = "a term is negative, infinite or not a number"
			continue
		}
		if best < 0 || e.Ready < d.Encoders[best].Ready {
			best = i
		}
	}
	if best < 0 {
		return 0, &ErrNoEncoder{Options: len(d.Encoders)}
	}
	d.Encoders[best].Chosen = true
	d.Encoder = d.Encoders[best].Name
	return d.Encoders[best].Ready, nil
}
