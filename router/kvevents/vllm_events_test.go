package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router"
)

// testdata/vllm_events.json (testdata/gen_vllm_events.py): batches shaped as vLLM publishes them
// for hybrid and MLA models and with skipped context, what each holds, and what a router that
// follows them must conclude.
type eventScenarios struct {
	BlockSize int `json:"block_size"`
	Scenarios []struct {
		Name    string `json:"name"`
		About   string `json:"about"`
		Layout  string `json:"layout"`
		Skip    int    `json:"skip_batches"` // batches the router never sees
		Batches []struct {
			Seq     uint64        `json:"seq"`
			Payload string        `json:"payload"`
			Events  []scenarioEvt `json:"events"`
		} `json:"batches"`
		Requests []struct {
			Tokens []uint32 `json:"tokens"`
			Lora   string   `json:"lora"`
			Salt   string   `json:"salt"`
			Media  []struct {
				ID     string `json:"id"`
				Offset int    `json:"offset"`
				Length int    `json:"length"`
			} `json:"media"`
			Overlap int `json:"overlap"`
		} `json:"requests"`
		Stats map[string]int64 `json:"stats"`
	} `json:"scenarios"`
}

type scenarioEvt struct {
	wantEvent
	Window        int         `json:"window"`
	Extra         []wantExtra `json:"extra"`
	Skipped       bool        `json:"skipped"`
	SkippedParent *decimal    `json:"skipped_parent"`
	SkippedTokens []uint32    `json:"skipped_tokens"`
	SkippedExtra  []wantExtra `json:"skipped_extra"`
}

type wantExtra struct {
	Media []string `json:"media"`
	Salt  string   `json:"salt"`
}

func loadScenarios(t testing.TB) eventScenarios {
	b, err := os.ReadFile("testdata/vllm_events.json")
	require.NoError(t, err)
	var s eventScenarios
	require.NoError(t, json.Unmarshal(b, &s))
	require.NotEmpty(t, s.Scenarios)
	return s
}

func checkExtras(t *testing.T, want []wantExtra, got []BlockExtra, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i, w := range want {
		var media []uint64
		for _, id := range w.Media {
			media = append(media, router.MediaHash(id))
		}
		require.Equal(t, media, got[i].Media, "%s block %d media", what, i)
		require.Equal(t, w.Salt, got[i].Salt, "%s block %d salt", what, i)
	}
}

// Every batch of the scenarios decodes to what python3-msgpack encoded: the group fields, the
// skipped context, the extra keys of stored and skipped blocks.
func TestDecodeBatchVLLMEvents(t *testing.T) {
	var b Batch // reused across batches on purpose
	for _, sc := range loadScenarios(t).Scenarios {
		for k, bt := range sc.Batches {
			payload, err := hex.DecodeString(bt.Payload)
			require.NoError(t, err)
			require.NoError(t, DecodeBatch(payload, &b), "%s batch %d", sc.Name, k)
			require.Equal(t, 0, b.DPRank, sc.Name)
			require.Len(t, b.Events, len(bt.Events), "%s batch %d", sc.Name, k)
			for i, w := range bt.Events {
				ev, what := &b.Events[i], sc.Name+" event "+w.Type
				require.Equal(t, w.Type, ev.Kind.String(), what)
				hashes := make([]uint64, len(w.Hashes))
				for j, h := range w.Hashes {
					hashes[j] = uint64(h)
				}
				require.Equal(t, hashes, append([]uint64{}, ev.Hashes...), what)
				require.Equal(t, w.Medium, ev.Medium, what)
				wantGroup := -1
				if w.Group != nil {
					wantGroup = *w.Group
				}
				require.Equal(t, wantGroup, ev.Group, what)
				if ev.Kind != BlockStored {
					continue
				}
				require.Equal(t, w.Parent != nil, ev.HasParent, what)
				if w.Parent != nil {
					require.Equal(t, uint64(*w.Parent), ev.Parent, what)
				}
				require.Equal(t, w.Tokens, ev.Tokens, what)
				require.Equal(t, w.BlockSize, ev.BlockSize, what)
				require.Equal(t, w.LoraName, ev.LoraName, what)
				require.Equal(t, w.Kind, ev.SpecKind, what)
				require.Equal(t, w.Window, ev.Window, what)
				checkExtras(t, w.Extra, ev.Extra, what+" extra_keys")
				require.Equal(t, w.Skipped, ev.HasSkipped, what)
				require.Equal(t, w.SkippedParent != nil, ev.HasSkippedParent, what)
				if w.SkippedParent != nil {
					require.Equal(t, uint64(*w.SkippedParent), ev.SkippedParent, what)
				}
				require.Equal(t, len(w.SkippedTokens), len(ev.SkippedTokens), what)
				if len(w.SkippedTokens) > 0 {
					require.Equal(t, w.SkippedTokens, ev.SkippedTokens, what)
				}
				checkExtras(t, w.SkippedExtra, ev.SkippedExtra, what+" skipped_extra_keys")
			}
		}
	}
}

// An engine fed each scenario's batches ends up with what the full-attention group holds: the
// overlap of each request (hashed as the router hashes requests) is the number of leading
// blocks that group caches, and the stats count what was ignored or dropped, by reason.
func TestEngineVLLMScenarios(t *testing.T) {
	scs := loadScenarios(t)
	h, err := router.NewHasher(scs.BlockSize)
	require.NoError(t, err)
	for _, sc := range scs.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			g := newEngineRig(t, 1, nil)
			for _, bt := range sc.Batches[sc.Skip:] {
				payload, err := hex.DecodeString(bt.Payload)
				require.NoError(t, err)
				g.eng.Live(bt.Seq, payload, nil)
			}
			require.Zero(t, g.stats.BadPayloads.Load())
			for i, r := range sc.Requests {
				var media []router.Media
				for _, m := range r.Media {
					media = append(media, router.Media{Hash: router.MediaHash(m.ID), Offset: m.Offset, Length: m.Length})
				}
				seqs, err := h.Sequence(nil, r.Tokens, router.SeedFor(r.Lora, r.Salt), media)
				require.NoError(t, err)
				require.Equal(t, r.Overlap, g.overlap(seqs, 0), "request %d", i)
			}
			for name, want := range sc.Stats {
				require.Equal(t, want, statByName(g.stats, name), name)
			}
		})
	}
}

// scenarioPayloads are every batch of the scenarios (fuzz seeds).
func scenarioPayloads(t testing.TB) [][]byte {
	var out [][]byte
	for _, sc := range loadScenarios(t).Scenarios {
		for _, bt := range sc.Batches {
			p, err := hex.DecodeString(bt.Payload)
			require.NoError(t, err)
			out = append(out, p)
		}
	}
	return out
}

// statByName reads a counter by its kv_events_total outcome.
func statByName(s *Stats, name string) int64 {
	for r := range numReasons {
		if reasonNames[r] == name {
			return s.counter(r).Load()
		}
	}
	if name == "skipped_context" {
		return s.SkippedContext.Load()
	}
	panic("no stat " + name)
}
