package api

import (
	"bufio"
	"encoding/json"
	"io"
)

// SSE writes server-sent events: "data: <json>\n\n" per event and "data: [DONE]\n\n" at the
// end, flushing each so clients see tokens as they come.
type SSE struct {
	w *bufio.Writer
}

// NewSSE wraps the response body writer.
func NewSSE(w *bufio.Writer) *SSE { return &SSE{w: w} }

// Event writes one JSON event.
func (s *SSE) Event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.raw(b)
}

// Done writes the terminating event.
func (s *SSE) Done() error { return s.raw([]byte("[DONE]")) }

// Error writes an error as an event (a stream that already started cannot change its status).
func (s *SSE) Error(e *Error) error { return s.raw(e.Body()) }

func (s *SSE) raw(b []byte) error {
	if _, err := io.WriteString(s.w, "data: "); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	if _, err := io.WriteString(s.w, "\n\n"); err != nil {
		return err
	}
	return s.w.Flush()
}
