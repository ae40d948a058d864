package kvevents

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// KV events in a JetStream stream: the NATS format (nats.go: subject <prefix>.<worker>,
// payload seq ‖ msgpack batch) kept by the server with bounded retention, so a router replica
// that starts late, restarts or falls behind reads the same history as the others and builds
// the same index. Publishers need nothing JetStream-specific: a core-NATS publish on a subject
// of the stream is stored (bench/mocker.NATSPublisher, the relay).

// StreamOptions configure the KV-event stream. DefaultStreamOptions has the defaults.
type StreamOptions struct {
	Name     string        // the stream; "DATAPLANE_KV"
	Prefix   string        // its subjects are <Prefix>.<worker>; DefaultNATSPrefix
	MaxAge   time.Duration // batches older than this are dropped; 24h
	MaxBytes int64         // the oldest batches go past this size; 1 GiB
	// Storage: file (the default) keeps the history across a NATS restart.
	Storage  jetstream.StorageType
	Replicas int // copies in a JetStream cluster; 1
}

// DefaultStreamName is the KV-event stream's name.
const DefaultStreamName = "DATAPLANE_KV"

// DefaultStreamOptions: DATAPLANE_KV on dataplane.kv.>, a day or 1 GiB, on file.
func DefaultStreamOptions() StreamOptions {
	return StreamOptions{Name: DefaultStreamName, Prefix: DefaultNATSPrefix, MaxAge: 24 * time.Hour, MaxBytes: 1 << 30,
		Storage: jetstream.FileStorage, Replicas: 1}
}

// EnsureStream creates the stream or brings an existing one to these limits. Every process
// that publishes or consumes calls it, so whoever starts first creates it; the same options
// again change nothing, other limits replace the stream's (give every process the same flags).
func EnsureStream(ctx context.Context, js jetstream.JetStream, o StreamOptions) (jetstream.Stream, error) {
	if o.MaxAge <= 0 || o.MaxBytes <= 0 {
		return nil, fmt.Errorf("kv event stream %s: max age %v and max bytes %d must be positive", o.Name, o.MaxAge, o.MaxBytes)
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: o.Name,
		Description: "dataplane KV events: <prefix>.<worker>, seq (8 bytes BE) then a vLLM msgpack batch",
		Subjects:    []string{o.Prefix + ".>"}, MaxAge: o.MaxAge, MaxBytes: o.MaxBytes, Storage: o.Storage,
		Replicas: max(o.Replicas, 1), Discard: jetstream.DiscardOld, Retention: jetstream.LimitsPolicy})
	if err != nil {
		return nil, fmt.Errorf("kv event stream %s: %w", o.Name, err)
	}
	return s, nil
}

// StreamFeedOptions configure a StreamFeed. DefaultStreamFeedOptions has the defaults.
type StreamFeedOptions struct {
	Stream StreamOptions
	// StartSeq is the stream sequence to start from; 0: the whole stream (what a replica that
	// must converge with the others needs).
	StartSeq uint64
	// Batches for workers not registered yet (their announcement is still on its way), or
	// catching up, wait, up to these bounds in all, the oldest dropped first; a worker's
	// batches are applied when it is registered (StreamFeed.AddWorker). 4,096 batches, 64 MiB.
	MaxWaiting      int
	MaxWaitingBytes int64
	// CatchUpTimeout bounds a joining worker's read of its history; 1 minute.
	CatchUpTimeout time.Duration
}

// DefaultStreamFeedOptions are the defaults above.
func DefaultStreamFeedOptions() StreamFeedOptions {
	return StreamFeedOptions{Stream: DefaultStreamOptions(), MaxWaiting: 4096, MaxWaitingBytes: 64 << 20, CatchUpTimeout: time.Minute}
}

// StreamStats count what a StreamFeed did with the stream's messages.
type StreamStats struct {
	Messages        atomic.Int64 // handled
	Waited          atomic.Int64 // for a worker not registered yet: held
	DroppedWaiting  atomic.Int64 // held past the bounds, or whose worker never came: dropped
	BadMessages     atomic.Int64 // shorter than the sequence number, or not on <prefix>.<worker>
	Resets          atomic.Int64 // consumer errors reported by the client (it recreates the consumer itself)
	CaughtUp        atomic.Int64 // batches a joining worker read again from the stream
	CatchUpFailures atomic.Int64 // joins whose history could not be read: the waiting batches only
}

// StreamFeed applies the KV-event stream to a Feed's workers with one ordered consumer: the
// client recreates it after a reconnect or a server restart from the last sequence it handed
// over, so nothing the stream holds is skipped or applied twice. Registration goes through it
// (AddWorker, RemoveWorker): a worker registered after the consumer has passed some of its
// batches (it was announced late, or it left and came back) first reads them again from the
// stream with an ordered consumer of its own subject, so its view is the stream's whole history
// of it, whenever it joined, as on every other replica. Batches that arrive meanwhile wait
// (bounded) and follow.
type StreamFeed struct {
	feed  *Feed
	js    jetstream.JetStream
	opts  StreamFeedOptions
	Stats StreamStats

	mu           sync.Mutex      // serialises engines' batches with registration; guards waiting, joining, applied
	joining      map[string]bool // registered, catching up from the stream: their batches wait
	waiting      map[string][]waitingBatch
	order        []waitingRef // every waiting batch, oldest first (entries of applied ones stay until compactOrder)
	waitingBytes int64
	waitingCount int

	applied   atomic.Uint64 // the last stream sequence handled
	behind    atomic.Uint64 // messages the consumer had still to deliver after it
	caughtUp  chan struct{}
	closeOnce sync.Once
}

type waitingBatch struct {
	streamSeq uint64
	data      []byte // seq ‖ batch
}

type waitingRef struct {
	name      string
	streamSeq uint64
}

// NewStreamFeed feeds f from the stream on js; Run consumes it.
func NewStreamFeed(f *Feed, js jetstream.JetStream, opts StreamFeedOptions) *StreamFeed {
	return &StreamFeed{feed: f, js: js, opts: opts, waiting: map[string][]waitingBatch{}, joining: map[string]bool{},
		caughtUp: make(chan struct{})}
}

// Feed is the feed the stream is applied to.
func (s *StreamFeed) Feed() *Feed { return s.feed }

// AddWorker registers a worker with the feed (Feed.AddWorker) and brings its engine up to the
// consumer's position: the worker's batches the consumer has passed are read again from the
// stream (its subject only), then the batches that waited are applied. Without a stream
// (js nil) or when the stream cannot be read, the waiting batches alone are applied (counted
// in Stats.CatchUpFailures). It returns once the engine is current.
func (s *StreamFeed) AddWorker(name string) (*Engine, error) {
	s.mu.Lock()
	e, err := s.feed.AddWorker(name)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	upTo := s.applied.Load()
	s.joining[name] = true // its batches wait while it catches up, without the lock
	s.mu.Unlock()

	from := uint64(0) // the waiting batches after what the catch-up applied
	if upTo > 0 && s.js != nil {
		if err := s.catchUp(e, name, upTo); err != nil {
			s.Stats.CatchUpFailures.Add(1)
		} else {
			from = upTo
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.waiting[name] {
		if b.streamSeq > from {
			seq, _ := be64(b.data[:8])
			e.Live(seq, b.data[8:], nil)
		}
		s.waitingBytes -= int64(len(b.data))
		s.waitingCount--
	}
	delete(s.waiting, name)
	delete(s.joining, name)
	s.compactOrder()
	return e, nil
}

// catchUp applies the worker's batches in the stream up to stream sequence upTo to e, with an
// ordered consumer of the worker's subject alone. e is registered but fed by nobody else.
func (s *StreamFeed) catchUp(e *Engine, name string, upTo uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CatchUpTimeout)
	defer cancel()
	subject := s.opts.Stream.Prefix + "." + name
	st, err := s.js.Stream(ctx, s.opts.Stream.Name)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return err
	}
	if info.State.Subjects[subject] == 0 {
		return nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return err
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if md.Sequence.Stream > upTo {
			return nil // the main consumer has it, or will
		}
		if data := m.Data(); len(data) >= 8 {
			seq, _ := be64(data[:8])
			e.Live(seq, data[8:], nil)
			s.Stats.CaughtUp.Add(1)
		}
		if md.NumPending == 0 || md.Sequence.Stream == upTo {
			return nil
		}
	}
}

// RemoveWorker takes a worker out of the feed (Feed.RemoveWorker: its index entries go); its
// later batches wait again, as a new worker's would.
func (s *StreamFeed) RemoveWorker(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.feed.RemoveWorker(name)
}

// CaughtUp is closed once the consumer has delivered everything the stream held when Run
// started (at once for an empty stream): from then on the index is as current as the stream.
func (s *StreamFeed) CaughtUp() <-chan struct{} { return s.caughtUp }

// Position is the last stream sequence handled and how many messages were still to come after
// it at the time.
func (s *StreamFeed) Position() (applied, behind uint64) { return s.applied.Load(), s.behind.Load() }

// Run consumes the stream until ctx ends. The stream must exist (EnsureStream). Errors the
// client recovers from (a reconnect, a missed heartbeat: it recreates the consumer) are counted
// in Stats.Resets and go to onErr (nil: ignored); Run returns only when it cannot start, or
// when ctx ends.
func (s *StreamFeed) Run(ctx context.Context, onErr func(error)) error {
	st, err := s.js.Stream(ctx, s.opts.Stream.Name)
	if err != nil {
		return fmt.Errorf("kv event stream %s: %w", s.opts.Stream.Name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("kv event stream %s: %w", s.opts.Stream.Name, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 || last < s.opts.StartSeq {
		s.closeOnce.Do(func() { close(s.caughtUp) })
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if s.opts.StartSeq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, s.opts.StartSeq
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("kv event stream %s: consumer: %w", s.opts.Stream.Name, err)
	}
	prefix := s.opts.Stream.Prefix + "."
	cc, err := cons.Consume(func(m jetstream.Msg) { s.handle(m, prefix, last) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.Stats.Resets.Add(1)
			if onErr != nil {
				onErr(err)
			}
		}))
	if err != nil {
		return fmt.Errorf("kv event stream %s: consume: %w", s.opts.Stream.Name, err)
	}
	<-ctx.Done()
	cc.Stop()
	select { // the handler in progress, if any, finishes first
	case <-cc.Closed():
	case <-time.After(5 * time.Second):
	}
	return nil
}

func (s *StreamFeed) handle(m jetstream.Msg, prefix string, lastAtStart uint64) {
	md, err := m.Metadata()
	if err != nil {
		s.Stats.BadMessages.Add(1)
		return
	}
	s.Stats.Messages.Add(1)
	name, ok := strings.CutPrefix(m.Subject(), prefix)
	data := m.Data()
	s.mu.Lock()
	switch e := s.feed.Engine(name); {
	case !ok || len(data) < 8:
		s.Stats.BadMessages.Add(1)
	case e != nil && !s.joining[name]:
		seq, _ := be64(data[:8])
		e.Live(seq, data[8:], nil)
	default:
		s.wait(name, md.Sequence.Stream, data)
	}
	s.applied.Store(md.Sequence.Stream) // under the lock: AddWorker reads where the consumer is
	s.mu.Unlock()
	s.behind.Store(md.NumPending)
	if md.NumPending == 0 || md.Sequence.Stream >= lastAtStart {
		s.closeOnce.Do(func() { close(s.caughtUp) })
	}
}

// wait holds a batch for a worker not registered yet. s.mu must be held.
func (s *StreamFeed) wait(name string, streamSeq uint64, data []byte) {
	s.Stats.Waited.Add(1)
	s.waiting[name] = append(s.waiting[name], waitingBatch{streamSeq: streamSeq, data: data})
	s.order = append(s.order, waitingRef{name: name, streamSeq: streamSeq})
	s.waitingBytes += int64(len(data))
	s.waitingCount++
	for (s.waitingCount > s.opts.MaxWaiting || s.waitingBytes > s.opts.MaxWaitingBytes) && len(s.order) > 0 {
		ref := s.order[0]
		s.order = s.order[1:]
		held := s.waiting[ref.name]
		if len(held) == 0 || held[0].streamSeq != ref.streamSeq {
			continue // applied when its worker came
		}
		s.Stats.DroppedWaiting.Add(1)
		s.waitingBytes -= int64(len(held[0].data))
		s.waitingCount--
		if len(held) == 1 {
			delete(s.waiting, ref.name)
		} else {
			s.waiting[ref.name] = held[1:]
		}
	}
	s.compactOrder()
}

// compactOrder drops the entries of batches no longer waiting (applied when their worker came)
// once they outnumber the waiting ones, and lets a drained queue's array go. s.mu must be held.
// Without it, workers that come and go with batches waiting for them each time would leave an
// entry a batch for the life of the process.
func (s *StreamFeed) compactOrder() {
	if len(s.order) > 2*s.waitingCount+1024 {
		kept := s.order[:0]
		for _, ref := range s.order {
			// A worker's batches leave its queue from the front or all at once, in stream order.
			if held := s.waiting[ref.name]; len(held) > 0 && ref.streamSeq >= held[0].streamSeq {
				kept = append(kept, ref)
			}
		}
		clear(s.order[len(kept):])
		s.order = kept
	}
	if cap(s.order) > 1024 && len(s.order) < cap(s.order)/4 {
		s.order = append([]waitingRef(nil), s.order...) // let a drained queue's array go
	}
}

// Waiting is how many batches wait for their worker, and their bytes.
func (s *StreamFeed) Waiting() (batches int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitingCount, s.waitingBytes
}

// NewStreamCollector exports a StreamFeed's counters: dataplane_router_kv_jetstream_messages_total{outcome},
// dataplane_router_kv_jetstream_sequence (the last stream sequence handled),
// dataplane_router_kv_jetstream_behind (messages still to deliver after it),
// dataplane_router_kv_jetstream_waiting_batches.
func NewStreamCollector(s *StreamFeed) prometheus.Collector { return &streamCollector{s: s} }

type streamCollector struct{ s *StreamFeed }

var (
	streamMessagesDesc = prometheus.NewDesc("dataplane_router_kv_jetstream_messages_total",
		"KV-event stream messages by outcome: handled, waited (for a worker not registered yet), dropped_waiting, bad, consumer_reset, caught_up (read again for a joining worker), catch_up_failed (joins).", []string{"outcome"}, nil)
	streamSeqDesc = prometheus.NewDesc("dataplane_router_kv_jetstream_sequence",
		"The last KV-event stream sequence this router handled.", nil, nil)
	streamBehindDesc = prometheus.NewDesc("dataplane_router_kv_jetstream_behind",
		"KV-event stream messages still to deliver after the last one handled.", nil, nil)
	streamWaitingDesc = prometheus.NewDesc("dataplane_router_kv_jetstream_waiting_batches",
		"KV-event batches held for workers not registered yet.", nil, nil)
)

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamMessagesDesc
	ch <- streamSeqDesc
	ch <- streamBehindDesc
	ch <- streamWaitingDesc
}

func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	st := &c.s.Stats
	for outcome, v := range map[string]int64{"handled": st.Messages.Load(), "waited": st.Waited.Load(),
		"dropped_waiting": st.DroppedWaiting.Load(), "bad": st.BadMessages.Load(), "consumer_reset": st.Resets.Load(),
		"caught_up": st.CaughtUp.Load(), "catch_up_failed": st.CatchUpFailures.Load()} {
		ch <- prometheus.MustNewConstMetric(streamMessagesDesc, prometheus.CounterValue, float64(v), outcome)
	}
	applied, behind := c.s.Position()
	ch <- prometheus.MustNewConstMetric(streamSeqDesc, prometheus.GaugeValue, float64(applied))
	ch <- prometheus.MustNewConstMetric(streamBehindDesc, prometheus.GaugeValue, float64(behind))
	n, _ := c.s.Waiting()
	ch <- prometheus.MustNewConstMetric(streamWaitingDesc, prometheus.GaugeValue, float64(n))
}
