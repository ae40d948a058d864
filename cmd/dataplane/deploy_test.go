package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The Kubernetes manifests of dataplane/deploy configure serve through a ConfigMap (the
// --config file) and DATAPLANE_* environment variables. Here serve's own flag set and loader
// read them: every setting must be a serve flag with a value it accepts. (dataplane/deploy's
// tests check the manifests against the Kubernetes API; they cannot import this package.)

const deployDir = "../../dataplane/deploy/k8s"

// pendingFlags are flags the manifests set before serve has them, with the work that adds
// them: an environment variable of a flag serve lacks is ignored, so they are harmless until
// then. Once serve has one, this test fails until it is taken off this list.
var pendingFlags = map[string]string{}

// envRef is a $(VAR) reference in an environment variable's value.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// downwardSamples are a pod's values of the Downward API fields the manifests read.
var downwardSamples = map[string]string{"metadata.name": "dataplane-x7k2q", "metadata.namespace": "dataplane",
	"spec.nodeName": "gpu-7.example.internal", "status.podIP": "10.4.2.17"}

// deployManifests is what this test reads of the manifests: the ConfigMap's data, and the
// daemon container's args and environment.
type deployManifests struct {
	config map[string]string
	args   []string
	env    map[string]string // DATAPLANE_* → value, a configMapKeyRef resolved
}

func loadDeployManifests(t *testing.T) deployManifests {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, "configmap.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &cm))

	type envVar struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			ConfigMapKeyRef *struct {
				Key string `yaml:"key"`
			} `yaml:"configMapKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name string   `yaml:"name"`
						Args []string `yaml:"args"`
						Env  []envVar `yaml:"env"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	raw, err = os.ReadFile(filepath.Join(deployDir, "daemonset.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &ds))

	m := deployManifests{config: cm.Data, env: map[string]string{}}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "dataplane" {
			continue
		}
		m.args = c.Args
		// Kubernetes expands $(VAR) in a value from the variables before it; the Downward
		// API's fields get a pod's sample values.
		seen := map[string]string{}
		for _, e := range c.Env {
			v := envRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
				if x, ok := seen[ref[2:len(ref)-1]]; ok {
					return x
				}
				return ref
			})
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				v = downwardSamples[e.ValueFrom.FieldRef.FieldPath]
			}
			seen[e.Name] = v
			if !strings.HasPrefix(e.Name, "DATAPLANE_") {
				continue
			}
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				var ok bool
				v, ok = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
				require.True(t, ok, "%s: the ConfigMap has no key %q", e.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			}
			m.env[e.Name] = v
		}
	}
	require.NotEmpty(t, m.args, "the daemon container")
	require.Equal(t, "serve", m.args[0])
	return m
}

// serveFlagNames lists serve's flags as its -h prints them.
func serveFlagNames(t *testing.T) map[string]bool {
	t.Helper()
	var out bytes.Buffer
	require.ErrorIs(t, serve(context.Background(), []string{"-h"}, &out), flag.ErrHelp)
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(out.String(), -1) {
		names[m[1]] = true
	}
	require.Contains(t, names, "listen", "serve -h lists its flags")
	return names
}

// runServeConfig runs serve's argument handling on args with configYAML as the --config file
// and env set, up to its first check after loading: a --log-level it refuses, added last.
// It returns what serve printed; "" would mean the configuration loaded and only that flag
// was wrong.
func runServeConfig(t *testing.T, args []string, configYAML string, env map[string]string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(file, []byte(configYAML), 0o644))
	args = append([]string(nil), args...)
	for i, a := range args {
		if a == "--config" && i+1 < len(args) {
			args[i+1] = file
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out bytes.Buffer
	err := serve(context.Background(), append(args, "--log-level", "deploy-check"), &out)
	require.ErrorIs(t, err, errUsage)
	rest := strings.TrimSpace(out.String())
	for _, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "serve: --log-level: ") {
			return strings.TrimSpace(strings.Replace(rest, line, "", 1))
		}
	}
	return rest + " (and serve did not reach the --log-level check)"
}

func TestDeployConfigIsServes(t *testing.T) {
	m := loadDeployManifests(t)
	flags := serveFlagNames(t)

	env := map[string]string{}
	for name, value := range m.env {
		f := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "DATAPLANE_"), "_", "-"))
		if why, pending := pendingFlags[f]; pending {
			require.False(t, flags[f], "serve has --%s now (%s): take it off pendingFlags", f, why)
			continue
		}
		require.True(t, flags[f], "%s: serve has no flag --%s", name, f)
		env[name] = value
	}
	require.Contains(t, m.args, "--config")
	cfg, ok := m.config["config.yaml"]
	require.True(t, ok)
	require.Empty(t, runServeConfig(t, m.args[1:], cfg, env), "serve refuses the deployment's configuration")
}

// The check above can fail: serve's loader names an unknown setting and a bad value.
func TestDeployConfigCheckCatches(t *testing.T) {
	m := loadDeployManifests(t)
	cfg := m.config["config.yaml"]
	require.Contains(t, runServeConfig(t, m.args[1:], cfg+"admin-port: 9090\n", nil), `unknown setting "admin-port"`)
	require.Contains(t, runServeConfig(t, m.args[1:], strings.Replace(cfg, "shutdown-timeout: 30s", "shutdown-timeout: 30", 1), nil), "shutdown-timeout")
	require.Contains(t, runServeConfig(t, m.args[1:], cfg, map[string]string{"DATAPLANE_MAX_CONNS": "many"}), "DATAPLANE_MAX_CONNS")
}
