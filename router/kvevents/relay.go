package kvevents

import (
	"sync/atomic"
)

// Relay forwards one vLLM publisher's batches (one data-parallel rank) to the KV-event stream
// in the engine's own numbering: it is a Sink for SubscribeZMQTo that fills a gap from the
// engine's replay socket before it forwards the batch after it, and drops repeats, so the
// stream holds the engine's history with no holes the engine could have filled, and every
// router replica applies it with the Engine's rules (a step back is a restart, a hole left is
// an unrecoverable gap). `dataplane relay` runs one per engine.
type Relay struct {
	publish func(seq uint64, payload []byte) error
	haveSeq bool
	last    uint64
	Stats   RelayStats
}

// RelayStats count what a Relay forwarded and what it found in the engine's stream.
type RelayStats struct {
	Forwarded      atomic.Int64 // batches published (live and replayed)
	Replayed       atomic.Int64 // of which from the engine's replay socket
	Duplicates     atomic.Int64 // the same seq again: dropped
	Gaps           atomic.Int64 // jumps ahead
	Unrecoverable  atomic.Int64 // gaps the replay could not fill: the stream has a hole there
	Restarts       atomic.Int64 // steps back: the engine restarted
	PublishErrors  atomic.Int64 // batches the connection refused (closed, or over the server's max payload)
	ReplayFailures atomic.Int64
}

// NewRelay forwards through publish. When the stream already has the worker's batches up to
// last (a relay that restarted while its engine ran on), have is true and forwarding resumes
// after last, replaying what the engine published meanwhile; otherwise the first batch replays
// what the engine still buffers from 0.
func NewRelay(publish func(seq uint64, payload []byte) error, last uint64, have bool) *Relay {
	return &Relay{publish: publish, last: last, haveSeq: have}
}

// Live handles the engine's next batch (Sink).
func (r *Relay) Live(seq uint64, payload []byte, replay Replayer) {
	switch {
	case r.haveSeq && seq == r.last+1:
	case r.haveSeq && seq == r.last:
		r.Stats.Duplicates.Add(1)
		return
	case r.haveSeq && seq < r.last:
		r.Stats.Restarts.Add(1)
		r.haveSeq = false
		r.catchUp(0, seq, replay)
	case r.haveSeq:
		r.Stats.Gaps.Add(1)
		r.catchUp(r.last+1, seq, replay)
		if r.last+1 != seq {
			r.Stats.Unrecoverable.Add(1)
		}
	default:
		if seq > 0 {
			r.catchUp(0, seq, replay)
		}
	}
	r.forward(seq, payload)
}

// Resume forwards what the engine still buffers after what was forwarded (from 0 when
// nothing was): call it once before the subscription starts, so a relay that starts or
// restarts while its engine is quiet does not wait for the engine's next batch to catch up.
// Batches published before the subscription is up are found as a gap at the next one.
func (r *Relay) Resume(replay Replayer) {
	from := uint64(0)
	if r.haveSeq {
		from = r.last + 1
	}
	r.catchUp(from, ^uint64(0), replay)
}

// catchUp forwards the replayed batches from..upTo-1 that follow on from what was forwarded
// (with nothing forwarded yet, from the first the engine still has).
func (r *Relay) catchUp(from, upTo uint64, replay Replayer) {
	if replay == nil {
		return
	}
	broken := false
	err := replay(from, func(seq uint64, payload []byte) {
		switch {
		case broken || seq >= upTo || (r.haveSeq && seq <= r.last):
		case r.haveSeq && seq != r.last+1:
			broken = true
		default:
			r.Stats.Replayed.Add(1)
			r.forward(seq, payload)
		}
	})
	if err != nil {
		r.Stats.ReplayFailures.Add(1)
	}
}

func (r *Relay) forward(seq uint64, payload []byte) {
	r.haveSeq, r.last = true, seq
	if err := r.publish(seq, payload); err != nil {
		r.Stats.PublishErrors.Add(1)
		return
	}
	r.Stats.Forwarded.Add(1)
}
