package chaos

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// sample is one line of Prometheus' text format: name{labels} value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is a scrape of /metrics.
type metrics []sample

// parseMetrics reads Prometheus' text exposition format (what /metrics serves): comments and
// blank lines are skipped, a timestamp after the value is ignored.
func parseMetrics(r io.Reader) (metrics, error) {
	var out metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	end := strings.IndexAny(line, "{ \t")
	if end <= 0 {
		return s, fmt.Errorf("%q: no value", line)
	}
	s.name, line = line[:end], line[end:]
	if line[0] == '{' {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, " ,")
			if line == "" {
				return s, fmt.Errorf("%s: unterminated labels", s.name)
			}
			if line[0] == '}' {
				line = line[1:]
				break
			}
			eq := strings.Index(line, `="`)
			if eq <= 0 {
				return s, fmt.Errorf("%s: bad label in %q", s.name, line)
			}
			key := strings.TrimSpace(line[:eq])
			val, rest, err := unquoteLabel(line[eq+2:])
			if err != nil {
				return s, fmt.Errorf("%s{%s}: %w", s.name, key, err)
			}
			s.labels[key], line = val, rest
		}
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || len(fields) > 2 {
		return s, fmt.Errorf("%s: want a value (and a timestamp), got %q", s.name, line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("%s: value %q: %w", s.name, fields[0], err)
	}
	s.value = v
	return s, nil
}

// unquoteLabel reads a label value up to its closing quote (escapes \\, \" and \n) and
// returns the rest of the line.
func unquoteLabel(s string) (val, rest string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 == len(s) {
				return "", "", fmt.Errorf("dangling escape")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated value")
}

// matches reports whether the sample has every label in want (pairs: name, value).
func (s *sample) matches(want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		if s.labels[want[i]] != want[i+1] {
			return false
		}
	}
	return true
}

// get returns the value of the series name with the given labels (pairs: name, value; other
// labels may be present: the first match wins) and whether there is one.
func (m metrics) get(name string, labels ...string) (float64, bool) {
	for i := range m {
		if m[i].name == name && m[i].matches(labels) {
			return m[i].value, true
		}
	}
	return 0, false
}

// by sums the series name that match labels, grouped by the value of label key.
func (m metrics) by(name, key string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for i := range m {
		if m[i].name == name && m[i].matches(labels) {
			out[m[i].labels[key]] += m[i].value
		}
	}
	return out
}
