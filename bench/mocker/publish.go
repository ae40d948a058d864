package mocker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"

	"dataplane/router/kvevents"
)

// ZMQOptions configure a vLLM-style publisher. DefaultZMQOptions has the defaults.
type ZMQOptions struct {
	Endpoint string // the PUB socket's bind address, e.g. tcp://127.0.0.1:5557 (port 0: any)
	Replay   string // the ROUTER replay socket's bind address; "" for none
	Topic    string // the first frame of every message; "" (vLLM's default)
	Buffer   int    // batches kept for replay; 10,000 (vLLM's)
	HWM      int    // batches queued for sending before new ones are dropped; 100,000 (vLLM's)
}

// DefaultZMQOptions fills the defaults around the two bind addresses.
func DefaultZMQOptions(endpoint, replay string) ZMQOptions {
	return ZMQOptions{Endpoint: endpoint, Replay: replay, Buffer: 10_000, HWM: 100_000}
}

// ZMQPublisher publishes one engine's batches as vLLM's ZmqEventPublisher does: PUB frames
// [topic, seq u64 big-endian, payload], sent by a goroutine from a bounded queue (dropped, and
// counted, past the high-water mark), and the last Buffer batches served on a ROUTER socket to
// DEALER clients asking [empty, start seq]: every buffered batch from start on as
// [empty, seq, payload], then the end marker (seq −1, empty payload).
type ZMQPublisher struct {
	opts   ZMQOptions
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	queue  chan zmq4.Msg
	wg     sync.WaitGroup

	mu   sync.Mutex
	ring []buffered // replay buffer, oldest first (a ring of Buffer entries)
	head int

	Dropped atomic.Int64 // batches dropped at the high-water mark
}

type buffered struct {
	seq     []byte
	payload []byte
}

// NewZMQPublisher binds the sockets. Close releases them.
func NewZMQPublisher(opts ZMQOptions) (*ZMQPublisher, error) {
	if opts.Buffer <= 0 || opts.HWM <= 0 {
		return nil, &ErrOptions{"ZMQOptions", fmt.Sprintf("buffer %d and HWM %d must be positive", opts.Buffer, opts.HWM)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &ZMQPublisher{opts: opts, cancel: cancel, pub: zmq4.NewPub(ctx), queue: make(chan zmq4.Msg, opts.HWM)}
	if err := p.pub.Listen(opts.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kv events: listen %s: %w", opts.Endpoint, err)
	}
	if opts.Replay != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("mocker")))
		if err := p.router.Listen(opts.Replay); err != nil {
			cancel()
			p.pub.Close()
			p.router.Close()
			return nil, fmt.Errorf("kv events: listen %s: %w", opts.Replay, err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	p.wg.Add(1)
	go p.send()
	return p, nil
}

// Endpoints are the bound addresses (tcp://host:port), for subscribers.
func (p *ZMQPublisher) Endpoints() (pub, replay string) {
	pub = "tcp://" + p.pub.Addr().String()
	if p.router != nil {
		replay = "tcp://" + p.router.Addr().String()
	}
	return pub, replay
}

// Publish queues one batch and keeps it for replay.
func (p *ZMQPublisher) Publish(_ string, seq uint64, payload []byte) {
	s := p.keep(seq, payload)
	select {
	case p.queue <- zmq4.NewMsgFrom([]byte(p.opts.Topic), s, payload):
	default:
		p.Dropped.Add(1)
	}
}

// keep puts a batch in the replay buffer and returns its encoded sequence number.
func (p *ZMQPublisher) keep(seq uint64, payload []byte) []byte {
	s := binary.BigEndian.AppendUint64(nil, seq)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ring) < p.opts.Buffer {
		p.ring = append(p.ring, buffered{s, payload})
	} else {
		p.ring[p.head] = buffered{s, payload}
		p.head = (p.head + 1) % len(p.ring)
	}
	return s
}

func (p *ZMQPublisher) send() {
	defer p.wg.Done()
	for m := range p.queue {
		_ = p.pub.Send(m) // a subscriber's broken connection is the socket's business
	}
}

func (p *ZMQPublisher) serveReplay() {
	defer p.wg.Done()
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for {
		m, err := p.router.Recv()
		if err != nil {
			return // closed
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue // not [id, empty, start]
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		p.mu.Lock()
		batches := make([]buffered, 0, len(p.ring))
		batches = append(append(batches, p.ring[p.head:]...), p.ring[:p.head]...)
		p.mu.Unlock()
		for _, b := range batches {
			if binary.BigEndian.Uint64(b.seq) >= start {
				if p.router.Send(zmq4.NewMsgFrom(id, []byte{}, b.seq, b.payload)) != nil {
					break
				}
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

// Close stops sending (what is queued is dropped) and closes the sockets. Call it after the
// engine stopped publishing (its loop returned).
func (p *ZMQPublisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
	close(p.queue)
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil // a subscriber's connection that went first (zmq4 reports closing it again)
	}
	return err
}

// NATSPublisher publishes every engine's batches on NATS as the router expects them: subject
// <prefix>.<worker>, payload seq (8 bytes big-endian) ‖ batch. One connection serves a fleet;
// the client buffers and flushes in the background.
type NATSPublisher struct {
	nc     *nats.Conn
	prefix string
	Errors atomic.Int64
}

// NewNATSPublisher publishes on nc under prefix ("" : kvevents.DefaultNATSPrefix).
func NewNATSPublisher(nc *nats.Conn, prefix string) *NATSPublisher {
	if prefix == "" {
		prefix = kvevents.DefaultNATSPrefix
	}
	return &NATSPublisher{nc: nc, prefix: prefix}
}

func (p *NATSPublisher) Publish(worker string, seq uint64, payload []byte) {
	if p.nc.Publish(p.prefix+"."+worker, kvevents.NATSMessage(seq, payload)) != nil {
		p.Errors.Add(1)
	}
}
