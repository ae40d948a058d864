package deploy

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Every manifest decodes strictly into its API type and breaks none of the API server's rules.
func TestManifestsAPIRules(t *testing.T) {
	b := loadBundle(t)
	require.Empty(t, apiRules(b))
}

// The manifests follow the daemon's configuration and the cluster's conventions.
func TestManifestsFollowTheDaemon(t *testing.T) {
	b := loadBundle(t)
	require.Empty(t, deploymentRules(b))
}

// Strict decoding refuses what the API server's strict field validation refuses.
func TestDecodeRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndatta: {}\n",
		"misspelt probe": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        livenesProbe: {}\n",
		"wrong type":     "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      terminationGracePeriodSeconds: 45s\n",
		"bad quantity":   "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        resources: {limits: {memory: 8 GB}}\n",
		"duplicate key":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: a, k: b}\n",
		"unknown kind":   "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n",
	} {
		_, err := decodeDocuments("t.yaml", []byte(doc))
		require.Error(t, err, name)
	}
	objs, err := decodeDocuments("t.yaml", []byte("# one\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# only a comment\n"))
	require.NoError(t, err)
	require.Len(t, objs, 1)
}

// Each check can fail: a copy of the manifests with one thing broken is caught, and named.
func TestChecksCatchBreakage(t *testing.T) {
	base := loadBundle(t)
	main := func(b *bundle) *corev1.Container {
		return findContainer(b.daemonSet.Spec.Template.Spec.Containers, mainContainer)
	}
	pod := func(b *bundle) *corev1.PodSpec { return &b.daemonSet.Spec.Template.Spec }
	setConfig := func(b *bundle, key, value string) { // replaces the key's line, or adds one
		cfg := b.configMap.Data["config.yaml"]
		line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `:.*$`)
		if line.MatchString(cfg) {
			b.configMap.Data["config.yaml"] = line.ReplaceAllString(cfg, key+": "+value)
		} else {
			b.configMap.Data["config.yaml"] = cfg + key + ": " + value + "\n"
		}
	}
	cases := []struct {
		name   string
		api    bool // apiRules, else deploymentRules
		mutate func(b *bundle)
		want   string
	}{
		{"invalid object name", true, func(b *bundle) { b.configMap.Name = "Data_Plane" }, "metadata.name"},
		{"selector misses the template", true, func(b *bundle) {
			b.daemonSet.Spec.Template.Labels["app.kubernetes.io/component"] = "other"
		}, "does not match template"},
		{"probe on an undeclared port", true, func(b *bundle) {
			main(b).LivenessProbe.HTTPGet.Port = intstr.FromString("metrics")
		}, "no container port has that name"},
		{"mount of a missing volume", true, func(b *bundle) {
			main(b).VolumeMounts = append(main(b).VolumeMounts, corev1.VolumeMount{Name: "models", MountPath: "/models"})
		}, "no such volume"},
		{"GPU request below its limit", true, func(b *bundle) {
			main(b).Resources.Requests[gpuResource] = resource.MustParse("0")
		}, "must equal its limit"},
		{"bad downward fieldPath", true, func(b *bundle) {
			findVolume(pod(b), "podinfo-topology").DownwardAPI.Items[0].FieldRef.FieldPath = "spec.nodeName"
		}, "not a supported fieldPath"},
		{"short token lifetime", true, func(b *bundle) {
			*findVolume(pod(b), "kube-api-access").Projected.Sources[0].ServiceAccountToken.ExpirationSeconds = 60
		}, "at least 10 minutes"},
		{"both update bounds zero", true, func(b *bundle) {
			zero := intstr.FromInt32(0)
			b.daemonSet.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable = &zero
		}, "cannot both be 0"},
		{"port name too long", true, func(b *bundle) { main(b).Ports[1].Name = "administration-port" }, "port name"},

		{"file left out of kustomization", false, func(b *bundle) { b.kustomization.Resources = b.kustomization.Resources[1:] }, "kustomization.yaml: resources"},
		{"object in another namespace", false, func(b *bundle) { b.configMap.Namespace = "default" }, "ConfigMap dataplane: namespace"},
		{"admin port moved in the config", false, func(b *bundle) {
			setConfig(b, "admin-listen", `":9091"`)
		}, "listens on"},
		{"readiness on /healthz", false, func(b *bundle) { main(b).ReadinessProbe.HTTPGet.Path = "/healthz" }, "readinessProbe must GET /readyz"},
		{"scrape on the API port", false, func(b *bundle) {
			b.daemonSet.Spec.Template.Annotations["prometheus.io/port"] = "8000"
		}, "prometheus.io annotations"},
		{"grace shorter than the drain", false, func(b *bundle) { setConfig(b, "shutdown-timeout", "60s") }, "terminationGracePeriodSeconds"},
		{"no memory limit", false, func(b *bundle) { delete(main(b).Resources.Limits, corev1.ResourceMemory) }, "no memory limit"},
		{"memory-bytes above the limit", false, func(b *bundle) { setConfig(b, "memory-bytes", "16GiB") }, "must be below the memory limit"},
		{"GOMEMLIMIT set", false, func(b *bundle) {
			main(b).Env = append(main(b).Env, corev1.EnvVar{Name: "GOMEMLIMIT", Value: "7GiB"})
		}, "GOMEMLIMIT"},
		{"more encoder threads than CPUs", false, func(b *bundle) {
			setConfig(b, "encoder-threads", "8")
		}, "encoder workers"},
		{"GPU pod on any node", false, func(b *bundle) { delete(pod(b).NodeSelector, gpuNodeLabel) }, "does not select"},
		{"surge with a GPU", false, func(b *bundle) {
			one := intstr.FromInt32(1)
			b.daemonSet.Spec.UpdateStrategy.RollingUpdate.MaxSurge = &one
		}, "maxSurge"},
		{"root user", false, func(b *bundle) { *pod(b).SecurityContext.RunAsUser = 0 }, "non-root user"},
		{"writable root filesystem", false, func(b *bundle) {
			f := false
			main(b).SecurityContext.ReadOnlyRootFilesystem = &f
		}, "readOnlyRootFilesystem"},
		{"tmpfs /tmp", false, func(b *bundle) { findVolume(pod(b), "tmp").EmptyDir.Medium = corev1.StorageMediumMemory }, "/tmp must be"},
		{"token in the daemon", false, func(b *bundle) {
			main(b).VolumeMounts = append(main(b).VolumeMounts, corev1.VolumeMount{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"})
		}, "must not mount the API token"},
		{"topology level nobody copies", false, func(b *bundle) {
			v := findVolume(pod(b), "podinfo-topology").DownwardAPI
			v.Items = append(v.Items, corev1.DownwardAPIVolumeFile{Path: "rack", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['example.com/rack']"}})
		}, "the init container copies"},
		{"topology env off", false, func(b *bundle) { findEnv(main(b), "DYN_TOPOLOGY_ENABLED").Value = "false" }, "DYN_TOPOLOGY_ENABLED"},
		{"no node read permission", false, func(b *bundle) { b.clusterRoles[0].Rules[0].Verbs = []string{"list"} }, "RBAC"},
		{"NATS URL without a port", false, func(b *bundle) { b.configMap.Data["nats-url"] = "nats://nats.nats.svc" }, "NATS URL"},
		{"image without a tag", false, func(b *bundle) { main(b).Image = "dataplane" }, "pinned by a tag"},
		{"service selects nothing", false, func(b *bundle) { b.services[0].Spec.Selector["app.kubernetes.io/component"] = "router" }, "does not select"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := base.clone()
			c.mutate(b)
			var got []string
			if c.api {
				got = apiRules(b)
			} else {
				got = deploymentRules(b)
			}
			require.NotEmpty(t, got, "nothing caught")
			require.Contains(t, strings.Join(got, "\n"), c.want)
		})
		require.Empty(t, deploymentRules(base), "the mutation leaked into the original")
	}
}

// kustomize builds the folder (kubectl's built-in kustomize, where kubectl is installed): the
// same objects, every namespaced one in the namespace.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, "kustomize", manifestDir).Output()
	require.NoError(t, err)
	rendered, err := decodeDocuments("kustomize output", out)
	require.NoError(t, err)
	b := loadBundle(t)
	key := func(o object) string { return o.kind + "/" + o.meta.Namespace + "/" + o.meta.Name }
	var want, got []string
	for _, o := range b.objects {
		want = append(want, key(o))
	}
	for _, o := range rendered {
		got = append(got, key(o))
	}
	sort.Strings(want)
	sort.Strings(got)
	require.Equal(t, want, got)
}

// The init container's script, run by bash with a stand-in kubectl (jq is the real one, as in
// the registry.k8s.io/kubectl image): it labels the pod with the node labels it has, skips the
// ones it lacks, and labels nothing when the node has none.
func TestTopologyInitScript(t *testing.T) {
	for _, tool := range []string{"bash", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	b := loadBundle(t)
	init := findContainer(b.daemonSet.Spec.Template.Spec.InitContainers, topologyInit)
	require.NotNil(t, init)
	require.Equal(t, []string{"bash", "-c"}, init.Command[:2])
	script := init.Command[2]

	run := func(nodeLabels map[string]string) (calls []string, output string) {
		dir := t.TempDir()
		node, err := json.Marshal(map[string]any{"metadata": map[string]any{"name": "gpu-7", "labels": nodeLabels}})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "node.json"), node, 0o644))
		// The stand-in answers `get node NAME -o json` and records every call, one per line.
		stub := "#!/bin/bash\necho \"$*\" >> \"" + filepath.Join(dir, "calls") + "\"\n" +
			"if [ \"$1 $2 $3\" = \"get node gpu-7\" ]; then cat \"" + filepath.Join(dir, "node.json") + "\"; exit 0; fi\n" +
			"[ \"$1\" = label ] || exit 3\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "kubectl"), []byte(stub), 0o755))
		cmd := exec.Command("bash", "-c", script)
		cmd.Env = []string{"PATH=" + dir + ":" + os.Getenv("PATH"), "NODE_NAME=gpu-7", "POD_NAME=dataplane-x1",
			"POD_NAMESPACE=dataplane", "TOPOLOGY_NODE_LABELS=" + findEnv(init, "TOPOLOGY_NODE_LABELS").Value}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		raw, _ := os.ReadFile(filepath.Join(dir, "calls"))
		return strings.Split(strings.TrimSpace(string(raw)), "\n"), string(out)
	}

	calls, out := run(map[string]string{
		"topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1",
		"kubernetes.io/hostname": "gpu-7",
	})
	require.Equal(t, []string{
		"get node gpu-7 -o json",
		"label pod dataplane-x1 --namespace dataplane --overwrite topology.kubernetes.io/region=us-east-1 topology.kubernetes.io/zone=us-east-1a",
	}, calls)
	require.Contains(t, out, "node gpu-7 has no label nvidia.com/gpu.clique")

	calls, _ = run(map[string]string{})
	require.Equal(t, []string{"get node gpu-7 -o json"}, calls, "nothing to label")
}
