package kvevents

import (
	"math/rand/v2"
	"testing"
	"time"

	"dataplane/router/index"
)

// Applying vLLM events: a batch storing 32 blocks (512 tokens, chained to a parent) and one
// removing the 32 blocks stored the batch before, decoded, hashed and written to the index,
// against decoding the same two payloads alone. x-decode is decode time over apply time.
func BenchmarkEngineApply(b *testing.B) {
	rnd := rand.New(rand.NewPCG(7, 8))
	ix, _ := index.New(index.DefaultOptions())
	w, _ := ix.AddWorker(0)
	opts := DefaultOptions()
	var stats Stats
	eng, _ := NewEngine(ix, w, 16, &opts, &stats)
	const batches = 512
	payloads := conversationBatches(rnd, 32, batches)
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

// The cost of a capacity (capacity.go) on the store path, per batch of 32 blocks, against the
// same engine without one in the same run (benchstat -col /cap), at two sizes:
//   - held=32: EngineApply's stream (store 32 new blocks, remove the 32 before); under a
//     capacity of 16,384 it never reaches, the cost is keeping the store order (stale entries
//     compacted away);
//   - held=16384: 32 new blocks a batch, chained, with the engine holding 16,384. Without a
//     capacity the stream removes the blocks stored 512 batches before (as an engine that
//     evicts them says); with one it only stores and the engine evicts its 32 oldest blocks
//     itself: the same index work, the removals found by the store order instead of events.
func BenchmarkEngineCapacity(b *testing.B) {
	const capacity, per, batches = 16384, 32, 512 // batches: a conversation's, capacity/per
	rnd := rand.New(rand.NewPCG(7, 9))
	storeRemove := conversationBatches(rnd, per, batches)
	// 4 conversations of 16,384 blocks, over and over: batch j stores blocks of conversation
	// j/512 and (explicit) removes those that batch j−512 stored.
	var convos []*convo
	for range 4 {
		convos = append(convos, newConvo(rnd, per*batches))
	}
	var storeOnly, storeOld [][]byte
	for j := range 4 * batches {
		c, k := convos[j/batches], j%batches
		storeOnly = append(storeOnly, batchOf(false, func(e *msgpackEncoder) { c.stored(e, k*per, (k+1)*per, false) }, 1))
		prev := convos[(j/batches+3)%4]
		storeOld = append(storeOld, batchOf(false, func(e *msgpackEncoder) {
			c.stored(e, k*per, (k+1)*per, false)
			prev.removed(e, k*per, (k+1)*per)
		}, 2))
	}
	cleared := []byte{0x92, 0x01, 0x91, 0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'}
	run := func(b *testing.B, limit int64, payloads [][]byte, warm int) {
		ix, _ := index.New(index.DefaultOptions())
		w, _ := ix.AddWorker(0)
		opts := DefaultOptions()
		var stats Stats
		eng, _ := NewEngine(ix, w, 16, &opts, &stats)
		eng.SetCapacity(limit)
		seq := uint64(0)
		live := func(p []byte) {
			eng.Live(seq, p, nil)
			seq++
		}
		for _, p := range payloads[:warm] { // to the steady state: the engine holds capacity blocks
			live(p)
		}
		for i := 0; b.Loop(); i++ {
			k := (warm + i) % len(payloads)
			if k == 0 && warm == 0 && i > 0 { // EngineApply's conversation is over: start again
				live(cleared)
			}
			live(payloads[k])
		}
		if stats.BadPayloads.Load()+stats.UnknownParent.Load() > 0 {
			b.Fatalf("bad payloads %d, unknown parents %d", stats.BadPayloads.Load(), stats.UnknownParent.Load())
		}
		if warm > 0 && ix.Held(w, 0) != capacity {
			b.Fatalf("%d blocks held, want %d", ix.Held(w, 0), capacity)
		}
		b.ReportMetric(float64(per*b.N)/b.Elapsed().Seconds(), "blocks/s")
	}
	b.Run("held=32/cap=none", func(b *testing.B) { run(b, 0, storeRemove, 0) })
	b.Run("held=32/cap=16384", func(b *testing.B) { run(b, capacity, storeRemove, 0) })
	b.Run("held=16384/cap=none", func(b *testing.B) { run(b, 0, storeOld, 2*batches) })
	b.Run("held=16384/cap=16384", func(b *testing.B) { run(b, capacity, storeOnly, 2*batches) })
}

// Decoding alone, into a reused Batch: a batch storing 32 blocks (chained) and removing 32, in
// both of msgspec's layouts, as a text-only engine publishes it; and the same in the map layout
// with the fields a hybrid-model engine adds (group_idx, kv_cache_spec_kind and its window).
func BenchmarkDecodeBatch(b *testing.B) {
	rnd := rand.New(rand.NewPCG(7, 10))
	c := newConvo(rnd, 64)
	hybrid := batchOf(true, func(e *msgpackEncoder) {
		e.map_(10).str("type").str("BlockStored").str("block_hashes").array(32)
		for _, h := range c.engine[32:] {
			e.uint(h)
		}
		e.str("parent_block_hash").uint(c.engine[31]).str("token_ids").array(512)
		for _, t := range c.tokens[512:] {
			e.uint(uint64(t))
		}
		e.str("block_size").uint(16).str("lora_id").nil().str("medium").str("GPU").str("lora_name").nil()
		e.str("group_idx").uint(1).str("kv_cache_spec_kind").str("sliding_window")
		e.map_(4).str("type").str("BlockRemoved").str("block_hashes").array(32)
		for _, h := range c.engine[:32] {
			e.uint(h)
		}
		e.str("medium").str("GPU").str("group_idx").uint(1)
	}, 2)
	for _, bc := range []struct {
		name    string
		payload []byte
	}{
		{"array", batchOf(false, func(e *msgpackEncoder) { c.stored(e, 32, 64, false); c.removed(e, 0, 32) }, 2)},
		{"map", batchOf(true, func(e *msgpackEncoder) { c.stored(e, 32, 64, true); c.removed(e, 0, 32) }, 2)},
		{"map-hybrid", hybrid},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var batch Batch
			b.SetBytes(int64(len(bc.payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeBatch(bc.payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
