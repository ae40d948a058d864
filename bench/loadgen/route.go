package loadgen

import (
	"fmt"
	"time"

	"dataplane/bench/mocker"
	"dataplane/router"
)

// Picker chooses each in-process request's engine and hears how the request goes.
// RunInProcess calls Pick from its one sending goroutine, in trace order; FirstToken and Done
// come from the engines' loops.
type Picker interface {
	Pick(id string, r *mocker.Request) (engine int, err error)
	FirstToken(id string)
	Done(id string) // finished, failed or refused
}

// KVRouter routes as the daemon does: router.Router.Decide over the router's index (fed by the
// engines' own KV events through whatever the caller subscribed it to, NATS for a fleet) and
// its slot tracker, which KVRouter keeps with each request's lifecycle.
type KVRouter struct {
	r        *router.Router
	engine   map[string]int // worker name → fleet index
	decision router.Decision
}

// NewKVRouter routes over f's engines; each must be a worker of r under its engine name.
func NewKVRouter(r *router.Router, f *mocker.Fleet) (*KVRouter, error) {
	k := &KVRouter{r: r, engine: make(map[string]int, f.Len())}
	workers := map[string]bool{}
	for _, w := range r.Workers() {
		workers[w] = true
	}
	for i := range f.Len() {
		name := f.Engine(i).Name()
		if !workers[name] {
			return nil, &router.ErrUnknownWorker{Name: name}
		}
		k.engine[name] = i
	}
	return k, nil
}

func (k *KVRouter) Pick(id string, req *mocker.Request) (int, error) {
	if err := k.r.Decide(router.Request{Tokens: req.Tokens, Media: req.Media, Salt: req.Salt}, &k.decision); err != nil {
		return -1, err
	}
	eng, ok := k.engine[k.decision.Worker]
	if !ok {
		return -1, fmt.Errorf("router chose %q, not an engine of this fleet", k.decision.Worker)
	}
	if err := k.r.Start(id, k.decision, k.decision.Worker, time.Now()); err != nil {
		return -1, err
	}
	return eng, nil
}

func (k *KVRouter) FirstToken(id string) { k.r.FirstToken(id) }
func (k *KVRouter) Done(id string)       { k.r.Finish(id) }
