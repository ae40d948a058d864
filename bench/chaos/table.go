package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one scenario's result: what the clients saw, what the daemon's process did, and the
// verdict. Failures empty means ok.
type Row struct {
	Scenario string
	// Statuses counts what the scenario's clients got: HTTP status codes ("200", "503") and
	// "timeout" (no answer within the client's timeout) or "error" (the connection failed).
	Statuses map[string]int
	// StatusSource says where Statuses came from when not from the clients ("server metrics").
	StatusSource string
	// PeakRSS is the serve process's largest resident set: the larger of VmRSS sampled every
	// 20 ms and VmHWM. MemoryBytes is the budget it was given (--memory-bytes), RSSBound what
	// the verdict allows (MemoryBytes + the slack).
	PeakRSS, MemoryBytes, RSSBound int64
	// FeaturesUsed and FeaturesReserved are dataplane_features_pool_bytes{pool="host"} after
	// the scenario; FeaturesRead says whether they could be read (FeaturesNote says why not).
	FeaturesUsed, FeaturesReserved int64
	FeaturesRead                   bool
	FeaturesNote                   string
	// LongestWait is the longest a client waited for an answer; Timeout the configured
	// timeout it is measured against, named by TimeoutName ("item-timeout").
	LongestWait, Timeout time.Duration
	TimeoutName          string
	// Alive: the serve process still ran and /healthz answered 200 after the scenario.
	// AliveNote says what was seen ("exited 2", "/healthz 503", "exited 0 as asked").
	Alive     bool
	AliveNote string
	Failures  []string // each a reason the row fails
	Notes     []string // what else the scenario measured
	Took      time.Duration
}

// OK reports whether the row passed.
func (r *Row) OK() bool { return len(r.Failures) == 0 }

// Verdict is "ok" or "FAIL (reason; reason)".
func (r *Row) Verdict() string {
	if r.OK() {
		return "ok"
	}
	return "FAIL (" + strings.Join(r.Failures, "; ") + ")"
}

// formatStatuses writes counts as "200×1010 503×12 timeout×3": status codes in numeric order,
// then the words in alphabetical order; "—" when there are none.
func formatStatuses(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "—"
	}
	slices.SortFunc(keys, func(a, b string) int {
		na, errA := strconv.Atoi(a)
		nb, errB := strconv.Atoi(b)
		switch {
		case errA == nil && errB == nil:
			return na - nb
		case errA == nil:
			return -1
		case errB == nil:
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// formatBytes writes a size in binary units: "512 KiB", "612 MiB", "1.3 GiB".
func formatBytes(n int64) string {
	switch {
	case n < 0:
		return "-" + formatBytes(-n)
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%d KiB", n>>10)
	case n < 1<<30:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// formatDuration writes "850ms" below a second and "12.3s" from there.
func formatDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func (r *Row) rssCell() string {
	if r.PeakRSS == 0 {
		return "—"
	}
	return formatBytes(r.PeakRSS) + " / " + formatBytes(r.MemoryBytes)
}

func (r *Row) featuresCell() string {
	switch {
	case !r.FeaturesRead && r.FeaturesNote != "":
		return "n/a (" + r.FeaturesNote + ")"
	case !r.FeaturesRead:
		return "—"
	case r.FeaturesUsed == 0 && r.FeaturesReserved == 0:
		return "yes"
	}
	return fmt.Sprintf("no (used %s, reserved %s)", formatBytes(r.FeaturesUsed), formatBytes(r.FeaturesReserved))
}

func (r *Row) waitCell() string {
	if r.LongestWait == 0 && r.Timeout == 0 {
		return "—"
	}
	s := formatDuration(r.LongestWait)
	if r.Timeout > 0 {
		s += " / " + formatDuration(r.Timeout) + " " + r.TimeoutName
	}
	return s
}

func (r *Row) aliveCell() string {
	s := "no"
	if r.Alive {
		s = "yes"
	}
	if r.AliveNote != "" {
		s += " (" + r.AliveNote + ")"
	}
	return s
}

func (r *Row) statusCell() string {
	s := formatStatuses(r.Statuses)
	if r.StatusSource != "" && s != "—" {
		s += " (" + r.StatusSource + ")"
	}
	return s
}

// WriteTable writes the rows as one aligned table, then each row's notes below it.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tstatuses\tpeak RSS / memory-bytes\tfeatures back to 0\tlongest wait / timeout\tdaemon alive\tverdict")
	for i := range rows {
		r := &rows[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Scenario, r.statusCell(), r.rssCell(), r.featuresCell(),
			r.waitCell(), r.aliveCell(), r.Verdict())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for i := range rows {
		if len(rows[i].Notes) > 0 {
			fmt.Fprintf(&b, "  %s: %s\n", rows[i].Scenario, strings.Join(rows[i].Notes, "; "))
		}
	}
	if b.Len() > 0 {
		if _, err := io.WriteString(w, "\nnotes:\n"+b.String()); err != nil {
			return err
		}
	}
	failed := 0
	for i := range rows {
		if !rows[i].OK() {
			failed++
		}
	}
	_, err := fmt.Fprintf(w, "\n%d scenarios, %d ok, %d failed\n", len(rows), len(rows)-failed, failed)
	return err
}

// jsonRow is a Row as --json writes it: sizes in bytes, times in seconds, the table's cells.
type jsonRow struct {
	Scenario         string         `json:"scenario"`
	Statuses         map[string]int `json:"statuses"`
	StatusesText     string         `json:"statuses_text"`
	StatusSource     string         `json:"status_source,omitempty"`
	PeakRSSBytes     int64          `json:"peak_rss_bytes"`
	MemoryBytes      int64          `json:"memory_bytes"`
	RSSBoundBytes    int64          `json:"rss_bound_bytes"`
	FeaturesRead     bool           `json:"features_read"`
	FeaturesUsed     int64          `json:"features_used_bytes"`
	FeaturesReserved int64          `json:"features_reserved_bytes"`
	FeaturesNote     string         `json:"features_note,omitempty"`
	LongestWaitS     float64        `json:"longest_wait_s"`
	TimeoutS         float64        `json:"timeout_s"`
	TimeoutName      string         `json:"timeout_name,omitempty"`
	Alive            bool           `json:"alive"`
	AliveNote        string         `json:"alive_note,omitempty"`
	OK               bool           `json:"ok"`
	Verdict          string         `json:"verdict"`
	Failures         []string       `json:"failures"`
	Notes            []string       `json:"notes"`
	TookS            float64        `json:"took_s"`
}

// WriteJSON writes the rows as a JSON array, one object per row with the table's fields.
func WriteJSON(w io.Writer, rows []Row) error {
	out := make([]jsonRow, len(rows))
	for i := range rows {
		r := &rows[i]
		out[i] = jsonRow{
			Scenario: r.Scenario, Statuses: r.Statuses, StatusesText: formatStatuses(r.Statuses), StatusSource: r.StatusSource,
			PeakRSSBytes: r.PeakRSS, MemoryBytes: r.MemoryBytes, RSSBoundBytes: r.RSSBound,
			FeaturesRead: r.FeaturesRead, FeaturesUsed: r.FeaturesUsed, FeaturesReserved: r.FeaturesReserved, FeaturesNote: r.FeaturesNote,
			LongestWaitS: r.LongestWait.Seconds(), TimeoutS: r.Timeout.Seconds(), TimeoutName: r.TimeoutName,
			Alive: r.Alive, AliveNote: r.AliveNote, OK: r.OK(), Verdict: r.Verdict(),
			Failures: nonNil(r.Failures), Notes: nonNil(r.Notes), TookS: r.Took.Seconds(),
		}
		if out[i].Statuses == nil {
			out[i].Statuses = map[string]int{}
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
