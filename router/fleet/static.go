package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
)

// A static fleet (`--worker-labels FILE` of serve and router): the workers, their roles and
// where they sit, written by hand or by `dataplane synth --fleet`, for setups without
// announcements. The same Worker values as the bucket's, so both are routed alike:
//
//	[{"name": "p0", "endpoint": "http://10.0.0.5:8000", "role": "prefill",
//	  "topology": {"zone": "us-east-1a", "rack": "r12"}}, ...]
//
// "model", "kv_blocks" and "block_size" may be given as in an announcement.

// Bounds on a static fleet file.
const (
	MaxStaticWorkers = 16384
	MaxStaticBytes   = 16 << 20
)

// staticWorker is one entry of the file.
type staticWorker struct {
	Name      string            `json:"name"`
	Endpoint  string            `json:"endpoint"`
	Role      Role              `json:"role"`
	Model     string            `json:"model,omitempty"`
	KVBlocks  int64             `json:"kv_blocks,omitempty"`
	BlockSize int               `json:"block_size,omitempty"`
	Topology  map[string]string `json:"topology,omitempty"`
}

// ParseStatic reads a static fleet: every entry checked as an announcement is (Worker.Check),
// an endpoint required (http:// or https://), names unique; errors name the entry.
func ParseStatic(raw []byte) ([]Worker, error) {
	if len(raw) > MaxStaticBytes {
		return nil, fmt.Errorf("worker labels: %d bytes, at most %d", len(raw), MaxStaticBytes)
	}
	var entries []staticWorker
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("worker labels: want a JSON list of {name, endpoint, role, topology}: %w", err)
	}
	if len(entries) > MaxStaticWorkers {
		return nil, fmt.Errorf("worker labels: %d workers, at most %d", len(entries), MaxStaticWorkers)
	}
	out := make([]Worker, 0, len(entries))
	seen := map[string]bool{}
	for i, e := range entries {
		w := Worker{Name: e.Name, Model: e.Model, Role: e.Role, Endpoint: e.Endpoint, KVBlocks: e.KVBlocks,
			BlockSize: e.BlockSize, Labels: e.Topology}
		if w.Role == "" {
			w.Role = Aggregated
		}
		err := w.Check()
		switch {
		case err != nil:
		case !strings.HasPrefix(w.Endpoint, "http://") && !strings.HasPrefix(w.Endpoint, "https://"):
			err = fmt.Errorf("endpoint %.60q: want http://host:port", w.Endpoint)
		case w.Role == Encoder:
			err = fmt.Errorf("role encoder: a static fleet lists LLM workers (aggregated, prefill, decode)")
		case seen[w.Name]:
			err = fmt.Errorf("name %q twice", w.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("worker labels: entry %d: %w", i, err)
		}
		seen[w.Name] = true
		out = append(out, w)
	}
	return out, nil
}
