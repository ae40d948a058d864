package memory

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Limit is the memory this process may use and where that number comes from: the cgroup's
// limit (v2 memory.max, else v1 memory.limit_in_bytes) when it is set and below physical
// memory, else physical memory (/proc/meminfo MemTotal).
func Limit() (int64, string, error) {
	return limitFrom("/sys/fs/cgroup", "/proc/self/cgroup", "/proc/meminfo")
}

func limitFrom(cgroupRoot, selfCgroup, meminfo string) (int64, string, error) {
	phys, err := memTotal(meminfo)
	if err != nil {
		return 0, "", err
	}
	if lim, where, ok := cgroupLimit(cgroupRoot, selfCgroup); ok && lim < phys {
		return lim, where, nil
	}
	return phys, meminfo + " MemTotal", nil
}

// memTotal reads MemTotal (kB) from a meminfo file.
func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil || kb <= 0 {
			return 0, fmt.Errorf("memory: %s: MemTotal %q", path, rest)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("memory: %s has no MemTotal", path)
}

// cgroupLimit finds this process's cgroup limit: v2 (the unified line "0::/path" of
// /proc/self/cgroup, memory.max under the root) or v1 (the memory controller's line,
// memory.limit_in_bytes). "max" or a v1 value near 2^63 means no limit.
func cgroupLimit(root, selfCgroup string) (int64, string, bool) {
	self, err := os.ReadFile(selfCgroup)
	if err != nil {
		return 0, "", false
	}
	for _, line := range bytes.Split(self, []byte("\n")) {
		parts := strings.SplitN(string(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = root + parts[2] + "/memory.max"
			if _, err := os.Stat(file); err != nil {
				file = root + "/memory.max" // a namespaced container sees its own cgroup as the root
			}
		case strings.Contains(","+parts[1]+",", ",memory,"):
			file = root + "/memory" + parts[2] + "/memory.limit_in_bytes"
			if _, err := os.Stat(file); err != nil {
				file = root + "/memory/memory.limit_in_bytes"
			}
		default:
			continue
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(raw))
		if s == "max" {
			return 0, "", false
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 || v >= 1<<62 {
			return 0, "", false
		}
		return v, file, true
	}
	return 0, "", false
}

// RSS is the process's resident memory now (/proc/self/statm), 0 where it cannot be read.
func RSS() int64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}
