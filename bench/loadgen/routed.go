package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/dataplane/worker"
)

// routed sends a run through standalone routers (Options.Routers, `dataplane router`): each
// request asks a router, round-robin, where to go (POST /v1/route with a request id, so the
// router tracks it), goes to that worker's endpoint as the router's fleet announces it (GET
// /v1/fleet, read again when a worker is new), and reports its first token and its end there
// (POST /v1/lifecycle). A disaggregated decision (the answer names a prefill worker) is sent as
// vLLM's disaggregated proxies do: the prefill step to the prefill worker, its end reported
// (prefill_done), then the request with the kv_transfer_params it returned to the decode worker.
// Request ids are the run's: "loadgen-<run>-<i>".
type routed struct {
	client  *http.Client
	routers []string
	run     string
	next    atomic.Uint64

	mu        sync.Mutex
	endpoints map[string]string // worker name → base URL
}

func newRouted(client *http.Client, routers []string, run string) *routed {
	return &routed{client: client, routers: routers, run: run, endpoints: map[string]string{}}
}

// prefillStep runs the prefill step of a disaggregated request on the prefill worker at ep (the
// prompt, max_tokens 1, answered whole) and returns the kv_transfer_params its answer carries
// for the decode step.
func (r *routed) prefillStep(ctx context.Context, router, ep string, body map[string]any) (json.RawMessage, error) {
	step := make(map[string]any, len(body)+1)
	for k, v := range body {
		step[k] = v
	}
	step["max_tokens"], step["stream"], step["kv_transfer_params"] = 1, false, worker.PrefillParams
	delete(step, "stream_options")
	var out struct {
		KVTransfer json.RawMessage `json:"kv_transfer_params"`
	}
	err := r.post(ctx, ep+"/v1/completions", step, &out)
	if fresh, ok := r.stale(ctx, router, ep, err); ok {
		err = r.post(ctx, fresh+"/v1/completions", step, &out)
	}
	if err != nil {
		return nil, fmt.Errorf("prefill step: %w", err)
	}
	if len(out.KVTransfer) == 0 || string(out.KVTransfer) == "null" {
		return nil, fmt.Errorf("prefill step at %s: no kv_transfer_params in its answer", ep)
	}
	return out.KVTransfer, nil
}

// route asks a router for the request's worker and returns the router, the worker's base URL
// and the request id; for a disaggregated decision the worker is the decode worker and
// prefillEP the prefill worker's base URL ("" otherwise).
func (r *routed) route(ctx context.Context, i int, toks []int32, spans []worker.MediaSpan) (router, endpoint, prefillEP, id string, err error) {
	router = r.routers[int(r.next.Add(1)-1)%len(r.routers)]
	id = "loadgen-" + r.run + "-" + strconv.Itoa(i)
	media := make([]map[string]any, 0, len(spans))
	for _, m := range spans {
		media = append(media, map[string]any{"id": m.ID, "offset": m.Start, "length": m.End - m.Start})
	}
	var d struct {
		Worker  string `json:"worker"`
		Prefill string `json:"prefill"`
	}
	if err := r.post(ctx, router+"/v1/route", map[string]any{"token_ids": toks, "media": media, "request_id": id}, &d); err != nil {
		return router, "", "", id, err
	}
	if endpoint, err = r.endpoint(ctx, router, d.Worker); err == nil && d.Prefill != "" {
		prefillEP, err = r.endpoint(ctx, router, d.Prefill)
	}
	if err != nil {
		r.lifecycle(router, id, "cancel")
	}
	return router, endpoint, prefillEP, id, err
}

// endpoint is a worker's base URL, from the router's fleet.
func (r *routed) endpoint(ctx context.Context, router, name string) (string, error) {
	r.mu.Lock()
	ep, ok := r.endpoints[name]
	r.mu.Unlock()
	if ok {
		return ep, nil
	}
	return r.refresh(ctx, router, name)
}

// stale handles a request that could not connect to ep: if the router's fleet now lists
// another endpoint under a name ep was cached for (a worker stopped and another started under
// its name, as a planner does), it returns that one, so the request can be sent again.
func (r *routed) stale(ctx context.Context, router, ep string, err error) (string, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return "", false
	}
	r.mu.Lock()
	name := ""
	for n, e := range r.endpoints {
		if e == ep {
			name = n
			delete(r.endpoints, n)
		}
	}
	r.mu.Unlock()
	if name == "" {
		return "", false
	}
	fresh, ferr := r.refresh(ctx, router, name)
	return fresh, ferr == nil && fresh != ep
}

// refresh reads the router's fleet into the cache and returns name's endpoint.
func (r *routed) refresh(ctx context.Context, router, name string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, router+"/v1/fleet", nil)
	if err != nil {
		return "", err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var workers []struct {
		Name     string `json:"name"`
		Endpoint string `json:"endpoint"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/v1/fleet: %s", router, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&workers); err != nil {
		return "", fmt.Errorf("GET %s/v1/fleet: %w", router, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range workers {
		if w.Endpoint != "" {
			r.endpoints[w.Name] = strings.TrimRight(w.Endpoint, "/")
		}
	}
	ep, ok := r.endpoints[name]
	if !ok {
		return "", fmt.Errorf("router %s routed to %q, which its fleet does not list with an endpoint", router, name)
	}
	return ep, nil
}

// lifecycle reports a request's first token or end to the router that routed it; a failure
// only costs the router an entry until its request TTL.
func (r *routed) lifecycle(router, id, event string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.post(ctx, router+"/v1/lifecycle", map[string]string{"request_id": id, "event": event}, nil)
}

func (r *routed) post(ctx context.Context, url string, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	if out != nil {
		return json.Unmarshal(msg, out)
	}
	return nil
}
