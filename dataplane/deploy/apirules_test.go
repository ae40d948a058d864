package deploy

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// What the API server would refuse beyond the schema. No JSON schemas for the Kubernetes API
// could be had here (kubeconform fetches them from GitHub at run time; neither the Go module
// proxy nor the npm registry ships them as data), so: strict decoding into k8s.io/api's types
// (load_test.go) plays the schema, and these are the API server's create-time rules for the
// fields these manifests use, as the API reference and the validation in kubernetes'
// pkg/apis/{core,apps,rbac}/validation state them. ObjectMeta, labels and selectors go through
// apimachinery's own validators, which the API server runs.

// apiRules returns every rule broken, each naming the object and the field.
func apiRules(b *bundle) []string {
	var p problems
	for _, o := range b.objects {
		where := o.kind + " " + o.meta.Name
		clusterScoped := o.kind == "Namespace" || o.kind == "ClusterRole" || o.kind == "ClusterRoleBinding"
		nameFn := apivalidation.NameIsDNSSubdomain
		if o.kind == "Namespace" || o.kind == "Service" {
			nameFn = apivalidation.NameIsDNSLabel // also DNS names of their own
		}
		p.fields(where, apivalidation.ValidateObjectMeta(o.meta, !clusterScoped, nameFn, field.NewPath("metadata")))
		switch v := o.obj.(type) {
		case *appsv1.DaemonSet:
			p.daemonSet(where, v)
		case *corev1.Service:
			p.service(where, v)
		case *corev1.ConfigMap:
			for k := range v.Data {
				for _, msg := range validation.IsConfigMapKey(k) {
					p.add("%s: data[%s]: %s", where, k, msg)
				}
			}
		case *rbacv1.ClusterRole:
			p.rules(where, v.Rules)
		case *rbacv1.Role:
			p.rules(where, v.Rules)
		case *rbacv1.ClusterRoleBinding:
			p.binding(where, v.RoleRef, v.Subjects, true)
		case *rbacv1.RoleBinding:
			p.binding(where, v.RoleRef, v.Subjects, false)
		}
	}
	return p
}

type problems []string

func (p *problems) add(format string, a ...any) { *p = append(*p, fmt.Sprintf(format, a...)) }

func (p *problems) fields(where string, errs field.ErrorList) {
	for _, e := range errs {
		p.add("%s: %v", where, e)
	}
}

func (p *problems) daemonSet(where string, ds *appsv1.DaemonSet) {
	spec := ds.Spec
	if spec.Selector == nil {
		p.add("%s: spec.selector is required", where)
	} else {
		p.fields(where, metavalidation.ValidateLabelSelector(spec.Selector, metavalidation.LabelSelectorValidationOptions{}, field.NewPath("spec", "selector")))
		sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
		if err != nil || sel.Empty() {
			p.add("%s: spec.selector: empty or invalid (%v)", where, err)
		} else if !sel.Matches(labels.Set(spec.Template.Labels)) {
			p.add("%s: spec.template.metadata.labels: `selector` does not match template `labels`", where)
		}
	}
	p.fields(where, metavalidation.ValidateLabels(spec.Template.Labels, field.NewPath("spec", "template", "metadata", "labels")))
	p.fields(where, apivalidation.ValidateAnnotations(spec.Template.Annotations, field.NewPath("spec", "template", "metadata", "annotations")))
	if u := spec.UpdateStrategy.RollingUpdate; u != nil {
		if isZero(u.MaxUnavailable) && isZero(u.MaxSurge) {
			p.add("%s: spec.updateStrategy.rollingUpdate: maxUnavailable and maxSurge cannot both be 0", where)
		}
	}
	p.podSpec(where, &spec.Template.Spec)
}

func isZero(v *intstr.IntOrString) bool {
	return v == nil || (v.Type == intstr.Int && v.IntVal == 0) || (v.Type == intstr.String && v.StrVal == "0%")
}

func (p *problems) podSpec(where string, spec *corev1.PodSpec) {
	volumes := map[string]bool{}
	for i, v := range spec.Volumes {
		at := fmt.Sprintf("%s: spec.volumes[%d]", where, i)
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			p.add("%s.name %q: %s", at, v.Name, msg)
		}
		if volumes[v.Name] {
			p.add("%s.name %q: duplicate", at, v.Name)
		}
		volumes[v.Name] = true
		p.volumeSource(at, v.VolumeSource)
	}
	names := map[string]bool{}
	all := append(append([]corev1.Container(nil), spec.InitContainers...), spec.Containers...)
	if len(spec.Containers) == 0 {
		p.add("%s: spec.containers: at least one is required", where)
	}
	for _, c := range all {
		at := where + ": container " + c.Name
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			p.add("%s: name: %s", at, msg)
		}
		if names[c.Name] {
			p.add("%s: duplicate name", at)
		}
		names[c.Name] = true
		p.container(at, &c, volumes)
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		p.add("%s: terminationGracePeriodSeconds must be >= 0", where)
	}
	for i, tol := range spec.Tolerations {
		if tol.Operator == corev1.TolerationOpExists && tol.Value != "" {
			p.add("%s: tolerations[%d]: value must be empty when operator is Exists", where, i)
		}
		if tol.Key != "" {
			for _, msg := range validation.IsQualifiedName(tol.Key) {
				p.add("%s: tolerations[%d].key: %s", where, i, msg)
			}
		}
	}
	for k, v := range spec.NodeSelector {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			p.add("%s: nodeSelector %s=%s: %s", where, k, v, msg)
		}
	}
	if sc := spec.SecurityContext; sc != nil {
		for _, id := range []*int64{sc.RunAsUser, sc.RunAsGroup, sc.FSGroup} {
			if id != nil && (*id < 0 || *id > math.MaxInt32) {
				p.add("%s: securityContext: id %d out of range", where, *id)
			}
		}
	}
}

// downwardVolumeFields are the fieldRef paths a downwardAPI volume may project; env adds a few.
var (
	downwardVolumeFields = []string{"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"}
	downwardEnvFields    = []string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}
	subscriptedField     = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)
)

// fieldPathProblem says what is wrong with a downward API fieldPath ("" when nothing).
func fieldPathProblem(fp string, allowed []string) string {
	if m := subscriptedField.FindStringSubmatch(fp); m != nil {
		if msgs := validation.IsQualifiedName(m[2]); len(msgs) > 0 {
			return strings.Join(msgs, "; ")
		}
		return ""
	}
	for _, a := range allowed {
		if fp == a {
			return ""
		}
	}
	return "not a supported fieldPath"
}

func (p *problems) volumeSource(at string, src corev1.VolumeSource) {
	n := 0
	for _, set := range []bool{src.ConfigMap != nil, src.DownwardAPI != nil, src.EmptyDir != nil, src.Projected != nil,
		src.Secret != nil, src.HostPath != nil, src.PersistentVolumeClaim != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		p.add("%s: exactly one volume source, found %d", at, n)
	}
	downward := func(items []corev1.DownwardAPIVolumeFile) {
		for i, it := range items {
			if it.Path == "" || path.IsAbs(it.Path) || strings.Contains(it.Path, "..") {
				p.add("%s: items[%d].path %q: must be a relative path without '..'", at, i, it.Path)
			}
			if (it.FieldRef == nil) == (it.ResourceFieldRef == nil) {
				p.add("%s: items[%d]: exactly one of fieldRef and resourceFieldRef", at, i)
			} else if it.FieldRef != nil {
				if msg := fieldPathProblem(it.FieldRef.FieldPath, downwardVolumeFields); msg != "" {
					p.add("%s: items[%d].fieldRef.fieldPath %q: %s", at, i, it.FieldRef.FieldPath, msg)
				}
			}
		}
	}
	if src.DownwardAPI != nil {
		downward(src.DownwardAPI.Items)
	}
	if src.ConfigMap != nil && src.ConfigMap.Name == "" {
		p.add("%s: configMap.name is required", at)
	}
	if pr := src.Projected; pr != nil {
		for i, s := range pr.Sources {
			if t := s.ServiceAccountToken; t != nil {
				if t.Path == "" {
					p.add("%s: sources[%d].serviceAccountToken.path is required", at, i)
				}
				if e := t.ExpirationSeconds; e != nil && (*e < 600 || *e > 1<<32) {
					p.add("%s: sources[%d].serviceAccountToken.expirationSeconds %d: must be at least 10 minutes and at most 2^32 s", at, i, *e)
				}
			}
			if s.DownwardAPI != nil {
				downward(s.DownwardAPI.Items)
			}
			if s.ConfigMap != nil && s.ConfigMap.Name == "" {
				p.add("%s: sources[%d].configMap.name is required", at, i)
			}
		}
	}
}

func (p *problems) container(at string, c *corev1.Container, volumes map[string]bool) {
	if strings.TrimSpace(c.Image) == "" {
		p.add("%s: image is required", at)
	}
	ports := map[string]bool{}
	for _, port := range c.Ports {
		for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
			p.add("%s: containerPort %d: %s", at, port.ContainerPort, msg)
		}
		if port.Name != "" {
			for _, msg := range validation.IsValidPortName(port.Name) {
				p.add("%s: port name %q: %s", at, port.Name, msg)
			}
			if ports[port.Name] {
				p.add("%s: port name %q: duplicate", at, port.Name)
			}
			ports[port.Name] = true
		}
	}
	envs := map[string]bool{}
	for _, e := range c.Env {
		for _, msg := range validation.IsEnvVarName(e.Name) {
			p.add("%s: env %q: %s", at, e.Name, msg)
		}
		if envs[e.Name] {
			p.add("%s: env %q: duplicate", at, e.Name)
		}
		envs[e.Name] = true
		if f := e.ValueFrom; f != nil {
			if e.Value != "" {
				p.add("%s: env %q: value and valueFrom are exclusive", at, e.Name)
			}
			if f.FieldRef != nil {
				if msg := fieldPathProblem(f.FieldRef.FieldPath, downwardEnvFields); msg != "" {
					p.add("%s: env %q: fieldPath %q: %s", at, e.Name, f.FieldRef.FieldPath, msg)
				}
			}
			if r := f.ConfigMapKeyRef; r != nil && (r.Name == "" || len(validation.IsConfigMapKey(r.Key)) > 0) {
				p.add("%s: env %q: configMapKeyRef needs a name and a valid key", at, e.Name)
			}
		}
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			p.add("%s: volumeMount %q: no such volume", at, m.Name)
		}
		if !path.IsAbs(m.MountPath) || mounts[m.MountPath] {
			p.add("%s: volumeMount %q: mountPath %q must be absolute and unique", at, m.Name, m.MountPath)
		}
		mounts[m.MountPath] = true
	}
	for name, probe := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
		if probe == nil {
			continue
		}
		h := probe.ProbeHandler
		n := 0
		for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			p.add("%s: %s: exactly one handler", at, name)
		}
		if g := h.HTTPGet; g != nil {
			p.port(at+": "+name, g.Port, ports)
			if !strings.HasPrefix(g.Path, "/") {
				p.add("%s: %s: path %q must start with /", at, name, g.Path)
			}
		}
		if probe.PeriodSeconds < 0 || probe.TimeoutSeconds < 0 || probe.FailureThreshold < 0 {
			p.add("%s: %s: negative timing", at, name)
		}
	}
	for res, lim := range c.Resources.Limits {
		req, ok := c.Resources.Requests[res]
		if ok && req.Cmp(lim) > 0 {
			p.add("%s: resources: requests.%s %s is above its limit %s", at, res, req.String(), lim.String())
		}
		if extendedResource(res) {
			if ok && req.Cmp(lim) != 0 {
				p.add("%s: resources: %s: an extended resource's request must equal its limit", at, res)
			}
			if lim.MilliValue()%1000 != 0 {
				p.add("%s: resources: %s: must be a whole number", at, res)
			}
		}
	}
	for res, req := range c.Resources.Requests {
		if req.Sign() < 0 {
			p.add("%s: resources: requests.%s is negative", at, res)
		}
		if _, ok := c.Resources.Limits[res]; !ok && extendedResource(res) {
			p.add("%s: resources: %s: an extended resource needs a limit", at, res)
		}
	}
}

// extendedResource: a resource name with a domain that is not kubernetes.io's (nvidia.com/gpu).
func extendedResource(name corev1.ResourceName) bool {
	s := string(name)
	return strings.Contains(s, "/") && !strings.HasPrefix(s, "kubernetes.io/") && !strings.HasPrefix(s, "requests.")
}

// port checks a probe's or Service's target port: a number in range, or a name the container
// (or pod) declares.
func (p *problems) port(at string, port intstr.IntOrString, names map[string]bool) {
	if port.Type == intstr.Int {
		for _, msg := range validation.IsValidPortNum(int(port.IntVal)) {
			p.add("%s: port %d: %s", at, port.IntVal, msg)
		}
		return
	}
	for _, msg := range validation.IsValidPortName(port.StrVal) {
		p.add("%s: port %q: %s", at, port.StrVal, msg)
	}
	if names != nil && !names[port.StrVal] {
		p.add("%s: port %q: no container port has that name", at, port.StrVal)
	}
}

func (p *problems) service(where string, s *corev1.Service) {
	if len(s.Spec.Ports) == 0 {
		p.add("%s: spec.ports: at least one is required", where)
	}
	names := map[string]bool{}
	for i, port := range s.Spec.Ports {
		at := fmt.Sprintf("%s: spec.ports[%d]", where, i)
		if len(s.Spec.Ports) > 1 && port.Name == "" {
			p.add("%s.name: required when there are several ports", at)
		}
		if port.Name != "" {
			for _, msg := range validation.IsDNS1123Label(port.Name) {
				p.add("%s.name %q: %s", at, port.Name, msg)
			}
			if names[port.Name] {
				p.add("%s.name %q: duplicate", at, port.Name)
			}
			names[port.Name] = true
		}
		for _, msg := range validation.IsValidPortNum(int(port.Port)) {
			p.add("%s.port: %s", at, msg)
		}
		p.port(at+".targetPort", port.TargetPort, nil)
	}
	for k, v := range s.Spec.Selector {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			p.add("%s: spec.selector %s=%s: %s", where, k, v, msg)
		}
	}
}

func (p *problems) rules(where string, rules []rbacv1.PolicyRule) {
	if len(rules) == 0 {
		p.add("%s: rules: none", where)
	}
	for i, r := range rules {
		if len(r.Verbs) == 0 {
			p.add("%s: rules[%d].verbs: at least one verb is required", where, i)
		}
		if len(r.NonResourceURLs) == 0 && (len(r.APIGroups) == 0 || len(r.Resources) == 0) {
			p.add("%s: rules[%d]: resource rules need apiGroups and resources", where, i)
		}
	}
}

func (p *problems) binding(where string, ref rbacv1.RoleRef, subjects []rbacv1.Subject, cluster bool) {
	if ref.APIGroup != rbacv1.GroupName {
		p.add("%s: roleRef.apiGroup %q: must be %s", where, ref.APIGroup, rbacv1.GroupName)
	}
	if ref.Kind != "ClusterRole" && (cluster || ref.Kind != "Role") {
		p.add("%s: roleRef.kind %q: not allowed here", where, ref.Kind)
	}
	if ref.Name == "" {
		p.add("%s: roleRef.name is required", where)
	}
	for i, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && (s.APIGroup != "" || s.Name == "" || (cluster && s.Namespace == "")) {
			p.add("%s: subjects[%d]: a ServiceAccount needs a name, no apiGroup, and a namespace in a ClusterRoleBinding", where, i)
		}
	}
}
