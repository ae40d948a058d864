package remote

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"dataplane/router/fleet"
)

// Catalog is what a daemon knows of the fleet's other encoders: where they take encode requests,
// what they encode at what calibrated cost, the queue they last reported, and the work this
// daemon sent them that has not come back. It predicts when an item sent to each would be done
// encoding (Candidates); the daemon adds the features' way back and lets the router choose.
type Catalog struct {
	self string // this daemon's own name: never a candidate
	max  int

	mu   sync.Mutex
	encs map[string]*encoderState
}

type encoderState struct {
	w        fleet.Worker
	costs    map[modelKey]float64 // seconds per feature row
	queue    float64              // reported seconds of encoding queued there
	reported time.Time            // when the report arrived (this daemon's clock)
	sent     float64              // seconds of work sent there and not answered yet
}

type modelKey struct{ model, modality string }

// MaxEncoders bounds the encoders a catalog keeps (a fleet of daemons, one per GPU node).
const MaxEncoders = 4096

// NewCatalog makes an empty catalog for the daemon named self.
func NewCatalog(self string) *Catalog {
	return &Catalog{self: self, max: MaxEncoders, encs: map[string]*encoderState{}}
}

// Join adds or updates an encoder from its announcement (fleet.Handler's Join): only encoders
// with a transfer address and at least one model count; any other worker is ignored. It reports
// whether the worker is in the catalog now.
func (c *Catalog) Join(w fleet.Worker) bool {
	if w.Role != fleet.Encoder || w.Transfer == "" || len(w.Encodes) == 0 || w.Name == c.self {
		c.Leave(w.Name)
		return false
	}
	costs := make(map[modelKey]float64, len(w.Encodes))
	for _, m := range w.Encodes {
		costs[modelKey{m.Model, m.Modality}] = m.SecondsPerToken
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.encs[w.Name]
	if e == nil {
		if len(c.encs) >= c.max {
			return false
		}
		e = &encoderState{}
		c.encs[w.Name] = e
	}
	e.w, e.costs = w, costs
	if w.Load != nil && e.reported.IsZero() { // the load subject's reports are fresher
		e.queue, e.reported = w.Load.EncodeSeconds, time.Now()
	}
	return true
}

// Leave forgets an encoder (its lease ended, or it stopped).
func (c *Catalog) Leave(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.encs, name)
}

// Report records an encoder's load report (fleet.SubscribeLoad).
func (c *Catalog) Report(name string, l fleet.Load) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.encs[name]; e != nil {
		e.queue, e.reported = l.EncodeSeconds, time.Now()
	}
}

// Len is the number of encoders known.
func (c *Catalog) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.encs)
}

// Candidate is an encoder that runs a model for a modality, and when an item sent now would be
// done there.
type Candidate struct {
	Name     string
	Transfer string            // its transfer address
	Labels   map[string]string // its topology
	Queue    time.Duration     // its reported queue, less the time since the report, plus what this daemon sent since
	Encode   time.Duration     // the item's rows at its calibrated cost
}

// Candidates lists up to n encoders that run model for modality, soonest done first (ties by
// name), each with an item of tokens rows.
func (c *Catalog) Candidates(model, modality string, tokens, n int, now time.Time) []Candidate {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Candidate
	for name, e := range c.encs {
		spt, ok := e.costs[modelKey{model, modality}]
		if !ok {
			continue
		}
		queue := max(e.queue-now.Sub(e.reported).Seconds(), 0) + e.sent
		out = append(out, Candidate{Name: name, Transfer: e.w.Transfer, Labels: e.w.Labels,
			Queue: seconds(queue), Encode: seconds(spt * float64(tokens))})
	}
	slices.SortFunc(out, func(a, b Candidate) int {
		if d := cmp.Compare(a.Queue+a.Encode, b.Queue+b.Encode); d != 0 {
			return d
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out[:min(n, len(out))]
}

// Sent counts work sent to an encoder until the returned function is called (the answer came,
// or the call failed), so this daemon's own traffic counts before the next report shows it.
func (c *Catalog) Sent(name string, work time.Duration) (done func()) {
	s := work.Seconds()
	c.mu.Lock()
	if e := c.encs[name]; e != nil {
		e.sent += s
	}
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if e := c.encs[name]; e != nil {
				e.sent = max(e.sent-s, 0)
			}
		})
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
