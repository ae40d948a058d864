package wire

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Client is the requesting side of request/response exchanges on one Conn (remote encoding:
// KindEncode out, KindFeatures or KindError back). Call numbers the request, sends it and waits
// for the answer with its id; one reader goroutine takes each answer and hands it to that
// call's recv on the Conn, so the answer's payload is read straight into the caller's memory
// (ReceiveInto a features.Job). A Window bounds the requests and bytes in flight.
//
// When the connection fails, every pending call gets the error and later calls fail at once:
// the owner makes a new Client on a new connection (or fails over to another encoder).
type Client struct {
	c   *Conn
	win *Window

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	err     error // set when the reader ended
	done    chan struct{}
}

// Recv takes the answer to a call: h is a KindFeatures (or another) frame whose payload is
// pending on c, or a KindError frame (h.Err()). It runs on the Client's reader goroutine and
// must read or skip the payload before returning.
type Recv func(ctx context.Context, c *Conn, h *Header) error

type call struct {
	recv Recv // nil once the caller gave up: the answer is skipped
	done chan error
}

// NewClient starts a client on c (which it owns from now on) with the window win.
func NewClient(c *Conn, win *Window) *Client {
	cl := &Client{c: c, win: win, pending: make(map[uint64]*call), done: make(chan struct{})}
	go cl.read()
	return cl
}

// Call sends h (its RequestID is set here) with payload and waits for the answer, which recv
// takes; it returns recv's error, or the connection's, or ctx's. A call whose context ends
// before its answer returns at once; the answer is skipped when it comes.
func (cl *Client) Call(ctx context.Context, h Header, payload []byte, recv Recv) error {
	return cl.call(ctx, int64(len(payload)), recv, func(h2 Header) error {
		return cl.c.Send(ctx, h2, payload)
	}, h)
}

// CallShm is Call with the payload in shared memory (Conn.SendShm): the sender's bytes must
// stay unchanged until Call returns.
func (cl *Client) CallShm(ctx context.Context, h Header, payload []byte, fd int, off int64, recv Recv) error {
	return cl.call(ctx, int64(len(payload)), recv, func(h2 Header) error {
		return cl.c.SendShm(ctx, h2, payload, fd, off)
	}, h)
}

// CallWithReply is Call whose answer is written by the peer straight into [off, off+n) of the
// memfd fd (Conn.SendWithReply): with recv = ReceiveInto of the job whose buffer that is, a
// same-node remote encoding copies nothing.
func (cl *Client) CallWithReply(ctx context.Context, h Header, payload []byte, fd int, off, n int64, recv Recv) error {
	return cl.call(ctx, int64(len(payload)), recv, func(h2 Header) error {
		return cl.c.SendWithReply(ctx, h2, payload, fd, off, n)
	}, h)
}

func (cl *Client) call(ctx context.Context, n int64, recv Recv, send func(Header) error, h Header) error {
	if recv == nil {
		return errors.New("wire: Call without a Recv")
	}
	if err := cl.win.Acquire(ctx, n); err != nil {
		return err
	}
	defer cl.win.Release(n)
	c := &call{recv: recv, done: make(chan error, 1)}
	cl.mu.Lock()
	if cl.err != nil {
		cl.mu.Unlock()
		return cl.err
	}
	cl.next++
	h.RequestID = cl.next
	cl.pending[h.RequestID] = c
	cl.mu.Unlock()
	if err := send(h); err != nil {
		cl.forget(h.RequestID)
		return err
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		cl.forget(h.RequestID)
		return fmt.Errorf("wire: waiting for the answer to request %d: %w", h.RequestID, ctx.Err())
	}
}

// forget drops a call the caller no longer waits for; its answer, if one comes, is skipped as
// one to no request (an answer that never comes must not keep the entry).
func (cl *Client) forget(id uint64) {
	cl.mu.Lock()
	delete(cl.pending, id)
	cl.mu.Unlock()
}

func (cl *Client) read() {
	ctx := context.Background()
	var err error
	for {
		var h Header
		if h, err = cl.c.Next(ctx); err != nil {
			break
		}
		cl.mu.Lock()
		c, ok := cl.pending[h.RequestID]
		delete(cl.pending, h.RequestID)
		var recv Recv
		if ok {
			recv = c.recv
		}
		cl.mu.Unlock()
		if recv == nil { // no such request (or its caller left): skip the answer
			continue // Next skips the payload
		}
		c.done <- recv(ctx, cl.c, &h)
		if err = cl.c.rbroke; err != nil { // recv broke the stream
			break
		}
	}
	cl.mu.Lock()
	cl.err = fmt.Errorf("wire: client connection ended: %w", err)
	for id, c := range cl.pending {
		c.done <- cl.err
		delete(cl.pending, id)
	}
	cl.mu.Unlock()
	close(cl.done)
}

// Close closes the connection; pending calls fail. It waits for the reader to end.
func (cl *Client) Close() error {
	err := cl.c.Close()
	<-cl.done
	return err
}
