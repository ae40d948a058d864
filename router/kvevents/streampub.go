package kvevents

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// StreamPublisher publishes workers' batches into the KV-event stream and loses none to a
// reconnect or a NATS restart: each batch stays queued until the stream acknowledges it, and
// a worker has one batch in flight at a time, so its batches are stored in order even when one
// has to be sent again (after an error, a missing acknowledgement, a reconnect). A batch stored
// whose acknowledgement was lost is sent again with the same message id
// (<worker>.<incarnation>.<seq>; the incarnation is this publisher's start, so an engine that
// restarts with seq 0 is not a duplicate) and the server drops the copy within the stream's
// duplicate window (2 minutes). Past its bounds a batch is dropped and counted: the routers
// then see a gap and drop that worker's view, as they would for any lost batch.
type StreamPublisher struct {
	nc          *nats.Conn
	prefix      string
	inbox       string
	incarnation string
	opts        StreamPublisherOptions
	sub         *nats.Subscription

	mu          sync.Mutex
	queues      map[string]*pubQueue
	ready       []*pubQueue // queues with a batch to send and none in flight
	queued      int
	queuedBytes int64
	closed      bool

	wake chan struct{} // one slot: ready is not empty, or an acknowledgement came
	done chan struct{}
	wg   sync.WaitGroup

	Stats StreamPublisherStats
}

// StreamPublisherOptions bound a StreamPublisher. DefaultStreamPublisherOptions has the defaults.
type StreamPublisherOptions struct {
	Prefix         string        // subjects <Prefix>.<worker>; DefaultNATSPrefix
	MaxQueued      int           // batches waiting or in flight, in all; 100,000
	MaxQueuedBytes int64         // their bytes; 256 MiB
	AckWait        time.Duration // a batch not acknowledged within this is sent again; 2s
}

// DefaultStreamPublisherOptions are the defaults above.
func DefaultStreamPublisherOptions() StreamPublisherOptions {
	return StreamPublisherOptions{Prefix: DefaultNATSPrefix, MaxQueued: 100_000, MaxQueuedBytes: 256 << 20, AckWait: 2 * time.Second}
}

// StreamPublisherStats count a StreamPublisher's batches.
type StreamPublisherStats struct {
	Stored     atomic.Int64 // acknowledged by the stream (duplicates included)
	Duplicates atomic.Int64 // acknowledged as already stored: a resend after a lost acknowledgement
	Resent     atomic.Int64 // sent again: an error, no acknowledgement in AckWait, a reconnect
	Dropped    atomic.Int64 // over the bounds: never sent
	Errors     atomic.Int64 // negative acknowledgements (no stream, stream full, ...)
}

type pubQueue struct {
	name     string
	items    []pubItem
	inflight bool
	sentAt   time.Time
	queued   bool // in ready
}

type pubItem struct {
	seq  uint64
	data []byte // seq ‖ batch
}

// NewStreamPublisher starts publishing on nc; Close stops it.
func NewStreamPublisher(nc *nats.Conn, opts StreamPublisherOptions) (*StreamPublisher, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultNATSPrefix
	}
	if opts.MaxQueued <= 0 || opts.MaxQueuedBytes <= 0 || opts.AckWait <= 0 {
		return nil, fmt.Errorf("stream publisher: max queued %d, max queued bytes %d and ack wait %v must be positive",
			opts.MaxQueued, opts.MaxQueuedBytes, opts.AckWait)
	}
	p := &StreamPublisher{nc: nc, prefix: opts.Prefix, inbox: nc.NewRespInbox(), opts: opts,
		incarnation: strconv.FormatInt(time.Now().UnixNano(), 36), queues: map[string]*pubQueue{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	sub, err := nc.Subscribe(p.inbox+".>", p.ack)
	if err != nil {
		return nil, fmt.Errorf("stream publisher: %w", err)
	}
	p.sub = sub
	p.wg.Add(1)
	go p.send()
	return p, nil
}

// Publish queues one batch of a worker (mocker.Publisher's method; payload is the publisher's
// to keep). It never blocks.
func (p *StreamPublisher) Publish(worker string, seq uint64, payload []byte) {
	data := NATSMessage(seq, payload)
	p.mu.Lock()
	if p.closed || p.queued >= p.opts.MaxQueued || p.queuedBytes+int64(len(data)) > p.opts.MaxQueuedBytes {
		p.mu.Unlock()
		p.Stats.Dropped.Add(1)
		return
	}
	q := p.queues[worker]
	if q == nil {
		q = &pubQueue{name: worker}
		p.queues[worker] = q
	}
	q.items = append(q.items, pubItem{seq: seq, data: data})
	p.queued++
	p.queuedBytes += int64(len(data))
	p.readyLocked(q)
	p.mu.Unlock()
}

// readyLocked puts q in line to send if it can. p.mu must be held.
func (p *StreamPublisher) readyLocked(q *pubQueue) {
	if !q.inflight && !q.queued && len(q.items) > 0 {
		q.queued = true
		p.ready = append(p.ready, q)
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// Queued is how many batches wait or are in flight.
func (p *StreamPublisher) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queued
}

// Flush waits until every batch queued so far has been stored, or ctx ends.
func (p *StreamPublisher) Flush(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for p.Queued() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream publisher: %d batches not stored: %w", p.Queued(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close stops sending; batches not stored by then are dropped (Flush first to wait for them).
func (p *StreamPublisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	close(p.done)
	p.wg.Wait()
	_ = p.sub.Unsubscribe()
}

// send is the one goroutine that sends: the heads of ready queues, and again the heads whose
// acknowledgement is overdue or whose connection was replaced.
func (p *StreamPublisher) send() {
	defer p.wg.Done()
	tick := time.NewTicker(max(p.opts.AckWait/4, 10*time.Millisecond))
	defer tick.Stop()
	reconnects := p.nc.Stats().Reconnects
	var batch []*pubQueue
	for {
		select {
		case <-p.done:
			return
		case <-p.wake:
		case <-tick.C:
			now := time.Now()
			r := p.nc.Stats().Reconnects
			p.mu.Lock()
			for _, q := range p.queues {
				if q.inflight && (r != reconnects || now.Sub(q.sentAt) > p.opts.AckWait) {
					q.inflight = false
					p.Stats.Resent.Add(1)
					p.readyLocked(q)
				}
			}
			p.mu.Unlock()
			reconnects = r
		}
		if !p.nc.IsConnected() {
			continue // sent after the reconnect (the ticker finds them)
		}
		p.mu.Lock()
		batch, p.ready = p.ready, batch[:0]
		now := time.Now()
		for _, q := range batch {
			q.queued = false
			q.inflight, q.sentAt = true, now
		}
		p.mu.Unlock()
		for _, q := range batch {
			p.mu.Lock()
			it := q.items[0]
			p.mu.Unlock()
			m := &nats.Msg{Subject: p.prefix + "." + q.name, Reply: p.inbox + "." + q.name + "." + strconv.FormatUint(it.seq, 10),
				Header: nats.Header{"Nats-Msg-Id": []string{q.name + "." + p.incarnation + "." + strconv.FormatUint(it.seq, 10)}},
				Data:   it.data}
			if err := p.nc.PublishMsg(m); err != nil {
				p.mu.Lock()
				q.inflight = false // sent again at the next tick
				p.mu.Unlock()
			}
		}
		clear(batch)
	}
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// ack handles an acknowledgement on <inbox>.<worker>.<seq>.
func (p *StreamPublisher) ack(m *nats.Msg) {
	rest := strings.TrimPrefix(m.Subject, p.inbox+".")
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return
	}
	name := rest[:i]
	seq, err := strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil {
		return
	}
	var a pubAck
	ok := m.Header.Get("Status") == "" && json.Unmarshal(m.Data, &a) == nil && a.Error == nil
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queues[name]
	if q == nil || !q.inflight || len(q.items) == 0 || q.items[0].seq != seq {
		return // late: for a batch sent again and already acknowledged
	}
	q.inflight = false
	if !ok { // no responders (JetStream not up yet), or the stream said no: send it again later
		p.Stats.Errors.Add(1)
		q.sentAt = time.Now()
		q.inflight = true // the ticker sends it again after AckWait
		return
	}
	p.Stats.Stored.Add(1)
	if a.Duplicate {
		p.Stats.Duplicates.Add(1)
	}
	p.queued--
	p.queuedBytes -= int64(len(q.items[0].data))
	q.items[0] = pubItem{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the array go
	}
	p.readyLocked(q)
}
