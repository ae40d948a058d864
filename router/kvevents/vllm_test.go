package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/internal/testrand"
)

type wantEvent struct {
	Type      string    `json:"type"`
	Hashes    []decimal `json:"hashes"`
	Parent    *decimal  `json:"parent"`
	Tokens    []uint32  `json:"tokens"`
	BlockSize int       `json:"block_size"`
	Medium    string    `json:"medium"`
	LoraName  string    `json:"lora_name"`
	Group     *int      `json:"group"`
	Kind      string    `json:"kind"`
}

type batchCase struct {
	Name    string `json:"name"`
	Payload string `json:"payload"`
	Want    struct {
		TS     float64     `json:"ts"`
		DPRank *int        `json:"dp_rank"`
		Events []wantEvent `json:"events"`
	} `json:"want"`
}

// batchCases are testdata/vllm_batches.json: payloads python3-msgpack wrote and what they hold
// (router/testdata/gen_vectors.py).
func batchCases(t testing.TB) []batchCase {
	b, err := os.ReadFile("testdata/vllm_batches.json")
	require.NoError(t, err)
	var cases []batchCase
	require.NoError(t, json.Unmarshal(b, &cases))
	return cases
}

// decimal is a uint64 the vectors write as a decimal string (JSON numbers end at 2^53).
type decimal uint64

func (d *decimal) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	*d = decimal(v)
	return err
}

// Payloads written by python3-msgpack in both of msgspec's layouts decode to what was encoded.
func TestDecodeBatchReferencePayloads(t *testing.T) {
	var b Batch // reused across cases on purpose
	for _, c := range batchCases(t) {
		payload, err := hex.DecodeString(c.Payload)
		require.NoError(t, err)
		require.NoError(t, DecodeBatch(payload, &b), c.Name)
		require.Equal(t, c.Want.TS, b.TS, c.Name)
		wantRank := -1
		if c.Want.DPRank != nil {
			wantRank = *c.Want.DPRank
		}
		require.Equal(t, wantRank, b.DPRank, c.Name)
		require.Len(t, b.Events, len(c.Want.Events), c.Name)
		for i, w := range c.Want.Events {
			ev := b.Events[i]
			require.Equal(t, w.Type, ev.Kind.String(), "%s event %d", c.Name, i)
			if ev.Kind == AllBlocksCleared {
				continue
			}
			require.Len(t, ev.Hashes, len(w.Hashes))
			for j := range w.Hashes {
				require.Equal(t, uint64(w.Hashes[j]), ev.Hashes[j], "%s event %d hash %d", c.Name, i, j)
			}
			require.Equal(t, w.Medium, ev.Medium)
			wantGroup := -1
			if w.Group != nil {
				wantGroup = *w.Group
			}
			require.Equal(t, wantGroup, ev.Group)
			if ev.Kind == BlockStored {
				require.Equal(t, w.Parent != nil, ev.HasParent)
				if w.Parent != nil {
					require.Equal(t, uint64(*w.Parent), ev.Parent)
				}
				require.Equal(t, w.Tokens, ev.Tokens)
				require.Equal(t, w.BlockSize, ev.BlockSize)
				require.Equal(t, w.LoraName, ev.LoraName)
				require.Equal(t, w.Kind, ev.SpecKind)
			}
		}
	}
}

func TestDecodeExtraKeys(t *testing.T) {
	// [ts, [["BlockStored", hashes, parent, tokens, bs, lora_id, medium, lora_name, extra_keys]]]
	hexDigest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	e := msgpackEncoder{}
	e.array(2).float(1).array(1)
	e.array(9).str("BlockStored").array(2).uint(1).uint(2).nil().array(0).uint(16).nil().str("GPU").str("my-lora")
	e.array(2)
	// block 0: lora name, a [uuid, offset] pair, a 64-hex digest, the salt
	e.array(4).str("my-lora").array(2).str("img-uuid").uint(3).str(hexDigest).str("tenant")
	// block 1: a prompt-embeds digest (bin)
	digest := []byte("0123456789abcdef0123456789abcdef")
	e.array(1).bin(digest)
	var b Batch
	require.NoError(t, DecodeBatch(e.b, &b))
	ev := b.Events[0]
	require.Equal(t, "my-lora", ev.LoraName)
	require.Len(t, ev.Extra, 2)
	require.Equal(t, "tenant", ev.Extra[0].Salt)
	require.Equal(t, []uint64{router.MediaHash("img-uuid"), 0x0123456789abcdef}, ev.Extra[0].Media)
	require.Equal(t, "", ev.Extra[1].Salt)
	require.Equal(t, []uint64{router.EmbedsDigestHash(digest)}, ev.Extra[1].Media, "what a prompt_embeds request hashes into the block")
}

// Decoding into a reused Batch allocates nothing for what a text-only engine publishes (stores
// and removes, both layouts, the reference payloads); strings that outlive the payload are
// copied: a LoRA name is one allocation, and extra keys (media, salt) a few per block.
func TestDecodeBatchAllocs(t *testing.T) {
	c := newConvo(testrand.New(t), 64)
	var b Batch
	f := func(name string, payload []byte, want float64) {
		t.Helper()
		require.NoError(t, DecodeBatch(payload, &b), name)
		require.Equal(t, want, testing.AllocsPerRun(100, func() { _ = DecodeBatch(payload, &b) }), name)
	}
	for _, asMap := range []bool{false, true} {
		f("stores and removes", batchOf(asMap, func(e *msgpackEncoder) {
			c.stored(e, 0, 32, asMap)
			c.stored(e, 32, 64, asMap)
			c.removed(e, 0, 64)
		}, 3), 0)
	}
	for _, bc := range batchCases(t) {
		if bc.Name != "array-full" { // its store names a LoRA and has extra keys
			payload, err := hex.DecodeString(bc.Payload)
			require.NoError(t, err)
			f(bc.Name, payload, 0)
		}
	}
	e := &msgpackEncoder{}
	e.array(2).float(1).array(1)
	e.array(8).str("BlockStored").array(1).uint(1).nil().array(16)
	for i := range 16 {
		e.uint(uint64(i))
	}
	e.uint(16).nil().str("GPU").str("my-lora")
	f("a LoRA name", e.b, 1)
}

func TestDecodeBatchErrors(t *testing.T) {
	f := func(name string, payload []byte) {
		t.Helper()
		var b Batch
		err := DecodeBatch(payload, &b)
		var de *DecodeError
		require.True(t, errors.As(err, &de), "%s: %v", name, err)
		require.NotEmpty(t, de.Error())
	}
	f("empty", nil)
	f("not a batch", []byte{0x01})
	f("short array", (&msgpackEncoder{}).array(1).float(1).b)
	f("huge array length", []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f("unknown event with a non-string tag", (&msgpackEncoder{}).array(2).float(1).array(1).array(1).uint(7).b)
	f("unknown event, truncated", (&msgpackEncoder{}).array(2).float(1).array(1).array(3).str("BlockMoved").array(2).uint(1).b)
	f("unknown map event, truncated", (&msgpackEncoder{}).array(2).float(1).array(1).map_(2).str("type").str("BlockMoved").str("x").b)
	f("map event with a non-string type", (&msgpackEncoder{}).array(2).float(1).array(1).map_(1).str("type").uint(1).b)
	f("map event without type", (&msgpackEncoder{}).array(2).float(1).array(1).map_(1).str("medium").str("GPU").b)
	f("negative token", (&msgpackEncoder{}).array(2).float(1).array(1).array(4).str("BlockStored").array(0).nil().array(1).int(-1).b)
	f("truncated", (&msgpackEncoder{}).array(2).float(1).array(1).array(2).str("BlockRemoved").array(2).uint(1).b)
	f("trailing bytes", append((&msgpackEncoder{}).array(2).float(1).array(0).b, 0xc0))
	f("ts not a number", (&msgpackEncoder{}).array(2).str("x").array(0).b)
}

// unknownEvent writes an event of a type vLLM may add one day, with fields that would not
// decode as any known event's (block_hashes as a string, token_ids as a map).
func unknownEvent(e *msgpackEncoder, asMap bool) {
	if asMap {
		// "type" after other fields: the decoder has to look ahead for it.
		e.map_(4).str("block_hashes").str("not a list").str("type").str("BlockMoved")
		e.str("token_ids").map_(1).str("k").array(2).nil().float(2).str("medium").uint(3)
	} else {
		e.array(4).str("BlockMoved").str("not a list").map_(1).str("k").array(2).nil().float(2).uint(3)
	}
}

// An event of an unknown type is skipped and counted; the events around it decode and, through
// an Engine, apply, in both the tagged-array and the map layout, in array and map batches.
func TestDecodeBatchSkipsUnknownEvents(t *testing.T) {
	r := testrand.New(t)
	for _, asMap := range []bool{false, true} {
		c := newConvo(r, 6)
		payload := batchOf(asMap, func(e *msgpackEncoder) {
			unknownEvent(e, asMap)
			c.stored(e, 0, 4, asMap)
			unknownEvent(e, asMap)
			unknownEvent(e, !asMap)
			c.removed(e, 3, 4)
			e.array(1).str("AllBlocksCleared")
			c.stored(e, 0, 2, asMap)
			unknownEvent(e, asMap)
		}, 8)
		var b Batch
		b.Unknown = 9 // reset by DecodeBatch
		require.NoError(t, DecodeBatch(payload, &b), "map=%v", asMap)
		require.Equal(t, 4, b.Unknown)
		kinds := []EventKind{}
		for _, ev := range b.Events {
			kinds = append(kinds, ev.Kind)
		}
		require.Equal(t, []EventKind{BlockStored, BlockRemoved, AllBlocksCleared, BlockStored}, kinds)
		require.Equal(t, c.engine[:4], b.Events[0].Hashes)
		require.Equal(t, c.tokens[:64], b.Events[0].Tokens)
		require.Equal(t, c.engine[3:4], b.Events[1].Hashes)
		require.Equal(t, c.engine[:2], b.Events[3].Hashes, "the slot an unknown event used is reused cleanly")

		// Through an engine: the known events apply, the unknown ones are counted.
		g := newEngineRig(t, 1, nil)
		g.eng.Live(0, batchOf(asMap, func(e *msgpackEncoder) {
			c.stored(e, 0, 4, asMap)
			unknownEvent(e, asMap)
			c.stored(e, 4, 6, asMap) // its parent (block 3) was stored by the event before last
			unknownEvent(e, !asMap)
			c.removed(e, 5, 6)
		}, 5), nil)
		require.Zero(t, g.stats.BadPayloads.Load())
		require.Equal(t, int64(2), g.stats.UnknownEvents.Load())
		require.Equal(t, int64(6), g.stats.BlocksStored.Load())
		require.Equal(t, int64(1), g.stats.BlocksRemoved.Load())
		require.Zero(t, g.stats.UnknownParent.Load())
		require.Equal(t, 5, g.overlap(c.ours, 0))
		require.Equal(t, int64(5), g.ix.Held(g.w, 0))
	}
}

// msgpackEncoder writes msgpack for tests; it is checked against python3-msgpack's bytes below.
type msgpackEncoder struct{ b []byte }

func (e *msgpackEncoder) hdr(small, base byte, n int, w16, w32 byte) *msgpackEncoder {
	switch {
	case n < int(small):
		e.b = append(e.b, base|byte(n))
	case n < 1<<16:
		e.b = append(e.b, w16, byte(n>>8), byte(n))
	default:
		e.b = append(e.b, w32, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return e
}
func (e *msgpackEncoder) array(n int) *msgpackEncoder { return e.hdr(16, 0x90, n, 0xdc, 0xdd) }
func (e *msgpackEncoder) map_(n int) *msgpackEncoder  { return e.hdr(16, 0x80, n, 0xde, 0xdf) }
func (e *msgpackEncoder) nil() *msgpackEncoder        { e.b = append(e.b, 0xc0); return e }
func (e *msgpackEncoder) str(s string) *msgpackEncoder {
	if len(s) < 32 {
		e.b = append(e.b, 0xa0|byte(len(s)))
	} else {
		e.b = append(e.b, 0xd9, byte(len(s)))
	}
	e.b = append(e.b, s...)
	return e
}
func (e *msgpackEncoder) bin(p []byte) *msgpackEncoder {
	e.b = append(e.b, 0xc4, byte(len(p)))
	e.b = append(e.b, p...)
	return e
}
func (e *msgpackEncoder) uint(v uint64) *msgpackEncoder {
	switch {
	case v < 128:
		e.b = append(e.b, byte(v))
	case v < 1<<16:
		e.b = append(e.b, 0xcd, byte(v>>8), byte(v))
	case v < 1<<32:
		e.b = append(e.b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		e.b = append(e.b, 0xcf)
		for s := 56; s >= 0; s -= 8 {
			e.b = append(e.b, byte(v>>uint(s)))
		}
	}
	return e
}
func (e *msgpackEncoder) int(v int64) *msgpackEncoder {
	if v >= 0 {
		return e.uint(uint64(v))
	}
	e.b = append(e.b, 0xd3)
	for s := 56; s >= 0; s -= 8 {
		e.b = append(e.b, byte(uint64(v)>>uint(s)))
	}
	return e
}
func (e *msgpackEncoder) float(f float64) *msgpackEncoder {
	e.b = append(e.b, 0xcb)
	bits := math.Float64bits(f)
	for s := 56; s >= 0; s -= 8 {
		e.b = append(e.b, byte(bits>>uint(s)))
	}
	return e
}

// The test encoder writes the same bytes as python3-msgpack for the reference map payload's
// structure, so test payloads built with it are real msgpack.
func TestTestEncoderMatchesReference(t *testing.T) {
	for _, c := range batchCases(t) {
		if c.Name != "array-v0.9" {
			continue
		}
		want, _ := hex.DecodeString(c.Payload)
		var b Batch
		require.NoError(t, DecodeBatch(want, &b))
		e := &msgpackEncoder{}
		e.array(2).float(b.TS).array(3)
		ev := b.Events[0]
		e.array(6).str("BlockStored").array(2).uint(ev.Hashes[0]).int(int64(ev.Hashes[1])).nil().array(len(ev.Tokens))
		for _, tok := range ev.Tokens {
			e.uint(uint64(tok))
		}
		e.uint(16).nil()
		e.array(2).str("BlockRemoved").array(1).uint(b.Events[1].Hashes[0])
		e.array(1).str("AllBlocksCleared")
		require.Equal(t, want, e.b)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, c := range batchCases(f) {
		p, _ := hex.DecodeString(c.Payload)
		f.Add(p)
	}
	for _, p := range scenarioPayloads(f) { // hybrid, MLA, skipped context
		f.Add(p)
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	r := rand.New(rand.NewPCG(1, 2))
	for _, asMap := range []bool{false, true} {
		c := newConvo(r, 2)
		f.Add(batchOf(asMap, func(e *msgpackEncoder) {
			c.stored(e, 0, 1, asMap)
			unknownEvent(e, asMap)
			unknownEvent(e, !asMap)
			c.removed(e, 0, 1)
		}, 4))
		f.Add(batchOf(asMap, func(e *msgpackEncoder) { unknownEvent(e, asMap) }, 1))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b Batch
		err := DecodeBatch(payload, &b)
		if err == nil {
			for _, ev := range b.Events {
				if ev.Kind < BlockStored || ev.Kind > AllBlocksCleared {
					t.Fatalf("event of kind %d in a decoded batch", ev.Kind)
				}
				if len(ev.SkippedTokens) > 0 && !ev.HasSkipped || ev.Group < -1 || ev.Window < 0 {
					t.Fatalf("event %+v", ev)
				}
			}
		}
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > len(payload) {
				t.Fatalf("error %v is not a DecodeError inside the payload", err)
			}
		}
	})
}
