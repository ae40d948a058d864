package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"

	"dataplane/cuda"
)

func init() {
	register(command{"gpu-probe", "print what the CUDA plugin and NVML see, as JSON (serve runs it as a child)", gpuProbe})
}

func gpuProbe(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpu-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	plugin := fs.String("cuda-plugin", "", "plugin file (default: $DATAPLANE_CUDA_PLUGIN, beside the binary, build/cuda/)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(cuda.ProbeHere(*plugin))
}
