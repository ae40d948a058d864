package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// KV events from our own engines over NATS. The format (documented in README.md):
//
//	subject  <prefix>.<worker>          default prefix "dataplane.kv"; <worker> is one NATS token
//	payload  seq (8 bytes, big-endian) ‖ a vLLM KV-event batch in msgpack (either layout)
//
// seq counts the engine's batches from 0 and starts again at 0 when it restarts, exactly as
// vLLM's ZMQ publisher does, so the same Engine logic applies: duplicates are ignored, a step
// back drops the worker's state. Core NATS keeps no history, so a gap cannot be replayed: the
// worker's state is dropped and rebuilt from the next batches (DESIGN.md: correctness before hit
// rate). The server is the caller's: `dataplane router --nats embedded` runs one in-process.

// DefaultNATSPrefix is the subject prefix our engines publish on.
const DefaultNATSPrefix = "dataplane.kv"

// NATSStats count messages the NATS subscriber could not hand to an engine: the subscription's
// own counts (the feed's Stats count them too, for its metrics: unknown_worker, bad_message).
type NATSStats struct {
	UnknownWorker atomic.Int64 // subject names a worker the feed does not have
	BadMessages   atomic.Int64 // shorter than the 8-byte sequence number
}

// maxLoggedNames bounds the unknown worker names a NATS subscription logs (once each): subjects
// come from anyone who can publish, so the set of names seen is not bounded.
const maxLoggedNames = 64

// NATSMessage builds a message payload: seq then the msgpack batch.
func NATSMessage(seq uint64, batch []byte) []byte {
	out := make([]byte, 8, 8+len(batch))
	for i := range 8 {
		out[i] = byte(seq >> (56 - 8*i))
	}
	return append(out, batch...)
}

// SubscribeNATS feeds f's workers from <prefix>.<worker> until ctx ends (StartNATS, then a
// drain when ctx ends).
func SubscribeNATS(ctx context.Context, nc *nats.Conn, prefix string, f *Feed, stats *NATSStats) error {
	sub, err := StartNATS(nc, prefix, f, stats)
	if err != nil {
		return err
	}
	<-ctx.Done()
	// Drain lets the handler finish what is queued; Unsubscribe would drop it.
	if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return err
	}
	return ctx.Err()
}

// StartNATS subscribes f's workers to <prefix>.<worker> and returns once the server has the
// subscription, so nothing published afterwards is missed; Drain the subscription to stop.
// Messages are handled one at a time on the subscription's goroutine (so each worker's batches
// stay in order); the client's pending limits bound what waits, and an overflow shows up as a
// sequence gap.
//
// A message for a worker the feed does not have is counted (stats, and the feed's
// unknown_worker) and its name logged once, for the first maxLoggedNames names; a message too
// short to hold a batch is counted (bad_message) and logged once per worker. stats may be nil.
func StartNATS(nc *nats.Conn, prefix string, f *Feed, stats *NATSStats) (*nats.Subscription, error) {
	if stats == nil {
		stats = &NATSStats{}
	}
	logged := map[string]bool{} // names logged; the handler runs on one goroutine at a time
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		name := strings.TrimPrefix(m.Subject, prefix+".")
		e := f.Engine(name)
		switch {
		case e == nil:
			stats.UnknownWorker.Add(1)
			f.stats.UnknownWorkers.Add(1)
			if log := f.opts.Log; log != nil && !logged[name] && len(logged) <= maxLoggedNames {
				logged[name] = true
				if len(logged) > maxLoggedNames {
					log.Warn("kv events dropped: more unknown worker names, not logged", "reason", reasonNames[reasonUnknownWorker],
						"names_logged", maxLoggedNames)
				} else {
					log.Warn("kv events dropped: no worker of that name (logged once per name; kv_events_total counts them all)",
						"reason", reasonNames[reasonUnknownWorker], "subject", m.Subject[:min(len(m.Subject), 256)])
				}
			}
		case len(m.Data) < 8:
			stats.BadMessages.Add(1)
			if e.drop(reasonBadMessage, 1) {
				e.logDrop(reasonBadMessage, "subject", m.Subject, "bytes", len(m.Data))
			}
		default:
			seq, _ := be64(m.Data[:8])
			e.Live(seq, m.Data[8:], nil)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("nats subscribe %s.>: %w", prefix, err)
	}
	if err := nc.Flush(); err != nil { // the server has the subscription when this returns
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("nats subscribe %s.>: %w", prefix, err)
	}
	return sub, nil
}
