package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseStatic(t *testing.T) {
	ws, err := ParseStatic([]byte(`[
		{"name": "p0", "endpoint": "http://127.0.0.1:8100", "role": "prefill", "topology": {"zone": "z0", "rack": "r1"}},
		{"name": "d0", "endpoint": "https://d0:8000", "role": "decode", "topology": {"zone": "z1"}, "kv_blocks": 100},
		{"name": "a0", "endpoint": "http://a0:8000"}]`))
	require.NoError(t, err)
	require.Len(t, ws, 3)
	require.Equal(t, Worker{Name: "p0", Role: Prefill, Endpoint: "http://127.0.0.1:8100", Labels: map[string]string{"zone": "z0", "rack": "r1"}}, ws[0])
	require.Equal(t, int64(100), ws[1].KVBlocks)
	require.Equal(t, Aggregated, ws[2].Role, "no role: aggregated")

	bad := func(raw, want string) {
		t.Helper()
		_, err := ParseStatic([]byte(raw))
		require.ErrorContains(t, err, want)
	}
	bad(`{}`, "want a JSON list")
	bad(`[{"name": "p 0", "endpoint": "http://x"}]`, "entry 0: name")
	bad(`[{"name": "p0", "endpoint": "x:80"}]`, "entry 0: endpoint")
	bad(`[{"name": "p0", "endpoint": "http://x", "role": "boss"}]`, `role "boss"`)
	bad(`[{"name": "p0", "endpoint": "http://x", "role": "encoder"}]`, "role encoder")
	bad(`[{"name": "p0", "endpoint": "http://x"}, {"name": "p0", "endpoint": "http://y"}]`, `entry 1: name "p0" twice`)
	bad(`[{"name": "p0", "endpoint": "http://x", "topology": {"": "z"}}]`, "label")
}

// FuzzParseStatic: a static fleet file never panics, and what it accepts passes the
// announcement's checks.
func FuzzParseStatic(f *testing.F) {
	f.Add(`[{"name": "p0", "endpoint": "http://127.0.0.1:8100", "role": "prefill", "topology": {"zone": "z0"}}]`)
	f.Add(`[{"name": "d", "endpoint": "https://x", "role": "decode", "kv_blocks": 3}]`)
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := ParseStatic([]byte(s))
		if err != nil {
			return
		}
		for _, w := range ws {
			require.NoError(t, w.Check())
		}
	})
}
