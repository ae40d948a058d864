package deploy

import (
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// plannerRequests are the API requests `dataplane plan --backend kubernetes` makes
// (dataplane/planner/kube.go; TestKubeDeployment and TestKubeGraphDeployment check them one
// by one): a GET and a merge PATCH of the object, polled with GETs.
var plannerRequests = []struct{ group, resource, verb string }{
	{"apps", "deployments", "get"},
	{"apps", "deployments", "patch"},
	{"nvidia.com", "dynamographdeployments", "get"},
	{"nvidia.com", "dynamographdeployments", "patch"},
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func TestPlannerRBAC(t *testing.T) {
	raw, err := os.ReadFile("planner/rbac.yaml")
	require.NoError(t, err)
	objs, err := decodeDocuments("planner/rbac.yaml", raw)
	require.NoError(t, err)
	require.Empty(t, apiRules(&bundle{objects: objs}))
	var sa *corev1.ServiceAccount
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *corev1.ServiceAccount:
			sa = v
		case *rbacv1.Role:
			role = v
		case *rbacv1.RoleBinding:
			binding = v
		}
	}
	require.NotNil(t, sa)
	require.NotNil(t, role)
	require.NotNil(t, binding)
	for _, r := range plannerRequests {
		require.True(t, allows(role.Rules, r.group, r.resource, r.verb), "%+v", r)
	}
	// Least privilege: nothing beyond those requests.
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					require.True(t, slices.ContainsFunc(plannerRequests, func(r struct{ group, resource, verb string }) bool {
						return r.group == g && r.resource == res && r.verb == v
					}), "the role grants %s %s/%s, which the planner never asks for", v, g, res)
				}
			}
		}
	}
	require.Equal(t, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name}, binding.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}, binding.Subjects)
	require.Equal(t, sa.Namespace, role.Namespace)
	require.Equal(t, sa.Namespace, binding.Namespace)
	require.False(t, allows(role.Rules, "apps", "deployments", "delete"), "the check can fail")
}
