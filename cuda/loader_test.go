package cuda

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The test binary doubles as the probe child: `<test binary> gpu-probe [--cuda-plugin P]`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "gpu-probe" {
		explicit := ""
		if len(os.Args) > 3 {
			explicit = os.Args[3]
		}
		json.NewEncoder(os.Stdout).Encode(ProbeHere(SearchPath{Explicit: explicit})) //nolint:errcheck
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestCandidates(t *testing.T) {
	require.Equal(t, []string{"/x/p.so"}, SearchPath{Explicit: "/x/p.so", ExeDir: "/bin", BuildDir: "build"}.Candidates())
	require.Equal(t, []string{"/opt/dp/" + PluginName, "build/cuda/" + PluginName},
		SearchPath{ExeDir: "/opt/dp", BuildDir: DevBuildDir}.Candidates())
	require.Empty(t, SearchPath{}.Candidates())

	_, err := SearchPath{Explicit: "/nonexistent/libdataplane_cuda.so"}.Find()
	require.ErrorIs(t, err, ErrNoPlugin)
	require.ErrorContains(t, err, "/nonexistent/libdataplane_cuda.so")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, PluginName), nil, 0o644))
	got, err := SearchPath{ExeDir: "/nonexistent", BuildDir: dir}.Find()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, PluginName), got, "the first candidate that exists")
}

func TestOpenRefusesWhatIsNotAPlugin(t *testing.T) {
	_, err := Open("/nonexistent/lib.so")
	require.ErrorContains(t, err, "open /nonexistent/lib.so")
	// A real shared library without the init symbol.
	libm := "/lib/x86_64-linux-gnu/libm.so.6"
	if _, err := os.Stat(libm); err == nil {
		_, err = Open(libm)
		require.ErrorContains(t, err, "is not a dataplane plugin: no dp_plugin_init symbol")
	}
	// Not a shared library at all.
	junk := filepath.Join(t.TempDir(), "junk.so")
	require.NoError(t, os.WriteFile(junk, []byte("not an ELF file"), 0o644))
	_, err = Open(junk)
	require.ErrorContains(t, err, "junk.so")
}

// Without a plugin or a driver (this machine), the probe says so and the daemon stays on the CPU.
func TestProbeWithoutGPU(t *testing.T) {
	missing := "/nonexistent/libdataplane_cuda.so"
	r := ProbeHere(SearchPath{Explicit: missing})
	require.False(t, r.Usable())
	require.Contains(t, r.PluginError, "CUDA plugin not found")
	require.Contains(t, r.Summary(), "running on the CPU backend")
	if r.NVMLError != "" {
		require.Contains(t, r.NVMLError, "NVML unavailable")
	}

	exe, err := os.Executable()
	require.NoError(t, err)
	child := Probe(context.Background(), exe, missing, 30*time.Second)
	require.Equal(t, r.PluginError, child.PluginError, "the child reports what an in-process probe does")

	if plugin := os.Getenv("DATAPLANE_TEST_PLUGIN"); plugin != "" {
		ok := Probe(context.Background(), exe, plugin, 30*time.Second)
		require.True(t, ok.Usable(), "%+v", ok)
		require.Equal(t, "cpu", ok.Devices[0].Name)
		require.Contains(t, ok.Summary(), "1 device(s), device 0 cpu")
	}
}

// A probe child that crashes or hangs is a report, not a hang or a crash of the daemon.
func TestProbeChildFailures(t *testing.T) {
	dir := t.TempDir()
	crash := filepath.Join(dir, "crash")
	require.NoError(t, os.WriteFile(crash, []byte("#!/bin/sh\necho driver fault >&2\nkill -SEGV $$\n"), 0o755))
	r := Probe(context.Background(), crash, "", 10*time.Second)
	require.False(t, r.Usable())
	require.Contains(t, r.PluginError, "GPU probe failed")

	hang := filepath.Join(dir, "hang")
	require.NoError(t, os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755))
	start := time.Now()
	r = Probe(context.Background(), hang, "", 200*time.Millisecond)
	require.Contains(t, r.PluginError, "timed out after 200ms")
	require.Less(t, time.Since(start), 10*time.Second)

	garbage := filepath.Join(dir, "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte(fmt.Sprintf("#!/bin/sh\necho %s\n", "not-json")), 0o755))
	require.Contains(t, Probe(context.Background(), garbage, "", 10*time.Second).PluginError, "printed no report")
}
