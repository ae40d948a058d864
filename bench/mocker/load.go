package mocker

import (
	"context"
	"time"
)

// EngineLoad is an engine's load as its loop sees it: what `dataplane mock` reports to the
// fleet (router/fleet's Load).
type EngineLoad struct {
	Running, Waiting int
	ActiveBlocks     int // KV blocks referenced by requests (full and partial)
	PrefillTokens    int // prompt tokens of waiting and running requests not computed yet
	Blocks           int // the KV cache's size
}

// load reads the engine's load (loop goroutine).
func (e *Engine) load() EngineLoad {
	l := EngineLoad{Running: len(e.running), Waiting: len(e.waiting), ActiveBlocks: e.kv.Active(), Blocks: e.kv.Capacity()}
	for _, q := range [][]*seq{e.waiting, e.running} {
		for _, s := range q {
			l.PrefillTokens += max(len(s.req.Tokens)-s.computed, 0)
		}
	}
	return l
}

// Loads reads every engine's load, visiting each loop once; the fleet must be running.
func (f *Fleet) Loads(ctx context.Context) ([]EngineLoad, error) {
	out := make([]EngineLoad, len(f.engines))
	done := make(chan struct{}, len(f.loops))
	for _, l := range f.loops {
		l.Do(func(time.Duration) {
			for i, e := range f.engines {
				if f.loopOf[i] == l {
					out[i] = e.load()
				}
			}
			done <- struct{}{}
		})
	}
	for range f.loops {
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}
