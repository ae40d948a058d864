package deploy

import (
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// What the manifests owe the daemon: ports, probes and scrape annotations on the ports its
// configuration opens, a grace period longer than its drain, a memory limit it can budget
// from, the topology files and environment, the NATS reference, the permissions of the init
// container and a locked-down pod; and the folder's own consistency (kustomization, names,
// selectors).

const (
	podinfoTopology = "/etc/podinfo/topology"
	gpuResource     = corev1.ResourceName("nvidia.com/gpu")
	gpuNodeLabel    = "nvidia.com/gpu.present"
	mainContainer   = "dataplane"
	topologyInit    = "topology-labels"
)

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func findEnv(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func findVolume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

func mountAt(c *corev1.Container, dir string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == dir {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func containerPort(c *corev1.Container, port intstr.IntOrString) int32 {
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return p.ContainerPort
		}
	}
	return -1
}

// deploymentRules returns every rule broken.
func deploymentRules(b *bundle) []string {
	var p problems
	spec := &b.daemonSet.Spec.Template.Spec
	c := findContainer(spec.Containers, mainContainer)
	if c == nil {
		return []string{"DaemonSet: no container " + mainContainer}
	}
	cfg, err := b.daemonConfig()
	if err != nil {
		return []string{err.Error()}
	}

	// The folder: kustomization lists every file; one namespace for everything namespaced.
	if !slices.Equal(sortedCopy(b.kustomization.Resources), sortedCopy(b.files)) {
		p.add("kustomization.yaml: resources %v, but the folder holds %v", b.kustomization.Resources, b.files)
	}
	if b.kustomization.Namespace != b.namespace.Name {
		p.add("kustomization.yaml: namespace %q, the Namespace is %q", b.kustomization.Namespace, b.namespace.Name)
	}
	for _, o := range b.objects {
		if o.kind != "Namespace" && o.kind != "ClusterRole" && o.kind != "ClusterRoleBinding" && o.meta.Namespace != b.namespace.Name {
			p.add("%s %s: namespace %q, not %q", o.kind, o.meta.Name, o.meta.Namespace, b.namespace.Name)
		}
	}

	// The daemon's settings: --config is the ConfigMap's file.
	cfgMount := mountAt(c, path.Dir(argAfter(c.Args, "--config")))
	cfgVol := (*corev1.Volume)(nil)
	if cfgMount != nil {
		cfgVol = findVolume(spec, cfgMount.Name)
	}
	if len(c.Args) == 0 || c.Args[0] != "serve" || cfgVol == nil || cfgVol.ConfigMap == nil || cfgVol.ConfigMap.Name != b.configMap.Name ||
		!slices.ContainsFunc(cfgVol.ConfigMap.Items, func(k corev1.KeyToPath) bool {
			return k.Key == "config.yaml" && k.Path == path.Base(argAfter(c.Args, "--config"))
		}) {
		p.add("DaemonSet: args %v must run serve --config on the ConfigMap's config.yaml", c.Args)
	}

	// Ports, probes, scrape annotations.
	listen, admin := hostPortNumber(cfg["listen"]), hostPortNumber(cfg["admin-listen"])
	if listen <= 0 || admin <= 0 {
		p.add("config.yaml: listen %q and admin-listen %q must both be HOST:PORT (the probes need the admin listener)", cfg["listen"], cfg["admin-listen"])
	}
	if containerPort(c, intstr.FromString("http")) != listen || containerPort(c, intstr.FromString("admin")) != admin {
		p.add("DaemonSet: ports http/admin %d/%d, config.yaml listens on %d/%d",
			containerPort(c, intstr.FromString("http")), containerPort(c, intstr.FromString("admin")), listen, admin)
	}
	for name, want := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"startupProbe": {c.StartupProbe, "/healthz"}, "livenessProbe": {c.LivenessProbe, "/healthz"}, "readinessProbe": {c.ReadinessProbe, "/readyz"}} {
		pr := want.probe
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != want.path || containerPort(c, pr.HTTPGet.Port) != admin {
			p.add("DaemonSet: %s must GET %s on the admin port %d", name, want.path, admin)
		}
	}
	ann := b.daemonSet.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(int(admin)) || ann["prometheus.io/path"] != "/metrics" {
		p.add("DaemonSet: prometheus.io annotations %v must scrape /metrics on the admin port %d", ann, admin)
	}
	for _, s := range b.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if len(s.Spec.Selector) == 0 || !sel.Matches(labels.Set(b.daemonSet.Spec.Template.Labels)) {
			p.add("Service %s: selector %v does not select the daemon's pods", s.Name, s.Spec.Selector)
		}
		for _, port := range s.Spec.Ports {
			if containerPort(c, port.TargetPort) <= 0 {
				p.add("Service %s: targetPort %s is no port of the daemon", s.Name, port.TargetPort.String())
			}
		}
	}

	// Shutdown: SIGTERM comes after the preStop hook; the drain must end before SIGKILL.
	shutdown := 30 * time.Second // serve's default
	if v, ok := cfg["shutdown-timeout"]; ok {
		if shutdown, err = time.ParseDuration(v); err != nil {
			p.add("config.yaml: shutdown-timeout %q: %v", v, err)
		}
	}
	preStop := time.Duration(0)
	if h := c.Lifecycle; h != nil && h.PreStop != nil && h.PreStop.Exec != nil {
		cmd := h.PreStop.Exec.Command
		if n, err := strconv.Atoi(cmd[len(cmd)-1]); len(cmd) == 2 && cmd[0] == "sleep" && err == nil {
			preStop = time.Duration(n) * time.Second
		} else {
			p.add("DaemonSet: preStop %v: this check reads only [sleep N]", cmd)
		}
	}
	grace := time.Duration(30) * time.Second // the API's default
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if grace <= preStop+shutdown {
		p.add("DaemonSet: terminationGracePeriodSeconds %v is not above preStop %v + shutdown-timeout %v", grace, preStop, shutdown)
	}

	// Memory: the daemon budgets from its cgroup limit (90%) unless memory-bytes says otherwise.
	limit, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
	request := c.Resources.Requests[corev1.ResourceMemory]
	switch {
	case !hasLimit:
		p.add("DaemonSet: no memory limit: the daemon would budget the node's physical memory")
	case request.Cmp(limit) != 0:
		p.add("DaemonSet: memory request %s differs from the limit %s the daemon budgets from", request.String(), limit.String())
	}
	if v, ok := cfg["memory-bytes"]; ok && hasLimit {
		// serve writes sizes as GOMEMLIMIT does (64MiB); Kubernetes as 64Mi.
		if q, err := resource.ParseQuantity(strings.TrimSuffix(v, "B")); err != nil || q.Cmp(limit) >= 0 {
			p.add("config.yaml: memory-bytes %q must be below the memory limit %s", v, limit.String())
		}
	}
	if findEnv(c, "GOMEMLIMIT") != nil {
		p.add("DaemonSet: GOMEMLIMIT is set: the daemon sets it from its memory budget")
	}

	// CPU: the encoder threads the configuration runs fit in the CPU request.
	if th, err := strconv.Atoi(cfg["encoder-threads"]); err == nil {
		workers := 1
		if w, err := strconv.Atoi(cfg["encoder-workers"]); err == nil {
			workers = w
		}
		cpu := c.Resources.Requests[corev1.ResourceCPU]
		if int64(th*workers)*1000 > cpu.MilliValue() {
			p.add("config.yaml: %d encoder workers x %d threads need more than the %s CPUs requested", workers, th, cpu.String())
		}
	}

	// The GPU: from the device plugin, on GPU nodes only, and no surge on update.
	if gpus, ok := c.Resources.Limits[gpuResource]; ok && gpus.Value() > 0 {
		if spec.NodeSelector[gpuNodeLabel] != "true" {
			p.add("DaemonSet: requests %s but does not select %s=true nodes", gpuResource, gpuNodeLabel)
		}
		if u := b.daemonSet.Spec.UpdateStrategy.RollingUpdate; u == nil || !isZero(u.MaxSurge) {
			p.add("DaemonSet: maxSurge must be 0: a surged pod needs a GPU the old pod holds")
		}
	}

	// The pod runs as the image's user, non-root, read-only, with /tmp on disk for ffmpeg.
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil ||
		strconv.FormatInt(*sc.RunAsUser, 10) != strings.Split(b.dockerUser, ":")[0] {
		p.add("DaemonSet: the pod must run as non-root user %s (the image's USER)", b.dockerUser)
	}
	for _, ct := range append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...) {
		s := ct.SecurityContext
		if s == nil || s.ReadOnlyRootFilesystem == nil || !*s.ReadOnlyRootFilesystem ||
			s.AllowPrivilegeEscalation == nil || *s.AllowPrivilegeEscalation ||
			s.Capabilities == nil || !slices.Contains(s.Capabilities.Drop, "ALL") {
			p.add("DaemonSet: container %s: readOnlyRootFilesystem, no privilege escalation, drop ALL", ct.Name)
		}
	}
	if tmp := mountAt(c, "/tmp"); tmp == nil {
		p.add("DaemonSet: no writable /tmp for ffmpeg's input files")
	} else if v := findVolume(spec, tmp.Name); v == nil || v.EmptyDir == nil || v.EmptyDir.Medium == corev1.StorageMediumMemory ||
		v.EmptyDir.SizeLimit == nil || tmp.ReadOnly {
		p.add("DaemonSet: /tmp must be a writable disk emptyDir with a sizeLimit (a tmpfs would count against the memory limit)")
	}

	// The API token reaches only the init container that needs it.
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p.add("DaemonSet: automountServiceAccountToken must be false")
	}
	tokenMount := "/var/run/secrets/kubernetes.io/serviceaccount"
	if mountAt(c, tokenMount) != nil {
		p.add("DaemonSet: the daemon must not mount the API token")
	}
	init := findContainer(spec.InitContainers, topologyInit)
	if init == nil {
		p.add("DaemonSet: no %s init container", topologyInit)
		return p
	}
	if m := mountAt(init, tokenMount); m == nil || findVolume(spec, m.Name) == nil || findVolume(spec, m.Name).Projected == nil {
		p.add("DaemonSet: %s needs the projected API token at %s", topologyInit, tokenMount)
	}

	// Topology: one file per level, each from a pod label the init container copies from the
	// node; Dynamo's environment names the directory.
	topo := mountAt(c, podinfoTopology)
	var projected []string
	if topo != nil && findVolume(spec, topo.Name) != nil && findVolume(spec, topo.Name).DownwardAPI != nil {
		for _, it := range findVolume(spec, topo.Name).DownwardAPI.Items {
			m := subscriptedField.FindStringSubmatch(it.FieldRef.FieldPath)
			if m == nil || m[1] != "labels" {
				p.add("DaemonSet: topology file %s: must project a pod label, not %q", it.Path, it.FieldRef.FieldPath)
				continue
			}
			projected = append(projected, m[2])
		}
	} else {
		p.add("DaemonSet: no downwardAPI volume at %s", podinfoTopology)
	}
	copied := []string{}
	if e := findEnv(init, "TOPOLOGY_NODE_LABELS"); e != nil {
		copied = strings.Fields(e.Value)
	}
	if len(projected) == 0 || !slices.Equal(sortedCopy(projected), sortedCopy(copied)) {
		p.add("DaemonSet: the topology files project labels %v, the init container copies %v", projected, copied)
	}
	for _, want := range [][2]string{{"DYN_TOPOLOGY_ENABLED", "true"}, {"DYN_TOPOLOGY_MOUNT_PATH", podinfoTopology}} {
		if e := findEnv(c, want[0]); e == nil || e.Value != want[1] {
			p.add("DaemonSet: env %s=%s", want[0], want[1])
		}
	}
	if !b.allowed(rbacv1.Subject{Kind: "ServiceAccount", Name: spec.ServiceAccountName, Namespace: b.namespace.Name}, "nodes", "get", true) ||
		!b.allowed(rbacv1.Subject{Kind: "ServiceAccount", Name: spec.ServiceAccountName, Namespace: b.namespace.Name}, "pods", "get", false) ||
		!b.allowed(rbacv1.Subject{Kind: "ServiceAccount", Name: spec.ServiceAccountName, Namespace: b.namespace.Name}, "pods", "patch", false) {
		p.add("RBAC: service account %q must get nodes, and get and patch pods in %s", spec.ServiceAccountName, b.namespace.Name)
	}

	// NATS: the URL list from the ConfigMap, as serve --nats takes it.
	nats := findEnv(c, "DATAPLANE_NATS")
	if nats == nil || nats.ValueFrom == nil || nats.ValueFrom.ConfigMapKeyRef == nil || nats.ValueFrom.ConfigMapKeyRef.Name != b.configMap.Name {
		p.add("DaemonSet: DATAPLANE_NATS must come from the ConfigMap")
	} else if urls, ok := b.configMap.Data[nats.ValueFrom.ConfigMapKeyRef.Key]; !ok {
		p.add("ConfigMap: no key %q for DATAPLANE_NATS", nats.ValueFrom.ConfigMapKeyRef.Key)
	} else {
		for _, s := range strings.Split(urls, ",") {
			u, err := url.Parse(strings.TrimSpace(s))
			if err != nil || u.Scheme != "nats" || u.Hostname() == "" || u.Port() == "" {
				p.add("ConfigMap: NATS URL %q: want nats://HOST:PORT", s)
			}
		}
	}

	// Images are pinned by tag.
	for _, ct := range append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...) {
		_, tag, ok := strings.Cut(path.Base(ct.Image), ":")
		if !ok || tag == "" || tag == "latest" {
			p.add("DaemonSet: container %s: image %q must be pinned by a tag", ct.Name, ct.Image)
		}
	}
	return p
}

// allowed reports whether the bundle's RBAC lets subject do verb on a core-group resource
// (cluster-wide when cluster is set, else in the bundle's namespace).
func (b *bundle) allowed(subject rbacv1.Subject, res, verb string, cluster bool) bool {
	grants := func(rules []rbacv1.PolicyRule) bool {
		return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb)
		})
	}
	has := func(subjects []rbacv1.Subject) bool { return slices.Contains(subjects, subject) }
	for _, cb := range b.clusterBinds {
		for _, cr := range b.clusterRoles {
			if has(cb.Subjects) && cb.RoleRef.Kind == "ClusterRole" && cb.RoleRef.Name == cr.Name && grants(cr.Rules) {
				return true
			}
		}
	}
	if cluster {
		return false
	}
	for _, rb := range b.roleBinds {
		for _, r := range b.roles {
			if has(rb.Subjects) && rb.RoleRef.Kind == "Role" && rb.RoleRef.Name == r.Name && r.Namespace == rb.Namespace && grants(r.Rules) {
				return true
			}
		}
	}
	return false
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

func hostPortNumber(hostPort string) int32 {
	i := strings.LastIndex(hostPort, ":")
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(hostPort[i+1:])
	if err != nil {
		return -1
	}
	return int32(n)
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
