package memory

import "fmt"

// RuntimeReserve is what the plan keeps aside for memory that does not grow with one
// request's input: goroutine stacks, connection buffers, the encoders' scratch, the Go
// runtime's own overhead.
const RuntimeReserve = 128 << 20

// MinRequests is the smallest request budget a plan accepts: one large image's body, its
// decoded pixels and its encoder input.
const MinRequests = 64 << 20

// Plan divides the process budget: the feature store's arena, what the process already holds
// (models, tokenizer, runtime: its RSS once they are loaded), a reserve, and the rest for
// requests.
type Plan struct {
	Total    int64 // --memory-bytes
	Features int64 // the feature store's host budget (--feature-bytes)
	Baseline int64 // resident when the plan was made
	Reserve  int64 // RuntimeReserve
	Requests int64 // the request budget: Total - the others
}

// NewPlan checks that total leaves room for requests.
func NewPlan(total, features, baseline int64) (Plan, error) {
	p := Plan{Total: total, Features: features, Baseline: baseline, Reserve: RuntimeReserve}
	p.Requests = total - features - baseline - p.Reserve
	if p.Requests < MinRequests {
		return p, fmt.Errorf("--memory-bytes %d leaves %d bytes for requests (at least %d) after the feature store's %d (--feature-bytes), "+
			"the %d the process holds with its models loaded, and a reserve of %d: raise --memory-bytes or lower --feature-bytes",
			total, max(p.Requests, 0), MinRequests, features, baseline, p.Reserve)
	}
	return p, nil
}
