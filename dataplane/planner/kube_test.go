package planner

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The kubernetes backend against a test API server that answers as the API server does for
// a Deployment (apps/v1) and a DynamoGraphDeployment (nvidia.com/v1alpha1) and records every
// request: the exact method, path, content type, token and patch body are checked. No real
// API server runs here (no kind, k3s or envtest binaries in the available registries).

type apiCall struct {
	Method, Path, ContentType, Auth string
	Body                            map[string]any
}

type fakeAPI struct {
	mu    sync.Mutex
	calls []apiCall
	// reply answers the n-th request to a path (counted from 0) with a JSON object.
	reply func(c apiCall, n int) (int, any)
	seen  map[string]int
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	c := apiCall{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Auth: r.Header.Get("Authorization")}
	if len(b) > 0 {
		_ = json.Unmarshal(b, &c.Body)
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	n := f.seen[r.Method+r.URL.Path]
	f.seen[r.Method+r.URL.Path]++
	f.mu.Unlock()
	code, out := f.reply(c, n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(out)
}

func kubeServer(t *testing.T, reply func(c apiCall, n int) (int, any)) (*fakeAPI, string) {
	f := &fakeAPI{reply: reply, seen: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func jsonObj(s string) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		panic(err)
	}
	return m
}

func TestKubeDeployment(t *testing.T) {
	const path = "/apis/apps/v1/namespaces/llm/deployments/decode-workers"
	f, url := kubeServer(t, func(c apiCall, n int) (int, any) {
		if c.Path != path {
			return 404, map[string]any{"kind": "Status", "message": "deployments.apps \"x\" not found"}
		}
		switch {
		case c.Method == "GET" && n == 0: // the count before the patch
			return 200, jsonObj(`{"metadata":{"generation":4},"spec":{"replicas":2},"status":{"observedGeneration":4,"replicas":2,"readyReplicas":2}}`)
		case c.Method == "PATCH":
			return 200, jsonObj(`{"metadata":{"generation":5},"spec":{"replicas":3},"status":{"observedGeneration":4,"replicas":2,"readyReplicas":2}}`)
		case n == 1: // rolled out, not ready
			return 200, jsonObj(`{"metadata":{"generation":5},"spec":{"replicas":3},"status":{"observedGeneration":5,"replicas":3,"readyReplicas":2}}`)
		default:
			return 200, jsonObj(`{"metadata":{"generation":5},"spec":{"replicas":3},"status":{"observedGeneration":5,"replicas":3,"readyReplicas":3}}`)
		}
	})
	k, err := NewKube(KubeOptions{Server: url, Token: "tok", Namespace: "llm", Kind: "deployment",
		Targets: map[Pool]string{PoolDecode: "decode-workers", PoolPrefill: "missing"}, Poll: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, k.Add(context.Background(), PoolDecode))
	require.Equal(t, []apiCall{
		{Method: "GET", Path: path, Auth: "Bearer tok"},
		{Method: "PATCH", Path: path, Auth: "Bearer tok", ContentType: "application/merge-patch+json", Body: jsonObj(`{"spec":{"replicas":3}}`)},
		{Method: "GET", Path: path, Auth: "Bearer tok"},
		{Method: "GET", Path: path, Auth: "Bearer tok"},
	}, f.calls)
	require.ErrorContains(t, k.Add(context.Background(), PoolPrefill), `404 Not Found: deployments.apps "x" not found`)
}

func TestKubeGraphDeployment(t *testing.T) {
	const path = "/apis/nvidia.com/v1alpha1/namespaces/dynamo/dynamographdeployments/vllm-disagg"
	f, url := kubeServer(t, func(c apiCall, n int) (int, any) {
		ready := `{"type":"Ready","status":"True"}`
		if c.Method == "PATCH" || n == 1 {
			ready = `{"type":"Ready","status":"False"}`
		}
		return 200, jsonObj(`{"metadata":{"generation":7},"spec":{"services":{"Frontend":{"replicas":1},"VllmPrefillWorker":{"replicas":2},"VllmDecodeWorker":{}}},
			"status":{"state":"successful","conditions":[` + ready + `]}}`)
	})
	k, err := NewKube(KubeOptions{Server: url, Namespace: "dynamo", Kind: "dynamographdeployment", Graph: "vllm-disagg",
		Targets: map[Pool]string{PoolPrefill: "VllmPrefillWorker", PoolDecode: "VllmDecodeWorker"}, Poll: time.Millisecond})
	require.NoError(t, err)
	n, err := k.Replicas(context.Background(), PoolDecode)
	require.NoError(t, err)
	require.Equal(t, 1, n, "a service without replicas has one")
	f.calls, f.seen = nil, map[string]int{}
	require.NoError(t, k.Remove(context.Background(), PoolPrefill))
	require.Equal(t, []apiCall{
		{Method: "GET", Path: path},
		{Method: "PATCH", Path: path, ContentType: "application/merge-patch+json",
			Body: jsonObj(`{"spec":{"services":{"VllmPrefillWorker":{"replicas":1}}}}`)},
		{Method: "GET", Path: path}, // Ready False: the operator is at work
		{Method: "GET", Path: path}, // Ready True
	}, f.calls)
}

func TestKubeRolloutTimeout(t *testing.T) {
	_, url := kubeServer(t, func(c apiCall, n int) (int, any) {
		return 200, jsonObj(`{"metadata":{"generation":1},"spec":{"replicas":1},"status":{"observedGeneration":1,"replicas":1,"readyReplicas":1}}`)
	})
	k, err := NewKube(KubeOptions{Server: url, Namespace: "llm", Kind: "deployment", Targets: map[Pool]string{PoolDecode: "d"},
		Poll: time.Millisecond, ReadyTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	require.ErrorContains(t, k.Add(context.Background(), PoolDecode), "not rolled out to 2 replicas")
}

func TestNewKubeRejects(t *testing.T) {
	good := KubeOptions{Server: "https://10.0.0.1:6443", Namespace: "llm", Kind: "deployment", Targets: map[Pool]string{PoolDecode: "d"}}
	_, err := NewKube(good)
	require.NoError(t, err)
	for want, f := range map[string]func(*KubeOptions){
		"want https://host:port":   func(o *KubeOptions) { o.Server = "10.0.0.1" },
		"namespace":                func(o *KubeOptions) { o.Namespace = "LLM" },
		"want deployment or":       func(o *KubeOptions) { o.Kind = "statefulset" },
		"DynamoGraphDeployment":    func(o *KubeOptions) { o.Kind = "dynamographdeployment" },
		"no pool has a target":     func(o *KubeOptions) { o.Targets = nil },
		`target "a/b"`:             func(o *KubeOptions) { o.Targets = map[Pool]string{PoolDecode: "a/b"} },
		"no PEM certificate":       func(o *KubeOptions) { o.CA = []byte("x") },
		"kubernetes client certif": func(o *KubeOptions) { o.CertPEM, o.KeyPEM = []byte("x"), []byte("y") },
	} {
		o := good
		f(&o)
		_, err := NewKube(o)
		require.ErrorContains(t, err, want)
	}
}

func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("secret\n"), 0o600))
	kc := `apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: other
  context: {cluster: c2, user: u2}
- name: dev
  context: {cluster: c1, user: u1, namespace: llm}
clusters:
- name: c1
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: LS0tLS1CRUdJTg==
users:
- name: u1
  user:
    tokenFile: token
`
	path := filepath.Join(dir, "config")
	require.NoError(t, os.WriteFile(path, []byte(kc), 0o600))
	got, err := LoadKubeconfig(path)
	require.NoError(t, err)
	require.Equal(t, &Kubeconfig{Server: "https://127.0.0.1:6443", Token: "secret", Namespace: "llm", CA: []byte("-----BEGIN")}, got)
	require.NoError(t, os.WriteFile(path, []byte("current-context: x\ncontexts: []\n"), 0o600))
	_, err = LoadKubeconfig(path)
	require.ErrorContains(t, err, `no context "x"`)
}

func FuzzParseKubeconfig(f *testing.F) {
	f.Add([]byte("current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: https://x}}]\nusers: [{name: u, user: {token: t}}]\n"))
	f.Add([]byte("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {certificate-authority: /etc/passwd}}]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kc, err := ParseKubeconfig(b, "") // no directory: files are never read
		if err == nil && kc.Namespace == "" {
			t.Fatal("a parsed kubeconfig has a namespace")
		}
	})
}
