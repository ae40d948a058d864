package chaos

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The pure parts only: running the scenarios needs a built binary and minutes
// (`make soak`), so no test here starts a process.

func TestFormatStatuses(t *testing.T) {
	f := func(in map[string]int, want string) {
		t.Helper()
		require.Equal(t, want, formatStatuses(in))
	}
	f(nil, "—")
	f(map[string]int{"503": 0}, "—")
	f(map[string]int{"503": 12, "200": 1010}, "200×1010 503×12")
	f(map[string]int{"timeout": 3, "error": 1, "499": 2, "1000": 1}, "499×2 1000×1 error×1 timeout×3")
}

func TestUnexpected(t *testing.T) {
	st := map[string]int{"200": 5, "503": 2, "500": 1, "timeout": 3}
	require.Equal(t, "500×1 timeout×3", unexpected(st, "200", "429", "503"))
	require.Equal(t, "", unexpected(map[string]int{"200": 5}, "200"))
}

func TestFormatBytesAndDurations(t *testing.T) {
	f := func(n int64, want string) {
		t.Helper()
		require.Equal(t, want, formatBytes(n))
	}
	f(0, "0 B")
	f(1023, "1023 B")
	f(512<<10, "512 KiB")
	f(612<<20, "612 MiB")
	f(1<<30, "1.0 GiB")
	f(2800<<20, "2.7 GiB")
	require.Equal(t, "850ms", formatDuration(850*time.Millisecond))
	require.Equal(t, "12.3s", formatDuration(12300*time.Millisecond))
}

const procStatusText = `Name:	dataplane
Umask:	0022
State:	S (sleeping)
Pid:	26838
VmPeak:	 2869864 kB
VmSize:	 2869864 kB
VmLck:	       0 kB
VmHWM:	  812344 kB
VmRSS:	   73312 kB
RssAnon:	   40000 kB
Threads:	12
`

func TestParseProcStatus(t *testing.T) {
	st, err := parseProcStatus([]byte(procStatusText))
	require.NoError(t, err)
	require.Equal(t, procStatus{RSS: 73312 << 10, HWM: 812344 << 10}, st)

	// A zombie's status has no Vm lines.
	_, err = parseProcStatus([]byte("Name:\tdataplane\nState:\tZ (zombie)\n"))
	require.Error(t, err)
	_, err = parseProcStatus([]byte("VmHWM:\t 12 kB\nVmRSS:\t twelve kB\n"))
	require.ErrorContains(t, err, "VmRSS")
	_, err = parseProcStatus([]byte("VmHWM:\t 12 MB\nVmRSS:\t 12 kB\n"))
	require.ErrorContains(t, err, "VmHWM")
}

func TestReadOwnProcStatus(t *testing.T) {
	st, err := readProcStatus(1) // init: present on any Linux
	if err != nil {
		t.Skip("no /proc/1/status here:", err)
	}
	require.Positive(t, st.HWM)
	require.GreaterOrEqual(t, st.HWM, st.RSS)
}

const metricsText = `# HELP dataplane_features_pool_bytes Bytes of a feature pool by use.
# TYPE dataplane_features_pool_bytes gauge
dataplane_features_pool_bytes{pool="host",use="capacity"} 1.073741824e+09
dataplane_features_pool_bytes{pool="host",use="used"} 0
dataplane_features_pool_bytes{pool="host",use="reserved"} 131072
dataplane_http_requests_total{code="200",route="/v1/chat/completions"} 4
dataplane_http_requests_total{code="499",route="/v1/chat/completions"} 14
dataplane_http_requests_total{code="200",route="/healthz"} 9
dataplane_requests_total{endpoint="chat",outcome="cancelled"} 14
dataplane_requests_total{endpoint="completions",outcome="cancelled"} 1
dataplane_request_duration_seconds_bucket{endpoint="chat",le="+Inf"} 18
weird_label{msg="a \"quoted\", comma\\ and\nnewline",x="y"} -3.5 1700000000000
process_resident_memory_bytes 7.3312e+07
`

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(metricsText))
	require.NoError(t, err)
	require.Len(t, m, 11)

	v, ok := m.get("dataplane_features_pool_bytes", "pool", "host", "use", "reserved")
	require.True(t, ok)
	require.Equal(t, 131072.0, v)
	_, ok = m.get("dataplane_features_pool_bytes", "pool", "device", "use", "used")
	require.False(t, ok)
	v, ok = m.get("process_resident_memory_bytes")
	require.True(t, ok)
	require.Equal(t, 73312e3, v)

	codes := m.by("dataplane_http_requests_total", "code", "route", "/v1/chat/completions")
	require.Equal(t, map[string]float64{"200": 4, "499": 14}, codes)
	require.Equal(t, map[string]float64{"cancelled": 15}, m.by("dataplane_requests_total", "outcome"))

	v, ok = m.get("weird_label", "msg", "a \"quoted\", comma\\ and\nnewline", "x", "y")
	require.True(t, ok)
	require.Equal(t, -3.5, v)
	v, ok = m.get("dataplane_request_duration_seconds_bucket", "le", "+Inf")
	require.True(t, ok)
	require.Equal(t, 18.0, v)

	for _, bad := range []string{
		`name{a="b"`,          // unterminated labels
		`name{a="b} 1`,        // unterminated value
		`name{a=b} 1`,         // unquoted value
		`name`,                // no value
		`name{a="b"} one`,     // not a number
		`name{a="b"} 1 2 3`,   // too many fields
		`name{a="b\`,          // dangling escape
		`{a="b"} 1`,           // no name
		"name{a=\"b\"}\t1\t2", // tabs are fine: this one parses
	} {
		_, err := parseMetrics(strings.NewReader(bad))
		if strings.HasPrefix(bad, "name{a=\"b\"}\t") {
			require.NoError(t, err, bad)
			continue
		}
		require.Error(t, err, bad)
	}
}

func TestListenAddressFromLogs(t *testing.T) {
	f := func(line, want string) {
		t.Helper()
		m := listenRE.FindStringSubmatch(line)
		got := ""
		if m != nil {
			got = m[1]
		}
		require.Equal(t, want, got)
	}
	f(`time=2026-11-24T08:54:17.220Z level=INFO msg="dataplane starting" version=4deefc4 go=go1.26.8 listen=127.0.0.1:37711 max_body_bytes=67108864`, "127.0.0.1:37711")
	f(`time=2026-11-24T08:54:17.220Z level=INFO msg=serving listen=[::1]:8200 first_engine=http://[::1]:8200/engines/0`, "[::1]:8200")
	f(`level=INFO msg="dataplane starting" admin_listen=127.0.0.1:9 listen=127.0.0.1:8000`, "127.0.0.1:8000")
	f(`level=INFO msg=models name=dataplane-demo`, "")
}

func TestHasFlag(t *testing.T) {
	h := &harness{help: `Usage: dataplane serve [flags]

Flags:
  -admin-listen string
    	HOST:PORT for /healthz and /metrics
  -fetch-http
    	allow http(s):// media URLs
  -max-conns int
    	most concurrent connections (default 16384)
  -memory-bytes-extra int
    	a longer name
`}
	require.True(t, h.hasFlag("admin-listen"))
	require.True(t, h.hasFlag("fetch-http"))
	require.True(t, h.hasFlag("max-conns"))
	require.False(t, h.hasFlag("memory-bytes"))
	require.False(t, h.hasFlag("conns"))
}

func testRows() []Row {
	return []Row{
		{Scenario: "body-flood", Statuses: map[string]int{"200": 1010, "503": 12}, PeakRSS: 700 << 20, MemoryBytes: 1 << 30,
			RSSBound: 1<<30 + 256<<20, FeaturesRead: true, LongestWait: 350 * time.Millisecond, Timeout: 10 * time.Second,
			TimeoutName: "client", Alive: true, Notes: []string{"100 flood connections"}},
		{Scenario: "sigterm-drain", Statuses: map[string]int{"200": 80}, PeakRSS: 68 << 20, MemoryBytes: 1 << 30,
			FeaturesNote: "daemon exited", LongestWait: 20 * time.Second, Timeout: 10 * time.Second, TimeoutName: "shutdown-timeout",
			AliveNote: "exit 1 after SIGTERM", Failures: []string{"exit 1 after SIGTERM", "serve has no --memory-bytes"}},
		{Scenario: "never-fits", Statuses: map[string]int{}, FeaturesRead: true, FeaturesUsed: 3 << 20, Alive: true,
			Failures: []string{"setup: serve exited"}},
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, testRows()))
	out := b.String()
	lines := strings.Split(out, "\n")
	require.Contains(t, lines[0], "scenario")
	require.Contains(t, lines[0], "peak RSS / memory-bytes")
	require.Contains(t, lines[1], "200×1010 503×12")
	require.Contains(t, lines[1], "700 MiB / 1.0 GiB")
	require.Contains(t, lines[1], "350ms / 10.0s client")
	require.True(t, strings.HasSuffix(strings.TrimSpace(lines[1]), "ok"), lines[1])
	require.Contains(t, lines[2], "n/a (daemon exited)")
	require.Contains(t, lines[2], "no (exit 1 after SIGTERM)")
	require.Contains(t, lines[2], "FAIL (exit 1 after SIGTERM; serve has no --memory-bytes)")
	require.Contains(t, lines[3], "no (used 3 MiB, reserved 0 B)")
	require.Contains(t, lines[3], "—")
	// The columns line up: every row's statuses cell starts where the header's does.
	col := strings.Index(lines[0], "statuses")
	for _, l := range lines[1:4] {
		require.Equal(t, byte(' '), l[col-1], l)
		require.NotEqual(t, byte(' '), l[col], l)
	}
	require.Contains(t, out, "notes:\n  body-flood: 100 flood connections\n")
	require.Contains(t, out, "3 scenarios, 1 ok, 2 failed")
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, testRows()))
	var got []map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &got))
	require.Len(t, got, 3)
	require.Equal(t, "body-flood", got[0]["scenario"])
	require.Equal(t, "200×1010 503×12", got[0]["statuses_text"])
	require.Equal(t, float64(700<<20), got[0]["peak_rss_bytes"])
	require.Equal(t, 0.35, got[0]["longest_wait_s"])
	require.Equal(t, true, got[0]["ok"])
	require.Equal(t, "ok", got[0]["verdict"])
	require.Equal(t, []any{}, got[0]["failures"])
	require.Equal(t, false, got[1]["ok"])
	require.Equal(t, []any{"exit 1 after SIGTERM", "serve has no --memory-bytes"}, got[1]["failures"])
	require.Equal(t, map[string]any{}, got[2]["statuses"])
}

func TestScenarioNamesUniqueAndBounded(t *testing.T) {
	seen := map[string]bool{}
	var total time.Duration
	for _, s := range scenarios() {
		require.False(t, seen[s.name], s.name)
		seen[s.name] = true
		require.Positive(t, s.limit, s.name)
		require.NotNil(t, s.run, s.name)
		total += s.limit
	}
	require.Len(t, seen, 12)
	// The limits are ceilings; a run's --total (5 min) bounds the sum of what they take.
	require.Less(t, total, 10*time.Minute)
}
