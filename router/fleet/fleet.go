// Package fleet is how the processes of a fleet find each other over NATS: workers (LLM
// engines, their relays, daemons with encoders) announce themselves in a JetStream key-value
// bucket whose entries live for a lease and are refreshed by heartbeats (Announcer); routers
// watch the bucket and learn who joined, who changed and who left, by a clean delete or by a
// lease that ran out (Watcher); each worker's load goes out on a core-NATS subject at a bounded
// rate (LoadPublisher) for every router replica to read (SubscribeLoad). It knows nothing of
// routing or KV events: callers wire what it reports into theirs. README.md is its map.
package fleet

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Defaults: the bucket, the lease and the load subjects.
const (
	DefaultBucket     = "dataplane_workers"
	DefaultLease      = 10 * time.Second
	DefaultLoadPrefix = "dataplane.load"
	// MinLease is the shortest lease: JetStream's delete markers live at least a second, and a
	// heartbeat every third of it must fit.
	MinLease = time.Second
)

// Role is what a worker does in a request.
type Role string

// The roles of DESIGN.md's fleet.
const (
	Aggregated Role = "aggregated" // prefill and decode in one engine
	Prefill    Role = "prefill"
	Decode     Role = "decode"
	Encoder    Role = "encoder" // media encoders (a daemon's), no KV cache of an LLM
)

// Worker is an announcement: the value of the worker's key in the bucket, as JSON (the schema is
// in README.md). Name is the key, and the last token of the worker's KV-event and load subjects.
type Worker struct {
	Name      string            `json:"name"`
	Model     string            `json:"model,omitempty"`
	Role      Role              `json:"role"`
	Endpoint  string            `json:"endpoint,omitempty"`   // HTTP base URL
	KVBlocks  int64             `json:"kv_blocks,omitempty"`  // KV cache size in blocks (0: unknown)
	BlockSize int               `json:"block_size,omitempty"` // tokens per KV block (0: unknown)
	Labels    map[string]string `json:"labels,omitempty"`     // topology and anything else
	Load      *Load             `json:"load,omitempty"`       // as of the heartbeat (fresher on the load subject)
	Started   time.Time         `json:"started"`              // this incarnation's start
	// An encoder's: where it takes encode requests over the feature transfer protocol
	// ("tcp://host:port" or "unix:///path"), and what it encodes at what calibrated cost.
	Transfer string         `json:"transfer,omitempty"`
	Encodes  []EncoderModel `json:"encodes,omitempty"`
}

// EncoderModel is a model an encoder runs for a modality, and its cost per feature row.
type EncoderModel struct {
	Model           string  `json:"model"`
	Modality        string  `json:"modality"`
	SecondsPerToken float64 `json:"seconds_per_token"`
}

// MaxEncoderModels bounds an encoder's announced models.
const MaxEncoderModels = 16

// Load is a worker's load at a moment: the value published on <load prefix>.<worker> and the
// announcement's load. Counts the worker does not know are -1 (a relay that cannot see them).
type Load struct {
	Running       int64     `json:"running"`        // requests being computed
	Waiting       int64     `json:"waiting"`        // requests queued
	ActiveBlocks  int64     `json:"active_blocks"`  // KV blocks held by running and waiting requests
	PrefillTokens int64     `json:"prefill_tokens"` // prompt tokens not yet computed
	KVBlocks      int64     `json:"kv_blocks"`      // KV cache size in blocks
	At            time.Time `json:"at"`             // when it was measured (the worker's clock)
	// An encoder's: seconds of encoding queued ahead of a new item (its least loaded worker's).
	EncodeSeconds float64 `json:"encode_seconds,omitempty"`
}

// Bounds on an announcement, so a bad or hostile value cannot grow a router.
const (
	MaxNameLen    = 128
	MaxLabels     = 32
	MaxLabelLen   = 256 // key or value
	MaxValueBytes = 16 << 10
)

// ValidName says whether s can name a worker: 1 to MaxNameLen of [A-Za-z0-9_-], which makes it
// both a bucket key and a single NATS subject token.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Check reports the first thing wrong with an announcement, naming the field.
func (w *Worker) Check() error {
	switch {
	case !ValidName(w.Name):
		return fmt.Errorf("name %q: want 1 to %d of A-Z a-z 0-9 _ -", w.Name, MaxNameLen)
	case w.Role != Aggregated && w.Role != Prefill && w.Role != Decode && w.Role != Encoder:
		return fmt.Errorf("role %q: want aggregated, prefill, decode or encoder", w.Role)
	case w.KVBlocks < 0:
		return fmt.Errorf("kv_blocks %d: negative", w.KVBlocks)
	case w.BlockSize < 0:
		return fmt.Errorf("block_size %d: negative", w.BlockSize)
	case len(w.Labels) > MaxLabels:
		return fmt.Errorf("labels: %d, at most %d", len(w.Labels), MaxLabels)
	case len(w.Endpoint) > 4096:
		return fmt.Errorf("endpoint: %d bytes, at most 4096", len(w.Endpoint))
	case len(w.Transfer) > 4096:
		return fmt.Errorf("transfer: %d bytes, at most 4096", len(w.Transfer))
	case len(w.Encodes) > MaxEncoderModels:
		return fmt.Errorf("encodes: %d models, at most %d", len(w.Encodes), MaxEncoderModels)
	}
	for i, m := range w.Encodes {
		if len(m.Model) > MaxLabelLen || len(m.Modality) > MaxLabelLen || !(m.SecondsPerToken >= 0) || math.IsInf(m.SecondsPerToken, 0) {
			return fmt.Errorf("encodes[%d]: model and modality up to %d bytes, seconds_per_token finite and not negative", i, MaxLabelLen)
		}
	}
	for k, v := range w.Labels {
		if k == "" || len(k) > MaxLabelLen || len(v) > MaxLabelLen {
			return fmt.Errorf("label %.40q: keys 1 to %d bytes, values up to %d", k, MaxLabelLen, MaxLabelLen)
		}
	}
	return nil
}

// ParseWorker decodes and checks an announcement; key is the bucket key it was found under,
// which must be its name.
func ParseWorker(key string, value []byte) (Worker, error) {
	var w Worker
	if len(value) > MaxValueBytes {
		return w, fmt.Errorf("worker %.40q: announcement of %d bytes, at most %d", key, len(value), MaxValueBytes)
	}
	if err := json.Unmarshal(value, &w); err != nil {
		return w, fmt.Errorf("worker %.40q: %w", key, err)
	}
	if err := w.Check(); err != nil {
		return w, fmt.Errorf("worker %.40q: %w", key, err)
	}
	if w.Name != key {
		return w, fmt.Errorf("worker %.40q: announced under key %.40q", w.Name, key)
	}
	return w, nil
}

// ParseLoad decodes a load report.
func ParseLoad(value []byte) (Load, error) {
	var l Load
	if len(value) > MaxValueBytes {
		return l, fmt.Errorf("load report of %d bytes, at most %d", len(value), MaxValueBytes)
	}
	if err := json.Unmarshal(value, &l); err != nil {
		return l, fmt.Errorf("load report: %w", err)
	}
	if !(l.EncodeSeconds >= 0) || math.IsInf(l.EncodeSeconds, 0) {
		return l, fmt.Errorf("load report: encode_seconds %v: want a finite number, not negative", l.EncodeSeconds)
	}
	return l, nil
}
