package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// Loading: every YAML document under k8s/ decoded strictly into its Kubernetes API type (an
// unknown or misspelt field, a duplicate key or a value of the wrong type is an error, as the
// API server's strict field validation makes it), and the Makefile's variables and recipes.

const manifestDir = "k8s"

// bundle is what k8s/ holds, by kind. Checks read it; tests mutate copies of it.
type bundle struct {
	kustomization kustomization
	files         []string // the YAML files besides kustomization.yaml
	objects       []object // in file order
	namespace     *corev1.Namespace
	configMap     *corev1.ConfigMap
	daemonSet     *appsv1.DaemonSet
	services      []*corev1.Service
	accounts      []*corev1.ServiceAccount
	clusterRoles  []*rbacv1.ClusterRole
	clusterBinds  []*rbacv1.ClusterRoleBinding
	roles         []*rbacv1.Role
	roleBinds     []*rbacv1.RoleBinding
	dockerUser    string // the runtime image's USER, from the Dockerfile
}

// object is one decoded document: its file, its kind and the typed value.
type object struct {
	file string
	kind string
	meta *metav1.ObjectMeta
	obj  any
}

// kustomization is the part of kustomize's Kustomization this folder uses; any other field is
// an error, so a typo cannot pass as an ignored field.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

// newObject returns an empty value of the Go type for apiVersion and kind: the kinds this
// folder may hold. Anything else is refused.
func newObject(apiVersion, kind string) (any, *metav1.ObjectMeta, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		o := &corev1.Namespace{}
		return o, &o.ObjectMeta, nil
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		return o, &o.ObjectMeta, nil
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		return o, &o.ObjectMeta, nil
	case "v1 Service":
		o := &corev1.Service{}
		return o, &o.ObjectMeta, nil
	case "apps/v1 DaemonSet":
		o := &appsv1.DaemonSet{}
		return o, &o.ObjectMeta, nil
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		o := &rbacv1.ClusterRole{}
		return o, &o.ObjectMeta, nil
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		o := &rbacv1.ClusterRoleBinding{}
		return o, &o.ObjectMeta, nil
	case "rbac.authorization.k8s.io/v1 Role":
		o := &rbacv1.Role{}
		return o, &o.ObjectMeta, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		o := &rbacv1.RoleBinding{}
		return o, &o.ObjectMeta, nil
	}
	return nil, nil, fmt.Errorf("apiVersion %q kind %q is not a kind this folder holds", apiVersion, kind)
}

// decodeDocuments splits a multi-document YAML stream (as kubectl does) and decodes each
// document strictly.
func decodeDocuments(file string, data []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		obj, meta, err := newObject(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, tm.Kind, err)
		}
		out = append(out, object{file: file, kind: tm.Kind, meta: meta, obj: obj})
	}
}

var commentLine = regexp.MustCompile(`(?m)^\s*#.*$`)

func stripComments(doc []byte) []byte { return commentLine.ReplaceAll(doc, nil) }

// loadBundle reads k8s/ (and the Dockerfile's USER) into a bundle.
func loadBundle(t testing.TB) *bundle {
	t.Helper()
	b := &bundle{}
	raw, err := os.ReadFile(filepath.Join(manifestDir, "kustomization.yaml"))
	require.NoError(t, err)
	require.NoError(t, sigsyaml.UnmarshalStrict(raw, &b.kustomization), "kustomization.yaml")

	paths, err := filepath.Glob(filepath.Join(manifestDir, "*.y*ml"))
	require.NoError(t, err)
	sort.Strings(paths)
	for _, p := range paths {
		name := filepath.Base(p)
		if name == "kustomization.yaml" {
			continue
		}
		b.files = append(b.files, name)
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		objs, err := decodeDocuments(name, data)
		require.NoError(t, err)
		b.objects = append(b.objects, objs...)
	}
	for _, o := range b.objects {
		switch v := o.obj.(type) {
		case *corev1.Namespace:
			require.Nil(t, b.namespace, "one Namespace")
			b.namespace = v
		case *corev1.ConfigMap:
			require.Nil(t, b.configMap, "one ConfigMap")
			b.configMap = v
		case *appsv1.DaemonSet:
			require.Nil(t, b.daemonSet, "one DaemonSet")
			b.daemonSet = v
		case *corev1.Service:
			b.services = append(b.services, v)
		case *corev1.ServiceAccount:
			b.accounts = append(b.accounts, v)
		case *rbacv1.ClusterRole:
			b.clusterRoles = append(b.clusterRoles, v)
		case *rbacv1.ClusterRoleBinding:
			b.clusterBinds = append(b.clusterBinds, v)
		case *rbacv1.Role:
			b.roles = append(b.roles, v)
		case *rbacv1.RoleBinding:
			b.roleBinds = append(b.roleBinds, v)
		}
	}
	require.NotNil(t, b.namespace, "a Namespace")
	require.NotNil(t, b.configMap, "a ConfigMap")
	require.NotNil(t, b.daemonSet, "a DaemonSet")
	b.dockerUser = loadDockerfile(t).stage("runtime").user
	return b
}

// clone is a deep copy of b (through the typed values' DeepCopy), for tests that break one
// thing and expect a check to say so.
func (b *bundle) clone() *bundle {
	c := *b
	c.files = append([]string(nil), b.files...)
	c.kustomization.Resources = append([]string(nil), b.kustomization.Resources...)
	c.namespace = b.namespace.DeepCopy()
	c.configMap = b.configMap.DeepCopy()
	c.daemonSet = b.daemonSet.DeepCopy()
	c.services, c.accounts = nil, nil
	c.clusterRoles, c.clusterBinds, c.roles, c.roleBinds = nil, nil, nil, nil
	c.objects = nil
	for _, o := range b.objects {
		n := o
		switch v := o.obj.(type) {
		case *corev1.Namespace:
			n.obj, n.meta = c.namespace, &c.namespace.ObjectMeta
		case *corev1.ConfigMap:
			n.obj, n.meta = c.configMap, &c.configMap.ObjectMeta
		case *appsv1.DaemonSet:
			n.obj, n.meta = c.daemonSet, &c.daemonSet.ObjectMeta
		case *corev1.Service:
			d := v.DeepCopy()
			c.services = append(c.services, d)
			n.obj, n.meta = d, &d.ObjectMeta
		case *corev1.ServiceAccount:
			d := v.DeepCopy()
			c.accounts = append(c.accounts, d)
			n.obj, n.meta = d, &d.ObjectMeta
		case *rbacv1.ClusterRole:
			d := v.DeepCopy()
			c.clusterRoles = append(c.clusterRoles, d)
			n.obj, n.meta = d, &d.ObjectMeta
		case *rbacv1.ClusterRoleBinding:
			d := v.DeepCopy()
			c.clusterBinds = append(c.clusterBinds, d)
			n.obj, n.meta = d, &d.ObjectMeta
		case *rbacv1.Role:
			d := v.DeepCopy()
			c.roles = append(c.roles, d)
			n.obj, n.meta = d, &d.ObjectMeta
		case *rbacv1.RoleBinding:
			d := v.DeepCopy()
			c.roleBinds = append(c.roleBinds, d)
			n.obj, n.meta = d, &d.ObjectMeta
		}
		c.objects = append(c.objects, n)
	}
	return &c
}

// daemonConfig is the daemon's YAML settings from the ConfigMap (serve --config): flag name →
// value as the flag would receive it. Lists are refused here: none of the settings this test
// reads is one.
func (b *bundle) daemonConfig() (map[string]string, error) {
	raw, ok := b.configMap.Data["config.yaml"]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s has no config.yaml", b.configMap.Name)
	}
	var nodes map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(raw), &nodes); err != nil {
		return nil, fmt.Errorf("config.yaml: %w", err)
	}
	out := map[string]string{}
	for k, n := range nodes {
		if n.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("config.yaml: %s: not a plain value", k)
		}
		out[k] = n.Value
	}
	return out, nil
}

// makefile is the root Makefile: its := and ?= variables and each target's recipe lines.
type makefile struct {
	vars    map[string]string
	recipes map[string][]string
}

var makeVar = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

func loadMakefile(t testing.TB) makefile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	require.NoError(t, err)
	m := makefile{vars: map[string]string{}, recipes: map[string][]string{}}
	assign := regexp.MustCompile(`^([A-Z_]+)\s*(?::=|\?=)\s*(.*)$`)
	target := regexp.MustCompile(`^([a-z][a-z-]*):`)
	current := ""
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "\t") && current != "" {
			m.recipes[current] = append(m.recipes[current], strings.TrimSpace(line))
			continue
		}
		current = ""
		if a := assign.FindStringSubmatch(line); a != nil {
			m.vars[a[1]] = strings.TrimSpace(a[2])
		} else if tg := target.FindStringSubmatch(line); tg != nil {
			current = tg[1]
		}
	}
	return m
}

// expand replaces $(VAR) by the Makefile's values, recursively.
func (m makefile) expand(s string) string {
	for i := 0; i < 10 && makeVar.MatchString(s); i++ {
		s = makeVar.ReplaceAllStringFunc(s, func(v string) string { return m.vars[v[2:len(v)-1]] })
	}
	return s
}
