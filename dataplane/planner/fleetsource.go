package planner

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"dataplane/router/fleet"
)

// FleetSource reads the pools and their load from the fleet: the announcement bucket (a
// fleet.Watcher hands it Join, Update, Leave) and the load subjects (OnLoad). The prefill
// queue is the prefill workers' waiting requests per prefill worker; the decode KV use is the
// mean over decode workers of active blocks / KV blocks (active blocks count waiting requests'
// blocks too, so it already holds what Dynamo adds for queued requests).
type FleetSource struct {
	PrefillRoles map[fleet.Role]bool // fleet roles counted as the prefill pool; {prefill}
	DecodeRoles  map[fleet.Role]bool // and as the decode pool; {decode, aggregated}
	Model        string              // only workers of this model ("": any)
	Stale        time.Duration       // a load older than this is not used; 3 s (three fleet.DefaultLoadQuiet)

	now func() time.Time
	mu  sync.Mutex
	w   map[string]*sourceWorker
}

type sourceWorker struct {
	role  fleet.Role
	model string
	load  fleet.Load
	at    time.Time // when the load arrived (our clock); zero: none
}

// maxSourceWorkers bounds the workers a source keeps (a hostile bucket cannot grow it).
const maxSourceWorkers = 1 << 16

// NewFleetSource counts prefill workers as prefill and decode and aggregated ones as decode.
func NewFleetSource() *FleetSource {
	return &FleetSource{PrefillRoles: map[fleet.Role]bool{fleet.Prefill: true},
		DecodeRoles: map[fleet.Role]bool{fleet.Decode: true, fleet.Aggregated: true},
		Stale:       3 * fleet.DefaultLoadQuiet, now: time.Now, w: map[string]*sourceWorker{}}
}

// Join is fleet.Handler's: a worker appeared.
func (s *FleetSource) Join(w fleet.Worker) { s.Update(w) }

// Update is fleet.Handler's: a heartbeat (with the load as of then).
func (s *FleetSource) Update(w fleet.Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sw := s.w[w.Name]
	if sw == nil {
		if len(s.w) >= maxSourceWorkers {
			return
		}
		sw = &sourceWorker{}
		s.w[w.Name] = sw
	}
	sw.role, sw.model = w.Role, w.Model
	if w.Load != nil && sw.at.IsZero() {
		sw.load, sw.at = *w.Load, s.now()
	}
}

// Leave is fleet.Handler's: the worker left.
func (s *FleetSource) Leave(name, _ string) {
	s.mu.Lock()
	delete(s.w, name)
	s.mu.Unlock()
}

// OnLoad takes a load report (fleet.SubscribeLoad's callback); reports of unknown workers
// are dropped.
func (s *FleetSource) OnLoad(name string, l fleet.Load) {
	s.mu.Lock()
	if sw := s.w[name]; sw != nil {
		sw.load, sw.at = l, s.now()
	}
	s.mu.Unlock()
}

func (s *FleetSource) pool(sw *sourceWorker) Pool {
	switch {
	case s.Model != "" && sw.model != s.Model:
		return ""
	case s.PrefillRoles[sw.role]:
		return PoolPrefill
	case s.DecodeRoles[sw.role]:
		return PoolDecode
	}
	return ""
}

// Pull is Source's.
func (s *FleetSource) Pull(context.Context) (Sample, Pools, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var p Pools
	var waiting, kv, tokens, requests float64
	queueN, kvN, tokN, reqN := 0, 0, 0, 0
	for _, sw := range s.w {
		pool := s.pool(sw)
		fresh := !sw.at.IsZero() && now.Sub(sw.at) <= s.Stale
		switch pool {
		case PoolPrefill:
			p.Prefill++
			if fresh && sw.load.Waiting >= 0 {
				waiting += float64(sw.load.Waiting)
				queueN++
			}
			if fresh && sw.load.PrefillTokens >= 0 {
				tokens += float64(sw.load.PrefillTokens)
				tokN++
			}
		case PoolDecode:
			p.Decode++
			if fresh && sw.load.ActiveBlocks >= 0 && sw.load.KVBlocks > 0 {
				kv += min(float64(sw.load.ActiveBlocks)/float64(sw.load.KVBlocks), 10)
				kvN++
			}
			if fresh && sw.load.Running >= 0 && sw.load.Waiting >= 0 {
				requests += float64(sw.load.Running + sw.load.Waiting)
				reqN++
			}
		}
	}
	smp := Sample{T: float64(now.UnixNano()) / 1e9, PrefillQueue: math.NaN(), DecodeKV: math.NaN(), PrefillTokens: math.NaN(), DecodeRequests: math.NaN()}
	if tokN > 0 {
		smp.PrefillTokens = tokens
	}
	if reqN > 0 {
		smp.DecodeRequests = requests
	}
	if queueN > 0 {
		smp.PrefillQueue = waiting / float64(queueN)
	}
	if kvN > 0 {
		smp.DecodeKV = kv / float64(kvN)
	}
	return smp, p, nil
}

// Count is the number of known workers of a pool whose names are prefix or start with
// prefix + "-" (the workers one local process announces).
func (s *FleetSource) Count(pool Pool, prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for name, sw := range s.w {
		if s.pool(sw) == pool && (prefix == "" || ownedBy(name, prefix)) {
			n++
		}
	}
	return n
}

// Names lists the known workers whose names are prefix or start with prefix + "-".
func (s *FleetSource) Names(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name := range s.w {
		if ownedBy(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

func ownedBy(name, prefix string) bool {
	return name == prefix || strings.HasPrefix(name, prefix+"-")
}
