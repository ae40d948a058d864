package cuda

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"time"
)

// Report is what a probe found: the plugin and the GPUs it drives, and NVML's view.
type Report struct {
	Plugin      string    `json:"plugin,omitempty"`       // the plugin file that loaded
	PluginError string    `json:"plugin_error,omitempty"` // why none loaded
	Devices     []Device  `json:"devices,omitempty"`      // the plugin's devices
	NVML        []GPUStat `json:"nvml,omitempty"`
	NVMLError   string    `json:"nvml_error,omitempty"`
}

// Device is one of the plugin's devices.
type Device struct {
	Index        int    `json:"index"`
	Name         string `json:"name"`
	TotalBytes   int64  `json:"total_bytes"`
	ComputeMajor int    `json:"compute_major"`
	ComputeMinor int    `json:"compute_minor"`
}

// Usable reports whether the plugin loaded and drives at least one GPU.
func (r Report) Usable() bool { return r.Plugin != "" && len(r.Devices) > 0 }

// Summary is the one line the daemon logs about CUDA.
func (r Report) Summary() string {
	if r.Usable() {
		d := r.Devices[0]
		return fmt.Sprintf("%s: %d device(s), device 0 %s (%.0f GiB, sm_%d%d)", r.Plugin, len(r.Devices), d.Name,
			float64(d.TotalBytes)/(1<<30), d.ComputeMajor, d.ComputeMinor)
	}
	if r.PluginError != "" {
		return "off: " + r.PluginError + "; running on the CPU backend"
	}
	return "off: the plugin reports no GPU; running on the CPU backend"
}

// ProbeHere loads the plugin and NVML in this process and reports what they see. It is what
// the `gpu-probe` child runs; the daemon itself calls Probe.
func ProbeHere(where SearchPath) Report {
	var r Report
	if path, err := where.Find(); err != nil {
		r.PluginError = err.Error()
	} else if b, err := Open(path); err != nil {
		r.PluginError = err.Error()
	} else {
		r.Plugin = path
		for i := range b.DeviceCount() {
			info, err := b.DeviceInfo(i)
			if err != nil {
				r.PluginError = err.Error()
				break
			}
			r.Devices = append(r.Devices, Device{Index: i, Name: info.Name, TotalBytes: info.TotalBytes,
				ComputeMajor: info.ComputeMajor, ComputeMinor: info.ComputeMin})
		}
	}
	if n, err := OpenNVML(); err != nil {
		r.NVMLError = err.Error()
	} else {
		r.NVML, err = n.Stats()
		if err != nil {
			r.NVMLError = err.Error()
		}
		n.Close()
	}
	return r
}

// Probe runs `exe gpu-probe [--cuda-plugin explicit]` as a child process, so a driver that
// crashes or hangs takes only the child down, and parses its report. Any failure of the child
// is a report saying so, with the CPU backend to fall back on.
func Probe(ctx context.Context, exe, explicit string, timeout time.Duration) Report {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := []string{"gpu-probe"}
	if explicit != "" {
		args = append(args, "--cuda-plugin", explicit)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return Report{PluginError: fmt.Sprintf("GPU probe timed out after %v", timeout)}
		}
		return Report{PluginError: fmt.Sprintf("GPU probe failed (%v): %s", err, bytes.TrimSpace(errOut.Bytes()))}
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return Report{PluginError: fmt.Sprintf("GPU probe printed no report: %v", err)}
	}
	return r
}
