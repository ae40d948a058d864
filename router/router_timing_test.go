package router

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
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

// A whole decision for a 4,096-token prompt over 64 workers (hash, match the cache index, match
// the active blocks, score, choose), against its two lookups alone: hashing plus index matching
// in the same loop. x-parts is (hash + match) / decide: the share of the decision they are.
func BenchmarkDecide4K(b *testing.B) {
	rnd := rand.New(rand.NewPCG(5, 6))
	opts := DefaultOptions()
	opts.Seed = 1
	r, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for i := range 64 {
		names = append(names, string(rune('A'+i/26))+string(rune('a'+i%26)))
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
		for _, w := range rnd.Perm(64)[:4] {
			r.Index().Store(r.find(names[w]).slot, 0, 0, hs, nil)
		}
		prompts = append(prompts, p)
	}
	var m Match
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

// Applying vLLM events: a batch storing 32 blocks (512 tokens, chained to a parent) and one
// removing the 32 blocks stored the batch before, decoded, hashed and written to the index,
// against decoding the same two payloads alone. x-decode is decode time over apply time.
func BenchmarkEngineApply(b *testing.B) {
	rnd := rand.New(rand.NewPCG(7, 8))
	ix, _ := NewIndex(DefaultIndexOptions())
	w, _ := ix.AddWorker(0)
	opts := DefaultFeedOptions()
	var stats FeedStats
	eng, _ := NewEngine(ix, w, &opts, &stats)
	// A long conversation, 32 blocks per batch; each batch also removes the previous batch's.
	const per = 32
	const batches = 512
	c := newConvo(rnd, per*batches)
	payloads := make([][]byte, batches)
	for k := range batches {
		e := &msgpackEncoder{}
		n := 1
		if k > 0 {
			n = 2
		}
		e.array(2).float(1).array(n)
		c.stored(e, k*per, (k+1)*per, false)
		if k > 0 {
			c.removed(e, (k-1)*per, k*per)
		}
		payloads[k] = e.b
	}
	var batch Batch
	var apply, decode time.Duration
	seq := uint64(0)
	for i := 0; b.Loop(); i++ {
		k := i % batches
		if k == 0 && i > 0 { // the conversation is over: start it again on a clean engine
			eng.Live(seq, []byte{0x92, 0x01, 0x91, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'}, nil)
			seq++
		}
		t0 := time.Now()
		eng.Live(seq, payloads[k], nil)
		t1 := time.Now()
		if err := DecodeBatch(payloads[k], &batch); err != nil {
			b.Fatal(err)
		}
		decode += time.Since(t1)
		apply += t1.Sub(t0)
		seq++
	}
	if stats.BadPayloads.Load()+stats.UnknownParent.Load() > 0 {
		b.Fatalf("bad payloads %d, unknown parents %d", stats.BadPayloads.Load(), stats.UnknownParent.Load())
	}
	b.ReportMetric(float64(stats.BlocksStored.Load()+stats.BlocksRemoved.Load())/apply.Seconds(), "blocks/s")
	b.ReportMetric(float64(decode)/float64(apply), "x-decode")
}
