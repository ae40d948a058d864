package mocker

import (
	"encoding/json"
	"fmt"
	"time"

	"dataplane/router/topology"
)

// Disaggregated prefill/decode as vLLM's engines do it with a KV connector (NixlConnector:
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py at 002a1057, and the proxy of
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py at 030ea52e): a prefill step is a
// request with kv_transfer_params {"do_remote_decode": true} and max_tokens 1; the prefill
// engine's answer carries kv_transfer_params {"do_remote_prefill": true, "remote_engine_id",
// "remote_block_ids", "remote_request_id", "remote_host", "remote_port", "tp_size"}
// (NixlConnectorScheduler.request_finished); the decode step is the same request with those
// params, which makes the decode engine read the prompt's KV cache from the prefill engine
// instead of computing it (get_num_new_matched_tokens; update_state_after_alloc needs
// remote_block_ids and the four remote_* keys, and without them computes the prompt itself).
// The mock engines answer both steps (http.go) and model the read as latency + bytes /
// bandwidth of the link between the two engines' domains (KVTransfer).

// KVTransferParams are vLLM's kv_transfer_params, as far as the mock engines use them.
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size,omitempty"`
	// RemoteTopology is the mock's own key: the prefill engine's labels, by which the decode
	// engine times the move (vLLM's engines ignore keys they do not use).
	RemoteTopology map[string]string `json:"remote_topology,omitempty"`
}

// MaxKVTransferParamsBytes bounds the params a request may carry (a prompt's block ids).
const MaxKVTransferParamsBytes = 4 << 20

// ParseKVTransferParams decodes kv_transfer_params (JSON null or absent: nil).
func ParseKVTransferParams(raw json.RawMessage) (*KVTransferParams, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) > MaxKVTransferParamsBytes {
		return nil, fmt.Errorf("kv_transfer_params: %d bytes, at most %d", len(raw), MaxKVTransferParamsBytes)
	}
	var p KVTransferParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("kv_transfer_params: %v", err)
	}
	if p.DoRemoteDecode && p.DoRemotePrefill {
		return nil, fmt.Errorf("kv_transfer_params: do_remote_decode and do_remote_prefill both set")
	}
	if len(p.RemoteTopology) > topology.MaxLevels {
		return nil, fmt.Errorf("kv_transfer_params: remote_topology has %d levels, at most %d", len(p.RemoteTopology), topology.MaxLevels)
	}
	return &p, nil
}

// Readable reports whether a decode step's params say where to read the KV cache from (what
// vLLM's decode side needs; without, it computes the prompt itself).
func (p *KVTransferParams) Readable() bool {
	return p != nil && p.DoRemotePrefill && len(p.RemoteBlockIDs) > 0 && p.RemoteEngineID != nil &&
		p.RemoteRequestID != nil && p.RemoteHost != nil && p.RemotePort != nil
}

// prefilled is the prefill engine's answer: the params of the decode step.
func prefilled(engine, requestID, host string, port, promptTokens, blockSize int, labels map[string]string) *KVTransferParams {
	ids := make([]int, blocksFor(promptTokens, blockSize))
	for i := range ids {
		ids[i] = i
	}
	return &KVTransferParams{DoRemotePrefill: true, RemoteBlockIDs: ids, RemoteEngineID: &engine, RemoteRequestID: &requestID,
		RemoteHost: &host, RemotePort: &port, TPSize: 1, RemoteTopology: labels}
}

// KVTransfer models the move of a prompt's KV cache from a prefill engine to a decode engine:
// the link between their domains (QoS.Between: latency + bytes / bandwidth), bytes = prompt
// tokens × BytesPerToken. The zero KVTransfer is instant.
type KVTransfer struct {
	QoS           topology.QoS
	BytesPerToken float64
}

// Time is how long tokens' KV takes from an engine labelled from to one labelled to.
func (k *KVTransfer) Time(from, to map[string]string, tokens int) time.Duration {
	if k.QoS.Empty() {
		return 0
	}
	link, _ := k.QoS.Between(from, to)
	return time.Duration(link.Seconds(float64(tokens)*k.BytesPerToken) * float64(time.Second))
}
