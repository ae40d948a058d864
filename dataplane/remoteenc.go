package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/remote"
	"dataplane/dataplane/sequence"
	"dataplane/features"
	"dataplane/native"
	"dataplane/router"
	"dataplane/router/topology"
	"dataplane/transfer/wire"
)

// Remote encoding (package remote). Both directions:
//
//   - Offering: PeerBackend encodes other daemons' items through this daemon's feature store
//     and encoder pool, so a key already cached here is answered without encoding, and what is
//     encoded stays cached (PeerCachePolicy) for the next daemon that asks.
//   - Sending: with SetRemote, a request whose items must be encoded is routed jointly (router
//     Request.Encoders): this daemon's encoders and the best few the fleet announces, each with
//     its queue, the items' calibrated cost and the features' way back (latency + bytes /
//     bandwidth by topology). The items go where the router says (dispatch); an encoder that
//     fails or does not answer in time hands the item to this daemon's own encoders, within the
//     item's deadline.

// LocalEncoder is the name this daemon's own encoders go by in a decision.
const LocalEncoder = "local"

// RemoteOptions configure sending items to the fleet's encoders.
type RemoteOptions struct {
	Client  *remote.Client
	Catalog *remote.Catalog
	// Labels are this daemon's topology; QoS the links by level (topology.QoS.Between); an
	// empty QoS: Link for every other daemon.
	Labels map[string]string
	QoS    topology.QoS
	Link   topology.Link
	// Candidates is how many remote encoders a decision weighs, soonest done first; 4.
	Candidates int
	// Patience is how much longer than predicted an item may take at a remote encoder before
	// it is encoded here instead (and at least MinPatience): 3×, 2 s.
	Patience    float64
	MinPatience time.Duration
}

// PeerCachePolicy is how long items encoded for other daemons stay cached here.
var PeerCachePolicy = features.Policy{Kind: features.KeepForReuse, TTL: 5 * time.Minute}

type remoteState struct {
	o RemoteOptions
	// counts, for metrics
	sent, fellBack, failed atomic.Int64
}

// SetRemote turns on sending items to the fleet's encoders. Call before serving.
func (s *Service) SetRemote(o RemoteOptions) {
	if o.Candidates <= 0 {
		o.Candidates = 4
	}
	if o.Patience <= 1 {
		o.Patience = 3
	}
	if o.MinPatience <= 0 {
		o.MinPatience = 2 * time.Second
	}
	if o.Link.BytesPerSecond <= 0 {
		o.Link = topology.Link{Latency: 200 * time.Microsecond, BytesPerSecond: s.opts.TransferBytesPerSecond}
	}
	s.remote = &remoteState{o: o}
}

// RemoteStats are the counts of items sent to other daemons' encoders: sent, encoded here
// after all (the encoder failed or took too long), failed outright.
func (s *Service) RemoteStats() (sent, fellBack, failed int64) {
	if s.remote == nil {
		return 0, 0, 0
	}
	return s.remote.sent.Load(), s.remote.fellBack.Load(), s.remote.failed.Load()
}

func wireDType(d native.DType) wire.DType {
	switch d {
	case native.F16:
		return wire.DTypeF16
	case native.BF16:
		return wire.DTypeBF16
	}
	return wire.DTypeF32
}

// remoteItem is an item as an encoder elsewhere sees it.
func (s *Service) remoteItem(it *item) remote.Item {
	return remote.Item{Key: it.key, Model: s.models.Name, Modality: it.modality.String(), Tokens: it.tokens,
		Hidden: s.models.Hidden, DType: wireDType(s.models.DType)}
}

// encoderOptions are the places the request's items to encode could go (local: this daemon's
// encoders' ETA for them, which route already has): this daemon's encoders
// first, then the fleet's that run the same model for every one of them (a request's items go
// to one encoder). Nil without remote encoding, or when nothing is to be encoded.
func (r *request) encoderOptions(local time.Duration) []router.EncoderOption {
	s, rs := r.s, r.s.remote
	if rs == nil {
		return nil
	}
	var todo []*item
	for _, it := range r.items {
		if it.job != nil && it.inputs != nil {
			todo = append(todo, it)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	opts := []router.EncoderOption{{Name: LocalEncoder, Link: "local", Encode: s.router.BlocksIn(local.Seconds())}}
	// Every encoder that runs an item's model, kept only if it runs every item's.
	now := time.Now()
	var bytes int64
	for _, it := range todo {
		bytes += s.remoteItem(it).Bytes()
	}
	type acc struct {
		c      remote.Candidate
		encode time.Duration
		n      int
	}
	byName := map[string]*acc{}
	var order []string
	for _, it := range todo {
		for _, c := range rs.o.Catalog.Candidates(s.models.Name, it.modality.String(), it.tokens, rs.o.Candidates*4, now) {
			a := byName[c.Name]
			if a == nil {
				a = &acc{c: c}
				byName[c.Name] = a
				order = append(order, c.Name)
			}
			a.encode += c.Encode
			a.n++
		}
	}
	r.remotes = r.remotes[:0]
	for _, name := range order {
		a := byName[name]
		if a.n != len(todo) {
			continue
		}
		link, level := rs.o.Link, "remote"
		if !rs.o.QoS.Empty() {
			if link, level = rs.o.QoS.Between(rs.o.Labels, a.c.Labels); level == "" {
				level = "local"
			}
		}
		opts = append(opts, router.EncoderOption{Name: name, Link: level, Queue: s.router.BlocksIn(a.c.Queue.Seconds()),
			Encode: s.router.BlocksIn(a.encode.Seconds()), Return: s.router.BlocksIn(link.Seconds(float64(bytes)))})
		a.c.Encode = a.encode
		r.remotes = append(r.remotes, a.c)
		if len(r.remotes) == rs.o.Candidates {
			break
		}
	}
	if len(opts) == 1 {
		return nil // only this daemon: route as without remote encoding
	}
	return opts
}

// dispatch sends the items admitted as misses to the encoder the decision chose (admit held
// them back because remote encoding is on); this daemon's encoders when it chose none.
func (r *request) dispatch(ctx context.Context, d *router.Decision, pri encoderpool.Priority) error {
	var chosen *remote.Candidate
	for i := range r.remotes {
		if r.remotes[i].Name == d.Encoder {
			chosen = &r.remotes[i]
		}
	}
	for _, it := range r.items {
		if it.job == nil || !it.held {
			continue
		}
		it.held = false
		if chosen == nil {
			if err := r.s.shedEncode(ctx, it, it.job); err != nil {
				r.failHeld(err)
				return err
			}
			if err := r.encode(it, it.job, pri); err != nil {
				r.failHeld(err)
				return err
			}
			continue
		}
		r.encodeRemote(ctx, it, *chosen, pri)
	}
	return nil
}

// failHeld fails the jobs of items still held back (the request ends before dispatching them).
func (r *request) failHeld(err error) {
	for _, it := range r.items {
		if it.job != nil && it.held {
			it.held = false
			it.job.Fail(err) //nolint:errcheck // the record reports it to its holders
		}
	}
}

// encodeRemote sends one item to an encoder elsewhere, its features read straight into the
// item's job buffer; if that fails or takes more than Patience × the prediction, the item is
// encoded here (while the item's deadline allows).
func (r *request) encodeRemote(ctx context.Context, it *item, c remote.Candidate, pri encoderpool.Priority) {
	s, rs := r.s, r.s.remote
	job := it.job
	rs.sent.Add(1)
	s.metrics.remoteItems.WithLabelValues("sent").Inc()
	predicted := c.Queue + c.Encode
	patience := max(time.Duration(float64(predicted)*rs.o.Patience), rs.o.MinPatience)
	done := rs.o.Catalog.Sent(c.Name, c.Encode)
	go func() { // owned: ends with the call's timeout, the job's context or the item's deadline
		defer done()
		until := time.Now().Add(patience)
		if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
			until = dl
		}
		cctx, cancel := context.WithDeadline(job.Context(), until)
		start, ri := time.Now(), s.remoteItem(it)
		err := rs.o.Client.Encode(cctx, c.Transfer, ri, it.inputs, job.Buffer().Bytes())
		cancel()
		if err == nil {
			s.metrics.encoded(it.modality, time.Since(start))
			job.Complete(ri.Bytes()) //nolint:errcheck // an abandoned job frees itself
			return
		}
		if job.Context().Err() != nil || ctx.Err() != nil { // nobody waits for it any more
			rs.failed.Add(1)
			s.metrics.remoteItems.WithLabelValues("failed").Inc()
			job.Fail(fmt.Errorf("remote encoder %s: %w", c.Name, err)) //nolint:errcheck
			return
		}
		s.log.Warn("remote encoder failed: encoding here", "request", r.id, "item", it.src.Path, "encoder", c.Name, "err", err)
		rs.fellBack.Add(1)
		s.metrics.remoteItems.WithLabelValues("fell_back").Inc()
		if err := r.encode(it, job, pri); err != nil {
			job.Fail(err) //nolint:errcheck
		}
	}()
}

// PeerBackend is this daemon's side of remote encoding: what package remote's Server calls.
func (s *Service) PeerBackend() remote.Backend { return peerBackend{s} }

type peerBackend struct{ s *Service }

func (b peerBackend) model(it remote.Item) (*encoder.Model, sequence.Modality, error) {
	s := b.s
	switch {
	case it.Model != s.models.Name:
		return nil, 0, fmt.Errorf("model %q: this encoder runs %q", it.Model, s.models.Name)
	case it.Hidden != s.models.Hidden || it.DType != wireDType(s.models.DType):
		return nil, 0, fmt.Errorf("features of width %d in %v: this encoder gives %d in %v", it.Hidden, it.DType, s.models.Hidden, wireDType(s.models.DType))
	case s.models.CountOnly:
		return nil, 0, errors.New("this daemon counts media, it does not encode them")
	}
	mod, err := sequence.ParseModality(it.Modality)
	if err != nil {
		return nil, 0, err
	}
	m, _, err := s.models.ForModality(mod)
	return m, mod, err
}

func (b peerBackend) InputFloats(it remote.Item, frames int) (int, error) {
	m, _, err := b.model(it)
	if err != nil {
		return 0, err
	}
	n := 1
	for _, d := range m.InputShape(frames) {
		n *= d
	}
	return n, nil
}

func (b peerBackend) Encode(ctx context.Context, ri remote.Item, inputs []encoder.Input) ([]byte, func(), error) {
	s := b.s
	m, mod, err := b.model(ri)
	if err != nil {
		return nil, nil, err
	}
	it := &item{modality: mod, model: m, inputs: inputs, key: ri.Key}
	for _, in := range inputs {
		n, err := m.Tokens(in)
		if err != nil {
			return nil, nil, err
		}
		it.rows = append(it.rows, n)
		it.tokens += n
	}
	if it.tokens != ri.Tokens {
		return nil, nil, fmt.Errorf("the inputs make %d feature rows here, the item says %d", it.tokens, ri.Tokens)
	}
	if !s.begin() {
		return nil, nil, errors.New("this daemon is shutting down")
	}
	ok := false
	defer func() {
		if !ok {
			s.active.Done()
		}
	}()
	r := &request{s: s, id: "peer-" + s.NewRequestID()}
	fr, err := s.store.Begin(r.id, PeerCachePolicy)
	if err != nil {
		return nil, nil, err
	}
	rec, job, err := fr.Admit(ctx, features.Item{Key: ri.Key, MediaID: ri.Key.Content, Bytes: ri.Bytes()})
	if err != nil {
		fr.Cancel()
		return nil, nil, err
	}
	s.metrics.item(mod, job == nil)
	if job != nil {
		if err := r.encode(it, job, encoderpool.Interactive); err != nil {
			fr.Cancel()
			return nil, nil, err
		}
	}
	select {
	case <-rec.Ready():
	case <-ctx.Done():
		fr.Cancel()
		return nil, nil, ctx.Err()
	}
	if err := rec.Err(); err != nil {
		fr.Cancel()
		return nil, nil, err
	}
	v, err := rec.Host()
	if err != nil {
		fr.Cancel()
		return nil, nil, err
	}
	ok = true
	release := func() { // the features were sent: cached here for the next daemon that asks
		if fr.Merged() != nil || fr.Prefilled() != nil {
			fr.Cancel()
		}
		s.active.Done()
	}
	return v.Bytes()[:ri.Bytes()], release, nil
}

// EncoderCosts are this daemon's encoders as the fleet hears of them: per modality, the
// calibrated seconds per feature row (none for a daemon that only counts media).
func (s *Service) EncoderCosts() map[string]float64 {
	out := map[string]float64{}
	if s.models.CountOnly {
		return out
	}
	for _, mod := range s.models.Modalities() {
		if m, _, err := s.models.ForModality(mod); err == nil {
			out[mod.String()] = s.pool.SecondsPerToken(m)
		}
	}
	return out
}

// EncodeQueue is the encoding queued ahead of a new item here (its least loaded encoder
// worker's), for the load this daemon reports.
func (s *Service) EncodeQueue() time.Duration {
	var m encoderpool.Model = s.models.Vision
	if s.models.Vision == nil {
		m = s.models.Audio
	}
	return s.pool.ETA(m, 0)
}

// RouterQoS is the routers' per-level link table (--kv-transfer-qos), the features' links too.
func (s *Service) RouterQoS() topology.QoS { return s.opts.Router.Disagg.QoS }
