package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/dataplane/encoder"
	"dataplane/transfer/wire"
)

// ClientOptions configure a Client. Zero fields take the defaults.
type ClientOptions struct {
	DialTimeout time.Duration // 2 s
	// IdleConns is how many idle connections are kept per encoder (each carries one item at a
	// time; more items at once dial more, and those beyond it are closed when done). 4.
	IdleConns int
	// IdleTimeout closes a connection idle this long (30 s): encoders come and go with their
	// addresses (a new pod, a new IP), and an address not used again must not keep sockets.
	IdleTimeout time.Duration
	// Wire is every connection's options; Wire.Compress compresses what this end sends (the
	// encoders' inputs: f32, which the probe mostly sends raw). Off by default: see the
	// transfer/wire README for where it pays.
	Wire wire.Options
}

// Client sends items to other daemons' encoders and reads their features back.
type Client struct {
	opts ClientOptions

	mu        sync.Mutex
	idle      map[string][]idleConn // by transfer address, most recently used last
	lastSweep time.Time
	closed    bool
	nextID    atomic.Uint64
}

type idleConn struct {
	conn  *wire.Conn
	since time.Time
}

// NewClient makes a client with no connections yet.
func NewClient(o ClientOptions) *Client {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.IdleConns <= 0 {
		o.IdleConns = 4
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Second
	}
	return &Client{opts: o, idle: map[string][]idleConn{}}
}

// ErrAddress: a transfer address the client cannot dial.
var ErrAddress = errors.New("remote: bad transfer address")

// splitAddress turns "tcp://host:port" or "unix:///path" into a network and an address.
func splitAddress(a string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(a, "tcp://"):
		return "tcp", strings.TrimPrefix(a, "tcp://"), nil
	case strings.HasPrefix(a, "unix://"):
		return "unix", strings.TrimPrefix(a, "unix://"), nil
	}
	return "", "", fmt.Errorf("%w: %q (want tcp://host:port or unix:///path)", ErrAddress, a)
}

func (c *Client) get(ctx context.Context, addr string) (*wire.Conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("remote: client closed")
	}
	for l := c.idle[addr]; len(l) > 0; l = c.idle[addr] {
		ic := l[len(l)-1]
		l[len(l)-1] = idleConn{}
		if len(l) == 1 {
			delete(c.idle, addr)
		} else {
			c.idle[addr] = l[:len(l)-1]
		}
		if time.Since(ic.since) < c.opts.IdleTimeout {
			c.mu.Unlock()
			return ic.conn, nil
		}
		ic.conn.Close() // the rest are older
	}
	c.mu.Unlock()
	network, a, err := splitAddress(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: c.opts.DialTimeout}
	nc, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("remote: dial %s: %w", addr, err)
	}
	return wire.NewConn(nc, c.opts.Wire), nil
}

func (c *Client) put(addr string, conn *wire.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle[addr]) >= c.opts.IdleConns {
		conn.Close()
		return
	}
	now := time.Now()
	c.idle[addr] = append(c.idle[addr], idleConn{conn, now})
	if now.Sub(c.lastSweep) >= c.opts.IdleTimeout/2 {
		c.sweep(now)
	}
}

// sweep closes the connections idle for IdleTimeout and forgets addresses left with none
// (mu held). It runs from put, at most twice an IdleTimeout: idle connections are left only
// by traffic, so without traffic there is nothing new to sweep.
func (c *Client) sweep(now time.Time) {
	c.lastSweep = now
	for a, l := range c.idle {
		old := 0
		for old < len(l) && now.Sub(l[old].since) >= c.opts.IdleTimeout {
			l[old].conn.Close()
			old++
		}
		switch {
		case old == len(l):
			delete(c.idle, a)
		case old > 0:
			c.idle[a] = append(l[:0], l[old:]...)
			clear(l[len(l)-old:])
		}
	}
}

// Close closes the idle connections; calls in flight end with their own.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for a, l := range c.idle {
		for _, ic := range l {
			ic.conn.Close()
		}
		delete(c.idle, a)
	}
}

// Encode sends an item's inputs to the encoder at addr and reads its features into dst (at
// least it.Bytes() long: a feature-store job's buffer, so they land where they are kept). It
// returns when the features are in dst and checked (XXH3 of the payload), or with the reason
// they are not: the encoder's own (wire.ErrRemote), the connection's, or ctx's.
func (c *Client) Encode(ctx context.Context, addr string, it Item, inputs []encoder.Input, dst []byte) error {
	if int64(len(dst)) < it.Bytes() {
		return fmt.Errorf("remote: %d bytes for %d features of %d × %v", len(dst), it.Tokens, it.Hidden, it.DType)
	}
	if len(inputs) == 0 || len(inputs) > MaxInputs {
		return fmt.Errorf("remote: %d inputs, want 1 to %d", len(inputs), MaxInputs)
	}
	conn, err := c.get(ctx, addr)
	if err != nil {
		return err
	}
	if err := c.exchange(ctx, conn, it, inputs, dst); err != nil {
		if !errors.Is(err, wire.ErrRemote) { // the stream is at an unknown place
			conn.Close()
			return err
		}
		c.put(addr, conn)
		return err
	}
	c.put(addr, conn)
	return nil
}

func (c *Client) exchange(ctx context.Context, conn *wire.Conn, it Item, inputs []encoder.Input, dst []byte) error {
	id := c.nextID.Add(1)
	dl, ok := ctx.Deadline()
	m := meta{Model: it.Model, Modality: it.Modality, Tokens: it.Tokens, Hidden: it.Hidden, DType: uint8(it.DType), Inputs: len(inputs)}
	for i, in := range inputs {
		m.Input, m.Frames, m.LeftMS = i, in.Frames, leftMS(dl, ok)
		h := wire.Header{Kind: wire.KindEncode, RequestID: id, Key: it.Key, DType: wire.DTypeF32,
			Rows: 1, Cols: uint32(len(in.Data)), Text: m.text()}
		if err := conn.Send(ctx, h, floats(in)); err != nil {
			return err
		}
	}
	h, err := conn.Next(ctx)
	if err != nil {
		return err
	}
	switch {
	case h.RequestID != id:
		return fmt.Errorf("remote: answer for request %d, want %d", h.RequestID, id)
	case h.Kind == wire.KindError:
		return h.Err()
	case h.Kind != wire.KindFeatures:
		return fmt.Errorf("remote: a %v frame, want features", h.Kind)
	case h.DType != it.DType || int(h.Rows) != it.Tokens || int(h.Cols) != it.Hidden:
		return fmt.Errorf("remote: features [%d, %d] %v, want [%d, %d] %v", h.Rows, h.Cols, h.DType, it.Tokens, it.Hidden, it.DType)
	}
	return conn.ReadPayload(ctx, dst)
}
