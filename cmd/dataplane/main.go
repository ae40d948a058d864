// Command dataplane is the multimodal data-plane daemon and its tools, one binary with
// subcommands. Only this package may exit the process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"dataplane/dataplane"
	"dataplane/native"
)

// A command is one subcommand. Each lives in its own file and registers itself from init, so
// adding one touches no other file.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands []command

func register(c command) { commands = append(commands, c) }

func init() {
	register(command{"version", "print the version and the native kernels in use", func(_ context.Context, _ []string, stdout, _ io.Writer) error {
		printVersion(stdout)
		return nil
	}})
}

func usage() string {
	var b strings.Builder
	b.WriteString("dataplane: the multimodal data plane for LLM serving\n\nUsage:\n")
	cmds := slices.Clone(commands)
	slices.SortFunc(cmds, func(a, b command) int { return strings.Compare(a.name, b.name) })
	for _, c := range cmds {
		fmt.Fprintf(&b, "  dataplane %-12s %s\n", c.name, c.summary)
	}
	b.WriteString("  dataplane help         this text\n")
	return b.String()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one subcommand and returns the process exit code: 0 ok, 1 failure, 2 usage.
// A command returns errUsage (after printing what was wrong) for bad arguments.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	case "--version", "-version":
		name = "version"
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		fmt.Fprintf(stderr, "dataplane: unknown command %q\n\n%s", args[0], usage())
		return 2
	}
	err := commands[i].run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "dataplane: %v\n", err)
		return 1
	}
}

var errUsage = errors.New("usage")

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "dataplane %s (%s, %s/%s)\nnative kernels: %s (supported: %s), C ABI %d\n",
		dataplane.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH,
		native.BestISA(), isaList(), native.ABIVersion)
}

func isaList() string {
	var names []string
	for _, isa := range native.SupportedISAs() {
		names = append(names, isa.String())
	}
	return strings.Join(names, ", ")
}
