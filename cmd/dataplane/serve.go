package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"

	"dataplane/dataplane"
	"dataplane/native"
)

func init() {
	register(command{"serve", "run the daemon (dataplane serve -h for flags)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return serve(ctx, args, stderr)
	}})
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
