package mocker

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"dataplane/router/kvevents"
)

// Each benchmark times its operation and a baseline in the same loop and reports the ratio
// (the machine is shared: ratios are what to quote).

// KV: referencing and releasing a 256-block prompt that is cached (the common admission and
// finish path), against the same increments and decrements on a plain map.
func BenchmarkKVUseDeref(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = r.Uint64()
	}
	kv := NewKV(16384, nil)
	if _, err := kv.Use(hashes, 0); err != nil {
		b.Fatal(err)
	}
	kv.Deref(hashes)
	plain := map[uint64]int32{}
	for _, h := range hashes {
		plain[h] = 0
	}
	var kvTime, mapTime time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := kv.Use(hashes, 0); err != nil {
			b.Fatal(err)
		}
		kv.Deref(hashes)
		t1 := time.Now()
		for _, h := range hashes {
			plain[h]++
		}
		for _, h := range hashes {
			plain[h]--
		}
		kvTime += t1.Sub(t0)
		mapTime += time.Since(t1)
	}
	b.ReportMetric(float64(kvTime.Nanoseconds())/float64(b.N*256), "ns/block")
	b.ReportMetric(float64(kvTime)/float64(mapTime), "x-map")
}

// KV events: encoding a step's batch (4 stored events of 16 blocks with tokens, one removal
// of 32 blocks) in vLLM's msgpack, against copying the payload's bytes; the router decoding
// the same payload is reported too.
func BenchmarkEventEncode(b *testing.B) {
	o := DefaultOptions()
	o.Name = "bench"
	l := newEventLog(o, PublisherFunc(func(string, uint64, []byte) {}))
	r := rand.New(rand.NewPCG(2, 2))
	var payload []byte
	fill := func() {
		for ev := range 4 {
			for blk := range 16 {
				toks := make([]uint32, 16)
				for i := range toks {
					toks[i] = r.Uint32N(150000)
				}
				l.stored(r.Uint64(), uint64(ev*100+blk), blk > 0, toks, nil)
			}
		}
		for range 32 {
			l.removed(r.Uint64())
		}
	}
	fill()
	payload = l.encode(nil, 1)
	dst := make([]byte, len(payload))
	buf := make([]byte, 0, len(payload))
	var batch kvevents.Batch
	var encTime, copyTime, decTime time.Duration
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		t0 := time.Now()
		buf = l.encode(buf[:0], 1)
		t1 := time.Now()
		copy(dst, payload)
		t2 := time.Now()
		if err := kvevents.DecodeBatch(buf, &batch); err != nil {
			b.Fatal(err)
		}
		encTime += t1.Sub(t0)
		copyTime += t2.Sub(t1)
		decTime += time.Since(t2)
	}
	b.ReportMetric(float64(copyTime)/float64(encTime), "x-memcpy")
	b.ReportMetric(float64(decTime)/float64(encTime), "router-decode/encode")
}

// The loop: stepping 1,000 engines, each decoding one long request, through a virtual Loop
// (heap, timers, wake-ups) against calling Step on the same engines directly in a plain loop.
func BenchmarkLoopOverhead(b *testing.B) {
	const engines = 1000
	build := func() ([]*Engine, *Loop) {
		l := NewLoop(Clock{Virtual: true})
		var es []*Engine
		for i := range engines {
			o := DefaultOptions()
			o.Seed = uint64(i + 1)
			e, err := NewEngine(o, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.Submit(&Request{ID: "r", Tokens: make([]uint32, 64), MaxTokens: 100_000, Sink: func(Output) {}}, 0); err != nil {
				b.Fatal(err)
			}
			es = append(es, e)
		}
		return es, l
	}
	const steps = 20 // per engine per iteration
	var loopTime, directTime time.Duration
	for b.Loop() {
		b.StopTimer()
		es, l := build()
		direct, _ := build()
		for _, e := range es {
			l.Wake(e)
		}
		stop := time.Duration(0)
		for _, e := range direct { // how far steps reach: the same for both
			t := time.Duration(0)
			for range steps {
				t, _ = e.Step(t)
			}
			stop = max(stop, t)
		}
		direct, _ = build()
		ctx, cancel := context.WithCancel(context.Background())
		l.At(stop, func(time.Duration) { cancel() })
		b.StartTimer()
		t0 := time.Now()
		_ = l.Run(ctx)
		t1 := time.Now()
		for _, e := range direct {
			t := time.Duration(0)
			for t <= stop {
				t, _ = e.Step(t)
			}
		}
		loopTime += t1.Sub(t0)
		directTime += time.Since(t1)
		cancel()
	}
	b.ReportMetric(float64(loopTime.Nanoseconds())/float64(b.N*engines*steps), "ns/step")
	b.ReportMetric(float64(loopTime)/float64(directTime), "x-direct")
}

// A decode step of a busy engine (256 running sequences): engine work per generated token
// (scheduling, block accounting, hashing filled blocks, events, delivery), against the least
// any engine does per token: draw it, append it to its sequence, hand it to the sink.
func BenchmarkDecodeStep(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	// A fresh engine every 1,000 steps (outside the timed parts), before any request ends.
	var e *Engine
	var t time.Duration
	build := func() {
		o := DefaultOptions()
		o.Seed = 1
		var err error
		if e, err = NewEngine(o, PublisherFunc(func(string, uint64, []byte) {})); err != nil {
			b.Fatal(err)
		}
		for i := range 256 {
			toks := make([]uint32, 32)
			for j := range toks {
				toks[j] = r.Uint32N(32000)
			}
			if _, err := e.Submit(&Request{ID: strconv.Itoa(i), Tokens: toks, MaxTokens: 2000, Sink: func(Output) {}}, 0); err != nil {
				b.Fatal(err)
			}
		}
		t, _ = e.Step(0)
		t, _ = e.Step(t) // the prefill step ends: all decoding from here
	}
	rr := rand.New(rand.NewPCG(4, 4))
	seqs := make([][]uint32, 256)
	delivered := 0
	deliver := func(o Output) { delivered += int(o.Token & 1) }
	var stepTime, minTime time.Duration
	steps := 0
	for b.Loop() {
		if steps%1000 == 0 {
			build()
		}
		steps++
		t0 := time.Now()
		t, _ = e.Step(t)
		t1 := time.Now()
		for i := range seqs {
			tok := uint32(rr.IntN(32000))
			if len(seqs[i]) > 2000 {
				seqs[i] = seqs[i][:0]
			}
			seqs[i] = append(seqs[i], tok)
			deliver(Output{Token: tok})
		}
		stepTime += t1.Sub(t0)
		minTime += time.Since(t1)
	}
	_ = delivered
	b.ReportMetric(float64(stepTime.Nanoseconds())/float64(b.N*256), "ns/token")
	b.ReportMetric(float64(stepTime)/float64(minTime), "x-minimal")
}
