// Command dataplane is the multimodal data-plane daemon and its tools, one binary with
// subcommands. Only this package may exit the process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"dataplane/dataplane"
	"dataplane/native"
)

const usage = `dataplane: the multimodal data plane for LLM serving

Usage:
  dataplane serve [flags]    run the daemon (dataplane serve -h for flags)
  dataplane version          print the version and the native kernels in use
  dataplane help             this text
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one subcommand and returns the process exit code: 0 ok, 1 failure, 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stderr)
	case "version", "--version", "-version":
		printVersion(stdout)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "dataplane: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
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

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	opts := dataplane.DefaultOptions()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opts.Listen, "listen", opts.Listen, "HOST:PORT to serve the HTTP API on")
	fs.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", opts.ShutdownTimeout, "how long shutdown waits for requests in flight")
	fs.IntVar(&opts.MaxBodyBytes, "max-body-bytes", opts.MaxBodyBytes, "largest request body accepted (larger: 413)")
	fs.DurationVar(&opts.ReadTimeout, "read-timeout", opts.ReadTimeout, "time allowed to read a whole request")
	fs.DurationVar(&opts.WriteTimeout, "write-timeout", opts.WriteTimeout, "time allowed to write a whole response")
	fs.DurationVar(&opts.IdleTimeout, "idle-timeout", opts.IdleTimeout, "keep-alive connections idle this long are closed")
	fs.IntVar(&opts.MaxConns, "max-conns", opts.MaxConns, "most concurrent connections")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "serve: -log-level: %v\n", err)
		return errUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("dataplane starting", "version", dataplane.Version, "go", runtime.Version(),
		"listen", ln.Addr().String(), "max_body_bytes", opts.MaxBodyBytes, "max_conns", opts.MaxConns,
		"read_timeout", opts.ReadTimeout, "write_timeout", opts.WriteTimeout, "idle_timeout", opts.IdleTimeout,
		"shutdown_timeout", opts.ShutdownTimeout)
	log.Info("backends", "cpu", native.BestISA().String(), "cpu_supported", isaList(),
		"cuda", "none (the CUDA plugin is not part of this build yet)")
	err = dataplane.NewServer(opts, log).Serve(ctx, ln)
	if err == nil {
		log.Info("stopped")
	}
	return err
}
