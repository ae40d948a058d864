package main

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag of bytes, written as GOMEMLIMIT writes them: a plain number, or one with
// a B, KiB, MiB, GiB or TiB suffix ("64MiB", "1GiB").
type byteSize struct{ p *int64 }

func bytesVar(p *int64) byteSize { return byteSize{p} }

func (b byteSize) String() string {
	if b.p == nil {
		return "0"
	}
	return formatBytes(*b.p)
}

func (b byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b.p = v
	return nil
}

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func parseBytes(s string) (int64, error) {
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, shift = strings.TrimSpace(n), u.shift
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is not a size in bytes (want e.g. 1073741824, 64MiB or 1GiB)", s)
	}
	return v << shift, nil
}

// formatBytes writes n with the largest unit that divides it.
func formatBytes(n int64) string {
	for _, u := range byteUnits[:4] {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
