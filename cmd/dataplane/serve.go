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
	"sync"
	"time"

	"dataplane/cuda"
	"dataplane/dataplane"
	"dataplane/dataplane/worker"
	"dataplane/native"
	"dataplane/router"
)

func init() {
	register(command{"serve", "run the daemon (dataplane serve -h for flags)", func(ctx context.Context, args []string, _, stderr io.Writer) error {
		return serve(ctx, args, stderr)
	}})
}

// serveFlags holds what serve's flags set beyond the server and service options.
type serveFlags struct {
	logLevel, cudaPlugin, dtype, workers, kvEvents, kvReplay string
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	opts := dataplane.DefaultOptions()
	so := dataplane.DefaultServiceOptions()
	var sf serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The HTTP server.
	fs.StringVar(&opts.Listen, "listen", opts.Listen, "HOST:PORT to serve the HTTP API on")
	fs.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", opts.ShutdownTimeout, "how long shutdown waits for requests in flight")
	fs.IntVar(&opts.MaxBodyBytes, "max-body-bytes", opts.MaxBodyBytes, "largest request body accepted (larger: 413)")
	fs.DurationVar(&opts.ReadTimeout, "read-timeout", opts.ReadTimeout, "time allowed to read a whole request")
	fs.DurationVar(&opts.WriteTimeout, "write-timeout", opts.WriteTimeout, "time allowed to write a whole response")
	fs.DurationVar(&opts.IdleTimeout, "idle-timeout", opts.IdleTimeout, "keep-alive connections idle this long are closed")
	fs.IntVar(&opts.MaxConns, "max-conns", opts.MaxConns, "most concurrent connections")
	fs.BoolVar(&opts.Pprof, "pprof", false, "serve /debug/pprof/")
	fs.StringVar(&sf.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&sf.cudaPlugin, "cuda-plugin", "", "CUDA plugin file (default: beside the binary, then build/cuda/)")
	fs.String("config", "", "YAML file of settings (keys are these flag names)")
	// Models.
	mo := &so.Models
	fs.StringVar(&mo.Name, "model-name", mo.Name, "the model id clients ask for")
	fs.StringVar(&mo.VisionModel, "vision-model", "", "vision encoder checkpoint directory (CLIP, SigLIP, LLaVA; default: a random demo model)")
	fs.StringVar(&mo.VisionPreset, "vision-preset", "", "media preset for images and video frames (default: clip-N / siglip-N from the model)")
	fs.StringVar(&mo.AudioModel, "audio-model", "", "Whisper encoder checkpoint directory (default: a random demo model)")
	fs.StringVar(&mo.AudioPreset, "audio-preset", "", "media preset for audio (default: whisper-80 / whisper-128 from the model)")
	fs.BoolVar(&mo.NoAudio, "no-audio", false, "serve no audio encoder")
	fs.StringVar(&mo.Embeddings, "embeddings", "", "safetensors file with the LLM's input embedding table (default: random)")
	fs.StringVar(&mo.EmbeddingTensor, "embedding-tensor", "", "the table's tensor name (default: model.embed_tokens.weight and the usual others)")
	fs.StringVar(&sf.dtype, "dtype", mo.DType.String(), "dtype of features and merged sequences: bf16, f16 or f32")
	fs.IntVar(&mo.DemoHidden, "demo-hidden", mo.DemoHidden, "the demo models' width (the demo LLM's hidden size)")
	fs.Uint64Var(&mo.Seed, "seed", mo.Seed, "seed of the demo models' random weights")
	fs.IntVar(&mo.Threads, "encoder-threads", 0, "threads an encoder batch uses (0: all CPUs, up to 8)")
	// Tokenizer.
	to := &so.Tokenizer
	fs.StringVar(&to.Dir, "tokenizer", "", "directory with tokenizer.json (default: the embedded demo tokenizer)")
	fs.StringVar(&to.ChatTemplate, "chat-template", "", "built-in chat template: chatml, llama3, qwen3, qwen2-vl, qwen2-audio, llava (default: the tokenizer's)")
	fs.StringVar(&to.ImageToken, "image-token", "", "image placeholder token (default: <|image_pad|>, <image>, ... whichever the tokenizer has)")
	fs.StringVar(&to.VideoToken, "video-token", "", "video placeholder token (default: <|video_pad|>, <video>)")
	fs.StringVar(&to.AudioToken, "audio-token", "", "audio placeholder token (default: <|AUDIO|>, <|audio_pad|>, <audio>)")
	// Workers and routing.
	fs.StringVar(&sf.workers, "workers", "", "LLM workers: http://host:port,... (OpenAI-compatible engines such as vLLM)")
	fs.StringVar(&sf.kvEvents, "kv-events", "", "the workers' vLLM KV-event publishers, same order: tcp://host:5557,...")
	fs.StringVar(&sf.kvReplay, "kv-replay", "", "their replay endpoints, same order: tcp://host:5558,...")
	fs.IntVar(&so.Router.BlockSize, "block-size", so.Router.BlockSize, "the engines' KV block size")
	fs.Float64Var(&so.Router.Temperature, "router-temperature", so.Router.Temperature, "0: the cheapest worker; > 0: softmax over costs")
	fs.Float64Var(&so.Router.OverlapWeight, "overlap-weight", so.Router.OverlapWeight, "weight of uncached prefill blocks against decode load")
	// Features and encoding.
	fs.Int64Var(&so.Features.Host.Capacity, "feature-bytes", so.Features.Host.Capacity, "host memory budget for features and merged sequences")
	fs.StringVar(&so.CachePolicy, "cache-policy", "", "default reuse policy: discard, keep[:TTL], until-done")
	fs.IntVar(&so.Pool.Workers, "encoder-workers", so.Pool.Workers, "encoder worker loops")
	fs.IntVar(&so.Pool.MaxBatch, "batch-max", so.Pool.MaxBatch, "inputs per encoder batch")
	fs.DurationVar(&so.Pool.MaxWait, "batch-wait", so.Pool.MaxWait, "how long a batch waits for company")
	fs.IntVar(&so.Pool.MaxBatchTokens, "batch-tokens", so.Pool.MaxBatchTokens, "feature rows per encoder batch")
	fs.DurationVar(&so.ItemTimeout, "item-timeout", so.ItemTimeout, "how long a request waits for its media to be encoded")
	fs.IntVar(&so.MaxPromptTokens, "max-prompt-tokens", so.MaxPromptTokens, "longest merged prompt (the model's context)")
	fs.IntVar(&so.DefaultMaxTokens, "default-max-tokens", so.DefaultMaxTokens, "max_tokens when a request gives none")
	// Media sources.
	fs.StringVar(&so.Fetch.FileDir, "media-dir", "", "allow file:// media below this directory")
	fs.BoolVar(&so.Fetch.HTTP, "fetch-http", false, "allow http(s):// media URLs")
	fs.BoolVar(&so.Fetch.AllowPrivateNetworks, "fetch-private", false, "let http(s) fetches reach private and loopback addresses")
	fs.Int64Var(&so.MaxMediaBytes, "max-media-bytes", so.MaxMediaBytes, "largest media item")
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
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "serve: "+format+"\n", a...)
		return errUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(sf.logLevel)); err != nil {
		return usageErr("--log-level: %v", err)
	}
	var err error
	if mo.DType, err = native.ParseDType(sf.dtype); err != nil {
		return usageErr("--dtype: %v", err)
	}
	so.Fetch.MaxBytes = so.MaxMediaBytes
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	so.Log = log

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	log.Info("dataplane starting", "version", dataplane.Version, "go", runtime.Version(),
		"listen", ln.Addr().String(), "max_body_bytes", opts.MaxBodyBytes, "max_conns", opts.MaxConns,
		"read_timeout", opts.ReadTimeout, "write_timeout", opts.WriteTimeout, "idle_timeout", opts.IdleTimeout,
		"shutdown_timeout", opts.ShutdownTimeout, "workers", sf.workers, "vision_model", mo.VisionModel,
		"audio_model", mo.AudioModel, "tokenizer", so.Tokenizer.Dir, "feature_bytes", so.Features.Host.Capacity,
		"dtype", mo.DType, "block_size", so.Router.BlockSize)
	srv := dataplane.NewServer(opts, log)
	backend := selectBackend(ctx, sf.cudaPlugin, log)
	log.Info("backends", "cpu", native.BestISA().String(), "cpu_supported", isaList(), "cuda", backend.cuda, "using", backend.name)
	if backend.nvml != nil {
		defer backend.nvml.Close()
		srv.Registry().MustRegister(backend.nvml.Collector())
	}

	svc, err := dataplane.NewService(so)
	if err != nil {
		return err
	}
	m := svc.Models()
	log.Info("models", "name", m.Name, "vision", m.Vision.Name, "vision_preset", m.VisionPreset.Name,
		"audio", audioName(m), "hidden", m.Hidden, "vocab", svc.Tokenizer().VocabSize())
	subs, err := addWorkers(ctx, svc, sf, log)
	if err != nil {
		svc.Close(context.Background()) //nolint:errcheck
		return err
	}
	srv.Attach(svc)
	err = srv.Serve(ctx, ln)
	subs()
	cctx, cancel := context.WithTimeout(context.Background(), opts.ShutdownTimeout)
	defer cancel()
	if cerr := svc.Close(cctx); cerr != nil && err == nil {
		err = cerr
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

func audioName(m *dataplane.Models) string {
	if m.Audio == nil {
		return "none"
	}
	return m.Audio.Name + " (" + m.AudioPreset.Name + ")"
}

// addWorkers builds the LLM workers and subscribes to their KV events; the returned function
// stops the subscriptions.
func addWorkers(ctx context.Context, svc *dataplane.Service, sf serveFlags, log *slog.Logger) (func(), error) {
	workers, events, replays := splitList(sf.workers), splitList(sf.kvEvents), splitList(sf.kvReplay)
	if len(events) > 0 && len(events) != len(workers) {
		return nil, fmt.Errorf("--kv-events lists %d endpoints for %d workers", len(events), len(workers))
	}
	if len(replays) > 0 && len(replays) != len(events) {
		return nil, fmt.Errorf("--kv-replay lists %d endpoints for %d --kv-events", len(replays), len(events))
	}
	subCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait() }
	for i, spec := range workers {
		if !strings.HasPrefix(spec, "http://") && !strings.HasPrefix(spec, "https://") {
			stop()
			return nil, fmt.Errorf("--workers: %q (want http://host:port)", spec)
		}
		w, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: spec, Embeds: true})
		if err != nil {
			stop()
			return nil, err
		}
		engine, err := svc.AddWorker(w)
		if err != nil {
			stop()
			return nil, err
		}
		if i >= len(events) {
			log.Warn("no KV events for a worker: routing sees its load but not its cache", "worker", w.Name())
			continue
		}
		zo := router.DefaultZMQOptions(events[i], "")
		if i < len(replays) {
			zo.Replay = replays[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := router.SubscribeZMQ(subCtx, zo, svc.Router().Stats(), func(rank int) (*router.Engine, error) {
				if rank != 0 {
					return nil, fmt.Errorf("worker %s publishes data-parallel rank %d: give each rank its own --workers entry", w.Name(), rank)
				}
				return engine, nil
			})
			if err != nil && subCtx.Err() == nil {
				log.Error("KV events", "worker", w.Name(), "endpoint", zo.Endpoint, "err", err)
			}
		}()
	}
	return stop, nil
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
