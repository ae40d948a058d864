package planner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Replay runs the rules over recorded metric pulls (`dataplane plan replay`). Changes complete
// at once, so the pools after an interval are its decision applied.

// Observation is one recorded pull, one JSON object a line:
// {"t": seconds, "prefill_queue": per prefill worker, "decode_kv": 0..1}. A missing or null
// field was not measured.
type Observation struct {
	T            *float64 `json:"t"`
	PrefillQueue *float64 `json:"prefill_queue"`
	DecodeKV     *float64 `json:"decode_kv"`
}

// maxGapIntervals bounds the empty intervals one gap in a record may hold.
const maxGapIntervals = 100000

// MaxObservationLine bounds one line of an observations file.
const MaxObservationLine = 4096

// ParseObservation reads one line into a Sample; errors name the bad field.
func ParseObservation(line []byte) (Sample, error) {
	var o Observation
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return Sample{}, fmt.Errorf("not an observation object: %w", err)
	}
	if dec.More() {
		return Sample{}, errors.New("more than one JSON value on the line")
	}
	s := Sample{PrefillQueue: math.NaN(), DecodeKV: math.NaN(), PrefillTokens: math.NaN(), DecodeRequests: math.NaN()}
	switch {
	case o.T == nil:
		return Sample{}, errors.New(`"t": missing`)
	case *o.T < 0 || *o.T > 1e12:
		return Sample{}, fmt.Errorf(`"t": %v is not a time in seconds (0 to 1e12)`, *o.T)
	}
	s.T = *o.T
	if o.PrefillQueue != nil {
		if *o.PrefillQueue < 0 || *o.PrefillQueue > 1e9 {
			return Sample{}, fmt.Errorf(`"prefill_queue": %v out of range (0 to 1e9)`, *o.PrefillQueue)
		}
		s.PrefillQueue = *o.PrefillQueue
	}
	if o.DecodeKV != nil {
		if *o.DecodeKV < 0 || *o.DecodeKV > 10 {
			return Sample{}, fmt.Errorf(`"decode_kv": %v out of range (0 to 10)`, *o.DecodeKV)
		}
		s.DecodeKV = *o.DecodeKV
	}
	return s, nil
}

// ObservationLine is a pull as a line of an observations file (unmeasured fields left out).
func ObservationLine(s Sample) []byte {
	b := strconv.AppendFloat([]byte(`{"t":`), s.T, 'f', 3, 64)
	if !math.IsNaN(s.PrefillQueue) {
		b = strconv.AppendFloat(append(b, `,"prefill_queue":`...), s.PrefillQueue, 'g', -1, 64)
	}
	if !math.IsNaN(s.DecodeKV) {
		b = strconv.AppendFloat(append(b, `,"decode_kv":`...), s.DecodeKV, 'g', -1, 64)
	}
	return append(b, "}\n"...)
}

// ReplayStep is one output line: the end of an adjustment interval, the pools after its
// decision, the action, and the interval's inputs.
type ReplayStep struct {
	T               float64  `json:"t"`
	Prefill         int      `json:"prefill"`
	Decode          int      `json:"decode"`
	Action          string   `json:"action"`
	Samples         int      `json:"samples"`
	AvgPrefillQueue *float64 `json:"avg_prefill_queue"`
	AvgDecodeKV     *float64 `json:"avg_decode_kv"`
}

// Replay reads observations (in time order) from r and calls emit once per adjustment
// interval. Intervals start at the first observation's t and last AdjustInterval; an interval
// is decided when an observation at or past its end arrives, and the last one when the file
// covers it up to its last pull (its end minus PullInterval). An interval with no
// observations (a gap in the record) holds.
func Replay(r io.Reader, rules Rules, start Pools, emit func(ReplayStep) error) error {
	if err := rules.Check(); err != nil {
		return err
	}
	if start.Decode < 0 || start.Prefill < 0 {
		return fmt.Errorf("initial pools %+v: counts must be at least 0", start)
	}
	iv := NewInterval(rules)
	pools := start
	adj, pull := rules.AdjustInterval.Seconds(), rules.PullInterval.Seconds()
	var end, last float64
	started := false
	decide := func() error {
		d := iv.Decide(pools)
		pools.Prefill += d.Prefill
		pools.Decode += d.Decode
		step := ReplayStep{T: end, Prefill: pools.Prefill, Decode: pools.Decode, Action: d.Action(), Samples: d.Samples,
			AvgPrefillQueue: finite(d.AvgPrefillQueue), AvgDecodeKV: finite(d.AvgDecodeKV)}
		end += adj
		return emit(step)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1024), MaxObservationLine)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		s, err := ParseObservation(line)
		if err != nil {
			return fmt.Errorf("observations line %d: %w", n, err)
		}
		if !started {
			started, end = true, s.T+adj
		} else if s.T < last {
			return fmt.Errorf("observations line %d: t %v goes back from %v", n, s.T, last)
		}
		last = s.T
		if (s.T-end)/adj > maxGapIntervals {
			return fmt.Errorf("observations line %d: t %v is more than %d adjustment intervals past the last", n, s.T, maxGapIntervals)
		}
		for s.T >= end {
			if err := decide(); err != nil {
				return err
			}
		}
		iv.Add(s)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("observations: a line longer than %d bytes", MaxObservationLine)
		}
		return fmt.Errorf("observations: %w", err)
	}
	if started && last >= end-pull-1e-9 {
		return decide()
	}
	return nil
}

func finite(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}
