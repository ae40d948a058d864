package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"

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
	return enc.Encode(cuda.ProbeHere(pluginSearchPath(*plugin, os.Getenv)))
}

// pluginSearchPath is where the CUDA plugin is looked for: the flag's file, else
// $DATAPLANE_CUDA_PLUGIN's, else beside this executable and then in a checkout's build/cuda/.
func pluginSearchPath(flagValue string, getenv func(string) string) cuda.SearchPath {
	p := cuda.SearchPath{Explicit: flagValue, BuildDir: cuda.DevBuildDir}
	if p.Explicit == "" {
		p.Explicit = getenv(cuda.EnvPlugin)
	}
	if exe, err := os.Executable(); err == nil {
		p.ExeDir = filepath.Dir(exe)
	}
	return p
}
