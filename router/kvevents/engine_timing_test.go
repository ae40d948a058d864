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
