package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/valyala/fasthttp"

	"dataplane/dataplane/memory"
)

// bodyChunk is how much of a body is read at a time; the buffer grows by doubling, each
// growth reserved before it is allocated.
const bodyChunk = 64 << 10

// readBody reads the request body as its bytes arrive (the server streams bodies: fasthttp
// would otherwise allocate the declared Content-Length up front, so 100 connections that
// declare 64 MiB and send one byte would hold 6.4 GB). Every growth of the buffer is reserved
// on acct first, as intake (held to a share of the budget, served after requests already in
// the work, so half-read bodies cannot starve those); once the body is in, the bytes stay
// reserved as ordinary ones. A body over MaxBodyBytes is a 413 as soon as it shows so (one that
// says so is refused before, in handle).
func (s *Server) readBody(ctx *fasthttp.RequestCtx, rctx context.Context, acct *memory.Account) ([]byte, error) {
	limit := s.opts.MaxBodyBytes
	tooLarge := func() error {
		ctx.SetConnectionClose() // the rest of the body is not read
		return s.bodyTooLarge()
	}
	declared := ctx.Request.Header.ContentLength() // -1 chunked, -2 none; over limit: refused in handle
	// The body and what parsing copies out of it: a body that could never fit is a 413 now.
	if err := acct.Fits(2*int64(declared), "request body"); err != nil {
		ctx.SetConnectionClose()
		return nil, err
	}
	r := ctx.RequestBodyStream()
	if r == nil { // no body stream (neither a length nor chunks): whatever fasthttp read is all
		b := ctx.PostBody()
		if len(b) > limit {
			return nil, tooLarge()
		}
		return b, acct.Reserve(rctx, int64(len(b)), "request body") // already read: not intake
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if len(buf) > limit {
				return nil, tooLarge()
			}
			grow := max(min(2*cap(buf), limit+1), bodyChunk)
			if declared >= 0 {
				grow = min(grow, declared) // never more than said, never before it arrives
				if grow <= cap(buf) {
					grow = cap(buf) + bodyChunk // more bytes than declared: fasthttp stops them
				}
			}
			if err := acct.ReserveIntake(rctx, int64(grow-cap(buf)), "request body"); err != nil {
				// The rest is read and dropped (no memory: a fixed scratch), bounded by the
				// declared length and the read timeout, so the client reads the 503 instead of
				// a connection reset while it still writes.
				if declared < 0 || s.discard(r, int64(declared-len(buf))) != nil {
					ctx.SetConnectionClose()
				}
				return nil, err
			}
			next := make([]byte, len(buf), grow)
			copy(next, buf)
			buf = next
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), len(buf)+bodyChunk)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			if len(buf) > limit {
				return nil, tooLarge()
			}
			acct.EndIntake()
			return buf, nil
		}
		if err != nil {
			ctx.SetConnectionClose()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, &Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
					Message: fmt.Sprintf("request body not read within %v (--read-timeout)", s.opts.ReadTimeout)}
			}
			return nil, &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: "reading the request body: " + err.Error()}
		}
	}
}

// bodyTooLarge is the 413 of a body over --max-body-bytes.
func (s *Server) bodyTooLarge() *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Message: fmt.Sprintf("request body larger than %d bytes (--max-body-bytes)", s.opts.MaxBodyBytes)}
}

// discard reads and drops n more bytes of a body.
func (s *Server) discard(r io.Reader, n int64) error {
	var scratch [32 << 10]byte
	for n > 0 {
		k, err := r.Read(scratch[:min(n, int64(len(scratch)))])
		n -= int64(k)
		if err != nil {
			if errors.Is(err, io.EOF) && n <= 0 {
				return nil
			}
			return err
		}
	}
	return nil
}
