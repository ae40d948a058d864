package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Handler handles one received frame on c. It reads or maps the payload (ReadPayload,
// MapPayload, ReceiveInto, Admit) or leaves it (it is then skipped), and may answer on c with
// Send / SendShm / SendError. A returned error closes the connection; refusing an item is not
// such an error: answer it with an error frame. Frames of one connection are handled one at a
// time, in order, which is the receiver's backpressure: a busy handler stops reading and TCP
// pushes back on the sender.
type Handler func(ctx context.Context, c *Conn, h *Header) error

// Server accepts connections (TCP or Unix) and runs Handler on each frame.
type Server struct {
	Handler  Handler
	Options  Options
	MaxConns int // connections served at once (default 64); further ones wait in the backlog
	// IdleTimeout closes a connection that sends no frame for this long (default 2 min): a
	// connection holds one of MaxConns while it waits, and a peer's client closes its own idle
	// ones sooner (remote.ClientOptions.IdleTimeout, 30 s).
	IdleTimeout time.Duration

	mu     sync.Mutex
	ln     []net.Listener
	conns  map[*Conn]struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{}
	closed bool
}

// DefaultMaxConns and DefaultIdleTimeout are MaxConns' and IdleTimeout's defaults.
const (
	DefaultMaxConns    = 64
	DefaultIdleTimeout = 2 * time.Minute
)

func (s *Server) init() {
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.conns = make(map[*Conn]struct{})
		n := s.MaxConns
		if n <= 0 {
			n = DefaultMaxConns
		}
		s.slots = make(chan struct{}, n)
	}
}

// ErrServerClosed is Serve's answer after Close.
var ErrServerClosed = errors.New("wire: server closed")

// Serve accepts on ln until Close. It returns ErrServerClosed after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.init()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.ln = append(s.ln, ln)
	s.mu.Unlock()
	for {
		select {
		case s.slots <- struct{}{}:
		case <-s.ctx.Done():
			return ErrServerClosed
		}
		nc, err := ln.Accept()
		if err != nil {
			<-s.slots
			if s.ctx.Err() != nil {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		c := NewConn(nc, s.Options)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-s.slots
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c *Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		<-s.slots
		s.wg.Done()
	}()
	idle := s.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	for {
		wait, cancel := context.WithTimeout(s.ctx, idle)
		h, err := c.Next(wait)
		end, _ := wait.Deadline()
		idled := !time.Now().Before(end) // the socket's deadline can fire before the context's timer
		cancel()
		if err != nil {
			if !idled && !errors.Is(err, io.EOF) && s.ctx.Err() == nil && !errors.Is(err, ErrChecksum) {
				// The peer sent something we cannot parse: say so before hanging up, best effort.
				_ = c.SendError(s.ctx, h.RequestID, h.Key, err.Error())
			}
			return
		}
		if err := s.Handler(s.ctx, c, &h); err != nil {
			return
		}
	}
}

// Close stops accepting, closes every connection and waits for the handlers to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.init()
	s.closed = true
	s.cancel()
	for _, ln := range s.ln {
		ln.Close()
	}
	for c := range s.conns {
		c.Net().Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
