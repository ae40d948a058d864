// Package topology is where workers sit (a domain per level: zone, rack, ...) and what moving a
// KV cache between two of them costs: the mismatch policy of Dynamo's topology-aware KV
// transfer (seed 004: decode workers filtered to the prefill worker's domain), the per-level
// QoS table of its soft cost (latency + bytes / bandwidth by the broadest level two workers
// differ at), the worker side's reading of its domains from files (ReadDomains), and a
// synthetic layout of a fleet over zones and racks for benchmarks (Layout). Standard library
// only; the router applies it (router/disagg.go). README.md is its map.
package topology

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Policy is what the router does when no decode worker shares the prefill worker's domain.
type Policy string

const (
	// Fail answers the request with an error naming the domain (seed 004's default).
	Fail Policy = "fail"
	// Fallback logs a warning and routes to any decode worker.
	Fallback Policy = "fallback"
)

// ParsePolicy reads a policy, case-insensitively; "" is Fail.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(strings.ToLower(strings.TrimSpace(s))); p {
	case "":
		return Fail, nil
	case Fail, Fallback:
		return p, nil
	}
	return "", fmt.Errorf("mismatch policy %q: want fail or fallback", s)
}

// Bounds on a QoS table and on labels, so a bad file cannot grow a router.
const (
	MaxLevels   = 16
	MaxLabelLen = 256 // a level name or a domain (router/fleet's bound on labels)
	// MaxLatency bounds a link's latency: anything longer is a typo.
	MaxLatency = time.Hour
)

// Link is the network a KV cache crosses between two workers: a fixed latency, then its bytes at
// a bandwidth.
type Link struct {
	Latency        time.Duration
	BytesPerSecond float64
}

// Seconds is how long bytes take over the link: latency + bytes / bandwidth.
func (l Link) Seconds(bytes float64) float64 {
	return l.Latency.Seconds() + bytes/l.BytesPerSecond
}

func (l Link) check(what string) error {
	switch {
	case l.Latency < 0 || l.Latency > MaxLatency:
		return fmt.Errorf("%s: latency %v: want 0 to %v", what, l.Latency, MaxLatency)
	case !(l.BytesPerSecond > 0) || math.IsInf(l.BytesPerSecond, 0):
		return fmt.Errorf("%s: bandwidth %v bytes/s: want a positive number", what, l.BytesPerSecond)
	}
	return nil
}

// LevelLink is a level's row of the QoS table: the link between two workers whose broadest
// differing level it is.
type LevelLink struct {
	Level string
	Link
}

// QoS is the per-level table of the soft transfer cost: Levels broadest first (zone, then rack,
// ...); two workers that differ first at Levels[i] are joined by its link; two that share every
// listed level by Local. A worker without a level's label counts as differing there (where it is
// is unknown, so the far link is assumed). The zero QoS (no levels, no Local) is no table.
type QoS struct {
	Levels []LevelLink
	Local  Link
}

// Empty reports whether q is no table.
func (q *QoS) Empty() bool { return q == nil || (len(q.Levels) == 0 && q.Local == Link{}) }

// Check reports the first thing wrong with the table, naming the row.
func (q *QoS) Check() error {
	if len(q.Levels) > MaxLevels {
		return fmt.Errorf("qos: %d levels, at most %d", len(q.Levels), MaxLevels)
	}
	seen := map[string]bool{}
	for _, l := range q.Levels {
		switch {
		case l.Level == "" || len(l.Level) > MaxLabelLen || l.Level == "local":
			return fmt.Errorf("qos: level %.40q: want 1 to %d bytes, not \"local\"", l.Level, MaxLabelLen)
		case seen[l.Level]:
			return fmt.Errorf("qos: level %q twice", l.Level)
		}
		seen[l.Level] = true
		if err := l.check("qos: level " + strconv.Quote(l.Level)); err != nil {
			return err
		}
	}
	return q.Local.check("qos: local")
}

// Between is the link between workers labelled a and b, and the level they differ at ("" when
// they share every level of the table: Local).
func (q *QoS) Between(a, b map[string]string) (Link, string) {
	for _, l := range q.Levels {
		va, oka := a[l.Level]
		vb, okb := b[l.Level]
		if !oka || !okb || va != vb {
			return l.Link, l.Level
		}
	}
	return q.Local, ""
}

// ParseQoS reads the table's flag form: LEVEL=LATENCY@BANDWIDTH entries, comma-separated,
// broadest level first, and local=LATENCY@BANDWIDTH for workers that share every level, e.g.
// "zone=2ms@5GB/s,rack=200us@25GB/s,local=20us@50GB/s". Latency is a Go duration; bandwidth a
// number of bytes a second with an optional decimal prefix (k, M, G, T), "B" and "/s".
func ParseQoS(s string) (QoS, error) {
	var q QoS
	local := false
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		level, spec, ok := strings.Cut(e, "=")
		lat, bw, ok2 := strings.Cut(spec, "@")
		if !ok || !ok2 {
			return QoS{}, fmt.Errorf("qos: %.60q is not LEVEL=LATENCY@BANDWIDTH", e)
		}
		link, err := parseLink(strings.TrimSpace(lat), strings.TrimSpace(bw))
		if err != nil {
			return QoS{}, fmt.Errorf("qos: %s: %w", strings.TrimSpace(level), err)
		}
		if level = strings.TrimSpace(level); level == "local" {
			if local {
				return QoS{}, fmt.Errorf("qos: local twice")
			}
			q.Local, local = link, true
			continue
		}
		q.Levels = append(q.Levels, LevelLink{Level: level, Link: link})
		if len(q.Levels) > MaxLevels {
			return QoS{}, fmt.Errorf("qos: more than %d levels", MaxLevels)
		}
	}
	if !local {
		return QoS{}, fmt.Errorf("qos: no local=LATENCY@BANDWIDTH entry (workers that share every level)")
	}
	return q, q.Check()
}

// qosFile is the table's file form (JSON).
type qosFile struct {
	Levels []struct {
		Level     string `json:"level"`
		Latency   string `json:"latency"`
		Bandwidth string `json:"bandwidth"`
	} `json:"levels"`
	Local *struct {
		Latency   string `json:"latency"`
		Bandwidth string `json:"bandwidth"`
	} `json:"local"`
}

// MaxQoSFileBytes bounds the JSON form.
const MaxQoSFileBytes = 64 << 10

// ParseQoSJSON reads the table's file form:
//
//	{"levels": [{"level": "zone", "latency": "2ms", "bandwidth": "5GB/s"}, ...],
//	 "local": {"latency": "20us", "bandwidth": "50GB/s"}}
func ParseQoSJSON(raw []byte) (QoS, error) {
	if len(raw) > MaxQoSFileBytes {
		return QoS{}, fmt.Errorf("qos: %d bytes, at most %d", len(raw), MaxQoSFileBytes)
	}
	var f qosFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return QoS{}, fmt.Errorf("qos: %w", err)
	}
	if len(f.Levels) > MaxLevels {
		return QoS{}, fmt.Errorf("qos: %d levels, at most %d", len(f.Levels), MaxLevels)
	}
	if f.Local == nil {
		return QoS{}, fmt.Errorf("qos: no \"local\" link (workers that share every level)")
	}
	var q QoS
	for i, l := range f.Levels {
		link, err := parseLink(l.Latency, l.Bandwidth)
		if err != nil {
			return QoS{}, fmt.Errorf("qos: levels[%d]: %w", i, err)
		}
		q.Levels = append(q.Levels, LevelLink{Level: l.Level, Link: link})
	}
	var err error
	if q.Local, err = parseLink(f.Local.Latency, f.Local.Bandwidth); err != nil {
		return QoS{}, fmt.Errorf("qos: local: %w", err)
	}
	return q, q.Check()
}

func parseLink(lat, bw string) (Link, error) {
	d, err := time.ParseDuration(lat)
	if err != nil {
		return Link{}, fmt.Errorf("latency %.40q: %v", lat, err)
	}
	b, err := ParseBandwidth(bw)
	if err != nil {
		return Link{}, err
	}
	return Link{Latency: d, BytesPerSecond: b}, nil
}

// ParseBandwidth reads bytes a second: a number with an optional decimal prefix (k, M, G, T),
// an optional "B" and an optional "/s": "5e9", "5GB/s", "400MB".
func ParseBandwidth(s string) (float64, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "/s")
	t = strings.TrimSuffix(t, "B")
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult = 1e3
		case 'M':
			mult = 1e6
		case 'G':
			mult = 1e9
		case 'T':
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || math.IsInf(v*mult, 0) {
		return 0, fmt.Errorf("bandwidth %.40q: want a positive number of bytes a second (5e9, 5GB/s)", s)
	}
	return v * mult, nil
}

// Layout spreads a fleet over Zones zones of Racks racks each: worker i of a role sits in zone
// i mod Zones, rack (i / Zones) mod Racks, so every zone gets its share of each role. Labels
// name them "zone-Z" and "zone-Z-rack-R" (a rack's name is unique across zones).
type Layout struct{ Zones, Racks int }

// Labels are worker i's topology labels; nil for a layout of no zones.
func (l Layout) Labels(i int) map[string]string {
	if l.Zones <= 0 {
		return nil
	}
	z := i % l.Zones
	out := map[string]string{"zone": fmt.Sprintf("zone-%d", z)}
	if l.Racks > 0 {
		out["rack"] = fmt.Sprintf("zone-%d-rack-%d", z, (i/l.Zones)%l.Racks)
	}
	return out
}
