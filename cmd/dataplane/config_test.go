package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type settings struct {
	listen  string
	timeout time.Duration
	conns   int
	workers string
	verbose bool
}

func newFlags(s *settings) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&s.listen, "listen", ":8000", "")
	fs.DurationVar(&s.timeout, "read-timeout", time.Minute, "")
	fs.IntVar(&s.conns, "max-conns", 100, "")
	fs.StringVar(&s.workers, "workers", "mock:4", "")
	fs.BoolVar(&s.verbose, "verbose", false, "")
	fs.String("config", "", "")
	return fs
}

func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dataplane.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
listen: ":7000"
read-timeout: 5s
max-conns: 7
workers: [http://a:1, http://b:2]
verbose: true
`), 0o644))
	env := map[string]string{"DATAPLANE_MAX_CONNS": "9", "DATAPLANE_CONFIG": file}
	getenv := func(k string) string { return env[k] }

	var s settings
	require.NoError(t, loadConfig(newFlags(&s), []string{"--listen", ":9000"}, getenv))
	require.Equal(t, ":9000", s.listen, "the flag wins")
	require.Equal(t, 9, s.conns, "the environment beats the file")
	require.Equal(t, 5*time.Second, s.timeout, "the file beats the default")
	require.Equal(t, "http://a:1,http://b:2", s.workers, "lists join with commas")
	require.True(t, s.verbose)

	s = settings{}
	require.NoError(t, loadConfig(newFlags(&s), nil, func(string) string { return "" }))
	require.Equal(t, settings{listen: ":8000", timeout: time.Minute, conns: 100, workers: "mock:4"}, s, "defaults")
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "c.yaml")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	var s settings
	f := func(args []string, env map[string]string, want string) {
		t.Helper()
		err := loadConfig(newFlags(&s), args, func(k string) string { return env[k] })
		require.ErrorContains(t, err, want)
	}
	f(nil, map[string]string{"DATAPLANE_MAX_CONNS": "lots"}, `$DATAPLANE_MAX_CONNS="lots": parse error`)
	f([]string{"--config", write("lisen: x\n")}, nil, `unknown setting "lisen"`)
	f([]string{"--config", write("read-timeout: soon\n")}, nil, `read-timeout: "soon": parse error`)
	f([]string{"--config", write("listen: [a, [b]]\n")}, nil, "want a list of plain values")
	f([]string{"--config", write("listen: {a: 1}\n")}, nil, "want a value or a list")
	f([]string{"--config", write(":\n  - [")}, nil, "c.yaml")
	f([]string{"--config", filepath.Join(dir, "missing.yaml")}, nil, "--config: open")
	require.Equal(t, "DATAPLANE_MAX_BODY_BYTES", envName("max-body-bytes"))
}

// A command-line error was printed by the FlagSet with its usage; an error from the environment
// or the file was not: configFailed prints only those, once.
func TestConfigFailedPrintsOnce(t *testing.T) {
	f := func(args []string, env map[string]string, printed string) {
		t.Helper()
		var s settings
		fs := newFlags(&s)
		var out bytes.Buffer
		fs.SetOutput(&out)
		err := configFailed("serve", loadConfig(fs, args, func(k string) string { return env[k] }), &out)
		require.ErrorIs(t, err, errUsage)
		require.Equal(t, 1, strings.Count(out.String(), printed), out.String())
	}
	f([]string{"--nope"}, nil, "flag provided but not defined: -nope")
	f([]string{"--max-conns", "lots"}, nil, `invalid value "lots" for flag -max-conns`)
	f(nil, map[string]string{"DATAPLANE_MAX_CONNS": "lots"}, `serve: $DATAPLANE_MAX_CONNS="lots"`)

	var s settings
	require.ErrorIs(t, configFailed("serve", loadConfig(newFlags(&s), []string{"-h"}, func(string) string { return "" }), io.Discard), flag.ErrHelp)
}
