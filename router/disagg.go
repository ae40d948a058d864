package router

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/router/topology"
)

// Disaggregated prefill/decode: a request goes to a prefill worker, which computes its KV cache
// and hands it over, then to a decode worker, which generates (vLLM's disaggregated serving, a
// kv connector such as NIXL between them; Dynamo's PrefillRouter, ai-dynamo/dynamo
// lib/llm/src/kv_router/prefill_router.rs at 007ddea7, routes the prefill step by KV overlap
// and hands its disaggregated_params to the decode request). DecideDisagg picks both:
//
//  1. the prefill worker by KV overlap and prefill load:
//     overlap weight × (prefill blocks + encode wait) + transfer (of media features);
//  2. the decode worker by decode load, with the KV cache's move from the chosen prefill worker
//     as a term: decode blocks + transfer weight × BlocksIn(latency + KV bytes / bandwidth), the
//     link from DisaggOptions.QoS (the broadest level the two differ at); KV bytes = prompt
//     tokens × KVBytesPerToken.
//
// With DisaggOptions.Level set, the rules of Dynamo's topology-aware KV transfer (seed 004):
//
//   - decode candidates are the prefill worker's domain at that level;
//   - none there, others elsewhere: policy fail → *ErrNoDecodeInDomain (naming the domain);
//     fallback → any decode worker (Decision.Topology.Fallback; the caller logs a warning);
//   - a worker without the level's label: excluded under fail; under fallback excluded when
//     same-domain workers exist, eligible when none do;
//   - before the prefill choice, prefill workers that have a decode worker in their domain are
//     preferred; only when none has one are the others eligible.
//
// (Dynamo has since published the same as its "required" enforcement, with a "preferred" one
// that biases the decode cost instead: its knowledge-base page "Topology-Aware KV Transfer";
// the soft cost below is ours, the seed's future work.)
//
// Level unset: no filtering, the decision is as it would be without topology (the soft cost
// applies if a QoS table is set). Prefill workers are never chosen by Decide (an aggregated
// decision); decode workers are (they can compute a prefill themselves, as vLLM's can).

// Role is what a worker does in a request: router/fleet's roles, without importing the fleet.
type Role string

const (
	RoleAggregated Role = "aggregated"
	RolePrefill    Role = "prefill"
	RoleDecode     Role = "decode"
)

// WorkerInfo is what the router knows of a worker beyond its name.
type WorkerInfo struct {
	Role   Role
	Labels map[string]string // topology (zone, rack, ...): level → domain
}

// DisaggOptions configure DecideDisagg. DefaultDisaggOptions has the defaults.
type DisaggOptions struct {
	// Level is the topology level KV transfers stay within (Dynamo's
	// DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL, e.g. "zone"); "": no filtering.
	Level string
	// Policy applies when no decode worker shares the prefill worker's domain; Fail.
	Policy topology.Policy
	// QoS is the per-level link table of the soft transfer cost; empty: no soft cost.
	QoS topology.QoS
	// TransferWeight scales the transfer term against decode blocks (kv_transfer_weight); 1.
	TransferWeight float64
	// KVBytesPerToken is the model's KV cache per token: 2 (K and V) × layers × KV heads × head
	// size × dtype bytes; 131,072 (Llama-3-8B in bf16: 2 × 32 × 8 × 128 × 2).
	KVBytesPerToken float64
}

// DefaultDisaggOptions: no topology level, fail, no QoS table, weight 1, Llama-3-8B's KV size.
func DefaultDisaggOptions() DisaggOptions {
	return DisaggOptions{Policy: topology.Fail, TransferWeight: 1, KVBytesPerToken: 2 * 32 * 8 * 128 * 2}
}

func (o *DisaggOptions) check() error {
	if o.Policy == "" {
		o.Policy = topology.Fail
	}
	if _, err := topology.ParsePolicy(string(o.Policy)); err != nil {
		return fmt.Errorf("router options: %w", err)
	}
	if len(o.Level) > topology.MaxLabelLen {
		return fmt.Errorf("router options: topology level of %d bytes, at most %d", len(o.Level), topology.MaxLabelLen)
	}
	if o.TransferWeight < 0 || o.KVBytesPerToken < 0 {
		return fmt.Errorf("router options: transfer weight %v and KV bytes per token %v must not be negative", o.TransferWeight, o.KVBytesPerToken)
	}
	if !o.QoS.Empty() {
		return o.QoS.Check()
	}
	return nil
}

// TopologyChoice is how topology shaped a disaggregated decision.
type TopologyChoice struct {
	Level    string          `json:"level,omitempty"`
	Domain   string          `json:"domain,omitempty"` // the prefill worker's, at Level
	Policy   topology.Policy `json:"policy,omitempty"`
	Fallback bool            `json:"fallback,omitempty"` // no decode worker in Domain: any decode worker
	KVBytes  float64         `json:"kv_bytes,omitempty"` // what the soft cost moves
}

// ErrNoDecodeInDomain is the fail policy's answer: no decode worker shares the prefill
// worker's domain.
type ErrNoDecodeInDomain struct {
	Level, Domain, Prefill string
	Elsewhere, Unlabelled  int // eligible decode workers in other domains, and without the label
}

func (e *ErrNoDecodeInDomain) Error() string {
	if e.Domain == "" {
		return fmt.Sprintf("prefill worker %s has no %s label, so no decode worker is in its %s (mismatch policy fail)", e.Prefill, e.Level, e.Level)
	}
	return fmt.Sprintf("no decode worker in %s %q, prefill worker %s's (%d in other %ss, %d without a %s label; mismatch policy fail)",
		e.Level, e.Domain, e.Prefill, e.Elsewhere, e.Level, e.Unlabelled, e.Level)
}

// disaggState is the router's bookkeeping for disaggregated workers and requests.
type disaggState struct {
	prefillWorkers atomic.Int64 // workers whose role is prefill (Disaggregated)
	legs           atomic.Int64 // prefill legs started (an upper bound of those in flight)
	domains        sync.Pool    // map[string]int scratch of DecideDisagg
}

// excludedPrefillOnly is why Decide passes a prefill worker over.
const excludedPrefillOnly = "prefill worker: takes only the prefill step of a disaggregated request"

// prefillLeg suffixes a request id for its prefill step in the slot tracker (the decode step
// goes under the id itself). Request ids with a NUL in them are refused by the APIs.
const prefillLeg = "\x00prefill"

func (w *worker) prefillOnly() bool {
	info := w.info.Load()
	return info != nil && info.Role == RolePrefill
}

func (w *worker) role() Role {
	if info := w.info.Load(); info != nil && info.Role != "" {
		return info.Role
	}
	return RoleAggregated
}

func (w *worker) labels() map[string]string {
	if info := w.info.Load(); info != nil {
		return info.Labels
	}
	return nil
}

// SetWorkerInfo records a worker's role and topology labels (copied). A worker without is
// aggregated and unlabelled.
func (r *Router) SetWorkerInfo(name string, info WorkerInfo) error {
	switch info.Role {
	case "":
		info.Role = RoleAggregated
	case RoleAggregated, RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("worker %q: role %q: want aggregated, prefill or decode", name, info.Role)
	}
	r.regMu.Lock()
	defer r.regMu.Unlock()
	w := r.find(name)
	if w == nil {
		return &ErrUnknownWorker{Name: name}
	}
	if info.Labels != nil {
		labels := make(map[string]string, len(info.Labels))
		for k, v := range info.Labels {
			labels[k] = v
		}
		info.Labels = labels
	}
	was := w.role() == RolePrefill
	w.info.Store(&info)
	switch is := info.Role == RolePrefill; {
	case is && !was:
		r.disagg.prefillWorkers.Add(1)
	case was && !is:
		r.disagg.prefillWorkers.Add(-1)
	}
	return nil
}

// WorkerInfo is what SetWorkerInfo recorded for a worker (the zero value: aggregated).
func (r *Router) WorkerInfo(name string) WorkerInfo {
	if w := r.find(name); w != nil {
		if info := w.info.Load(); info != nil {
			return *info
		}
	}
	return WorkerInfo{Role: RoleAggregated}
}

// forgetInfo is RemoveWorker's: r.regMu must be held.
func (r *Router) forgetInfo(w *worker) {
	if w.prefillOnly() {
		r.disagg.prefillWorkers.Add(-1)
	}
}

// Disaggregated reports whether the fleet has prefill workers: requests then take two steps.
func (r *Router) Disaggregated() bool { return r.disagg.prefillWorkers.Load() > 0 }

// Route decides for whatever the fleet is: DecideDisagg when it has prefill workers, else Decide.
func (r *Router) Route(req Request, d *Decision) error {
	if r.Disaggregated() {
		return r.DecideDisagg(req, d)
	}
	d.Prefill, d.Decode, d.PrefillScores, d.Topology = "", "", d.PrefillScores[:0], nil
	return r.Decide(req, d)
}

// DecideDisagg picks a prefill worker and a decode worker for a request and explains both (the
// rules are at the top of this file), reusing d's slices; no side effects. Errors:
// *ErrBadMedia, *ErrNoWorker (no eligible prefill or decode worker), *ErrNoDecodeInDomain.
func (r *Router) DecideDisagg(req Request, d *Decision) error {
	sc := r.hashers.Get().(*scratch)
	defer r.hashers.Put(sc)
	total, err := r.lookup(&req, d, sc)
	if err != nil {
		return err
	}
	workers := *r.workers.Load()
	o := &r.opts.Disagg
	d.Prefill, d.Decode = "", ""
	d.Scores, d.PrefillScores, d.Topology = d.Scores[:0], d.PrefillScores[:0], nil
	now := time.Now()
	usable := func(w *worker) string {
		switch {
		case !w.healthy.Load():
			return "unhealthy"
		case len(req.Allow) > 0 && !slices.Contains(req.Allow, w.name):
			return "not in allow-list"
		}
		return ""
	}

	// Where the usable decode workers are.
	domains, _ := r.disagg.domains.Get().(map[string]int)
	if domains == nil {
		domains = map[string]int{}
	}
	defer func() { clear(domains); r.disagg.domains.Put(domains) }()
	decodes, unlabelled := 0, 0
	for _, w := range workers {
		if w.role() != RoleDecode || usable(w) != "" {
			continue
		}
		decodes++
		if o.Level != "" {
			if v, ok := w.labels()[o.Level]; ok {
				domains[v]++
			} else {
				unlabelled++
			}
		}
	}

	// Step 1: the prefill worker.
	preferred := 0
	for _, w := range workers {
		if w.role() != RolePrefill {
			continue
		}
		d.PrefillScores = append(d.PrefillScores, WorkerScore{})
		s := &d.PrefillScores[len(d.PrefillScores)-1]
		r.scoreWorker(s, w, sc, req, total, now)
		s.Cost = r.opts.OverlapWeight*(s.PrefillBlocks+s.EncodeWait) + s.Transfer
		s.TTFT = (s.PrefillBlocks + s.EncodeWait + s.Transfer) * r.msPerBlock()
		if s.Excluded = usable(w); s.Excluded != "" {
			continue
		}
		s.Eligible = true
		if o.Level == "" {
			continue
		}
		v, ok := w.labels()[o.Level]
		s.Domain = v
		switch {
		case !ok && o.Policy == topology.Fail:
			s.Eligible, s.Excluded = false, "no "+o.Level+" label (mismatch policy fail)"
		case ok && domains[v] > 0:
			preferred++
		}
	}
	if preferred > 0 { // seed 004: prefer prefill workers with a decode worker in their domain
		for i := range d.PrefillScores {
			if s := &d.PrefillScores[i]; s.Eligible && domains[s.Domain] == 0 {
				s.Eligible, s.Excluded = false, fmt.Sprintf("no decode worker in its %s %q (others have one)", o.Level, s.Domain)
			}
		}
	}
	pick := Choose(d.PrefillScores, r.opts.Temperature, r.draw())
	if pick < 0 {
		return fmt.Errorf("prefill step: %w", &ErrNoWorker{Workers: len(d.PrefillScores)})
	}
	prefill := d.PrefillScores[pick].Worker
	pw := r.find(prefill)
	plabels := pw.labels()

	// Step 2: the decode worker.
	pv, pok := plabels[o.Level]
	fallback := false
	if o.Level != "" {
		d.Topology = &TopologyChoice{Level: o.Level, Domain: pv, Policy: o.Policy}
		if same := domains[pv]; !pok || same == 0 {
			if decodes == 0 {
				return fmt.Errorf("decode step: %w", &ErrNoWorker{Workers: 0})
			}
			if o.Policy == topology.Fail {
				return &ErrNoDecodeInDomain{Level: o.Level, Domain: pv, Prefill: prefill, Elsewhere: decodes - unlabelled - same, Unlabelled: unlabelled}
			}
			fallback = true
			d.Topology.Fallback = true
		}
	}
	kvBytes := float64(len(req.Tokens)) * o.KVBytesPerToken
	soft := !o.QoS.Empty()
	if soft {
		if d.Topology == nil {
			d.Topology = &TopologyChoice{}
		}
		d.Topology.KVBytes = kvBytes
	}
	for _, w := range workers {
		if w.role() != RoleDecode {
			continue
		}
		d.Scores = append(d.Scores, WorkerScore{})
		s := &d.Scores[len(d.Scores)-1]
		r.scoreWorker(s, w, sc, req, total, now)
		labels := w.labels()
		if soft {
			link, level := o.QoS.Between(plabels, labels)
			s.KVTransfer, s.Link = r.BlocksIn(link.Seconds(kvBytes)), level
			if level == "" {
				s.Link = "local"
			}
		}
		s.Cost = s.DecodeBlocks + o.TransferWeight*s.KVTransfer
		if s.Excluded = usable(w); s.Excluded != "" {
			continue
		}
		s.Eligible = true
		if o.Level == "" {
			continue
		}
		v, ok := labels[o.Level]
		s.Domain = v
		switch {
		case fallback:
		case !ok:
			s.Eligible, s.Excluded = false, "no "+o.Level+" label"
		case v != pv:
			s.Eligible, s.Excluded = false, fmt.Sprintf("%s %q, not the prefill worker's %q", o.Level, v, pv)
		}
	}
	pick = Choose(d.Scores, r.opts.Temperature, r.draw())
	if pick < 0 {
		return fmt.Errorf("decode step: %w", &ErrNoWorker{Workers: len(d.Scores)})
	}
	d.Prefill, d.Decode = prefill, d.Scores[pick].Worker
	d.Worker = d.Decode
	r.decisions.Add(1)
	return nil
}

// scoreWorker fills in a worker's overlap and load terms, all but the cost (Decide's and each
// step of DecideDisagg's differ). Decide writes the same terms out in its loop (its hot path).
func (r *Router) scoreWorker(s *WorkerScore, w *worker, sc *scratch, req Request, total int, now time.Time) {
	bs, isl := r.opts.BlockSize, len(req.Tokens)
	*s = WorkerScore{Worker: w.name}
	s.Overlap = sc.cached.Blocks(w.slot, 0)
	s.OverlapAny = sc.cached.Blocks(w.slot, r.opts.Index.Tiers-1)
	s.ActiveBlocks, s.PrefillTokens, _, s.Reported = r.slots.LoadAt(w.slot, now, r.opts.LoadReportTTL)
	s.NewBlocks = total - sc.active.Blocks(w.slot, 0)
	s.Uncached = max(isl-s.Overlap*bs, 0)
	s.PrefillBlocks = float64(s.PrefillTokens+int64(s.Uncached)) / float64(bs)
	s.DecodeBlocks = float64(s.ActiveBlocks + int64(s.NewBlocks))
	s.EncodeWait = max(req.ReadyIn-float64(s.PrefillTokens)/float64(bs), 0)
	if req.Transfer != nil {
		s.Transfer = req.Transfer(w.name)
	}
}

// draw is a uniform draw for a temperature choice (0 at temperature 0).
func (r *Router) draw() float64 {
	if r.opts.Temperature <= 0 {
		return 0
	}
	r.randMu.Lock()
	defer r.randMu.Unlock()
	return r.rand.Float64()
}

// startDisagg is Start for a disaggregated decision: the prefill step on d.Prefill (its
// uncached tokens to compute, its blocks until PrefillDone), the decode step on decode (the
// prompt's blocks, nothing to prefill: they arrive computed) until FirstToken and Finish.
func (r *Router) startDisagg(id string, d Decision, decode *worker, now time.Time) error {
	p := r.find(d.Prefill)
	if p == nil {
		return &ErrUnknownWorker{Name: d.Prefill}
	}
	uncached := d.Tokens
	for i := range d.PrefillScores {
		if d.PrefillScores[i].Worker == d.Prefill {
			uncached = d.PrefillScores[i].Uncached
		}
	}
	if err := r.slots.Start(id+prefillLeg, p.slot, d.Hashes, d.Tokens, uncached, now); err != nil {
		return err
	}
	r.disagg.legs.Add(1)
	if err := r.slots.Start(id, decode.slot, d.Hashes, d.Tokens, 0, now); err != nil {
		r.PrefillDone(id)
		return err
	}
	return nil
}

// PrefillDone records that a disaggregated request's prefill step ended (the prefill worker
// answered): its load leaves the prefill worker. FirstToken and Finish call it too.
func (r *Router) PrefillDone(id string) {
	if r.disagg.legs.Load() <= 0 {
		return // no disaggregated request was ever started: nothing to look up
	}
	if r.slots.Finish(id + prefillLeg) {
		r.disagg.legs.Add(-1)
	}
}
