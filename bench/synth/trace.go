// Package synth reads and writes Mooncake-style request traces, learns their prefix structure
// (the core radix tree of shared hash blocks) and synthesizes new traces from it, with knobs
// for prefix and prompt lengths, output lengths, arrival rate and multimodal content.
package synth

import (
	"bufio"
	"dataplane/dataplane/sequence"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Record is one request of a trace: Mooncake's fields, plus our media extension.
type Record struct {
	Timestamp    float64 `json:"timestamp"`     // ms since the trace began
	InputLength  int     `json:"input_length"`  // prompt tokens
	OutputLength int     `json:"output_length"` // generated tokens
	// HashIDs names each BlockSize-token block of the prompt (the last may be partial); equal
	// ids are identical blocks, and, as blocks are chained, identical prefixes.
	HashIDs []int64 `json:"hash_ids"`
	Media   []Media `json:"media,omitempty"`
}

// Media is a media item inside a prompt: its placeholder tokens [Offset, Offset+Tokens) and
// the identifier engines and routers hash (equal ids: the same image, audio or video).
type Media struct {
	Modality sequence.Modality `json:"modality"` // "image", "video", "audio"
	ID       string            `json:"id"`
	Offset   int               `json:"offset"`
	Tokens   int               `json:"tokens"`
	// A video's sampled frames and their rate (the encoder's work is per frame); 0 otherwise.
	Frames int     `json:"frames,omitempty"`
	FPS    float64 `json:"fps,omitempty"`
}

// Limits bound what a trace may hold. DefaultLimits has the defaults.
type Limits struct {
	MaxRecords     int // 10,000,000
	MaxLineBytes   int // 4 MiB
	MaxInputLength int // 10,000,000 tokens
	BlockSize      int // tokens per hash id; 512 (Mooncake's)
}

// DefaultLimits are generous for published traces.
func DefaultLimits() Limits {
	return Limits{MaxRecords: 10_000_000, MaxLineBytes: 4 << 20, MaxInputLength: 10_000_000, BlockSize: 512}
}

// ErrTrace says which line of a trace is wrong and how.
type ErrTrace struct {
	Line    int
	Problem string
}

func (e *ErrTrace) Error() string { return fmt.Sprintf("trace line %d: %s", e.Line, e.Problem) }

// ReadTrace reads JSON Lines records (blank lines skipped) and checks each: lengths in range,
// one hash id per block (ceil(input_length / block size)), media inside the prompt, and
// timestamps that do not go backwards.
func ReadTrace(r io.Reader, lim Limits) ([]Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), lim.MaxLineBytes)
	var out []Record
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		if len(out) >= lim.MaxRecords {
			return nil, &ErrTrace{line, fmt.Sprintf("more than %d records", lim.MaxRecords)}
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, &ErrTrace{line, err.Error()}
		}
		if err := rec.check(lim); err != nil {
			return nil, &ErrTrace{line, err.Error()}
		}
		if n := len(out); n > 0 && rec.Timestamp < out[n-1].Timestamp {
			return nil, &ErrTrace{line, fmt.Sprintf("timestamp %v before the previous %v", rec.Timestamp, out[n-1].Timestamp)}
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ErrTrace{line + 1, fmt.Sprintf("longer than %d bytes", lim.MaxLineBytes)}
		}
		return nil, err
	}
	return out, nil
}

func (rec *Record) check(lim Limits) error {
	switch {
	case rec.Timestamp < 0 || rec.Timestamp != rec.Timestamp:
		return fmt.Errorf("timestamp %v", rec.Timestamp)
	case rec.InputLength <= 0 || rec.InputLength > lim.MaxInputLength:
		return fmt.Errorf("input_length %d (want 1..%d)", rec.InputLength, lim.MaxInputLength)
	case rec.OutputLength < 0 || rec.OutputLength > lim.MaxInputLength:
		return fmt.Errorf("output_length %d (want 0..%d)", rec.OutputLength, lim.MaxInputLength)
	case len(rec.HashIDs) != (rec.InputLength+lim.BlockSize-1)/lim.BlockSize:
		return fmt.Errorf("%d hash_ids for %d tokens in blocks of %d (want %d)", len(rec.HashIDs), rec.InputLength, lim.BlockSize,
			(rec.InputLength+lim.BlockSize-1)/lim.BlockSize)
	}
	for i, m := range rec.Media {
		switch {
		case m.Modality == 0:
			return fmt.Errorf("media[%d].modality is missing", i)
		case m.ID == "":
			return fmt.Errorf("media[%d].id is empty", i)
		case m.Tokens <= 0 || m.Offset < 0 || m.Offset > rec.InputLength-m.Tokens:
			return fmt.Errorf("media[%d]: tokens [%d, %d+%d) not inside the %d-token prompt", i, m.Offset, m.Offset, m.Tokens, rec.InputLength)
		case m.Frames < 0 || m.Frames > maxFrames:
			return fmt.Errorf("media[%d].frames %d (want 0..%d)", i, m.Frames, maxFrames)
		case !(m.FPS >= 0 && m.FPS <= maxFPS):
			return fmt.Errorf("media[%d].fps %v (want 0..%d)", i, m.FPS, maxFPS)
		}
	}
	return nil
}

// Bounds on a video item's frames and rate (a day of 60 fps video is far beyond any model).
const (
	maxFrames = 1 << 22
	maxFPS    = 1000
)

// WriteTrace writes records as JSON Lines.
func WriteTrace(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
