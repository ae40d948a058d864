package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"dataplane/router/index"
)

// Hashing a 4,096-token prompt into 256 sequence hashes, against XXH3 over the same 16 KiB in
// one call (the ceiling: the same bytes hashed without block boundaries or chaining). x-bulk is
// the bulk time over ours (1.0 = no cost for the block structure).
func BenchmarkHash4K(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = r.Uint32N(150_000)
	}
	raw := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		raw = append(raw, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	h, _ := NewHasher(16)
	out := make([]uint64, 0, 256)
	var ours, bulk time.Duration
	var sink uint64
	for b.Loop() {
		t0 := time.Now()
		out, _ = h.Sequence(out[:0], tokens, HashSeed, nil)
		t1 := time.Now()
		sink += xxh3.HashSeed(raw, HashSeed)
		bulk += time.Since(t1)
		ours += t1.Sub(t0)
	}
	b.ReportMetric(float64(bulk)/float64(ours), "x-bulk")
	b.SetBytes(int64(len(raw)))
	_ = sink
}

// Hashing a 4,096-token prompt sent as prompt_embeds (one media entry per block: its digest's
// hash), against the same prompt without media (x-plain: plain time over this one).
func BenchmarkHash4KEmbeds(b *testing.B) {
	tokens := make([]uint32, 4096)
	media := make([]Media, 256)
	for i := range media {
		media[i] = Media{Hash: uint64(i)*0x9e3779b97f4a7c15 + 1, Offset: i * 16, Length: 16}
	}
	h, _ := NewHasher(16)
	out := make([]uint64, 0, 256)
	var ours, plain time.Duration
	for b.Loop() {
		t0 := time.Now()
		out, _ = h.Sequence(out[:0], tokens, HashSeed, media)
		t1 := time.Now()
		out, _ = h.Sequence(out[:0], tokens, HashSeed, nil)
		plain += time.Since(t1)
		ours += t1.Sub(t0)
	}
	b.ReportMetric(float64(plain)/float64(ours), "x-plain")
}

// A whole decision for a 4,096-token prompt over 64 and 10,000 workers (hash, match the cache
// index, match the active blocks, score, choose), against its two lookups alone: hashing plus
// index matching in the same loop. x-parts is (hash + match) / decide: the share of the
// decision they are; the rest grows with the workers (each is scored).
func BenchmarkDecide4K(b *testing.B) {
	for _, workers := range []int{64, 10_000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchDecide4K(b, workers) })
	}
}

func benchDecide4K(b *testing.B, workers int) {
	rnd := rand.New(rand.NewPCG(5, 6))
	opts := DefaultOptions()
	opts.Seed = 1
	opts.Index.MaxWorkers = workers
	r, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for i := range workers {
		names = append(names, fmt.Sprintf("w%05d", i))
		if _, err := r.AddWorker(names[i]); err != nil {
			b.Fatal(err)
		}
	}
	h, _ := NewHasher(16)
	var prompts [][]uint32
	for range 200 {
		p := make([]uint32, 4096)
		for i := range p {
			p[i] = rnd.Uint32N(150_000)
		}
		hs, _ := h.Sequence(nil, p, HashSeed, nil)
		for _, w := range rnd.Perm(workers)[:4] {
			r.Index().Store(r.find(names[w]).slot, 0, 0, hs, nil)
		}
		prompts = append(prompts, p)
	}
	var m index.Match
	var hs []uint64
	var d Decision
	var decide, parts time.Duration
	for i := 0; b.Loop(); i++ {
		p := prompts[i%len(prompts)]
		t0 := time.Now()
		if err := r.Decide(Request{Tokens: p}, &d); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		hs, _ = h.Sequence(hs[:0], p, HashSeed, nil)
		r.Index().Match(hs, &m)
		parts += time.Since(t1)
		decide += t1.Sub(t0)
	}
	b.ReportMetric(float64(parts)/float64(decide), "x-parts")
	b.ReportMetric(float64(decide.Nanoseconds())/float64(b.N), "decide-ns")
}

// A large fleet: a router for 1,024 workers (16 mask words per block) routing 12,000-token
// prompts (750 blocks), each cached on 4 workers, with 256 requests in flight: Decide, Start and
// Finish per request. The ref counting that Start and Finish do (Slots' index.Counts) is timed
// again beside the same counting in a Go map keyed by (block, worker), fed the same requests
// and holding the same counts: x-map is the map's time over ours.
func BenchmarkRoute1024(b *testing.B) {
	const workers, promptTokens, inFlight = 1024, 12_000, 256
	rnd := rand.New(rand.NewPCG(5, 6))
	opts := DefaultOptions()
	opts.Seed = 1
	opts.Index.MaxWorkers = workers
	r, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for i := range workers {
		names = append(names, fmt.Sprintf("w%d", i))
		if _, err := r.AddWorker(names[i]); err != nil {
			b.Fatal(err)
		}
	}
	h, _ := NewHasher(16)
	var prompts [][]uint32
	for range 200 {
		p := make([]uint32, promptTokens)
		for i := range p {
			p[i] = rnd.Uint32N(150_000)
		}
		hs, _ := h.Sequence(nil, p, HashSeed, nil)
		for _, w := range rnd.Perm(workers)[:4] {
			r.Index().Store(r.find(names[w]).slot, 0, 0, hs, nil)
		}
		prompts = append(prompts, p)
	}
	ids := make([]string, inFlight)
	for i := range ids {
		ids[i] = fmt.Sprint("req-", i)
	}
	type flight struct {
		w    index.Worker
		seqs []uint64
	}
	ring := make([]flight, inFlight)
	ours, theirs := index.NewCounts(), map[mapRefKey]int32{}
	var gone []uint64
	var d Decision
	var decide, start, finish, oursRefs, mapRefs time.Duration
	now := time.Now()
	for i := 0; b.Loop(); i++ {
		slot := i % inFlight
		if i >= inFlight { // the request started inFlight requests ago ends
			t0 := time.Now()
			r.Finish(ids[slot])
			finish += time.Since(t0)
			f := ring[slot]
			t1 := time.Now()
			gone = ours.Decr(f.seqs, f.seqs, f.w, gone[:0])
			t2 := time.Now()
			for _, h := range f.seqs {
				k := mapRefKey{h, f.w}
				if theirs[k]--; theirs[k] <= 0 {
					delete(theirs, k)
				}
			}
			oursRefs += t2.Sub(t1)
			mapRefs += time.Since(t2)
		}
		t0 := time.Now()
		if err := r.Decide(Request{Tokens: prompts[i%len(prompts)]}, &d); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := r.Start(ids[slot], d, d.Worker, now); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		decide += t1.Sub(t0)
		start += t2.Sub(t1)
		w := r.find(d.Worker).slot
		ring[slot] = flight{w, append(ring[slot].seqs[:0], d.Hashes...)}
		t3 := time.Now()
		ours.Incr(ring[slot].seqs, w)
		t4 := time.Now()
		for _, h := range ring[slot].seqs {
			theirs[mapRefKey{h, w}]++
		}
		oursRefs += t4.Sub(t3)
		mapRefs += time.Since(t4)
	}
	n := float64(b.N)
	b.ReportMetric(float64(decide.Nanoseconds())/n, "decide-ns")
	b.ReportMetric(float64(start.Nanoseconds())/n, "start-ns")
	b.ReportMetric(float64(finish.Nanoseconds())/n, "finish-ns")
	b.ReportMetric(float64(oursRefs.Nanoseconds())/n, "refs-ns")
	b.ReportMetric(float64(mapRefs)/float64(oursRefs), "x-map")
}

type mapRefKey struct {
	hash   uint64
	worker index.Worker
}
