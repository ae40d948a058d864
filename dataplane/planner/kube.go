package planner

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The kubernetes backend changes a pool's replica count through the API server with a JSON
// merge patch, then waits until the change is rolled out:
//
//   - a Deployment per pool (apps/v1): {"spec":{"replicas":N}}; done when the status's
//     observedGeneration reaches the patch's generation and readyReplicas (or, for a
//     scale-down, replicas) equals N;
//   - one DynamoGraphDeployment (nvidia.com/v1alpha1, plural dynamographdeployments) with a
//     service per pool: {"spec":{"services":{"<service>":{"replicas":N}}}}, as Dynamo's planner
//     patches it (components/planner/src/dynamo/planner/kube.py, update_graph_replicas); done
//     when its Ready condition is True again, as kube.py's is_deployment_ready reads it.
//
// Plain HTTP with the service account's token (or a kubeconfig's server, token and CA); no
// client-go. A removed pod gets SIGTERM and its terminationGracePeriodSeconds to drain.

// KubeOptions configure the kubernetes backend.
type KubeOptions struct {
	Server string // https://host:port
	Token  string // bearer token ("": none, e.g. a test server)
	CA     []byte // PEM; nil: the system's
	// CertPEM and KeyPEM are a client certificate (a kubeconfig's client-certificate-data).
	CertPEM, KeyPEM []byte
	Namespace       string
	// Kind is "deployment" or "dynamographdeployment".
	Kind string
	// Targets name per pool what is scaled: a Deployment, or the graph's service.
	Targets map[Pool]string
	Graph   string // the DynamoGraphDeployment's name
	// ReadyTimeout bounds the wait for a rollout; Poll is the wait between reads (1 s).
	ReadyTimeout, Poll time.Duration
	Client             *http.Client // nil: one from CA
	Log                *slog.Logger
}

// Kube is the kubernetes backend.
type Kube struct{ o KubeOptions }

// NewKube checks the options.
func NewKube(o KubeOptions) (*Kube, error) {
	u, err := url.Parse(o.Server)
	switch {
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return nil, fmt.Errorf("kubernetes API server %q: want https://host:port", o.Server)
	case !validKubeName(o.Namespace):
		return nil, fmt.Errorf("kubernetes namespace %q: not a name", o.Namespace)
	case o.Kind != "deployment" && o.Kind != "dynamographdeployment":
		return nil, fmt.Errorf("kubernetes kind %q: want deployment or dynamographdeployment", o.Kind)
	case o.Kind == "dynamographdeployment" && !validKubeName(o.Graph):
		return nil, fmt.Errorf("DynamoGraphDeployment name %q: not a name", o.Graph)
	case len(o.Targets) == 0:
		return nil, errors.New("kubernetes: no pool has a target")
	}
	for p, t := range o.Targets {
		if err := poolCheck(p); err != nil {
			return nil, err
		}
		// A graph's service names are the graph's keys (VllmDecodeWorker): any case.
		if !validKubeName(t) && (o.Kind == "deployment" || !validKubeName(strings.ToLower(strings.ReplaceAll(t, "_", "-")))) {
			return nil, fmt.Errorf("kubernetes target %q of pool %s: not a name", t, p)
		}
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 10 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CA != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(o.CA) {
				return nil, errors.New("kubernetes CA: no PEM certificate")
			}
			tr.TLSClientConfig.RootCAs = pool
		}
		if o.CertPEM != nil {
			cert, err := tls.X509KeyPair(o.CertPEM, o.KeyPEM)
			if err != nil {
				return nil, fmt.Errorf("kubernetes client certificate: %w", err)
			}
			tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
		}
		o.Client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	return &Kube{o: o}, nil
}

// validKubeName: a DNS-1123 name (lowercase alphanumerics and '-', '.'), at most 253.
func validKubeName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// In-cluster configuration, as client-go's rest.InClusterConfig reads it.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// InClusterServer returns the API server, token, CA and namespace of the pod's service account.
func InClusterServer() (server, token string, ca []byte, namespace string, err error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", "", nil, "", errors.New("not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset): give --kube-server or --kubeconfig")
	}
	tok, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return "", "", nil, "", err
	}
	ca, err = os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return "", "", nil, "", err
	}
	ns, _ := os.ReadFile(serviceAccountDir + "/namespace")
	if strings.Contains(host, ":") { // IPv6
		host = "[" + host + "]"
	}
	return "https://" + host + ":" + port, strings.TrimSpace(string(tok)), ca, strings.TrimSpace(string(ns)), nil
}

func (k *Kube) path() string {
	if k.o.Kind == "deployment" {
		return "/apis/apps/v1/namespaces/" + k.o.Namespace + "/deployments/"
	}
	return "/apis/nvidia.com/v1alpha1/namespaces/" + k.o.Namespace + "/dynamographdeployments/" + k.o.Graph
}

func (k *Kube) objectPath(p Pool) string {
	if k.o.Kind == "deployment" {
		return k.path() + k.o.Targets[p]
	}
	return k.path()
}

// maxKubeBody bounds what is read of one API response.
const maxKubeBody = 8 << 20

func (k *Kube) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(k.o.Server, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	if k.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+k.o.Token)
	}
	resp, err := k.o.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxKubeBody))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var st struct{ Message string }
		_ = json.Unmarshal(b, &st)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, st.Message)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}

// kubeObject holds the fields of a Deployment and a DynamoGraphDeployment the backend reads.
type kubeObject struct {
	Metadata struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int32 `json:"replicas"`
		Services map[string]*struct {
			Replicas *int32 `json:"replicas"`
		} `json:"services"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration"`
		Replicas           int32 `json:"replicas"`
		ReadyReplicas      int32 `json:"readyReplicas"`
		Conditions         []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// Replicas reads a pool's replica count (absent: 1, the API's default).
func (k *Kube) Replicas(ctx context.Context, p Pool) (int, error) {
	var obj kubeObject
	if err := k.do(ctx, http.MethodGet, k.objectPath(p), nil, &obj); err != nil {
		return 0, err
	}
	return k.replicasOf(&obj, p)
}

func (k *Kube) replicasOf(obj *kubeObject, p Pool) (int, error) {
	if k.o.Kind == "deployment" {
		if obj.Spec.Replicas == nil {
			return 1, nil
		}
		return int(*obj.Spec.Replicas), nil
	}
	svc := obj.Spec.Services[k.o.Targets[p]]
	if svc == nil {
		return 0, fmt.Errorf("DynamoGraphDeployment %s has no service %q", k.o.Graph, k.o.Targets[p])
	}
	if svc.Replicas == nil {
		return 1, nil
	}
	return int(*svc.Replicas), nil
}

// Add is Backend's.
// Manages says whether the pool has a target.
func (k *Kube) Manages(p Pool) bool { _, ok := k.o.Targets[p]; return ok }

func (k *Kube) Add(ctx context.Context, p Pool) error { return k.scale(ctx, p, +1) }

// Remove is Backend's.
func (k *Kube) Remove(ctx context.Context, p Pool) error { return k.scale(ctx, p, -1) }

func (k *Kube) scale(ctx context.Context, p Pool, delta int) error {
	if _, ok := k.o.Targets[p]; !ok {
		return fmt.Errorf("kubernetes: pool %s has no target", p)
	}
	n, err := k.Replicas(ctx, p)
	if err != nil {
		return err
	}
	want := n + delta
	if want < 0 {
		return fmt.Errorf("%s: %w", p, ErrNoWorker)
	}
	var patch any = map[string]any{"spec": map[string]any{"replicas": want}}
	if k.o.Kind == "dynamographdeployment" {
		patch = map[string]any{"spec": map[string]any{"services": map[string]any{k.o.Targets[p]: map[string]any{"replicas": want}}}}
	}
	var obj kubeObject
	if err := k.do(ctx, http.MethodPatch, k.objectPath(p), patch, &obj); err != nil {
		return err
	}
	k.o.Log.Info("planner: patched replicas", "kind", k.o.Kind, "target", k.o.Targets[p], "from", n, "to", want)
	gen := obj.Metadata.Generation
	ctx, cancel := context.WithTimeout(ctx, k.o.ReadyTimeout)
	defer cancel()
	// A graph's Ready condition is still the old one right after the patch: read it again
	// after a poll, as kube.py's wait_for_graph_deployment_ready does.
	for first := true; ; first = false {
		if (!first || k.o.Kind == "deployment") && k.done(&obj, gen, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: %s %s not rolled out to %d replicas within %v", k.o.Kind, k.o.Targets[p], want, k.o.ReadyTimeout)
		case <-time.After(k.o.Poll):
		}
		obj = kubeObject{}
		if err := k.do(ctx, http.MethodGet, k.objectPath(p), nil, &obj); err != nil {
			k.o.Log.Warn("planner: reading the rollout failed", "err", err)
		}
	}
}

func (k *Kube) done(obj *kubeObject, gen int64, want int) bool {
	if k.o.Kind == "deployment" {
		st := obj.Status
		return st.ObservedGeneration >= gen && int(st.Replicas) == want && int(st.ReadyReplicas) == want
	}
	for _, c := range obj.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// Kubeconfig is what the backend takes from a kubeconfig file: its current context's server,
// credentials and namespace.
type Kubeconfig struct {
	Server, Token, Namespace string
	CA, CertPEM, KeyPEM      []byte
}

// LoadKubeconfig reads path's current context (inline data or files for the CA and client
// certificate; a token or token file).
func LoadKubeconfig(path string) (*Kubeconfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	kc, err := ParseKubeconfig(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return kc, nil
}

// ParseKubeconfig reads a kubeconfig's current context; files it names (CA, client
// certificate and key, token) are read relative to dir.
func ParseKubeconfig(b []byte, dir string) (*Kubeconfig, error) {
	if len(b) > maxKubeBody {
		return nil, fmt.Errorf("larger than %d bytes", maxKubeBody)
	}
	var kc struct {
		CurrentContext string `json:"current-context"`
		Contexts       []struct {
			Name    string `json:"name"`
			Context struct {
				Cluster, User, Namespace string
			} `json:"context"`
		} `json:"contexts"`
		Clusters []struct {
			Name    string `json:"name"`
			Cluster struct {
				Server                   string `json:"server"`
				CertificateAuthority     string `json:"certificate-authority"`
				CertificateAuthorityData []byte `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			Name string `json:"name"`
			User struct {
				Token                 string `json:"token"`
				TokenFile             string `json:"tokenFile"`
				ClientCertificate     string `json:"client-certificate"`
				ClientCertificateData []byte `json:"client-certificate-data"`
				ClientKey             string `json:"client-key"`
				ClientKeyData         []byte `json:"client-key-data"`
			} `json:"user"`
		} `json:"users"`
	}
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, err
	}
	out := &Kubeconfig{}
	var cluster, user string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			cluster, user, out.Namespace, found = c.Context.Cluster, c.Context.User, c.Context.Namespace, true
		}
	}
	if !found {
		return nil, fmt.Errorf("no context %q", kc.CurrentContext)
	}
	var err error
	file := func(f string) ([]byte, error) {
		if dir == "" {
			return nil, fmt.Errorf("%s: no directory to read it from", f)
		}
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		return os.ReadFile(f)
	}
	found = false
	for _, c := range kc.Clusters {
		if c.Name == cluster {
			found = true
			out.Server, out.CA = c.Cluster.Server, c.Cluster.CertificateAuthorityData
			if out.CA == nil && c.Cluster.CertificateAuthority != "" {
				if out.CA, err = file(c.Cluster.CertificateAuthority); err != nil {
					return nil, err
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no cluster %q", cluster)
	}
	for _, u := range kc.Users {
		if u.Name != user {
			continue
		}
		out.Token, out.CertPEM, out.KeyPEM = u.User.Token, u.User.ClientCertificateData, u.User.ClientKeyData
		if out.Token == "" && u.User.TokenFile != "" {
			t, err := file(u.User.TokenFile)
			if err != nil {
				return nil, err
			}
			out.Token = strings.TrimSpace(string(t))
		}
		if out.CertPEM == nil && u.User.ClientCertificate != "" {
			if out.CertPEM, err = file(u.User.ClientCertificate); err != nil {
				return nil, err
			}
		}
		if out.KeyPEM == nil && u.User.ClientKey != "" {
			if out.KeyPEM, err = file(u.User.ClientKey); err != nil {
				return nil, err
			}
		}
	}
	if out.Namespace == "" {
		out.Namespace = "default"
	}
	return out, nil
}
