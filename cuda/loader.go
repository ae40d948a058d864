// Package cuda finds, checks and opens the CUDA plugin (libdataplane_cuda.so, built by CMake
// from this folder) at run time, reads GPU memory and utilisation through NVML, and probes the
// GPUs in a short-lived child process so a driver crash cannot take the daemon down. Nothing
// here needs CUDA to build: the plugin is dlopen'ed, NVML too (through go-nvml).
package cuda

/*
#cgo LDFLAGS: -ldl
#cgo CFLAGS: -I${SRCDIR}/../native
#include <dlfcn.h>
#include <stdlib.h>
#include "dp_backend.h"

static const dp_backend *call_plugin_init(void *fn) { return ((dp_plugin_init_fn)fn)(); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"dataplane/native"
)

// PluginName is the plugin's file name.
const PluginName = "libdataplane_cuda.so"

// EnvPlugin names the environment variable that points at the plugin.
const EnvPlugin = "DATAPLANE_CUDA_PLUGIN"

// ErrNoPlugin: no plugin file was found where SearchPath.Candidates looked.
var ErrNoPlugin = errors.New("CUDA plugin not found")

// SearchPath says where the plugin is looked for. The caller fills it (cmd from the flag, the
// environment and the executable's place, tests with their own), so nothing here reads the
// process's environment.
type SearchPath struct {
	Explicit string // a file given by --cuda-plugin or $DATAPLANE_CUDA_PLUGIN: the only candidate when set
	ExeDir   string // the directory of the running executable ("": not looked in)
	BuildDir string // a development checkout's CMake output ("": not looked in)
}

// DevBuildDir is where `make cuda` puts the plugin, relative to a checkout's root.
var DevBuildDir = filepath.Join("build", "cuda")

// Candidates lists the files looked for, in order: the explicit file if set, else the plugin
// beside the executable, then in the build folder.
func (p SearchPath) Candidates() []string {
	if p.Explicit != "" {
		return []string{p.Explicit}
	}
	var out []string
	for _, dir := range []string{p.ExeDir, p.BuildDir} {
		if dir != "" {
			out = append(out, filepath.Join(dir, PluginName))
		}
	}
	return out
}

// Find returns the first candidate that exists.
func (p SearchPath) Find() (string, error) {
	cands := p.Candidates()
	for _, c := range cands {
		if _, err := os.Stat(c); err == nil {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w (looked in %v; set --cuda-plugin or $%s)", ErrNoPlugin, cands, EnvPlugin)
}

// Open loads a plugin file, calls its dp_plugin_init and checks the table's ABI version and
// entries. The library stays loaded for the life of the process (a backend's memory and
// encoders may outlive any one caller). It does not touch a GPU: call DeviceCount for that, in
// a child process first (Probe).
func Open(path string) (*native.Backend, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("open %s: %s", path, C.GoString(C.dlerror()))
	}
	csym := C.CString(C.DP_PLUGIN_INIT_SYMBOL)
	defer C.free(unsafe.Pointer(csym))
	fn := C.dlsym(h, csym)
	if fn == nil {
		C.dlclose(h)
		return nil, fmt.Errorf("%s is not a dataplane plugin: no %s symbol", path, C.DP_PLUGIN_INIT_SYMBOL)
	}
	table := C.call_plugin_init(fn)
	b, err := native.BackendFromTable(unsafe.Pointer(table))
	if err != nil {
		C.dlclose(h)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}
