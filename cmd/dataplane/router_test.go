package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// startRouter runs `dataplane router` on loopback with a vLLM-style publisher there as its
// worker's event source (named name, or after its endpoint when name is "") and returns the
// publisher, the API's address and the command's stop once the router has subscribed.
func startRouter(t *testing.T, name string) (pub zmq4.Socket, addr string, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pub = zmq4.NewPub(ctx)
	require.NoError(t, pub.Listen("tcp://127.0.0.1:0"))
	t.Cleanup(func() { pub.Close() })
	ep := "tcp://" + pub.Addr().String()
	args := []string{"router", "--listen", "127.0.0.1:0", "--kv-events", ep, "--nats", "none"}
	if name != "" {
		args = append(args, "--workers", name+"="+ep)
	}
	m, stop := startCommand(t, args, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`))
	require.Eventually(t, func() bool { return len(pub.(interface{ Topics() []string }).Topics()) > 0 }, 10*time.Second, 10*time.Millisecond)
	return pub, m[0][1], stop
}

// `dataplane router` against a vLLM-style publisher on loopback: one BlockStored batch in, a
// routing answer out that sees the cached block.
func TestRouterCommand(t *testing.T) {
	pub, addr, stop := startRouter(t, "vllm-a")

	// [1, [["BlockStored", [7], nil, [0..15], 16, nil, "GPU"]]] in msgpack, tokens 0..15.
	payload := []byte{0x92, 0x01, 0x91, 0x97, 0xab}
	payload = append(payload, "BlockStored"...)
	payload = append(payload, 0x91, 0x07, 0xc0, 0xdc, 0x00, 0x10)
	for i := range 16 {
		payload = append(payload, byte(i))
	}
	payload = append(payload, 0x10, 0xc0, 0xa3, 'G', 'P', 'U')
	require.NoError(t, pub.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0), payload)))

	body := `{"token_ids": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,99,98]}`
	var d struct {
		Worker string `json:"worker"`
		Scores []struct {
			Worker  string `json:"worker"`
			Overlap int    `json:"overlap_blocks"`
		} `json:"scores"`
	}
	require.Eventually(t, func() bool {
		resp, err := http.Post("http://"+addr+"/v1/route", "application/json", strings.NewReader(body))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&d) == nil && len(d.Scores) == 1 && d.Scores[0].Overlap == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "vllm-a", d.Worker)
	stop()
}

func TestRouterCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"router", "--nats", "none"},
		{"router", "--kv-events", "tcp://127.0.0.1:1", "--workers", "nonsense"},
		{"router", "--nats-workers", "a"},
		{"router", "--nats", "localhost:4222"},
		{"router", "--lease", "10ms"},
		{"router", "--roles", "chef"},
		{"router", "--nats-tls-cert", "c.pem"},
		{"router", "--kv-max-bytes", "2GiB", "--nats-max-store", "1GiB"},
		{"router", "--kv-events", "tcp://127.0.0.1:1", "--kv-replay", "a,b"},
		{"router", "--kv-events", "tcp://127.0.0.1:1", "--log-level", "loud"},
	} {
		require.Equal(t, 2, run(context.Background(), args, io.Discard, io.Discard), "%q", args)
	}
	require.Equal(t, 1, run(context.Background(), []string{"router", "--kv-events", "tcp://127.0.0.1:1", "--block-size", "0", "--nats", "none"}, io.Discard, io.Discard))
}
