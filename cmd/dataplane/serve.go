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
	"runtime"
	"strings"
	"time"

	"dataplane/cuda"
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
	cudaPlugin := fs.String("cuda-plugin", "", "CUDA plugin file (default: beside the binary, then build/cuda/)")
	fs.String("config", "", "YAML file of settings (keys are these flag names)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: dataplane serve [flags]\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(stderr, configUsage(fs))
	}
	if err := loadConfig(fs, args, os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		if !strings.Contains(err.Error(), "flag provided but not defined") && !strings.HasPrefix(err.Error(), "invalid value") {
			fmt.Fprintf(stderr, "serve: %v\n", err) // from the environment or the config file
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
	srv := dataplane.NewServer(opts, log)
	backend := selectBackend(ctx, *cudaPlugin, log)
	log.Info("backends", "cpu", native.BestISA().String(), "cpu_supported", isaList(), "cuda", backend.cuda, "using", backend.name)
	if backend.nvml != nil {
		defer backend.nvml.Close()
		srv.Registry().MustRegister(backend.nvml.Collector())
	}
	err = srv.Serve(ctx, ln)
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// backendChoice is the backend serve runs on and what to log about CUDA.
type backendChoice struct {
	b    *native.Backend
	name string
	cuda string // one line: where the plugin is and what it drives, or why it is off
	nvml *cuda.NVML
}

// selectBackend probes the GPUs in a child process (a driver crash takes only the child down)
// and loads the CUDA plugin when it found one that drives a GPU; otherwise the CPU backend.
func selectBackend(ctx context.Context, explicit string, log *slog.Logger) backendChoice {
	choice := backendChoice{b: native.CPU(), name: "cpu"}
	exe, err := os.Executable()
	if err != nil {
		choice.cuda = "off: cannot find this executable to run the GPU probe: " + err.Error()
		return choice
	}
	report := cuda.Probe(ctx, exe, explicit, 20*time.Second)
	choice.cuda = report.Summary()
	if report.Usable() {
		if b, err := cuda.Open(report.Plugin); err != nil {
			choice.cuda = "off: " + err.Error() + "; running on the CPU backend"
		} else {
			choice.b, choice.name = b, b.Name()
		}
	}
	if n, err := cuda.OpenNVML(); err == nil {
		choice.nvml = n
	} else {
		log.Debug("no GPU metrics", "reason", err)
	}
	return choice
}
