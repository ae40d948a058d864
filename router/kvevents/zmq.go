package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
)

// vLLM's ZMQ transport: a SUB socket on the publisher's PUB endpoint receives
// [topic, seq u64 big-endian, msgpack batch]; a DEALER on its ROUTER endpoint asks for
// buffered batches with [empty, start seq] and gets [empty, (topic,) seq, payload] back, then an
// end marker with seq -1 (eight 0xff bytes).

// ZMQOptions configure one subscription. DefaultZMQOptions has the defaults.
type ZMQOptions struct {
	Endpoint      string        // the publisher's PUB endpoint, e.g. tcp://10.0.0.5:5557
	Replay        string        // its ROUTER endpoint, e.g. tcp://10.0.0.5:5558; "" if it has none
	LiveBuffer    int           // live batches held while a replay runs; default 10,000
	ReplayTimeout time.Duration // the longest a replay may take; default 10s
	RedialEvery   time.Duration // how often a lost connection is redialled; default 1s
	Log           *slog.Logger  // the first message that is not [topic, seq, payload] is logged here; nil: none
}

// DefaultZMQOptions fills the defaults around an endpoint.
func DefaultZMQOptions(endpoint, replay string) ZMQOptions {
	return ZMQOptions{Endpoint: endpoint, Replay: replay, LiveBuffer: 10_000,
		ReplayTimeout: 10 * time.Second, RedialEvery: time.Second}
}

// endSeq is vLLM's end-of-replay marker: seq -1 as 8 big-endian bytes.
const endSeq = ^uint64(0)

// ErrBadFrames reports a ZMQ message that is not a vLLM event message.
type ErrBadFrames struct{ Frames int }

func (e *ErrBadFrames) Error() string {
	return fmt.Sprintf("zmq message with %d frames, want [topic, seq, payload]", e.Frames)
}

// SubscribeZMQ receives one publisher's batches until ctx ends and hands each to the engine of
// its data-parallel rank (engineFor is called once per rank seen, from this goroutine). A
// receiving goroutine keeps reading while the engine replays, up to LiveBuffer batches; past
// that the socket's own bounded queue and then the publisher's high-water mark hold or drop
// them (a drop shows up as a gap). It returns ctx.Err() when ctx ends, or the first error
// dialling or from engineFor.
func SubscribeZMQ(ctx context.Context, opts ZMQOptions, stats *Stats, engineFor func(rank int) (*Engine, error)) error {
	return SubscribeZMQTo(ctx, opts, stats, func(rank int) (Sink, error) { return engineFor(rank) })
}

// Sink takes one publisher's batches in the order they come, as Engine.Live does (a Relay
// forwards them instead of indexing them).
type Sink interface {
	Live(seq uint64, payload []byte, replay Replayer)
}

// SubscribeZMQTo is SubscribeZMQ for any Sink: sinkFor is called once per rank seen.
func SubscribeZMQTo(ctx context.Context, opts ZMQOptions, stats *Stats, sinkFor func(rank int) (Sink, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(opts.RedialEvery), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.Dial(opts.Endpoint); err != nil {
		return fmt.Errorf("zmq dial %s: %w", opts.Endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fmt.Errorf("zmq subscribe %s: %w", opts.Endpoint, err)
	}
	live := make(chan zmq4.Msg, max(opts.LiveBuffer, 1))
	go func() {
		defer close(live)
		for {
			m, err := sub.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(opts.RedialEvery / 10) // a dropped connection: the socket redials
				continue
			}
			select {
			case live <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	var replay Replayer
	if opts.Replay != "" {
		replay = func(from uint64, deliver func(uint64, []byte)) error {
			return ReplayZMQ(ctx, opts.Replay, opts.ReplayTimeout, from, deliver)
		}
	}
	engines := map[int]Sink{}
	badFrames := 0
	for m := range live {
		seq, payload, err := parseEventFrames(m.Frames, false)
		if err != nil {
			stats.BadMessages.Add(1)
			if badFrames++; badFrames == 1 && opts.Log != nil {
				opts.Log.Warn("kv events dropped (logged once per subscription; kv_events_total counts them all)",
					"endpoint", opts.Endpoint, "reason", reasonNames[reasonBadMessage], "error", err)
			}
			continue
		}
		rank := peekDPRank(payload)
		e := engines[rank]
		if e == nil {
			if e, err = sinkFor(rank); err != nil {
				return err
			}
			engines[rank] = e
		}
		e.Live(seq, payload, replay)
	}
	return ctx.Err()
}

// parseEventFrames takes [topic, seq, payload] (or, from a replay, [empty, (topic,) seq,
// payload]) apart.
func parseEventFrames(frames [][]byte, fromReplay bool) (uint64, []byte, error) {
	if fromReplay && len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:] // the DEALER sees ROUTER's empty delimiter
	}
	if len(frames) == 3 {
		frames = frames[1:] // the topic
	}
	if len(frames) != 2 {
		return 0, nil, &ErrBadFrames{Frames: len(frames)}
	}
	seq, ok := be64(frames[0])
	if !ok {
		return 0, nil, &ErrBadFrames{Frames: len(frames)}
	}
	return seq, frames[1], nil
}

// ReplayZMQ asks a vLLM publisher's ROUTER endpoint for its buffered batches from seq `from`
// on, and hands each to deliver until the end marker.
func ReplayZMQ(ctx context.Context, endpoint string, timeout time.Duration, from uint64, deliver func(uint64, []byte)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(int(timeout/(50*time.Millisecond))+1))
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		return fmt.Errorf("zmq replay dial %s: %w", endpoint, err)
	}
	start := binary.BigEndian.AppendUint64(nil, from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return fmt.Errorf("zmq replay request to %s: %w", endpoint, err)
	}
	for {
		m, err := d.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("zmq replay from %s: %w", endpoint, ctx.Err())
			}
			return fmt.Errorf("zmq replay from %s: %w", endpoint, err)
		}
		seq, payload, err := parseEventFrames(m.Frames, true)
		if err != nil {
			var bad *ErrBadFrames
			if errors.As(err, &bad) {
				continue // not an event message: ignore it, as the live path does
			}
			return err
		}
		if seq == endSeq {
			return nil
		}
		deliver(seq, payload)
	}
}

// peekDPRank reads a batch's data_parallel_rank without decoding its events; 0 when absent or
// unreadable (the engine then reports the payload as bad).
func peekDPRank(payload []byte) int {
	r := &mpReader{b: payload}
	isMap := r.kind() == mpMap
	n, err := r.readLen(isMap)
	if err != nil {
		return 0
	}
	for i := range n {
		key := ""
		if isMap {
			k, err := r.readStr()
			if err != nil {
				return 0
			}
			key = string(k)
		}
		if (!isMap && i == 2) || key == "data_parallel_rank" {
			if r.readNil() {
				return 0
			}
			v, err := r.readSmallInt(0, 1<<20, "data_parallel_rank")
			if err != nil {
				return 0
			}
			return int(v)
		}
		if r.skip() != nil {
			return 0
		}
	}
	return 0
}
