//go:build long

package main

// Remote encoding as separate processes on loopback (`make test-long`): Debian's nats-server,
// a mock fleet announcing two engines, and two daemons routing to it. Daemon A gets a burst of
// pictures; those its own encoder would finish later than B's go to B over the transfer
// protocol (B's served-items metric counts them), come back intact (every answer is 200; the
// protocol checks each payload's XXH3), and the decisions name B. Then B is killed (-9): A
// fails over to its own encoder within the items' deadline, every answer still 200.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/native/fixtures"
)

func TestLongRemoteEncoding(t *testing.T) {
	natsBin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("no nats-server on PATH (make test-long installs Debian's)")
	}
	bin := dataplaneBin(t)
	natsPort := freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	ns := startProc(t, "nats-server", natsBin, "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", filepath.Join(t.TempDir(), "js"))
	ns.waitLog(t, `Server is ready`, 10*time.Second)
	ecDir := t.TempDir() // A's items reach the engines as vLLM's EC connector reads them
	mock := startProc(t, "mock", bin, "mock", "--engines", "2", "--kv-events", "nats", "--nats", natsURL,
		"--listen", "127.0.0.1:0", "--speedup", "20", "--stats-every", "0", "--ec-dir", ecDir, "--lease", "2s") // it makes the bucket: its lease is everyone's
	mock.waitLog(t, `msg=announcing`, 10*time.Second)

	daemon := func(name, ecDir string) (*proc, string) {
		p := startProc(t, name, bin, "serve", "--workers", "fleet", "--nats", natsURL, "--listen", "127.0.0.1:0",
			"--fleet-name", name, "--lease", "2s", "--memory-bytes", "2GiB", "--handoff", "ec", "--ec-dir", ecDir)
		addr := p.waitLog(t, `msg="dataplane starting".* listen=(127\.0\.0\.1:\d+)`, 20*time.Second)[1]
		waitReady(t, addr, 20*time.Second)
		return p, "http://" + addr
	}
	b, baseB := daemon("daemon-b", t.TempDir())
	a, baseA := daemon("daemon-a", ecDir)
	a.waitLog(t, `msg="remote encoder joined" name=daemon-b`, 10*time.Second)

	png, err := os.ReadFile(fixtures.Path(t, "image_200x150.png"))
	require.NoError(t, err)
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
	burst := func(n, from int) {
		t.Helper()
		var wg sync.WaitGroup
		codes := make([]int, n)
		outs := make([]map[string]any, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body, _ := json.Marshal(map[string]any{"model": "dataplane-demo", "max_tokens": 2, "cache_salt": fmt.Sprint("s", from+i),
					"messages": []any{map[string]any{"role": "user", "content": []any{
						map[string]any{"type": "text", "text": "What is in this picture?"},
						map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}}}}})
				codes[i], outs[i] = postJSON(t, baseA+"/v1/chat/completions", body)
			}()
		}
		wg.Wait()
		for i := range n {
			require.Equal(t, 200, codes[i], "%v", outs[i])
		}
	}
	burst(8, 0)
	served := metricValue(t, baseB+"/metrics", `dataplane_remote_served_items_total{outcome="encoded"}`)
	require.NotEqual(t, "0", served, "B encoded some of A's pictures")
	require.NotEmpty(t, served)
	sent := metricValue(t, baseA+"/metrics", `dataplane_remote_encode_items_total{outcome="sent"}`)
	require.Equal(t, served, sent, "every item A sent was encoded at B")
	missesA := metricValue(t, baseA+"/metrics", `dataplane_media_items_total{cache="miss",modality="image"}`)
	require.Equal(t, "8", missesA)
	t.Logf("8 pictures at A: %s encoded at B", served)

	// B dies; its announcement lives out its lease, so A still sends it items: each fails to
	// connect and is encoded at A instead, every answer still 200.
	time.Sleep(time.Second) // a heartbeat (every lease/3) brings A B's encoder cost as calibrated by the burst
	b.kill()
	burst(8, 100)
	sentAfter := metricValue(t, baseA+"/metrics", `dataplane_remote_encode_items_total{outcome="sent"}`)
	fellBack := metricValue(t, baseA+"/metrics", `dataplane_remote_encode_items_total{outcome="fell_back"}`)
	var last map[string]any
	getJSON(t, baseA+"/debug/route", &last)
	dec, _ := json.Marshal(last["decision"].(map[string]any)["encoders"])
	t.Logf("A's last decision's encoders: %s", dec)
	s0, _ := strconv.Atoi(sent)
	s1, _ := strconv.Atoi(sentAfter)
	require.Greater(t, s1, s0, "A sent B items after its kill, within B's lease")
	require.Equal(t, strconv.Itoa(s1-s0), fellBack, "each of them encoded at A instead")
	t.Logf("after B's kill: %d sent to B, %s encoded at A instead", s1-s0, fellBack)
	a.stop(t)
}
