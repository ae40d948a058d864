package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Load reports go out on core NATS: the latest report is all a router needs, so nothing is
// stored and a lost one is replaced by the next.

// WorkerLoad is a worker's name and its load.
type WorkerLoad struct {
	Name string
	Load Load
}

// LoadPublisher publishes workers' loads on <prefix>.<worker>, as JSON (Load), at a bounded
// rate: every Every it reads the loads and publishes those that changed, and the others at
// least every MaxQuiet, so a router can tell a quiet worker from a silent one. At most one
// message per worker per Every.
type LoadPublisher struct {
	nc       *nats.Conn
	prefix   string
	list     func() []WorkerLoad
	Every    time.Duration // how often loads are read; DefaultLoadEvery
	MaxQuiet time.Duration // the longest a worker goes without a report; DefaultLoadQuiet

	Published, Errors atomic.Int64
}

// Publishing rates: a router treats a report older than three MaxQuiet periods as stale.
const (
	DefaultLoadEvery = 250 * time.Millisecond
	DefaultLoadQuiet = time.Second
)

// NewLoadPublisher publishes the loads list returns under prefix ("": DefaultLoadPrefix).
func NewLoadPublisher(nc *nats.Conn, prefix string, list func() []WorkerLoad) *LoadPublisher {
	if prefix == "" {
		prefix = DefaultLoadPrefix
	}
	return &LoadPublisher{nc: nc, prefix: prefix, list: list, Every: DefaultLoadEvery, MaxQuiet: DefaultLoadQuiet}
}

type sentLoad struct {
	l  Load
	at time.Time
}

// Run publishes until ctx ends.
func (p *LoadPublisher) Run(ctx context.Context) error {
	if p.Every <= 0 || p.MaxQuiet < p.Every {
		return fmt.Errorf("load publisher: every %v and max quiet %v: want 0 < every <= max quiet", p.Every, p.MaxQuiet)
	}
	last := map[string]sentLoad{}
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		now := time.Now()
		seen := make(map[string]bool, len(last))
		for _, wl := range p.list() {
			seen[wl.Name] = true
			prev, ok := last[wl.Name]
			l := wl.Load
			l.At = time.Time{} // compared without the time
			if ok && l == prev.l && now.Sub(prev.at) < p.MaxQuiet {
				continue
			}
			out := wl.Load
			out.At = now
			msg, err := json.Marshal(out)
			if err == nil {
				err = p.nc.Publish(p.prefix+"."+wl.Name, msg)
			}
			if err != nil {
				p.Errors.Add(1)
				continue
			}
			p.Published.Add(1)
			last[wl.Name] = sentLoad{l: l, at: now}
		}
		for name := range last {
			if !seen[name] {
				delete(last, name)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// LoadStats count load reports a subscriber could not use.
type LoadStats struct {
	Received   atomic.Int64
	BadReports atomic.Int64 // not a worker name, or not a Load
}

// SubscribeLoad hands every load report on <prefix>.<worker> to fn, one at a time on the
// subscription's goroutine, until the subscription is drained or unsubscribed. Reports that do
// not parse are counted and dropped; so are reports past the client's pending limits (a slow
// handler): the next report replaces them.
func SubscribeLoad(nc *nats.Conn, prefix string, stats *LoadStats, fn func(name string, l Load)) (*nats.Subscription, error) {
	if prefix == "" {
		prefix = DefaultLoadPrefix
	}
	sub, err := nc.Subscribe(prefix+".*", func(m *nats.Msg) {
		stats.Received.Add(1)
		name := strings.TrimPrefix(m.Subject, prefix+".")
		l, err := ParseLoad(m.Data)
		if err != nil || !ValidName(name) {
			stats.BadReports.Add(1)
			return
		}
		fn(name, l)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s.*: %w", prefix, err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s.*: %w", prefix, err)
	}
	return sub, nil
}
