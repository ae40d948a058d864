package worker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// vllmCacheConfig is vLLM's cache config info gauge as prometheus_client writes it:
//   - name, help and type: vllm/v1/metrics/loggers.py at vllm-project/vllm@a6f0308cfe806b7731ad4979c9bea6e470c35efd
//     (PrometheusStatLogger.log_metrics_info: name "vllm:cache_config_info", documentation
//     "Information of the LLMEngine CacheConfig", a Gauge set to 1 whose label names are
//     cache_config.metrics_info().keys());
//   - the labels: CacheConfig.metrics_info in vllm/config/cache.py at
//     vllm-project/vllm@c1d86421174a87056edc90a41dc9942391509e84 (every field, str(value), in
//     field order: num_gpu_blocks is "None" until the engine has profiled its memory);
//   - the layout of the line: docs/source/design/v1/metrics.md ("Cache Config Info") at
//     vllm-project/vllm@2466487104d4e5a1a34d125c113494a69675e56a.
//
// blocks and engine fill num_gpu_blocks and, for versions that label engines, engine ("" : no
// engine label).
func vllmCacheConfig(blocks, engine string) string {
	labels := `block_size="16",gpu_memory_utilization="0.9",swap_space="4",cache_dtype="auto",is_attention_free="False",` +
		`num_gpu_blocks_override="None",sliding_window="None",enable_prefix_caching="True",prefix_caching_hash_algo="sha256",` +
		`cpu_offload_gb="0",calculate_kv_scales="False",cpu_kvcache_space_bytes="None",mamba_page_size_padded="None",` +
		`mamba_block_size="None",mamba_cache_dtype="auto",mamba_ssm_cache_dtype="auto",num_gpu_blocks="` + blocks + `",` +
		`num_cpu_blocks="None",kv_sharing_fast_prefill="False",kv_cache_memory_bytes="None",kv_offloading_size="None",` +
		`kv_offloading_backend="None"`
	if engine != "" {
		labels += `,engine="` + engine + `"`
	}
	return "vllm:cache_config_info{" + labels + "} 1.0\n"
}

// metricsPage is a vLLM /metrics page around the cache config lines (a gauge and a histogram
// of vLLM's, and prometheus_client's own python_info).
func metricsPage(cacheConfig ...string) string {
	page := `# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-VL-7B-Instruct"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-VL-7B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen2.5-VL-7B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-VL-7B-Instruct"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen2.5-VL-7B-Instruct"} 0.0
`
	if len(cacheConfig) > 0 {
		page += "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n" +
			strings.Join(cacheConfig, "")
	}
	return page
}

func TestKVCapacity(t *testing.T) {
	page := ""
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	ctx := context.Background()

	ok := func(want int64, p string) {
		t.Helper()
		page = p
		got, err := KVCapacity(ctx, srv.Client(), srv.URL+"/")
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	fails := func(wantErr, p string) {
		t.Helper()
		page = p
		_, err := KVCapacity(ctx, srv.Client(), srv.URL)
		require.ErrorContains(t, err, wantErr)
	}
	ok(27283, metricsPage(vllmCacheConfig("27283", "")))
	ok(27283, metricsPage(vllmCacheConfig("27283", "0")))
	ok(9000, metricsPage(vllmCacheConfig("12000", "1"), vllmCacheConfig("9000", "0")))
	fails("has no vllm:cache_config_info (not a vLLM engine", metricsPage())
	fails(`num_gpu_blocks is "None", not a block count (yet)`, metricsPage(vllmCacheConfig("None", "0")))
	fails("has no num_gpu_blocks label", metricsPage("vllm:cache_config_info{block_size=\"16\"} 1.0\n"))
	fails("page larger than", metricsPage(vllmCacheConfig("1", ""))+strings.Repeat("# padding\n", MaxMetricsBytes/10+1))
	fails("text format parsing error", "vllm:cache_config_info{block_size=16} 1.0\n")
	status = http.StatusServiceUnavailable
	fails("503 Service Unavailable", metricsPage(vllmCacheConfig("27283", "")))
}
