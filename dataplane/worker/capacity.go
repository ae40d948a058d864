package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MaxMetricsBytes bounds the /metrics page KVCapacity reads (a vLLM engine's is tens of KiB).
const MaxMetricsBytes = 4 << 20

// cacheConfigMetric is vLLM's info gauge of its CacheConfig: one series (per engine, on versions
// that label engines) whose labels are the config's fields, num_gpu_blocks among them
// (vllm/v1/metrics/loggers.py, CacheConfig.metrics_info in vllm/config/cache.py).
const cacheConfigMetric = "vllm:cache_config_info"

// KVCapacity asks a vLLM engine at baseURL (http://host:port) how many KV blocks its cache has:
// the num_gpu_blocks label of vllm:cache_config_info on its /metrics page (engine "0"'s series
// when the engine labels several). It reads at most MaxMetricsBytes. A page without the metric
// (not vLLM, or metrics off), or whose num_gpu_blocks is not a positive number yet ("None" while
// the engine profiles its memory), is an error that says so.
func KVCapacity(ctx context.Context, client *http.Client, baseURL string) (int64, error) {
	url := strings.TrimRight(baseURL, "/") + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("kv capacity: %w", err)
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("kv capacity: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("kv capacity: GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMetricsBytes+1))
	if err != nil {
		return 0, fmt.Errorf("kv capacity: GET %s: %w", url, err)
	}
	if len(body) > MaxMetricsBytes {
		return 0, fmt.Errorf("kv capacity: GET %s: page larger than %d bytes", url, MaxMetricsBytes)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("kv capacity: %s: %w", url, err)
	}
	fam := families[cacheConfigMetric]
	if fam == nil || len(fam.GetMetric()) == 0 {
		return 0, fmt.Errorf("kv capacity: %s has no %s (not a vLLM engine, or one that exports no metrics)", url, cacheConfigMetric)
	}
	var labels map[string]string
	for _, m := range fam.GetMetric() {
		ls := map[string]string{}
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		if labels == nil || ls["engine"] == "0" {
			labels = ls
		}
	}
	v, ok := labels["num_gpu_blocks"]
	if !ok {
		return 0, fmt.Errorf("kv capacity: %s: %s has no num_gpu_blocks label", url, cacheConfigMetric)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("kv capacity: %s: num_gpu_blocks is %q, not a block count (yet)", url, v)
	}
	return n, nil
}
