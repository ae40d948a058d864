package topology

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The worker side, as Dynamo's components/src/dynamo/common/utils/topology.py (ai-dynamo/dynamo
// at 4de2344f) does it: every non-hidden, non-empty regular file of the directory is a level
// (its name) and this worker's domain there (its content, trimmed); Kubernetes' Downward API
// projects node labels so, its own entries ("..data", ...) hidden. The configured level's file
// may appear after the process starts (an init container copies the label), so it is polled.

// DefaultDir is where the topology files are mounted (DESIGN.md; Dynamo's default is
// /etc/dynamo/topology).
const DefaultDir = "/etc/podinfo/topology"

// Defaults of the poll: Dynamo's (once a second, 30 seconds).
const (
	DefaultWait = 30 * time.Second
	DefaultPoll = time.Second
)

// maxFileBytes bounds what is read of one file: a domain is at most MaxLabelLen bytes.
const maxFileBytes = MaxLabelLen + 64

// ErrDomainMissing is the configured level's file still missing or empty after the wait.
type ErrDomainMissing struct {
	Dir, Level string
	Waited     time.Duration
}

func (e *ErrDomainMissing) Error() string {
	return fmt.Sprintf("topology: %s has no %q file with a domain in it after %v (the level must be published before the worker starts; are the node labels projected there?)",
		e.Dir, e.Level, e.Waited)
}

// ReadDomains reads the worker's domains from dir, polling every poll until level's file has
// content or wait has passed (then *ErrDomainMissing), or ctx ends. A value longer than
// MaxLabelLen, or more than MaxLevels files, is an error naming the file.
func ReadDomains(ctx context.Context, dir, level string, wait, poll time.Duration) (map[string]string, error) {
	if level == "" || strings.ContainsAny(level, `/\`) || strings.HasPrefix(level, ".") {
		return nil, fmt.Errorf("topology: level %q: want a file name", level)
	}
	deadline := time.Now().Add(wait)
	for {
		domains, err := readDir(dir)
		if err != nil {
			return nil, err
		}
		if domains[level] != "" {
			return domains, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, &ErrDomainMissing{Dir: dir, Level: level, Waited: wait}
		}
		t := time.NewTimer(min(poll, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// readDir reads one listing; a directory that does not exist (yet) has no domains.
func readDir(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	out := map[string]string{}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		st, err := os.Stat(path) // follows the Downward API's symbolic links
		if err != nil || !st.Mode().IsRegular() {
			continue // vanished meanwhile, or not a file
		}
		v, err := readSmall(path)
		if err != nil {
			return nil, err
		}
		if v == "" {
			continue
		}
		if len(name) > MaxLabelLen {
			return nil, fmt.Errorf("topology: %s: a level name of %d bytes, at most %d", path, len(name), MaxLabelLen)
		}
		if len(out) == MaxLevels {
			return nil, fmt.Errorf("topology: %s: more than %d levels", dir, MaxLevels)
		}
		out[name] = v
	}
	return out, nil
}

func readSmall(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return "", nil
		}
		return "", fmt.Errorf("topology: %w", err)
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("topology: %w", err)
	}
	if len(buf) > maxFileBytes {
		return "", fmt.Errorf("topology: %s: more than %d bytes (a domain is at most %d)", path, maxFileBytes, MaxLabelLen)
	}
	v := strings.TrimSpace(string(buf))
	if len(v) > MaxLabelLen {
		return "", fmt.Errorf("topology: %s: a domain of %d bytes, at most %d", path, len(v), MaxLabelLen)
	}
	return v, nil
}
