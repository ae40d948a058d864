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

// NATSStats count messages the NATS subscriber could not hand to an engine.
type NATSStats struct {
	UnknownWorker atomic.Int64 // subject names a worker the feed does not have
	BadMessages   atomic.Int64 // shorter than the 8-byte sequence number
}

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
func StartNATS(nc *nats.Conn, prefix string, f *Feed, stats *NATSStats) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		name := strings.TrimPrefix(m.Subject, prefix+".")
		e := f.Engine(name)
		switch {
		case e == nil:
			stats.UnknownWorker.Add(1)
		case len(m.Data) < 8:
			stats.BadMessages.Add(1)
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
