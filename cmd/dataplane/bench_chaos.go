package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"dataplane/bench/chaos"
)

// benchChaos runs `dataplane bench chaos`: a real serve (and mock workers) as children, put
// through the scenarios of bench/chaos; one table, exit status 1 when a row fails.
func benchChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := chaos.DefaultOptions()
	fs.StringVar(&o.Binary, "binary", "", "the dataplane executable to run as serve and mock (default: this one)")
	fs.Int64Var(&o.MemoryBytes, "memory-bytes", o.MemoryBytes, "--memory-bytes given to serve; peak RSS is held to it plus --rss-slack")
	fs.Int64Var(&o.RSSSlack, "rss-slack", o.RSSSlack, "how far peak RSS may pass --memory-bytes")
	fs.Int64Var(&o.RSSKill, "rss-kill", o.RSSKill, "kill serve above this RSS (protects the machine; the row fails)")
	fs.DurationVar(&o.Total, "total", o.Total, "time for the whole run; scenarios that do not fit are not run")
	only := fs.String("scenarios", "", "comma-separated scenarios to run (default: all)")
	jsonOut := fs.String("json", "", "also write the rows as JSON to this file")
	fs.StringVar(&o.LogDir, "logs", "", "directory for every child's output (<scenario>.<child>.log)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: dataplane bench chaos [flags]\n\nScenarios, in order:\n")
		for _, s := range chaos.Names() {
			fmt.Fprintf(stderr, "  %-18s %s\n", s[0], s[1])
		}
		fmt.Fprint(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseBench(fs, args, stderr); err != nil {
		return err
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench chaos: --binary not given and this executable not found: %w", err)
		}
		o.Binary = exe
	}
	o.Scenarios = splitList(*only)
	for _, name := range o.Scenarios {
		if !slices.ContainsFunc(chaos.Names(), func(s [2]string) bool { return s[0] == name }) {
			fmt.Fprintf(stderr, "bench chaos: no scenario %q (dataplane bench chaos -h lists them)\n", name)
			return errUsage
		}
	}
	o.Progress = stderr
	start := time.Now()
	rows, err := chaos.Run(ctx, o)
	if rows == nil && err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dataplane bench chaos: %s, --memory-bytes %d, %.0fs\n\n", o.Binary, o.MemoryBytes, time.Since(start).Seconds())
	if werr := chaos.WriteTable(stdout, rows); werr != nil {
		return werr
	}
	if *jsonOut != "" {
		if werr := writeFile(*jsonOut, func(w io.Writer) error { return chaos.WriteJSON(w, rows) }); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("bench chaos: stopped early: %w", err)
	}
	var failed []string
	for i := range rows {
		if !rows[i].OK() {
			failed = append(failed, rows[i].Scenario)
		}
	}
	if len(failed) > 0 {
		return errors.New("bench chaos: failed: " + strings.Join(failed, ", "))
	}
	return nil
}
