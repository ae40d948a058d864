package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Configuration comes from three places, in this precedence: command-line flags, then
// environment variables (DATAPLANE_ + the flag name in upper case with - as _; then, for the
// few settings Dynamo's deployments set, its name: envAliases), then a YAML file (--config /
// $DATAPLANE_CONFIG; keys are the flag names), then the built-in defaults.
// Every setting is a flag, so `-h` documents all of them; this is the one place that reads
// the environment.

// envName is the environment variable of a flag: max-body-bytes → DATAPLANE_MAX_BODY_BYTES.
func envName(flagName string) string {
	return "DATAPLANE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// loadConfig parses args into fs and fills every flag not given on the command line from the
// environment (getenv) or the YAML file named by the "config" flag. Errors name the source; a
// command-line error is a *flagError, which the FlagSet has printed already.
func loadConfig(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return &flagError{err}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	fromEnv := map[string]bool{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookupEnv(getenv, name)
		if alias := envAliases[f.Name]; !ok && alias != "" {
			name = alias
			v, ok = lookupEnv(getenv, alias)
		}
		if ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("$%s=%q: %v", name, v, err))
			}
			fromEnv[f.Name] = true
		}
	})
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	cfg := fs.Lookup("config")
	if cfg == nil || cfg.Value.String() == "" {
		return nil
	}
	raw, err := os.ReadFile(cfg.Value.String())
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var values map[string]yaml.Node
	if err := yaml.Unmarshal(raw, &values); err != nil {
		return fmt.Errorf("%s: %w", cfg.Value.String(), err)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil || k == "config" {
			errs = append(errs, fmt.Errorf("%s: unknown setting %q (settings are the flag names; see -h)", cfg.Value.String(), k))
			continue
		}
		if given[k] || fromEnv[k] {
			continue
		}
		node := values[k]
		v, err := yamlScalar(&node)
		if err == nil {
			if err = f.Value.Set(v); err != nil {
				err = fmt.Errorf("%q: %v", v, err)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %v", cfg.Value.String(), k, err))
		}
	}
	return errors.Join(errs...)
}

// flagError is a command-line error: the FlagSet printed it with its usage.
type flagError struct{ err error }

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

// configFailed reports a loadConfig error of command cmd: -h stays flag.ErrHelp, an error the
// FlagSet has not printed (from the environment or the file) is printed, and the command
// fails with errUsage.
func configFailed(cmd string, err error, stderr io.Writer) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if fe := (*flagError)(nil); !errors.As(err, &fe) {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	}
	return errUsage
}

// yamlScalar turns a YAML value into the flag's string form: scalars as written, lists of
// scalars joined by commas.
func yamlScalar(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, len(n.Content))
		for i, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("want a list of plain values")
			}
			parts[i] = c.Value
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a value or a list of values")
}

// envAliases are the environment variables of Dynamo's topology-aware KV transfer (seed 004),
// by the flag they set where DATAPLANE_ + the flag's name is not given.
var envAliases = map[string]string{
	"topology":                    "DYN_TOPOLOGY_ENABLED",
	"topology-dir":                "DYN_TOPOLOGY_MOUNT_PATH",
	"topology-level":              "DYN_TOPOLOGY_DOMAIN",
	"kv-transfer-topology-level":  "DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL",
	"kv-transfer-mismatch-policy": "DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY",
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

// configUsage is the text -h prints after the flags.
func configUsage(fs *flag.FlagSet) string {
	example := "listen"
	if fs.Lookup(example) == nil {
		fs.VisitAll(func(f *flag.Flag) { example = f.Name })
	}
	return fmt.Sprintf(`
Every flag can also be set by the environment variable DATAPLANE_ + its name in upper case
with - as _ (e.g. %s), or in the YAML file given by --config / $DATAPLANE_CONFIG,
whose keys are the flag names (e.g. "%s: ..."). Precedence: flag, environment, file, default.
`, envName(example), example)
}
