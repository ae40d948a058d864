package fleet

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"dataplane/router/internal/natstest"
)

// recorder is a Handler that keeps what it heard.
type recorder struct {
	mu     sync.Mutex
	now    map[string]Worker
	joins  int
	leaves map[string]string // name → why, last leave
	leftAt map[string]time.Time
}

func newRecorder() *recorder {
	return &recorder{now: map[string]Worker{}, leaves: map[string]string{}, leftAt: map[string]time.Time{}}
}

func (r *recorder) Join(w Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now[w.Name] = w
	r.joins++
}

func (r *recorder) Update(w Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now[w.Name] = w
}

func (r *recorder) Leave(name, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.now, name)
	r.leaves[name] = why
	r.leftAt[name] = time.Now()
}

func (r *recorder) has(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.now[name]
	return ok
}

func (r *recorder) why(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaves[name]
}

func watch(t *testing.T, ctx context.Context, b *Bucket, nc *nats.Conn) (*Watcher, *recorder) {
	rec := newRecorder()
	w := NewWatcher(b, nc, rec)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	t.Cleanup(wg.Wait)
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher not ready")
	}
	return w, rec
}

func TestParseWorker(t *testing.T) {
	ok := Worker{Name: "mock-0", Role: Aggregated, Model: "m", Endpoint: "http://127.0.0.1:1/engines/0", KVBlocks: 100,
		BlockSize: 16, Labels: map[string]string{"zone": "a"}}
	v, err := json.Marshal(ok)
	require.NoError(t, err)
	w, err := ParseWorker("mock-0", v)
	require.NoError(t, err)
	require.Equal(t, "a", w.Labels["zone"])

	f := func(key, value, want string) {
		t.Helper()
		_, err := ParseWorker(key, []byte(value))
		require.ErrorContains(t, err, want)
	}
	f("mock-0", string(v[:len(v)-1]), "unexpected end")
	f("other", string(v), `announced under key "other"`)
	f("a.b", `{"name":"a.b","role":"decode"}`, `name "a.b"`)
	f("a", `{"name":"a","role":"chef"}`, `role "chef"`)
	f("a", `{"name":"a","role":"decode","kv_blocks":-1}`, "kv_blocks -1")
	f("a", `{"name":"a","role":"decode","labels":{"":"x"}}`, "label")
	f("a", `{"name":"a","role":"decode","endpoint":"`+strings.Repeat("x", MaxValueBytes)+`"}`, "bytes, at most")
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	raw, _ := json.Marshal(Worker{Name: "a", Role: Decode, Labels: many})
	f("a", string(raw), "labels: 33")
	f("a", `{"name":"a","role":"encoder","encodes":[{"model":"m","modality":"image","seconds_per_token":-1}]}`, "encodes[0]")
	enc, err := ParseWorker("e", []byte(`{"name":"e","role":"encoder","transfer":"tcp://127.0.0.1:9","encodes":[{"model":"m","modality":"image","seconds_per_token":1e-4}]}`))
	require.NoError(t, err)
	require.Equal(t, []EncoderModel{{Model: "m", Modality: "image", SecondsPerToken: 1e-4}}, enc.Encodes)
	_, err = ParseLoad([]byte(`{"encode_seconds":-2}`))
	require.ErrorContains(t, err, "encode_seconds -2")
	l, err := ParseLoad([]byte(`{"encode_seconds":1.5}`))
	require.NoError(t, err)
	require.Equal(t, 1.5, l.EncodeSeconds)
	require.True(t, ValidName("Mock_0-1"))
	require.False(t, ValidName(""))
	require.False(t, ValidName("a*"))
	require.False(t, ValidName(strings.Repeat("a", MaxNameLen+1)))
}

func FuzzParseWorker(f *testing.F) {
	f.Add("mock-0", []byte(`{"name":"mock-0","role":"aggregated","labels":{"a":"b"},"load":{"running":1}}`))
	f.Add("x", []byte(`{"name":"x","role":"encoder","kv_blocks":1e3}`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		w, err := ParseWorker(key, value)
		if err != nil {
			return
		}
		require.NoError(t, w.Check())
		raw, err := json.Marshal(w)
		require.NoError(t, err)
		again, err := ParseWorker(key, raw)
		require.NoError(t, err)
		require.Equal(t, w.Name, again.Name)
	})
}

func FuzzParseLoad(f *testing.F) {
	f.Add([]byte(`{"running":1,"waiting":2,"active_blocks":3,"prefill_tokens":-1,"kv_blocks":5,"at":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"at":"not a time"}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		l, err := ParseLoad(value)
		if err != nil {
			return
		}
		raw, err := json.Marshal(l)
		if err != nil {
			return // a time json cannot write back (a year past 9999)
		}
		again, err := ParseLoad(raw)
		require.NoError(t, err)
		require.Equal(t, l.Running, again.Running)
	})
}

// Announced workers are seen within a heartbeat, updates follow, a worker dropped from the list
// and all of them at the announcer's stop leave at once ("withdrawn").
func TestAnnounceWatch(t *testing.T) {
	s := natstest.JetStream(t, t.TempDir(), 0)
	nc, js := natstest.Connect(t, s.ClientURL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := DefaultBucketOptions()
	opts.Lease = time.Second
	b, err := OpenBucket(ctx, js, opts)
	require.NoError(t, err)
	require.Equal(t, time.Second, b.Lease)
	require.True(t, b.Markers, "nats-server 2.11+ leaves TTL markers")
	_, rec := watch(t, ctx, b, nc)

	var mu sync.Mutex
	list := []Worker{{Name: "a", Role: Aggregated, KVBlocks: 10}, {Name: "b", Role: Prefill}}
	actx, stop := context.WithCancel(ctx)
	a := NewAnnouncer(js, opts, func() []Worker {
		mu.Lock()
		defer mu.Unlock()
		return append([]Worker(nil), list...)
	})
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	require.Eventually(t, func() bool { return rec.has("a") && rec.has("b") }, time.Second, 10*time.Millisecond)

	mu.Lock()
	list[0].KVBlocks = 20
	list = list[:1]
	mu.Unlock()
	require.Eventually(t, func() bool { return rec.why("b") == "withdrawn" }, 2*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.now["a"].KVBlocks == 20
	}, 2*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return rec.why("a") == "withdrawn" }, 2*time.Second, 10*time.Millisecond)
	require.Zero(t, a.Errors.Load())
}

// A worker that stops heartbeating without withdrawing leaves within its lease: by the server's
// marker where the bucket has them, by the watcher's clock where it does not (a bucket made as
// nats-server 2.9 makes it).
func TestLeaseExpiry(t *testing.T) {
	for _, markers := range []bool{true, false} {
		t.Run(map[bool]string{true: "markers", false: "clock"}[markers], func(t *testing.T) {
			s := natstest.JetStream(t, t.TempDir(), 0)
			nc, js := natstest.Connect(t, s.ClientURL())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := DefaultBucketOptions()
			opts.Lease = time.Second
			if !markers {
				_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: opts.Bucket, History: 1, TTL: opts.Lease})
				require.NoError(t, err)
			}
			b, err := OpenBucket(ctx, js, opts)
			require.NoError(t, err)
			require.Equal(t, markers, b.Markers)
			w, rec := watch(t, ctx, b, nc)

			v, _ := json.Marshal(Worker{Name: "dead", Role: Decode})
			_, err = b.KV.Put(ctx, "dead", v)
			require.NoError(t, err)
			put := time.Now()
			require.Eventually(t, func() bool { return rec.has("dead") }, time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool { return rec.why("dead") != "" }, 3*time.Second, 10*time.Millisecond)
			took := rec.leftAt["dead"].Sub(put)
			t.Logf("left after %v: %s", took, rec.why("dead"))
			require.Less(t, took, opts.Lease+300*time.Millisecond)
			require.GreaterOrEqual(t, took, opts.Lease-50*time.Millisecond)
			if !markers {
				require.Equal(t, "lease expired", rec.why("dead"))
				require.Equal(t, int64(1), w.Stats.Expired.Load())
			}
		})
	}
}

// The NATS server restarts (same store): the announcements survive, the watcher watches again
// and keeps the live worker, and a worker that stopped heartbeating leaves.
func TestWatchAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s := natstest.JetStream(t, dir, 0)
	port := s.Addr().(*net.TCPAddr).Port
	nc, js := natstest.Connect(t, s.ClientURL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := DefaultBucketOptions()
	opts.Lease = 2 * time.Second
	b, err := OpenBucket(ctx, js, opts)
	require.NoError(t, err)
	w, rec := watch(t, ctx, b, nc)

	a := NewAnnouncer(js, opts, func() []Worker { return []Worker{{Name: "live", Role: Aggregated}} })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	v, _ := json.Marshal(Worker{Name: "dies", Role: Decode})
	_, err = b.KV.Put(ctx, "dies", v)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.has("live") && rec.has("dies") }, time.Second, 5*time.Millisecond)

	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(300 * time.Millisecond)
	natstest.JetStream(t, dir, port)
	require.Eventually(t, func() bool { return rec.why("dies") != "" }, 2*opts.Lease, 10*time.Millisecond)
	require.Eventually(t, func() bool { return w.Stats.Rewatches.Load() > 0 }, opts.Lease, 10*time.Millisecond)
	time.Sleep(opts.Lease) // a lease later the live worker is still there, never having left
	require.True(t, rec.has("live"))
	require.Empty(t, rec.why("live"))
	t.Logf("dies: %s; rewatches %d; announcer errors %d", rec.why("dies"), w.Stats.Rewatches.Load(), a.Errors.Load())
}

// Loads go out when they change, and at least every MaxQuiet when they do not; a subscriber
// gets them by worker name and counts what does not parse.
func TestLoadPublisher(t *testing.T) {
	s := natstest.JetStream(t, t.TempDir(), 0)
	nc, _ := natstest.Connect(t, s.ClientURL())
	var mu sync.Mutex
	got := map[string][]Load{}
	var stats LoadStats
	sub, err := SubscribeLoad(nc, "", &stats, func(name string, l Load) {
		mu.Lock()
		defer mu.Unlock()
		got[name] = append(got[name], l)
	})
	require.NoError(t, err)
	defer sub.Unsubscribe() //nolint:errcheck

	var running atomic.Int64
	p := NewLoadPublisher(nc, "", func() []WorkerLoad {
		return []WorkerLoad{{Name: "busy", Load: Load{Running: running.Load(), KVBlocks: 8}}, {Name: "idle", Load: Load{KVBlocks: 8}}}
	})
	p.Every, p.MaxQuiet = 20*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for i := range 10 {
		running.Store(int64(i + 1))
		time.Sleep(40 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, nc.Publish(DefaultLoadPrefix+".busy", []byte("{not json")))
	require.NoError(t, nc.Publish(DefaultLoadPrefix+".x", []byte(`{"running":1}`)))
	require.NoError(t, nc.Flush())
	// The bad report and x's arrive in order on one subscription: wait for x's, the later one.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["x"]) == 1
	}, time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), stats.BadReports.Load())

	mu.Lock()
	defer mu.Unlock()
	busy, idle := got["busy"], got["idle"]
	require.Equal(t, int64(10), busy[len(busy)-1].Running)
	require.GreaterOrEqual(t, len(busy), 10, "one report per change")
	require.LessOrEqual(t, len(busy), 10+4)
	// 700 ms without a change: one at the start and one each 200 ms.
	require.GreaterOrEqual(t, len(idle), 3)
	require.LessOrEqual(t, len(idle), 5)
	require.False(t, idle[0].At.IsZero())
	require.Len(t, got["x"], 1)
}
