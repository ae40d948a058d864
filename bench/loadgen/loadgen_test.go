package loadgen

import (
	"bytes"
	"context"
	"encoding/csv"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"dataplane/bench/mocker"
	"dataplane/bench/synth"
	"dataplane/dataplane/sequence"
	"dataplane/router"
	"dataplane/router/kvevents"
)

// runFleet runs a real-time mock fleet (20× speed) until the test ends.
func runFleet(t *testing.T, engines, loops int) (*mocker.Fleet, context.Context) {
	return runFleetWith(t, engines, loops, nil)
}

// runFleetWith is runFleet with the engines' KV events going to pub.
func runFleetWith(t *testing.T, engines, loops int, pub mocker.Publisher) (*mocker.Fleet, context.Context) {
	fo := mocker.DefaultFleetOptions()
	fo.Engines, fo.Clock, fo.Loops, fo.Publisher = engines, mocker.Clock{Speedup: 20}, loops, pub
	f, err := mocker.NewFleet(fo)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f, ctx
}

// A small trace against two mock engines over HTTP on loopback: every request completes with
// its output length, TTFT and ITLs are measured, and the CSV and charts are written.
func TestLoadgenAgainstMockFleet(t *testing.T) {
	f, _ := runFleet(t, 2, 1)
	srv := httptest.NewServer(mocker.NewServer(f, mocker.DefaultServerOptions()))
	defer srv.Close()

	var recs []synth.Record
	for i := range 24 {
		recs = append(recs, synth.Record{Timestamp: float64(i * 40), InputLength: 700, OutputLength: 3 + i%5, HashIDs: []int64{0, int64(i + 1)}})
	}
	recs[3].Media = []synth.Media{{Modality: sequence.Image, ID: "cat", Offset: 512, Tokens: 100}}
	opts := DefaultOptions()
	opts.Endpoints = []string{srv.URL + "/engines/0", srv.URL + "/engines/1/"}
	opts.Speedup = 4
	var progress bytes.Buffer
	opts.Progress = &progress
	rep, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	for i, s := range rep.Samples {
		require.Empty(t, s.Err, "request %d", i)
		require.Equal(t, recs[i].OutputLength, s.OutputTokens)
		require.Positive(t, s.TTFT)
		require.GreaterOrEqual(t, s.E2E, s.TTFT)
		require.Len(t, s.ITL, s.OutputTokens-1)
		require.InDelta(t, float64(recs[i].Timestamp)/4, float64(s.Scheduled.Milliseconds()), 1)
	}
	sum := rep.Summarize()
	require.Equal(t, 24, sum.Completed)
	require.Positive(t, sum.CacheHit, "block 0 (512 tokens) is shared: later requests hit it")
	t.Log("\n" + sum.String())
	require.Contains(t, progress.String(), "24/24")

	var buf bytes.Buffer
	require.NoError(t, rep.WriteCSV(&buf))
	rows, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 25)
	require.Equal(t, []string{"class", "ttft_ms"}, []string{rows[0][1], rows[0][5]})
	require.Equal(t, []string{synth.ClassText, synth.ClassImage}, []string{rows[1][1], rows[4][1]}, "request 3 has an image")
	require.Len(t, sum.ByClass, 2)
	require.Equal(t, ClassSummary{Class: synth.ClassImage, Completed: 1, TTFT: synth.Summarize([]float64{ms(rep.Samples[3].TTFT)})}, sum.ByClass[1])
	require.Equal(t, 23, sum.ByClass[0].Completed)
	dir := t.TempDir()
	require.NoError(t, rep.WriteCharts(dir, "test"))
	for _, name := range []string{"ttft_cdf.png", "latency_over_time.png"} {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
}

// Past the in-flight limit requests are skipped, not delayed; failures are recorded with the
// engine's message.
func TestLoadgenSkipsAndErrors(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad/v1/completions" {
			http.Error(w, `{"error": {"message": "no"}}`, 400)
			return
		}
		<-block
	}))
	defer srv.Close()
	recs := []synth.Record{{InputLength: 5, OutputLength: 1, HashIDs: []int64{1}}, {InputLength: 5, OutputLength: 1, HashIDs: []int64{1}}, {Timestamp: 1, InputLength: 5, OutputLength: 1, HashIDs: []int64{1}}}
	opts := DefaultOptions()
	opts.Endpoints = []string{srv.URL + "/bad", srv.URL}
	opts.MaxInFlight = 1
	opts.Timeout = time.Second
	go func() { time.Sleep(200 * time.Millisecond); close(block) }()
	rep, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	sum := rep.Summarize()
	require.Equal(t, 3, sum.Requests)
	require.Positive(t, sum.Failed)
	require.Contains(t, rep.Samples[0].Err, "400")

	_, err = Run(context.Background(), recs, Options{Endpoints: []string{"ftp://x"}, Speedup: 1, MaxInFlight: 1})
	var oe *ErrOptions
	require.ErrorAs(t, err, &oe)
}

// The in-process load generator drives a real-time fleet directly: every request completes
// with its output length, and the shared first block is a cache hit for later requests.
func TestInProcess(t *testing.T) {
	f, ctx := runFleet(t, 8, 2)
	var recs []synth.Record
	for i := range 64 {
		recs = append(recs, synth.Record{Timestamp: float64(i * 10), InputLength: 600, OutputLength: 1 + i%7, HashIDs: []int64{0, int64(i + 1)}})
	}
	opts := DefaultOptions()
	opts.Speedup = 4
	rep, err := RunInProcess(ctx, f, recs, opts)
	require.NoError(t, err)
	for i, s := range rep.Samples {
		require.Empty(t, s.Err)
		require.Equal(t, recs[i].OutputLength, s.OutputTokens)
		require.Positive(t, s.TTFT)
	}
	sum := rep.Summarize()
	require.Equal(t, 64, sum.Completed)
	require.Positive(t, sum.CacheHit)
}

// Routed by the router package over the engines' own KV events (NATS, as `bench fleet --route
// kv`): each conversation's later turns go to the engine holding its earlier turns, the
// engines report the hits, and the slot tracker ends with nothing in flight.
func TestInProcessKVRouted(t *testing.T) {
	srv := natsserver.RunRandClientPortServer()
	defer srv.Shutdown()
	pub, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer pub.Close()
	f, ctx := runFleetWith(t, 8, 2, mocker.NewNATSPublisher(pub, ""))

	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	feed, err := kvevents.NewFeed(r, kvevents.DefaultOptions())
	require.NoError(t, err)
	for i := range f.Len() {
		_, err := feed.AddWorker(f.Engine(i).Name())
		require.NoError(t, err)
	}
	sub, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer sub.Close()
	var ns kvevents.NATSStats
	s, err := kvevents.StartNATS(sub, kvevents.DefaultNATSPrefix, feed, &ns)
	require.NoError(t, err)
	defer s.Drain() //nolint:errcheck
	kv, err := NewKVRouter(r, f)
	require.NoError(t, err)

	// 4 conversations of 6 turns, a turn of each at once every 200 ms; turn k has k+1 blocks.
	// First turns decode 100 tokens (~30 ms here), so all four are in flight when the last is
	// routed and land on four engines; later turns decode 2, so a turn's engine is idle again
	// when the next comes and holds its blocks.
	var recs []synth.Record
	for turn := range 6 {
		for c := range 4 {
			ids := make([]int64, turn+1)
			for k := range ids {
				ids[k] = int64(100*c + k)
			}
			recs = append(recs, synth.Record{Timestamp: float64(200 * turn), InputLength: 512*(turn+1) - 100, OutputLength: max(2, 100*(1-turn)), HashIDs: ids})
		}
	}
	opts := DefaultOptions()
	opts.Route = kv
	rep, err := RunInProcess(ctx, f, recs, opts)
	require.NoError(t, err)
	home := map[int]string{}
	for i, smp := range rep.Samples {
		require.Empty(t, smp.Err)
		c := i % 4
		if i < 4 {
			home[c] = smp.Endpoint
			continue
		}
		require.Equal(t, home[c], smp.Endpoint, "request %d: conversation %d left its engine", i, c)
		require.Positive(t, smp.CachedTokens, "request %d", i)
	}
	require.Len(t, map[string]bool{home[0]: true, home[1]: true, home[2]: true, home[3]: true}, 4,
		"first turns, in flight together, spread over the idle engines")
	require.Eventually(t, func() bool {
		for _, w := range r.Snapshot() {
			if w.Requests != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "every request finished in the slot tracker")
	require.Zero(t, feed.Stats().Gaps.Load())
	require.Zero(t, ns.UnknownWorker.Load())
}
