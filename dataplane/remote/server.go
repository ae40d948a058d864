package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/memory"
	"dataplane/transfer/wire"

	"github.com/prometheus/client_golang/prometheus"
)

// Backend is what a Server needs of its daemon: check an item against the encoders it runs
// (the input size each of its frames must have), and encode it — through its feature store, so
// an item already cached there is not encoded again — returning the features' bytes, which stay
// valid until release.
type Backend interface {
	InputFloats(it Item, frames int) (int, error)
	Encode(ctx context.Context, it Item, inputs []encoder.Input) (features []byte, release func(), err error)
}

// ServerOptions configure a Server. Zero fields take the defaults.
type ServerOptions struct {
	// MaxInputBytes bounds the inputs held at once over every connection (a 30-frame video at
	// 336 × 336 is 40 MiB); a frame that would pass it waits. 512 MiB.
	MaxInputBytes int64
	// Budget, when given, is the daemon's request memory budget: the inputs are reserved on it
	// too, as a request's own are, so peers' items share the process's plan instead of adding
	// up to MaxInputBytes beside it. A refusal is answered as the window's is (the requester
	// encodes elsewhere).
	Budget *memory.Budget
	// MaxWait bounds an item's encode when its requester gives no time left. 60 s.
	MaxWait  time.Duration
	MaxConns int // wire.Server's
	// Wire is every connection's options; Wire.Compress compresses the features this end
	// sends back (bf16 pays on slow links only: the transfer/wire README's rule). Off by
	// default; requesters read compressed answers with no option.
	Wire wire.Options
}

// ServerStats count what a Server did.
type ServerStats struct {
	Items, Failed atomic.Int64 // answered with features; with an error frame
	InBytes       atomic.Int64 // input payload bytes received
	OutBytes      atomic.Int64 // feature bytes sent
}

// Server offers a daemon's encoders to others over the transfer protocol.
type Server struct {
	b      Backend
	opts   ServerOptions
	ws     *wire.Server
	inputs *wire.Window
	Stats  ServerStats
}

// NewServer makes a server that encodes with b.
func NewServer(b Backend, o ServerOptions) *Server {
	if o.MaxInputBytes <= 0 {
		o.MaxInputBytes = 512 << 20
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 60 * time.Second
	}
	s := &Server{b: b, opts: o, inputs: wire.NewWindow(1<<30, o.MaxInputBytes)}
	s.ws = &wire.Server{Handler: s.handle, Options: o.Wire, MaxConns: o.MaxConns}
	return s
}

// Serve accepts on ln until Close (wire.ErrServerClosed then).
func (s *Server) Serve(ln net.Listener) error { return s.ws.Serve(ln) }

// Close stops accepting and closes every connection (their requesters fail over).
func (s *Server) Close() error { return s.ws.Close() }

// handle takes an item's first encode frame and reads the rest on the same connection: an
// item's frames come together, and it is answered before the next item is read.
func (s *Server) handle(ctx context.Context, c *wire.Conn, h *wire.Header) error {
	if h.Kind != wire.KindEncode {
		return c.SendError(ctx, h.RequestID, h.Key, fmt.Sprintf("a %v frame: this encoder takes encode frames", h.Kind))
	}
	var m meta
	it, err := s.parse(h, &m)
	if err == nil && m.Input != 0 {
		err = fmt.Errorf("input %d first: an item's inputs come in order from 0", m.Input)
	}
	if err != nil { // how many frames follow is unknown: say why, then hang up
		s.Stats.Failed.Add(1)
		_ = c.SendError(ctx, h.RequestID, h.Key, err.Error())
		return err
	}
	id := h.RequestID
	wait := s.opts.MaxWait
	if m.LeftMS > 0 {
		wait = min(wait, time.Duration(m.LeftMS)*time.Millisecond)
	}
	ictx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()

	inputs := make([]encoder.Input, 0, m.Inputs)
	var held int64
	acct := s.opts.Budget.Account() // nil without a budget: reservations are no-ops
	defer func() {
		if held > 0 {
			s.inputs.Release(held)
		}
		acct.Close()
	}()
	for i := 0; ; i++ {
		if i > 0 {
			if *h, err = c.Next(ictx); err != nil {
				return err
			}
			var mi meta
			_, err := s.parse(h, &mi)
			if err == nil && (h.Kind != wire.KindEncode || h.RequestID != id || mi.Input != i || mi.Inputs != m.Inputs) {
				err = fmt.Errorf("a %v frame of request %d, input %d of %d: want input %d of %d of request %d", h.Kind, h.RequestID, mi.Input, mi.Inputs, i, m.Inputs, id)
			}
			if err != nil { // out of step: say why, then hang up
				s.Stats.Failed.Add(1)
				_ = c.SendError(ctx, id, it.Key, err.Error())
				return err
			}
			m.Frames = mi.Frames
		}
		n, err := s.b.InputFloats(it, m.Frames)
		if err == nil && (h.DType != wire.DTypeF32 || int64(h.Rows)*int64(h.Cols) != int64(n)) {
			err = fmt.Errorf("input %d: [%d, %d] %v, the encoder takes %d f32 values", i, h.Rows, h.Cols, h.DType, n)
		}
		if err == nil {
			if err = s.inputs.Acquire(ictx, h.Len); err == nil {
				held += h.Len
				err = acct.Reserve(ictx, h.Len, "a peer's encoder inputs")
			}
		}
		if err != nil {
			return s.refuse(ctx, c, id, it, m.Inputs-i, err)
		}
		in := encoder.Input{Data: make([]float32, n), Frames: m.Frames}
		if err := c.ReadPayload(ictx, unsafe.Slice((*byte)(unsafe.Pointer(&in.Data[0])), n*4)); err != nil {
			return err // a checksum mismatch too: the item cannot be encoded from it
		}
		s.Stats.InBytes.Add(h.Len)
		inputs = append(inputs, in)
		if i == m.Inputs-1 {
			break
		}
	}
	out, release, err := s.b.Encode(ictx, it, inputs)
	if err != nil {
		s.Stats.Failed.Add(1)
		return c.SendError(ctx, id, it.Key, err.Error())
	}
	defer release()
	if int64(len(out)) != it.Bytes() {
		s.Stats.Failed.Add(1)
		return c.SendError(ctx, id, it.Key, fmt.Sprintf("encoded %d bytes, want %d", len(out), it.Bytes()))
	}
	if err := c.Send(ctx, wire.Header{Kind: wire.KindFeatures, RequestID: id, Key: it.Key, DType: it.DType,
		Rows: uint32(it.Tokens), Cols: uint32(it.Hidden)}, out); err != nil {
		return err
	}
	s.Stats.Items.Add(1)
	s.Stats.OutBytes.Add(int64(len(out)))
	return nil
}

func (s *Server) parse(h *wire.Header, m *meta) (Item, error) {
	if err := json.Unmarshal([]byte(h.Text), m); err != nil {
		return Item{}, fmt.Errorf("encode frame text: %w", err)
	}
	return m.item(h.Key)
}

// refuse skips the rest of an item (its remaining frames, this one's payload included) and
// answers it with an error frame, keeping the stream in step.
func (s *Server) refuse(ctx context.Context, c *wire.Conn, id uint64, it Item, left int, why error) error {
	s.Stats.Failed.Add(1)
	if err := c.Discard(ctx); err != nil {
		return err
	}
	for range left - 1 {
		nh, err := c.Next(ctx)
		if err != nil {
			return err
		}
		if nh.Kind != wire.KindEncode || nh.RequestID != id {
			return fmt.Errorf("remote: a %v frame of request %d inside request %d", nh.Kind, nh.RequestID, id)
		}
		if err := c.Discard(ctx); err != nil {
			return err
		}
	}
	return c.SendError(ctx, id, it.Key, why.Error())
}

var (
	servedItemsDesc = prometheus.NewDesc("dataplane_remote_served_items_total",
		"Items other daemons sent this one to encode, by outcome: encoded (features sent back, a cache hit included) or failed (an error frame).", []string{"outcome"}, nil)
	servedBytesDesc = prometheus.NewDesc("dataplane_remote_served_bytes_total",
		"Payload bytes of remote encoding: in (inputs received), out (features sent).", []string{"direction"}, nil)
)

// Collector exports the server's counts, read at scrape time.
func (s *Server) Collector() prometheus.Collector { return serverCollector{s} }

type serverCollector struct{ s *Server }

func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- servedItemsDesc
	ch <- servedBytesDesc
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := &c.s.Stats
	ch <- prometheus.MustNewConstMetric(servedItemsDesc, prometheus.CounterValue, float64(st.Items.Load()), "encoded")
	ch <- prometheus.MustNewConstMetric(servedItemsDesc, prometheus.CounterValue, float64(st.Failed.Load()), "failed")
	ch <- prometheus.MustNewConstMetric(servedBytesDesc, prometheus.CounterValue, float64(st.InBytes.Load()), "in")
	ch <- prometheus.MustNewConstMetric(servedBytesDesc, prometheus.CounterValue, float64(st.OutBytes.Load()), "out")
}
