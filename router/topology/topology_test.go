package topology

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParsePolicy(t *testing.T) {
	f := func(in string, want Policy) {
		t.Helper()
		p, err := ParsePolicy(in)
		require.NoError(t, err)
		require.Equal(t, want, p)
	}
	f("", Fail)
	f("fail", Fail)
	f(" Fallback ", Fallback)
	_, err := ParsePolicy("prefer")
	require.ErrorContains(t, err, `"prefer"`)
}

func TestParseQoS(t *testing.T) {
	q, err := ParseQoS("zone=2ms@5GB/s, rack=200us@25GB,local=20us@5e10")
	require.NoError(t, err)
	require.Equal(t, []LevelLink{{"zone", Link{2 * time.Millisecond, 5e9}}, {"rack", Link{200 * time.Microsecond, 25e9}}}, q.Levels)
	require.Equal(t, Link{20 * time.Microsecond, 5e10}, q.Local)

	j, err := ParseQoSJSON([]byte(`{"levels": [{"level": "zone", "latency": "2ms", "bandwidth": "5GB/s"},
		{"level": "rack", "latency": "200us", "bandwidth": "25e9"}], "local": {"latency": "20us", "bandwidth": "50GB"}}`))
	require.NoError(t, err)
	require.Equal(t, q, j, "the flag and file forms say the same")

	bad := func(in, want string) {
		t.Helper()
		_, err := ParseQoS(in)
		require.ErrorContains(t, err, want)
	}
	bad("zone=2ms@5GB", "no local=")
	bad("zone=2ms", "is not LEVEL=LATENCY@BANDWIDTH")
	bad("zone=2ms@0,local=1us@1", "bandwidth")
	bad("zone=-1ms@1G,local=1us@1", "latency")
	bad("zone=1ms@1G,zone=2ms@1G,local=1us@1", `level "zone" twice`)
	bad("=1ms@1G,local=1us@1", "level")
	bad("zone=1ms@1G,local=1us@1,local=1us@1", "local twice")
	bad("zone=1ms@1e400,local=1us@1", "bandwidth")
	_, err = ParseQoSJSON([]byte(`{"levels": []}`))
	require.ErrorContains(t, err, `no "local"`)
	_, err = ParseQoSJSON([]byte(`{"levels": [{"level": "zone", "latency": "x", "bandwidth": "1"}], "local": {"latency": "1us", "bandwidth": "1"}}`))
	require.ErrorContains(t, err, "levels[0]: latency")
}

// The link is the broadest level two workers differ at; a missing label differs.
func TestBetween(t *testing.T) {
	q, err := ParseQoS("zone=10ms@1GB,rack=1ms@10GB,local=100us@100GB")
	require.NoError(t, err)
	a := map[string]string{"zone": "z0", "rack": "r0"}
	f := func(b map[string]string, level string, seconds float64) {
		t.Helper()
		l, lv := q.Between(a, b)
		require.Equal(t, level, lv)
		require.InDelta(t, seconds, l.Seconds(1e9), 1e-12)
	}
	f(map[string]string{"zone": "z0", "rack": "r0"}, "", 100e-6+0.01)
	f(map[string]string{"zone": "z0", "rack": "r1"}, "rack", 1e-3+0.1)
	f(map[string]string{"zone": "z1", "rack": "r0"}, "zone", 10e-3+1)
	f(map[string]string{"rack": "r0"}, "zone", 10e-3+1)
	f(nil, "zone", 10e-3+1)
	require.True(t, (&QoS{}).Empty())
	require.False(t, q.Empty())
}

func TestLayout(t *testing.T) {
	l := Layout{Zones: 2, Racks: 2}
	require.Equal(t, map[string]string{"zone": "zone-0", "rack": "zone-0-rack-0"}, l.Labels(0))
	require.Equal(t, map[string]string{"zone": "zone-1", "rack": "zone-1-rack-0"}, l.Labels(1))
	require.Equal(t, map[string]string{"zone": "zone-0", "rack": "zone-0-rack-1"}, l.Labels(2))
	require.Equal(t, map[string]string{"zone": "zone-0", "rack": "zone-0-rack-0"}, l.Labels(4))
	require.Equal(t, map[string]string{"zone": "zone-1"}, Layout{Zones: 2}.Labels(3))
	require.Nil(t, Layout{}.Labels(3))
}

// Present: every visible file is a level; hidden entries and directories (the Downward API's
// "..data") are not, and a symbolic link to a file is read through.
func TestReadDomainsPresent(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "zone"), []byte("us-east-1a\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "..data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "..data", "rack"), []byte("r7"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join("..data", "rack"), filepath.Join(dir, "rack")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".hidden"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "node"), nil, 0o644)) // empty: no level
	d, err := ReadDomains(context.Background(), dir, "zone", time.Second, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"zone": "us-east-1a", "rack": "r7"}, d)
}

// Absent: the level's file is polled for until the wait ends, then an error names it; one that
// appears (or gets content) meanwhile is read.
func TestReadDomainsRetryThenFail(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	_, err := ReadDomains(context.Background(), dir, "zone", 150*time.Millisecond, 20*time.Millisecond)
	var missing *ErrDomainMissing
	require.True(t, errors.As(err, &missing), "%v", err)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "it waited")
	require.Contains(t, err.Error(), `"zone"`)
	require.Contains(t, err.Error(), dir)

	// The directory itself appears late, with an empty file that fills later still.
	late := filepath.Join(dir, "late")
	go func() {
		time.Sleep(40 * time.Millisecond)
		_ = os.Mkdir(late, 0o755)
		_ = os.WriteFile(filepath.Join(late, "zone"), nil, 0o644)
		time.Sleep(40 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(late, "zone.tmp"), []byte("eu-west-1b"), 0o644)
		_ = os.Rename(filepath.Join(late, "zone.tmp"), filepath.Join(late, "zone"))
	}()
	d, err := ReadDomains(context.Background(), late, "zone", 5*time.Second, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "eu-west-1b", d["zone"])

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ReadDomains(ctx, dir, "zone", time.Minute, time.Millisecond)
	require.ErrorIs(t, err, context.Canceled)
}

// Label missing: other levels are there but not the configured one; bad files are named.
func TestReadDomainsLabelMissingAndBadFiles(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "zone"), []byte("z1"), 0o644))
	_, err := ReadDomains(context.Background(), dir, "rack", 30*time.Millisecond, 10*time.Millisecond)
	require.ErrorContains(t, err, `no "rack" file`)

	_, err = ReadDomains(context.Background(), dir, "../zone", time.Second, time.Millisecond)
	require.ErrorContains(t, err, "want a file name")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "rack"), []byte(strings.Repeat("r", 400)), 0o644))
	_, err = ReadDomains(context.Background(), dir, "zone", time.Second, time.Millisecond)
	require.ErrorContains(t, err, "rack: more than")
}

// FuzzParseQoS: both forms of the table never panic, and what they accept passes Check with
// finite, positive bandwidths.
func FuzzParseQoS(f *testing.F) {
	f.Add("zone=2ms@5GB/s,rack=200us@25GB,local=20us@5e10")
	f.Add(`{"levels": [{"level": "zone", "latency": "2ms", "bandwidth": "5GB/s"}], "local": {"latency": "1us", "bandwidth": "1"}}`)
	f.Add("local=0s@1k")
	f.Fuzz(func(t *testing.T, s string) {
		for _, parse := range []func() (QoS, error){
			func() (QoS, error) { return ParseQoS(s) },
			func() (QoS, error) { return ParseQoSJSON([]byte(s)) },
		} {
			q, err := parse()
			if err != nil {
				continue
			}
			require.NoError(t, q.Check())
			l, _ := q.Between(map[string]string{"zone": "a"}, nil)
			require.False(t, l.Seconds(1e9) < 0)
		}
	})
}
