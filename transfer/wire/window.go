package wire

import (
	"context"
	"fmt"
	"sync"
)

// Window bounds what a sender has in flight on a connection: at most Frames requests and Bytes
// payload bytes awaiting their answers. A sender acquires before Send and releases when the
// answer (or an error) comes back, so a slow peer makes senders wait here, with a deadline,
// rather than queue without bound. (Within one frame, TCP's own window is the backpressure: a
// receiver reads a frame only when it has somewhere to put it.)
type Window struct {
	frames int
	bytes  int64

	mu       sync.Mutex
	inFrames int
	inBytes  int64
	wake     chan struct{} // closed and replaced on every release
}

// NewWindow makes a window of frames requests and bytes payload bytes (both > 0).
func NewWindow(frames int, bytes int64) *Window {
	return &Window{frames: max(frames, 1), bytes: max(bytes, 1), wake: make(chan struct{})}
}

// Acquire takes one frame of n bytes, waiting until it fits or ctx ends. A frame larger than
// the whole window is admitted alone (when nothing else is in flight), so it cannot starve.
func (w *Window) Acquire(ctx context.Context, n int64) error {
	for {
		w.mu.Lock()
		fits := w.inFrames < w.frames && (w.inBytes+n <= w.bytes || w.inFrames == 0)
		if fits {
			w.inFrames++
			w.inBytes += n
			w.mu.Unlock()
			return nil
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("wire: waiting for the send window (%d frames, %d bytes in flight): %w", w.frames, w.bytes, ctx.Err())
		}
	}
}

// Release gives back a frame of n bytes taken by Acquire.
func (w *Window) Release(n int64) {
	w.mu.Lock()
	w.inFrames--
	w.inBytes -= n
	if w.inFrames < 0 || w.inBytes < 0 {
		w.mu.Unlock()
		panic("wire: Window.Release without Acquire")
	}
	close(w.wake)
	w.wake = make(chan struct{})
	w.mu.Unlock()
}

// InFlight is what is in flight now.
func (w *Window) InFlight() (frames int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inFrames, w.inBytes
}
