package mocker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/topology"
)

// A decode step whose KV cache arrives computed (RemotePrefill) prefills one token: its first
// token comes a step after admission, long before a local prefill of the same prompt would
// end; its blocks are stored (events) as if computed; after that first admission it is an
// ordinary request.
func TestEngineRemotePrefill(t *testing.T) {
	first := map[bool]time.Duration{}
	for _, remote := range []bool{false, true} {
		e, err := NewEngine(DefaultOptions(), nil)
		require.NoError(t, err)
		out := outputs{}
		r := &Request{ID: "q", Tokens: promptOf(4000, 1), MaxTokens: 3, RemotePrefill: remote, Sink: out.sink("q")}
		drive(t, e, []arrival{{0, r}}, nil)
		first[remote] = out["q"][0].At
		require.True(t, out["q"][0].First)
		st := e.Stats()
		if remote {
			require.Equal(t, int64(3999), st.RemoteTokens)
			require.Zero(t, st.PrefillTokens, "the last prompt token is computed like a decode step's")
		} else {
			require.Zero(t, st.RemoteTokens)
		}
		h, _ := router.NewHasher(16)
		hashes, _ := h.Sequence(nil, r.Tokens, router.SeedFor("", ""), nil)
		require.Equal(t, 250, e.KV().CachedPrefix(hashes), "every full prompt block held, received or computed")
	}
	require.Less(t, first[true]*10, first[false], "remote prefill: %v, local: %v", first[true], first[false])
}

// promptOf is n tokens from seed.
func promptOf(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*100000 + uint32(i)
	}
	return out
}

// A prefill step (do_remote_decode) is answered with vLLM's params for the decode step, naming
// the engine and where it sits; the decode step with them waits the KV cache's move by the two
// engines' domains, longer across zones, then streams with its prompt received, not computed;
// params without the remote keys make the engine compute the prompt, as vLLM's does.
func TestHTTPDisaggregatedSteps(t *testing.T) {
	fo := DefaultFleetOptions()
	fo.Engines, fo.Clock = 3, Clock{Speedup: 10}
	f, err := NewFleet(fo)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()
	so := DefaultServerOptions()
	layout := topology.Layout{Zones: 2}
	so.Labels = layout.Labels // engines 0, 2 in zone-0, 1 in zone-1
	so.Transfer.QoS, err = topology.ParseQoS("zone=300ms@1GB,local=1ms@1TB")
	require.NoError(t, err)
	so.Transfer.BytesPerToken = 1e6
	srv := httptest.NewServer(NewServer(f, so))
	defer func() { srv.Close(); cancel(); wg.Wait() }()

	prompt, _ := json.Marshal(promptOf(100, 2))
	post := func(path, body string) (int, string, time.Duration) {
		t.Helper()
		t0 := time.Now()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw), time.Since(t0)
	}
	code, out, _ := post("/engines/0/v1/completions", fmt.Sprintf(`{"prompt": %s, "max_tokens": 1, "stream": false,
		"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
		"remote_block_ids": null, "remote_host": null, "remote_port": null}}`, prompt))
	require.Equal(t, 200, code, out)
	var answer struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &answer))
	kv, err := ParseKVTransferParams(answer.KV)
	require.NoError(t, err)
	require.True(t, kv.Readable(), out)
	require.Equal(t, "mock-0", *kv.RemoteEngineID)
	require.Len(t, kv.RemoteBlockIDs, 7)
	require.Equal(t, "127.0.0.1", *kv.RemoteHost)
	require.Equal(t, map[string]string{"zone": "zone-0"}, kv.RemoteTopology)

	decode := func(engine int, params string) time.Duration {
		code, out, took := post(fmt.Sprintf("/engines/%d/v1/completions", engine),
			fmt.Sprintf(`{"prompt": %s, "max_tokens": 2, "stream": true, "kv_transfer_params": %s}`, prompt, params))
		require.Equal(t, 200, code, out)
		require.Contains(t, out, "[DONE]")
		return took
	}
	far := decode(1, string(answer.KV))
	require.GreaterOrEqual(t, far, 40*time.Millisecond, "across zones: 300 ms + 100 MB at 1 GB/s, at 10x")
	near := decode(2, string(answer.KV))
	require.Less(t, near, far)
	remote := func(i int) (n int64) {
		require.NoError(t, f.Inspect(context.Background(), i, func(e *Engine) { n = e.Stats().RemoteTokens }))
		return n
	}
	require.Equal(t, int64(99), remote(1))
	require.Equal(t, int64(99), remote(2))

	decode(1, `{"do_remote_prefill": true}`) // no remote keys: computed here
	require.Equal(t, int64(99), remote(1))

	code, out, _ = post("/engines/0/v1/completions", fmt.Sprintf(`{"prompt": %s, "stream": true, "kv_transfer_params": {"do_remote_decode": true}}`, prompt))
	require.Equal(t, 400, code, out)
	code, out, _ = post("/engines/0/v1/completions", fmt.Sprintf(`{"prompt": %s, "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": true}}`, prompt))
	require.Equal(t, 400, code, out)
	require.Contains(t, out, "kv_transfer_params")
}

// FuzzParseKVTransferParams: the params never panic, and a readable decode step names every
// remote key.
func FuzzParseKVTransferParams(f *testing.F) {
	f.Add(`{"do_remote_prefill": true, "remote_block_ids": [1, 2], "remote_engine_id": "e", "remote_request_id": "r", "remote_host": "h", "remote_port": 5600, "tp_size": 1}`)
	f.Add(`{"do_remote_decode": true, "remote_engine_id": null}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseKVTransferParams(json.RawMessage(s))
		if err != nil || !p.Readable() {
			return
		}
		require.NotNil(t, p.RemoteHost)
		require.NotEmpty(t, p.RemoteBlockIDs)
	})
}
