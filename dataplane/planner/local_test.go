package planner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The local backend against worker processes that are this test binary
// (TestHelperWorker): a worker "announces" itself by writing NAME.up (with its
// CUDA_VISIBLE_DEVICES) in $PLANNER_TEST_DIR and, on SIGTERM, writes NAME.term, finishes its
// "current request" (100 ms) and writes NAME.done before it exits. fileFleet reads those
// files as the fleet and records revocations with the time.

func TestHelperWorker(t *testing.T) {
	dir := os.Getenv("PLANNER_TEST_DIR")
	if dir == "" {
		t.Skip("a worker process for the local backend's tests")
	}
	name := os.Args[len(os.Args)-1]
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, name+".up"), []byte(os.Getenv("CUDA_VISIBLE_DEVICES")), 0o600))
	<-term
	must(os.WriteFile(filepath.Join(dir, name+".term"), []byte(time.Now().Format(time.RFC3339Nano)), 0o600))
	time.Sleep(100 * time.Millisecond)
	must(os.WriteFile(filepath.Join(dir, name+".done"), nil, 0o600))
	os.Exit(0)
}

type fileFleet struct {
	dir     string
	mu      sync.Mutex
	revoked map[string]time.Time
}

func (f *fileFleet) up(prefix string) []string {
	ups, _ := filepath.Glob(filepath.Join(f.dir, "*.up"))
	var out []string
	for _, u := range ups {
		name := strings.TrimSuffix(filepath.Base(u), ".up")
		if _, err := os.Stat(filepath.Join(f.dir, name+".done")); err == nil {
			continue
		}
		f.mu.Lock()
		_, gone := f.revoked[name]
		f.mu.Unlock()
		if !gone && (prefix == "" || ownedBy(name, prefix)) {
			out = append(out, name)
		}
	}
	return out
}

func (f *fileFleet) Count(pool Pool, prefix string) int {
	n := 0
	for _, name := range f.up(prefix) {
		if strings.Contains(name, "_"+string(pool)) {
			n++
		}
	}
	return n
}

func (f *fileFleet) Names(prefix string) []string { return f.up(prefix) }

func (f *fileFleet) Revoke(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked[name] = time.Now()
	return nil
}

func localSetup(t *testing.T, gpus []string) (*Local, *fileFleet, string) {
	dir := t.TempDir()
	t.Setenv("PLANNER_TEST_DIR", dir)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := fmt.Sprintf("%s -test.run=^TestHelperWorker$ -- {name}", exe)
	st := State{Namespace: "dp", Components: map[string]Component{
		"dp_prefill": {Pool: PoolPrefill, Cmd: cmd},
		"dp_decode":  {Pool: PoolDecode, Cmd: cmd},
	}}
	st.Environment.SystemResources.GPUInfo = gpus
	if len(gpus) > 0 {
		p, d := st.Components["dp_prefill"], st.Components["dp_decode"]
		p.Resources.AllocatedGPUs, d.Resources.AllocatedGPUs = gpus[:1], gpus[1:2]
		st.Components["dp_prefill"], st.Components["dp_decode"] = p, d
	}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	path := filepath.Join(dir, "state.json")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	f := &fileFleet{dir: dir, revoked: map[string]time.Time{}}
	l, err := NewLocal(LocalOptions{StateFile: path, Fleet: f, StartTimeout: 20 * time.Second, StopTimeout: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(l.StopAll)
	return l, f, dir
}

func readState(t *testing.T, dir string) *State {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	require.NoError(t, err)
	s, err := ParseState(b)
	require.NoError(t, err)
	return s
}

func TestLocalScalesProcesses(t *testing.T) {
	l, f, dir := localSetup(t, []string{"0", "1", "2", "3"})
	ctx := context.Background()
	require.NoError(t, l.Start(ctx))
	require.Equal(t, 1, f.Count(PoolPrefill, ""))
	require.Equal(t, 1, f.Count(PoolDecode, ""))

	require.NoError(t, l.Add(ctx, PoolDecode))
	require.NoError(t, l.Add(ctx, PoolPrefill))
	require.Equal(t, 2, f.Count(PoolDecode, ""))
	s := readState(t, dir)
	require.Equal(t, []string{"dp_decode", "dp_decode_1"}, s.running(PoolDecode))
	require.Equal(t, []string{"2"}, s.Components["dp_decode_1"].Resources.AllocatedGPUs)
	require.Equal(t, []string{"3"}, s.Components["dp_prefill_1"].Resources.AllocatedGPUs)
	got, err := os.ReadFile(filepath.Join(dir, "dp_decode_1.up"))
	require.NoError(t, err)
	require.Equal(t, "2", string(got), "CUDA_VISIBLE_DEVICES")
	require.Contains(t, s.Components["dp_decode_1"].Cmd, "-- dp_decode_1", "the entry keeps its command line")
	require.Contains(t, s.Components["dp_decode"].Cmd, "{name}", "the first keeps the template")
	require.ErrorContains(t, l.Add(ctx, PoolDecode), "0 free GPUs of 4")

	// Decode: the lease goes first, then SIGTERM, and the worker finishes its request.
	require.NoError(t, l.Remove(ctx, PoolDecode))
	term, err := os.ReadFile(filepath.Join(dir, "dp_decode_1.term"))
	require.NoError(t, err)
	termAt, err := time.Parse(time.RFC3339Nano, string(term))
	require.NoError(t, err)
	require.True(t, f.revoked["dp_decode_1"].Before(termAt), "revoked before SIGTERM")
	require.FileExists(t, filepath.Join(dir, "dp_decode_1.done"), "Remove returns after the drain")
	// Prefill: SIGTERM only; its lease ends as it stops.
	require.NoError(t, l.Remove(ctx, PoolPrefill))
	require.FileExists(t, filepath.Join(dir, "dp_prefill_1.done"))
	require.NotContains(t, f.revoked, "dp_prefill_1")
	s = readState(t, dir)
	require.NotContains(t, s.Components, "dp_decode_1")
	require.NotContains(t, s.Components, "dp_prefill_1")

	// The first entry stops but stays, for its command; adding brings it back, not a _1.
	require.NoError(t, l.Remove(ctx, PoolPrefill))
	s = readState(t, dir)
	require.True(t, s.Components["dp_prefill"].Stopped)
	require.Empty(t, s.Components["dp_prefill"].Resources.AllocatedGPUs)
	require.ErrorIs(t, l.Remove(ctx, PoolPrefill), ErrNoWorker)
	require.NoError(t, os.Remove(filepath.Join(dir, "dp_prefill.done")))
	require.NoError(t, os.Remove(filepath.Join(dir, "dp_prefill.up")))
	require.NoError(t, l.Add(ctx, PoolPrefill))
	s = readState(t, dir)
	require.False(t, s.Components["dp_prefill"].Stopped)
	require.NotContains(t, s.Components, "dp_prefill_1")
	require.Equal(t, []string{"0"}, s.Components["dp_prefill"].Resources.AllocatedGPUs)
}

func TestLocalWorkerThatNeverComes(t *testing.T) {
	dir := t.TempDir()
	st := `{"namespace":"dp","components":{"dp_decode":{"pool":"decode","cmd":"sleep 30"}}}`
	path := filepath.Join(dir, "state.json")
	require.NoError(t, os.WriteFile(path, []byte(st), 0o600))
	f := &fileFleet{dir: dir, revoked: map[string]time.Time{}}
	l, err := NewLocal(LocalOptions{StateFile: path, Fleet: f, StartTimeout: 300 * time.Millisecond, StopTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(l.StopAll)
	require.True(t, l.Manages(PoolDecode))
	require.False(t, l.Manages(PoolPrefill), "no dp_prefill entry to clone")
	require.ErrorContains(t, l.Add(context.Background(), PoolDecode), "not announced as decode within 300ms")
	require.NotContains(t, readState(t, dir).Components, "dp_decode_1", "a worker that never came is removed")
	require.Empty(t, l.proc)
}

func TestParseState(t *testing.T) {
	for st, want := range map[string]string{
		`{"namespace":"","components":{}}`:                                                                                         "namespace",
		`{"namespace":"dp","components":{}}`:                                                                                       "no components",
		`{"namespace":"dp","components":{"x_decode":{"pool":"decode","cmd":"a"}}}`:                                                 "want dp_prefill",
		`{"namespace":"dp","components":{"dp_decode_01":{"pool":"decode","cmd":"a"}}}`:                                             "want dp_prefill",
		`{"namespace":"dp","components":{"dp_decode":{"pool":"prefill","cmd":"a"}}}`:                                               "its name says",
		`{"namespace":"dp","components":{"dp_decode":{"pool":"decode"}}}`:                                                          "no cmd",
		`{"namespace":"dp","components":{"dp_decode_2":{"pool":"decode","cmd":"a"}}}`:                                              "no first entry",
		`{"namespace":"dp","components":{"dp_decode":{"pool":"decode","cmd":"a"},"dp_decode_1":{"pool":"decode","stopped":true}}}`: "only the first",
		`[`: "statefile",
	} {
		_, err := ParseState([]byte(st))
		require.ErrorContains(t, err, want, st)
	}
	_, err := ParseState([]byte(`{"namespace":"dp","components":{"dp_decode":{"pool":"decode","cmd":"a"},"dp_decode_3":{"pool":"decode"}}}`))
	require.NoError(t, err)
}

func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"namespace":"dp","components":{"dp_decode":{"pool":"decode","cmd":"a"},"dp_decode_3":{"pool":"decode"}}}`))
	f.Add([]byte(`{"namespace":"dp","environment":{"SYSTEM_RESOURCES":{"gpu_info":["0"]}},"components":{"dp_prefill":{"pool":"prefill","cmd":"x {name}","stopped":true}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseState(b)
		if err != nil {
			return
		}
		for name, c := range s.Components {
			if p, _, ok := s.parseName(name); !ok || p != c.Pool {
				t.Fatalf("accepted %q as %+v", name, c)
			}
		}
	})
}

// A restarted planner adopts its workers that still run, and never a pid the system reused.
func TestLocalAdopts(t *testing.T) {
	l, f, dir := localSetup(t, nil)
	ctx := context.Background()
	require.NoError(t, l.Start(ctx))
	first := readState(t, dir).Components["dp_decode"].PID
	require.NotZero(t, first)
	// A second planner over the same statefile: the running worker is adopted, not restarted.
	l2, err := NewLocal(LocalOptions{StateFile: filepath.Join(dir, "state.json"), Fleet: f, StartTimeout: 20 * time.Second, StopTimeout: 20 * time.Second})
	require.NoError(t, err)
	require.NoError(t, l2.Start(ctx))
	require.Equal(t, first, readState(t, dir).Components["dp_decode"].PID)
	require.Equal(t, first, l2.proc["dp_decode"].pid)
	// A recorded pid that is another process (this test's): started anew.
	s := readState(t, dir)
	c := s.Components["dp_prefill"]
	l.StopAll()
	c.PID = os.Getpid()
	s.Components["dp_prefill"] = c
	require.NoError(t, l.save(s))
	for _, n := range []string{"dp_prefill", "dp_decode"} {
		_ = os.Remove(filepath.Join(dir, n+".up"))
		_ = os.Remove(filepath.Join(dir, n+".done"))
	}
	l3, err := NewLocal(LocalOptions{StateFile: filepath.Join(dir, "state.json"), Fleet: f, StartTimeout: 20 * time.Second, StopTimeout: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(l3.StopAll)
	require.NoError(t, l3.Start(ctx))
	require.NotEqual(t, os.Getpid(), readState(t, dir).Components["dp_prefill"].PID)
	require.FileExists(t, filepath.Join(dir, "dp_prefill.up"))
}
