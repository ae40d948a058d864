package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrNoNVML: the NVIDIA management library could not be used (no driver on this machine:
// libnvidia-ml.so is not found, which go-nvml reports as ERROR_LIBRARY_NOT_FOUND).
var ErrNoNVML = errors.New("NVML unavailable")

// GPUStat is one GPU's state as NVML reports it.
type GPUStat struct {
	Index                      int
	Name                       string
	TotalBytes, UsedBytes      uint64
	UtilizationGPU, UtilMemory float64 // 0..1 over NVML's last sample period
}

// NVML reads GPU memory and utilisation. Open it once; Close when done.
type NVML struct {
	mu     sync.Mutex
	closed bool
}

// OpenNVML initialises NVML; without a driver it returns an error wrapping ErrNoNVML.
func OpenNVML() (*NVML, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", ErrNoNVML, nvmlError(ret))
	}
	return &NVML{}, nil
}

func nvmlError(ret nvml.Return) string {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		return "libnvidia-ml.so not found (no NVIDIA driver)"
	}
	return ret.Error()
}

// Stats reads every GPU.
func (n *NVML) Stats() ([]GPUStat, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("%w: closed", ErrNoNVML)
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device count: %s", nvmlError(ret))
	}
	out := make([]GPUStat, 0, count)
	for i := range count {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: device %d: %s", i, nvmlError(ret))
		}
		s := GPUStat{Index: i}
		s.Name, _ = d.GetName()
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.TotalBytes, s.UsedBytes = mem.Total, mem.Used
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			s.UtilizationGPU, s.UtilMemory = float64(u.Gpu)/100, float64(u.Memory)/100
		}
		out = append(out, s)
	}
	return out, nil
}

// Close shuts NVML down.
func (n *NVML) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		nvml.Shutdown()
		n.closed = true
	}
}

var (
	gpuMemDesc = prometheus.NewDesc("dataplane_gpu_memory_bytes", "GPU memory by NVML, total and used.",
		[]string{"gpu", "name", "kind"}, nil)
	gpuUtilDesc = prometheus.NewDesc("dataplane_gpu_utilization_ratio",
		"Share of NVML's last sample period the GPU (kind=gpu) or its memory bus (kind=memory) was busy.",
		[]string{"gpu", "name", "kind"}, nil)
	gpuErrDesc = prometheus.NewDesc("dataplane_gpu_nvml_errors_total", "Scrapes where NVML failed.", nil, nil)
)

// Collector exports Stats at scrape time.
func (n *NVML) Collector() prometheus.Collector { return &collector{n: n} }

type collector struct {
	n      *NVML
	mu     sync.Mutex
	errors float64
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gpuMemDesc
	ch <- gpuUtilDesc
	ch <- gpuErrDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.n.Stats()
	c.mu.Lock()
	if err != nil {
		c.errors++
	}
	ch <- prometheus.MustNewConstMetric(gpuErrDesc, prometheus.CounterValue, c.errors)
	c.mu.Unlock()
	for _, s := range stats {
		gpu := strconv.Itoa(s.Index)
		ch <- prometheus.MustNewConstMetric(gpuMemDesc, prometheus.GaugeValue, float64(s.TotalBytes), gpu, s.Name, "total")
		ch <- prometheus.MustNewConstMetric(gpuMemDesc, prometheus.GaugeValue, float64(s.UsedBytes), gpu, s.Name, "used")
		ch <- prometheus.MustNewConstMetric(gpuUtilDesc, prometheus.GaugeValue, s.UtilizationGPU, gpu, s.Name, "gpu")
		ch <- prometheus.MustNewConstMetric(gpuUtilDesc, prometheus.GaugeValue, s.UtilMemory, gpu, s.Name, "memory")
	}
}
