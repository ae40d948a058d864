package main

import (
	"bufio"
	"encoding/binary"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// metricFamilies scrapes url and lists its dataplane_* families as "name{labels} type help",
// sorted (the label names its series have, le aside). go_* and process_* come from
// client_golang and change with Go's version.
func metricFamilies(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	help, typ, labels := map[string]string{}, map[string]string{}, map[string]map[string]bool{}
	labelName := regexp.MustCompile(`[{,]([a-z_]+)="`)
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	family := ""
	for lines.Scan() {
		line := lines.Text()
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, text, _ := strings.Cut(rest, " ")
			help[name], family, labels[name] = text, name, map[string]bool{}
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, kind, _ := strings.Cut(rest, " ")
			typ[name] = kind
		} else if family != "" && strings.HasPrefix(line, family) {
			for _, m := range labelName.FindAllStringSubmatch(line, -1) {
				if m[1] != "le" {
					labels[family][m[1]] = true
				}
			}
		}
	}
	require.NoError(t, lines.Err())
	var out []string
	for name, text := range help {
		if strings.HasPrefix(name, "dataplane_") {
			keys := slices.Sorted(maps.Keys(labels[name]))
			out = append(out, name+"{"+strings.Join(keys, ",")+"} "+typ[name]+" "+text)
		}
	}
	slices.Sort(out)
	return out
}

// routerFamilies are what a router with workers exposes wherever it runs: its index, its slot
// tracker, its workers and the KV events' counters.
var routerFamilies = []string{
	"dataplane_router_decisions_total{} counter Routing decisions made.",
	"dataplane_router_index_blocks{} gauge Distinct KV blocks in the index (its nodes).",
	"dataplane_router_index_bytes{} gauge Memory of the index's tables, summaries and overflow bitmaps.",
	"dataplane_router_index_entries{} gauge (block, worker, tier) entries in the index.",
	"dataplane_router_kv_blocks_total{op} counter Index entries added or removed by KV events, or evicted to keep a worker within its KV capacity.",
	"dataplane_router_kv_events_total{outcome} counter KV events and batches by outcome.",
	"dataplane_router_kv_stream_total{incident} counter Event stream incidents.",
	"dataplane_router_requests_in_flight{} gauge Requests tracked by the slot tracker.",
	"dataplane_router_worker_active_blocks{worker} gauge Blocks in use by the worker's requests in flight (shared prefixes once).",
	"dataplane_router_worker_cached_blocks{tier,worker} gauge Blocks the index says a worker holds, per tier.",
	"dataplane_router_worker_healthy{worker} gauge 1 if the worker takes new requests.",
	"dataplane_router_worker_prefill_tokens{worker} gauge Prompt tokens routed to the worker and not yet past their first output token.",
	"dataplane_router_worker_requests{worker} gauge Requests in flight on the worker.",
}

// withRouterFamilies is families and routerFamilies, sorted.
func withRouterFamilies(families ...string) []string {
	return slices.Sorted(slices.Values(slices.Concat(families, routerFamilies)))
}

// What `dataplane router` exposes once it has a worker and has answered a route, with each
// family's labels, type and help: users scrape these, so a rename, a relabelling or a reworded
// help is a change to them, never a side effect of moving code.
func TestRouterCommandMetricNames(t *testing.T) {
	pub, addr, stop := startRouter(t, "")
	defer stop()
	base := "http://" + addr
	require.NoError(t, pub.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0), []byte{0x92, 0x01, 0x90})))
	resp, err := http.Post(base+"/v1/route", "application/json", strings.NewReader(`{"token_ids": [1, 2, 3]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.Equal(t, withRouterFamilies(
		"dataplane_router_http_requests_total{code,route} counter Router HTTP requests by route and status code.",
		"dataplane_router_route_duration_seconds{} histogram Time to answer POST /v1/route: parse, hash, match, score.",
	), metricFamilies(t, base+"/metrics"))
}

// What `dataplane serve` exposes once it has answered a chat request (the router's families
// among them), as TestRouterCommandMetricNames does for the router alone.
func TestServeMetricNames(t *testing.T) {
	base, curl := startServe(t, "--mock-speedup", "20")
	body := []byte(curl[strings.Index(curl, "-d '")+4 : len(curl)-1])
	code, out := postJSON(t, base+"/v1/chat/completions", body)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, withRouterFamilies(
		"dataplane_build_info{goversion,native_isa,version} gauge Always 1; the labels say which build and native kernels are running.",
		"dataplane_encode_batch_items{modality} histogram Inputs per encoder batch.",
		"dataplane_encode_batch_seconds{modality} histogram Time an encoder batch ran.",
		"dataplane_encode_queue_wait_seconds{modality} histogram Time the oldest input of a batch waited in the encoder queue.",
		"dataplane_encode_seconds{modality} histogram One media item from submission to its last input encoded.",
		"dataplane_features_cache_hits_total{} counter Admissions that reused a live record (cached or being encoded) and skipped encoding.",
		"dataplane_features_cache_misses_total{} counter Admissions that reserved memory to encode.",
		"dataplane_features_evictions_total{reason} counter Idle cached entries dropped: lru (memory needed), ttl (expired), close.",
		"dataplane_features_pool_bytes{pool,use} gauge Bytes of a feature pool by use: capacity (the budget), used (settled), reserved (encodings in flight), idle (cached, evictable), free.",
		"dataplane_features_pool_fragmentation_ratio{kind,pool} gauge internal: share of carved bytes lost to block rounding; external: share of free bytes no single allocation can reach.",
		"dataplane_features_pool_rejections_total{pool,reason} counter Allocations refused: queue_full (429), timeout (503), too_large (413).",
		"dataplane_features_pool_waiting{pool} gauge Allocations waiting for memory now.",
		"dataplane_features_pool_waits_total{pool} counter Allocations that had to wait for memory (backpressure).",
		"dataplane_features_records{state} gauge Live feature records by state.",
		"dataplane_http_request_duration_seconds{route} histogram Time from request read to response written, by route.",
		"dataplane_http_requests_total{code,route} counter HTTP requests answered, by route and status code.",
		"dataplane_media_items_total{cache,modality} counter Media items admitted, by modality and whether the reuse cache had their features.",
		"dataplane_memory_budget_bytes{part} gauge How --memory-bytes is divided: total, features (the feature store), baseline (resident with the models loaded), reserve (runtime), requests.",
		"dataplane_memory_refusals_total{reason} counter Reservations the request budget refused, by reason (too_large: 413; full, queue_full: 503).",
		"dataplane_memory_request_bytes{use} gauge The request budget (bodies, decoded media, encoder inputs): capacity, used now, of it intake (bodies still arriving), peak since start.",
		"dataplane_merge_seconds{} histogram Time to merge a request's text and media into its sequence.",
		"dataplane_request_duration_seconds{endpoint} histogram Arrival to the last token (or the failure).",
		"dataplane_requests_total{endpoint,outcome} counter Requests by endpoint and outcome (ok, bad_request, rejected, cancelled, error).",
		"dataplane_ttft_seconds{} histogram Arrival to the first token from the LLM worker.",
		"dataplane_warmup_failed_total{} counter Prefix warm-ups the worker refused or did not answer in time.",
		"dataplane_warmup_sent_total{} counter Prefix warm-ups sent to the chosen worker while a request's media encoded.",
		"dataplane_warmup_skipped_total{reason} counter Requests with media not warmed up, by reason: reused (nothing to encode), handoff (embeds), short (prefix under the minimum), cached (already there), busy (in-flight limit), closing.",
		"dataplane_worker_probes_total{result,worker} counter Health probes of LLM workers, by result (ok, failed).",
	), metricFamilies(t, base+"/metrics"))
}
