package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/internal/testrand"
)

// logRecords is a slog handler that keeps its records' attributes.
type logRecords struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}

// count is how many records have every given key=value.
func (l *logRecords) count(kv ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.recs {
		ok := true
		for i := 0; i < len(kv); i += 2 {
			ok = ok && m[kv[i]] == kv[i+1]
		}
		if ok {
			n++
		}
	}
	return n
}

// Every drop is counted; each worker logs a reason once, however often it recurs, and a
// dropped event costs no allocation once logged.
func TestDropsLoggedOncePerWorkerAndReason(t *testing.T) {
	rnd := testrand.New(t)
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	var logs logRecords
	opts := DefaultOptions()
	opts.Log = slog.New(&logs)
	f, err := NewFeed(r, opts)
	require.NoError(t, err)
	c := newConvo(rnd, 4)
	sliding := batchOf(true, func(e *msgpackEncoder) {
		e.map_(10).str("type").str("BlockStored").str("block_hashes").array(1).uint(c.engine[0])
		e.str("parent_block_hash").nil().str("token_ids").array(16)
		for _, tok := range c.tokens[:16] {
			e.uint(uint64(tok))
		}
		e.str("block_size").uint(16).str("lora_id").nil().str("medium").str("GPU").str("lora_name").nil()
		e.str("group_idx").uint(1).str("kv_cache_spec_kind").str("sliding_window")
	}, 1)
	orphan := batchOf(false, func(e *msgpackEncoder) { c.stored(e, 2, 3, false) }, 1) // parent never stored
	for _, name := range []string{"a", "b"} {
		eng, err := f.AddWorker(name)
		require.NoError(t, err)
		seq := uint64(0)
		for range 5 {
			eng.Live(seq, []byte{0xc1}, nil)
			eng.Live(seq+1, sliding, nil)
			eng.Live(seq+2, orphan, nil)
			seq += 3
		}
		require.Zero(t, testing.AllocsPerRun(20, func() {
			eng.Live(seq, sliding, nil)
			eng.Live(seq+1, orphan, nil)
			seq += 2
		}))
	}
	s := f.Stats()
	require.Equal(t, int64(10), s.BadPayloads.Load())
	require.Equal(t, int64(2*(5+21)), s.FilteredGroup.Load())
	require.Equal(t, int64(2*(5+21)), s.UnknownParent.Load())
	for _, w := range []string{"a", "b"} {
		for _, reason := range []string{"bad_payload", "filtered_group", "unknown_parent"} {
			require.Equal(t, 1, logs.count("worker", w, "reason", reason), "%s %s", w, reason)
		}
	}
	require.Equal(t, 1, logs.count("worker", "a", "reason", "filtered_group", "kind", "sliding_window", "level", "INFO"))
	require.Equal(t, 6, len(logs.recs))
}

// NATS messages for worker names the feed does not have are counted in the feed's stats (its
// metrics) and the subscription's, and logged once per name, up to maxLoggedNames names and
// one line saying more were not.
func TestNATSUnknownWorkersCountedAndLogged(t *testing.T) {
	srv := natsserver.RunRandClientPortServer()
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	var logs logRecords
	opts := DefaultOptions()
	opts.Log = slog.New(&logs)
	f, err := NewFeed(r, opts)
	require.NoError(t, err)
	_, err = f.AddWorker("known")
	require.NoError(t, err)
	sub, err := StartNATS(nc, DefaultNATSPrefix, f, nil) // no NATSStats of its own
	require.NoError(t, err)
	defer sub.Unsubscribe()

	const names = maxLoggedNames + 36
	for round := range 3 {
		for i := range names {
			require.NoError(t, nc.Publish(fmt.Sprintf("%s.stranger-%d", DefaultNATSPrefix, i), NATSMessage(uint64(round), nil)))
		}
	}
	require.NoError(t, nc.Publish(DefaultNATSPrefix+".known", []byte{1}))
	require.NoError(t, nc.Publish(DefaultNATSPrefix+".known", []byte{2}))
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool {
		return f.Stats().UnknownWorkers.Load() == 3*names && f.Stats().BadMessages.Load() == 2
	}, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, maxLoggedNames+1, logs.count("reason", "unknown_worker"))
	require.Equal(t, 1, logs.count("reason", "unknown_worker", "subject", DefaultNATSPrefix+".stranger-0"))
	require.Zero(t, logs.count("subject", fmt.Sprintf("%s.stranger-%d", DefaultNATSPrefix, names-1)))
	require.Equal(t, 1, logs.count("reason", "bad_message", "worker", "known"))
}
