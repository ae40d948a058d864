package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/bench/mocker"
	"dataplane/router"
	"dataplane/router/fleet"
	"dataplane/router/kvevents"
)

// routerFleet wires a fleet into a router: the workers announced in the bucket are registered
// with the router (through the stream feed, so the batches they published before their
// announcement arrived are applied first) and taken out when they leave; the KV-event stream
// feeds their engines; their load reports reach the slot tracker.
type routerFleet struct {
	sf      *kvevents.StreamFeed
	r       *router.Router
	roles   map[fleet.Role]bool
	model   string
	log     *slog.Logger
	watcher *fleet.Watcher

	// add and remove put an announced worker into routing and take it out: registration with
	// the stream feed (the standalone router), or an LLM worker of serve's service as well.
	add    func(w fleet.Worker) error
	remove func(name string) error

	registered map[string]int64 // routed workers → their announced KV capacity; the watcher's goroutine only
	count      atomic.Int64     // len(registered), for metrics
	refused    atomic.Int64     // announcements not routed to: another role, model or block size, or no slot
	loadStats  fleet.LoadStats
	streamErrs atomic.Int64
}

// fleetRouting says which announced workers a router routes to, and how they join and leave
// it (nil add / remove: registration with the stream feed alone).
type fleetRouting struct {
	nats   *natsConfig
	roles  map[fleet.Role]bool
	model  string // "": any
	add    func(w fleet.Worker) error
	remove func(name string) error
}

// startRouterFleet ensures the stream and the bucket, registers the workers announced now,
// then consumes the stream (so no worker's batches arrive before it is known) and watches for
// changes, until ctx ends; its goroutines join wg.
func startRouterFleet(ctx context.Context, wg *sync.WaitGroup, n *natsClient, c fleetRouting, sf *kvevents.StreamFeed, log *slog.Logger) (*routerFleet, error) {
	if err := n.ensureStream(ctx, c.nats.stream); err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := fleet.OpenBucket(octx, n.js, c.nats.bucket)
	cancel()
	if err != nil {
		return nil, err
	}
	rf := &routerFleet{sf: sf, r: sf.Feed().Router(), roles: c.roles, model: c.model, log: log, registered: map[string]int64{},
		add: c.add, remove: c.remove}
	if rf.add == nil {
		rf.add = func(w fleet.Worker) error { _, err := sf.AddWorker(w.Name); return err }
	}
	if rf.remove == nil {
		rf.remove = sf.RemoveWorker
	}
	rf.watcher = fleet.NewWatcher(b, n.nc, rf)
	wg.Add(1)
	go func() { defer wg.Done(); _ = rf.watcher.Run(ctx) }()
	select {
	case <-rf.watcher.Ready():
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("fleet bucket %s: no answer from the watch in 30s", b.KV.Bucket())
	}
	// Workers' own load reports, beside this router's counts (router.Slots.LoadAt).
	sub, err := fleet.SubscribeLoad(n.nc, c.nats.load, &rf.loadStats, func(name string, l fleet.Load) {
		reqs := l.Running + l.Waiting
		if l.Running < 0 || l.Waiting < 0 {
			reqs = -1
		}
		_ = rf.r.ReportLoad(name, router.LoadReport{ActiveBlocks: l.ActiveBlocks, PrefillTokens: l.PrefillTokens, Requests: reqs})
	})
	if err != nil {
		return nil, err
	}
	wg.Add(2)
	go func() { defer wg.Done(); <-ctx.Done(); _ = sub.Unsubscribe() }()
	go func() {
		defer wg.Done()
		err := sf.Run(ctx, func(err error) {
			rf.streamErrs.Add(1)
			log.Debug("kv event stream", "err", err) // the client recreates its consumer
		})
		if err != nil {
			log.Error("kv event stream", "err", err)
		}
	}()
	log.Info("fleet", "nats", n.url, "bucket", b.KV.Bucket(), "lease", b.Lease, "delete_markers", b.Markers,
		"workers", len(rf.watcher.Workers()), "kv_stream", c.nats.stream.Name, "load_subjects", c.nats.load+".<worker>")
	return rf, nil
}

// ready is /readyz: the bucket has been read and the stream replayed to where it was.
func (rf *routerFleet) ready() error {
	select {
	case <-rf.sf.CaughtUp():
		return nil
	default:
		applied, behind := rf.sf.Position()
		return fmt.Errorf("replaying the kv event stream: at sequence %d, %d behind", applied, behind)
	}
}

// routed says whether an announcement is one this router routes to, and why not.
func (rf *routerFleet) routed(w fleet.Worker) string {
	switch bs := rf.r.Options().BlockSize; {
	case !rf.roles[w.Role]:
		return "role " + string(w.Role) + " not routed (--roles)"
	case rf.model != "" && w.Model != rf.model:
		return "model " + w.Model + " is not --model " + rf.model
	case w.BlockSize != 0 && w.BlockSize != bs:
		return fmt.Sprintf("block size %d, the router's is %d: its events could never match", w.BlockSize, bs)
	}
	return ""
}

// Join registers an announced worker (fleet.Handler).
func (rf *routerFleet) Join(w fleet.Worker) {
	if why := rf.routed(w); why != "" {
		rf.refused.Add(1)
		rf.log.Info("worker not routed", "worker", w.Name, "why", why)
		return
	}
	if err := rf.add(w); err != nil {
		rf.refused.Add(1)
		rf.log.Warn("worker not routed", "worker", w.Name, "err", err)
		return
	}
	rf.registered[w.Name] = -1
	rf.count.Store(int64(len(rf.registered)))
	rf.setInfo(w)
	rf.setCapacity(w)
	rf.log.Info("worker joined", "worker", w.Name, "model", w.Model, "role", w.Role, "endpoint", w.Endpoint,
		"kv_blocks", w.KVBlocks, "labels", w.Labels)
}

// Update follows a heartbeat: a changed capacity, or a worker that could not join before.
func (rf *routerFleet) Update(w fleet.Worker) {
	if _, ok := rf.registered[w.Name]; !ok {
		if rf.routed(w) == "" {
			rf.Join(w) // refused earlier (no slot then): try again
		}
		return
	}
	rf.setInfo(w)
	rf.setCapacity(w)
}

// setInfo gives the router the worker's role and topology labels (disaggregated routing) when
// they changed.
func (rf *routerFleet) setInfo(w fleet.Worker) {
	info := workerInfo(w)
	if old := rf.r.WorkerInfo(w.Name); old.Role == info.Role && maps.Equal(old.Labels, info.Labels) {
		return
	}
	if err := rf.r.SetWorkerInfo(w.Name, info); err != nil {
		rf.log.Warn("worker info", "worker", w.Name, "err", err)
	}
}

func (rf *routerFleet) setCapacity(w fleet.Worker) {
	if w.KVBlocks <= 0 || rf.registered[w.Name] == w.KVBlocks {
		return
	}
	if err := rf.sf.Feed().SetCapacity(w.Name, w.KVBlocks); err == nil {
		rf.registered[w.Name] = w.KVBlocks
	}
}

// Leave takes a worker out of routing and the index.
func (rf *routerFleet) Leave(name, why string) {
	if _, ok := rf.registered[name]; !ok {
		return
	}
	delete(rf.registered, name)
	rf.count.Store(int64(len(rf.registered)))
	if err := rf.remove(name); err != nil {
		rf.log.Warn("worker left", "worker", name, "why", why, "err", err)
		return
	}
	rf.log.Info("worker left", "worker", name, "why", why)
}

var (
	fleetWorkersDesc = prometheus.NewDesc("dataplane_router_fleet_workers",
		"Announced workers this router routes to.", nil, nil)
	fleetEventsDesc = prometheus.NewDesc("dataplane_router_fleet_events_total",
		"Announcement bucket events: join, update, leave (expired: by the lease), refused (not routed here), bad (did not parse), rewatch.", []string{"event"}, nil)
	fleetLoadDesc = prometheus.NewDesc("dataplane_router_fleet_load_reports_total",
		"Load reports received, and bad ones.", []string{"outcome"}, nil)
)

func (rf *routerFleet) Describe(ch chan<- *prometheus.Desc) {
	ch <- fleetWorkersDesc
	ch <- fleetEventsDesc
	ch <- fleetLoadDesc
}

func (rf *routerFleet) Collect(ch chan<- prometheus.Metric) {
	st := &rf.watcher.Stats
	ch <- prometheus.MustNewConstMetric(fleetWorkersDesc, prometheus.GaugeValue, float64(rf.count.Load()))
	for event, v := range map[string]int64{"join": st.Joins.Load(), "update": st.Updates.Load(), "leave": st.Leaves.Load(),
		"expired": st.Expired.Load(), "refused": rf.refused.Load(), "bad": st.BadValues.Load(), "rewatch": st.Rewatches.Load()} {
		ch <- prometheus.MustNewConstMetric(fleetEventsDesc, prometheus.CounterValue, float64(v), event)
	}
	ch <- prometheus.MustNewConstMetric(fleetLoadDesc, prometheus.CounterValue, float64(rf.loadStats.Received.Load()), "received")
	ch <- prometheus.MustNewConstMetric(fleetLoadDesc, prometheus.CounterValue, float64(rf.loadStats.BadReports.Load()), "bad")
}

// rolesList is the roles, sorted (for the log).
func rolesList(roles map[fleet.Role]bool) []string {
	var out []string
	for r := range roles {
		out = append(out, string(r))
	}
	slices.Sort(out)
	return out
}

// announceFleet announces a mock fleet's engines in the bucket and publishes their loads,
// until ctx ends (then it withdraws them); its goroutines join wg. The loads are read from the
// engines' loops by one goroutine every fleet.DefaultLoadEvery; heartbeats and load reports
// take the latest, so a busy loop never delays a heartbeat.
func announceFleet(ctx context.Context, wg *sync.WaitGroup, c *mockConfig, f *mocker.Fleet, log *slog.Logger) {
	started := time.Now().UTC()
	var latest atomic.Pointer[[]fleet.Load]
	read := func() {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		ls, err := f.Loads(lctx)
		if err != nil {
			return // the loops are stopping
		}
		now, out := time.Now(), make([]fleet.Load, len(ls))
		for i, l := range ls {
			out[i] = fleet.Load{Running: int64(l.Running), Waiting: int64(l.Waiting), ActiveBlocks: int64(l.ActiveBlocks),
				PrefillTokens: int64(l.PrefillTokens), KVBlocks: int64(l.Blocks), At: now}
		}
		latest.Store(&out)
	}
	read()
	e := c.fleet.Engine
	workers := func() []fleet.Worker {
		ls := latest.Load()
		out := make([]fleet.Worker, f.Len())
		for i := range out {
			out[i] = fleet.Worker{Name: f.Engine(i).Name(), Model: c.model, Role: fleet.Role(c.role),
				Endpoint: fmt.Sprintf("%s/engines/%d", c.advertise, i), KVBlocks: int64(e.Blocks), BlockSize: e.BlockSize,
				Labels: c.engineLabels(i), Started: started}
			if ls != nil {
				out[i].Load = &(*ls)[i]
			}
		}
		return out
	}
	a := fleet.NewAnnouncer(c.natsClient.js, c.nats.bucket, workers)
	a.OnError = func(err error) { log.Warn("announce", "err", err) }
	lp := fleet.NewLoadPublisher(c.natsClient.nc, c.nats.load, func() []fleet.WorkerLoad {
		ls := latest.Load()
		if ls == nil {
			return nil
		}
		out := make([]fleet.WorkerLoad, len(*ls))
		for i, l := range *ls {
			l.At = time.Time{}
			out[i] = fleet.WorkerLoad{Name: f.Engine(i).Name(), Load: l}
		}
		return out
	})
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := a.Run(ctx); err != nil {
			log.Error("announce", "err", err)
		}
	}()
	go func() { defer wg.Done(); _ = lp.Run(ctx) }()
	go func() {
		defer wg.Done()
		t := time.NewTicker(fleet.DefaultLoadEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				read()
			}
		}
	}()
	log.Info("announcing", "engines", f.Len(), "bucket", c.nats.bucket.Bucket, "endpoint", c.advertise+"/engines/<i>",
		"model", c.model, "role", c.role, "labels", c.labels, "zones", c.layout.Zones, "racks", c.layout.Racks, "load_subjects", c.nats.load+".<engine>")
}

// parseLabels reads key=value,... (topology labels).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		out[k] = v
	}
	if len(out) == 0 {
		return nil, nil
	}
	w := fleet.Worker{Name: "x", Role: fleet.Aggregated, Labels: out}
	return out, w.Check()
}

// announceDaemon announces serve in the fleet as an encoder (its media encoders, behind its
// OpenAI API) until the returned stop, which withdraws it.
// Its transfer address and its encoders' calibrated costs (encodes, read at each heartbeat) let
// other daemons send it items (remote encoding).
func announceDaemon(ctx context.Context, n *natsClient, sf *serveFlags, labels map[string]string, addr net.Addr, model, transfer string, encodes func() []fleet.EncoderModel, log *slog.Logger) (stop func()) {
	name, endpoint := daemonName(sf, addr), sf.advertise
	if endpoint == "" {
		endpoint = "http://" + addr.String()
	}
	w := fleet.Worker{Name: name, Model: model, Role: fleet.Encoder, Endpoint: endpoint, Labels: labels, Started: time.Now().UTC(), Transfer: transfer}
	a := fleet.NewAnnouncer(n.js, sf.nats.bucket, func() []fleet.Worker {
		if transfer != "" {
			w.Encodes = encodes()
		}
		return []fleet.Worker{w}
	})
	a.OnError = func(err error) { log.Warn("announce", "err", err) }
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			log.Error("announce", "err", err)
		}
	}()
	log.Info("fleet", "nats", n.url, "name", name, "role", fleet.Encoder, "endpoint", endpoint, "bucket", sf.nats.bucket.Bucket)
	return func() { cancel(); <-done }
}

// daemonName is the daemon's name in the fleet: --fleet-name, else dataplane-HOST-PORT.
func daemonName(sf *serveFlags, addr net.Addr) string {
	if sf.fleetName != "" {
		return sf.fleetName
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(addr.String())
	return fleetToken("dataplane-" + host + "-" + port)
}

// fleetToken makes s a worker name: characters other than A-Z a-z 0-9 _ - become -, at most
// fleet.MaxNameLen of them.
func fleetToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), fleet.MaxNameLen)])
}
