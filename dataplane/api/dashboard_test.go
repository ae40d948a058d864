package api

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every metric the Grafana dashboard queries is one a running daemon exports (GPU metrics
// only exist where NVML does).
func TestDashboardMetricsExist(t *testing.T) {
	raw, err := os.ReadFile("../dashboards/dataplane.json")
	require.NoError(t, err)
	d := startDaemon(t, nil)
	code, _ := d.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user",
		"content": []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}}}}}})
	require.Equal(t, 200, code)
	_, metrics := get(t, d.base+"/metrics")
	for _, name := range regexp.MustCompile(`dataplane_[a-z_]+`).FindAllString(string(raw), -1) {
		if strings.HasPrefix(name, "dataplane_gpu_") {
			continue
		}
		require.Contains(t, metrics, "\n"+name, "the dashboard queries %s", name)
	}
}
