package synth

import (
	"bytes"
	"dataplane/dataplane/sequence"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const conversation = "../../../shared/traces/mooncake_conversation_trace.jsonl"

func loadTree(t *testing.T, path string) ([]Record, *Tree) {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		t.Skipf("%s not here (it lives in ../shared/traces)", path)
	}
	require.NoError(t, err)
	defer f.Close()
	recs, err := ReadTrace(f, DefaultLimits())
	require.NoError(t, err)
	tree, err := BuildTree(recs, 512)
	require.NoError(t, err)
	require.NoError(t, tree.Check())
	return recs, tree
}

func within(t *testing.T, what string, want, got, rel float64) {
	t.Helper()
	require.InDelta(t, want, got, rel*want, "%s: source %.1f, synthesized %.1f (tolerance %.0f%%)", what, want, got, rel*100)
}

// On Mooncake's conversation trace, a synthesized trace of the same size reproduces the
// prefix-cache hit ratio within 0.04 (absolute) and the ISL and OSL means, medians and 90th
// percentiles within 6 %, for several seeds.
func TestSynthesizeReproducesConversationTrace(t *testing.T) {
	recs, tree := loadTree(t, conversation)
	srcHit := HitRatio(recs)
	srcISL, srcOSL := Lengths(recs)
	a, b := Summarize(srcISL), Summarize(srcOSL)
	require.InDelta(t, 0.366, srcHit, 0.001) // the trace's own number, computed independently in Python
	for range 3 {
		k := DefaultKnobs()
		k.Seed = rand.Uint64()
		out, err := Synthesize(tree, k)
		require.NoError(t, err)
		require.Len(t, out, len(recs))
		hit := HitRatio(out)
		isl, osl := Lengths(out)
		c, d := Summarize(isl), Summarize(osl)
		t.Logf("seed %d: hit %.3f (source %.3f); ISL mean/p50/p90 %.0f/%.0f/%.0f (%.0f/%.0f/%.0f); OSL %.0f/%.0f/%.0f (%.0f/%.0f/%.0f)",
			k.Seed, hit, srcHit, c.Mean, c.P50, c.P90, a.Mean, a.P50, a.P90, d.Mean, d.P50, d.P90, b.Mean, b.P50, b.P90)
		require.InDelta(t, srcHit, hit, 0.04, "hit ratio")
		within(t, "ISL mean", a.Mean, c.Mean, 0.06)
		within(t, "ISL p50", a.P50, c.P50, 0.06)
		within(t, "ISL p90", a.P90, c.P90, 0.06)
		within(t, "OSL mean", b.Mean, d.Mean, 0.06)
		within(t, "OSL p50", b.P50, d.P50, 0.06)
		within(t, "OSL p90", b.P90, d.P90, 0.06)
		for _, r := range out { // every record is valid
			require.NoError(t, r.check(DefaultLimits()))
		}
	}
}

// Each knob changes what it claims and nothing else: with the same seed, every request keeps
// everything but the scaled quantity.
func TestKnobs(t *testing.T) {
	_, tree := loadTree(t, conversation)
	base := DefaultKnobs()
	base.Seed, base.Requests = rand.Uint64(), 3000
	t.Logf("seed %d", base.Seed)
	b, bp, err := synthesize(tree, base)
	require.NoError(t, err)
	run := func(change func(k *Knobs)) ([]Record, []provenance) {
		k := base
		change(&k)
		out, p, err := synthesize(tree, k)
		require.NoError(t, err)
		require.Len(t, out, len(b))
		return out, p
	}
	// prefix_len_multiplier: shared prefixes twice as long; unique parts, outputs, times the same.
	out, p := run(func(k *Knobs) { k.PrefixLenMultiplier = 2 })
	for i := range b {
		require.Equal(t, 2*bp[i].prefixBlocks, p[i].prefixBlocks)
		require.Equal(t, bp[i].uniqueBlocks, p[i].uniqueBlocks)
		require.Equal(t, b[i].InputLength+512*bp[i].prefixBlocks, out[i].InputLength)
		require.Equal(t, b[i].OutputLength, out[i].OutputLength)
		require.Equal(t, b[i].Timestamp, out[i].Timestamp)
	}
	require.Greater(t, HitRatio(out), HitRatio(b))
	// prompt_len_multiplier: unique parts twice as long; prefixes the same.
	out, p = run(func(k *Knobs) { k.PromptLenMultiplier = 2 })
	for i := range b {
		require.Equal(t, bp[i].prefixBlocks, p[i].prefixBlocks)
		require.Equal(t, 2*bp[i].uniqueBlocks, p[i].uniqueBlocks)
		require.Equal(t, b[i].OutputLength, out[i].OutputLength)
		require.Equal(t, b[i].HashIDs[:bp[i].prefixBlocks], out[i].HashIDs[:p[i].prefixBlocks])
		require.Equal(t, b[i].Timestamp, out[i].Timestamp)
	}
	require.Less(t, HitRatio(out), HitRatio(b))
	// osl_multiplier: outputs doubled, prompts identical.
	out, _ = run(func(k *Knobs) { k.OSLMultiplier = 2 })
	for i := range b {
		require.Equal(t, 2*b[i].OutputLength, out[i].OutputLength)
		require.Equal(t, b[i].HashIDs, out[i].HashIDs)
		require.Equal(t, b[i].InputLength, out[i].InputLength)
		require.Equal(t, b[i].Timestamp, out[i].Timestamp)
	}
	// speedup_ratio: arrivals twice as dense, nothing else.
	out, _ = run(func(k *Knobs) { k.SpeedupRatio = 2 })
	for i := range b {
		require.InDelta(t, b[i].Timestamp/2, out[i].Timestamp, 1e-6)
		require.Equal(t, b[i].HashIDs, out[i].HashIDs)
		require.Equal(t, b[i].OutputLength, out[i].OutputLength)
	}
	// prefix_root_multiplier: the same prefix lengths over 4 disjoint copies of the tree: less
	// sharing, and no block shared across copies.
	out, p = run(func(k *Knobs) { k.PrefixRootMultiplier = 4 })
	owner := map[int64]int{}
	for i := range b {
		require.Equal(t, bp[i].prefixBlocks, p[i].prefixBlocks)
		require.Equal(t, b[i].InputLength, out[i].InputLength)
		require.Equal(t, b[i].OutputLength, out[i].OutputLength)
		require.Equal(t, b[i].Timestamp, out[i].Timestamp)
		for _, id := range out[i].HashIDs {
			if c, ok := owner[id]; ok {
				require.Equal(t, c, p[i].copy, "block %d shared across tree copies", id)
			}
			owner[id] = p[i].copy
		}
	}
	require.Less(t, HitRatio(out), HitRatio(b)*0.75)
	// Media: shares near what was asked, of the sizes asked, at the start of the new part;
	// against the same knobs without media, prefixes, outputs and arrival times untouched.
	media := func(k Knobs) ([]Record, []provenance) {
		out, p := run(func(kk *Knobs) { *kk = k })
		plain := k
		plain.ImageShare, plain.VideoShare, plain.AudioShare, plain.MediaReuse = 0, 0, 0, 0
		b, bp := run(func(kk *Knobs) { *kk = plain })
		for i, r := range out {
			require.Equal(t, bp[i].prefixBlocks, p[i].prefixBlocks)
			require.Equal(t, bp[i].uniqueBlocks, p[i].uniqueBlocks)
			require.Equal(t, b[i].HashIDs[:bp[i].prefixBlocks], r.HashIDs[:p[i].prefixBlocks])
			added := 0
			for _, m := range r.Media {
				require.GreaterOrEqual(t, m.Offset, 512*p[i].prefixBlocks)
				added += m.Tokens
				require.Equal(t, map[sequence.Modality]int{sequence.Image: k.ImageTokens, sequence.Video: k.VideoTokenCount(), sequence.Audio: k.AudioTokens}[m.Modality], m.Tokens)
			}
			want := b[i].InputLength
			if len(r.Media) > 0 { // filled to its last shared block's end first
				want = max(want, 512*p[i].prefixBlocks)
			}
			require.Equal(t, want+added, r.InputLength)
			require.Len(t, r.HashIDs, (r.InputLength+511)/512)
			require.Equal(t, b[i].OutputLength, r.OutputLength)
			require.Equal(t, b[i].Timestamp, r.Timestamp)
		}
		return out, p
	}
	share := func(out []Record, modality sequence.Modality) float64 {
		n := 0
		for _, r := range out {
			for _, m := range r.Media {
				if m.Modality == modality {
					n++
				}
			}
		}
		return float64(n) / float64(len(out))
	}
	k := base
	k.ImageShare, k.AudioShare = 0.3, 0.1
	mixed, _ := media(k)
	require.InDelta(t, 0.3, share(mixed, sequence.Image), 0.04)
	require.InDelta(t, 0.1, share(mixed, sequence.Audio), 0.03)
	require.Zero(t, share(mixed, sequence.Video))
	k = base
	k.VideoShare = 0.2
	video, _ := media(k)
	require.InDelta(t, 0.2, share(video, sequence.Video), 0.03)
	require.Zero(t, share(video, sequence.Image)+share(video, sequence.Audio))
	// Sizes: the same requests get the same items, only their token counts change.
	k = base
	k.ImageShare, k.VideoShare, k.AudioShare = 0.3, 0.2, 0.1
	sized, _ := media(k)
	k.ImageTokens, k.VideoTokens, k.AudioTokens = 1000, 100, 2000
	resized, _ := media(k)
	for i := range sized {
		require.Len(t, resized[i].Media, len(sized[i].Media))
		for j, m := range sized[i].Media {
			require.Equal(t, m.Modality, resized[i].Media[j].Modality)
		}
	}
	// media_reuse 0: every item is new. Above 0, items repeat, only within their conversation
	// (requests ending in the same core segment of the same tree copy) and modality; at 1 each
	// conversation uses one item per modality. Nothing but the ids changes.
	type scope struct {
		copy, conversation int
		modality           sequence.Modality
	}
	reuse := func(r float64) (items, repeats int, scopes map[scope]bool) {
		k := base
		k.ImageShare, k.VideoShare, k.AudioShare, k.PrefixRootMultiplier, k.MediaReuse = 0.3, 0.2, 0.1, 2, r
		out, p := media(k)
		k.MediaReuse = 0
		fresh, _ := media(k)
		where := map[string]scope{}
		scopes = map[scope]bool{}
		for i, rec := range out {
			require.Len(t, rec.Media, len(fresh[i].Media))
			for j, m := range rec.Media {
				f := fresh[i].Media[j]
				f.ID = m.ID
				require.Equal(t, f, m, "request %d media %d: only the id changes", i, j)
				items++
				sc := scope{p[i].copy, int(p[i].conversation), m.Modality}
				scopes[sc] = true
				if w, ok := where[m.ID]; ok {
					repeats++
					require.Equal(t, w, sc, "media %s repeated outside its conversation", m.ID)
				}
				where[m.ID] = sc
			}
			require.Equal(t, fresh[i].HashIDs, rec.HashIDs)
		}
		return items, repeats, scopes
	}
	_, none, _ := reuse(0)
	require.Zero(t, none, "media_reuse 0 repeats nothing")
	_, some, _ := reuse(0.5)
	require.Positive(t, some)
	items, all, scopes := reuse(1)
	require.Greater(t, all, some)
	require.Equal(t, items-len(scopes), all, "media_reuse 1: one item per conversation and modality")
}

// A trace round-trips through WriteTrace and ReadTrace; prompts made from it share exactly the
// tokens their hash ids share.
func TestTraceRoundTripAndTokens(t *testing.T) {
	_, tree := loadTree(t, conversation)
	k := DefaultKnobs()
	k.Seed, k.Requests, k.ImageShare = 7, 200, 0.5
	out, err := Synthesize(tree, k)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteTrace(&buf, out))
	back, err := ReadTrace(&buf, DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, out, back)

	a, _ := PromptTokens(&out[0], 512, 32000)
	require.Len(t, a, out[0].InputLength)
	for _, r := range out[1:] {
		toks, spans := PromptTokens(&r, 512, 32000)
		require.Len(t, toks, r.InputLength)
		require.Len(t, spans, len(r.Media))
		same := 0
		for same < len(r.HashIDs) && same < len(out[0].HashIDs) && r.HashIDs[same] == out[0].HashIDs[same] {
			same++
		}
		n := min(same*512, len(a), len(toks))
		require.Equal(t, a[:n], toks[:n])
	}
}

// Traces that break the rules are errors naming the line.
func TestReadTraceErrors(t *testing.T) {
	f := func(text, want string) {
		t.Helper()
		_, err := ReadTrace(strings.NewReader(text), DefaultLimits())
		var te *ErrTrace
		require.ErrorAs(t, err, &te)
		require.Contains(t, err.Error(), want)
	}
	ok := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n"
	f(ok+`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}`, "line 2: 1 hash_ids for 600 tokens")
	f(ok+`{"timestamp": -1, "input_length": 1, "hash_ids": [1]}`, "timestamp -1")
	f(`{"timestamp": 5, "input_length": 1, "hash_ids": [1]}`+"\n"+`{"timestamp": 4, "input_length": 1, "hash_ids": [1]}`, "before the previous")
	f(`{"timestamp": 0, "input_length": 0, "hash_ids": []}`, "input_length 0")
	f(`{"timestamp": 0, "input_length": 10, "hash_ids": [1], "media": [{"modality": "image", "id": "x", "offset": 5, "tokens": 6}]}`, "media[0]: tokens [5, 5+6)")
	f(`{"timestamp": 0, "input_length": 10, "hash_ids": [1], "media": [{"modality": "smell", "id": "x", "offset": 0, "tokens": 1}]}`, `unknown modality "smell"`)
	f(`{"timestamp": 0,`, "line 1")
	// Hash ids that are not a prefix tree.
	recs, err := ReadTrace(strings.NewReader(ok+`{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [3, 2]}`), DefaultLimits())
	require.NoError(t, err)
	_, err = BuildTree(recs, 512)
	var nt *ErrNotATree
	require.ErrorAs(t, err, &nt)
	require.Equal(t, int64(2), nt.ID)
}

// Knob values out of range are errors naming the knob.
func TestKnobErrors(t *testing.T) {
	tree := &Tree{BlockSize: 512, Nodes: []Node{{Count: 1, End: 1, Ends: []int32{0}}}, UniqueBlocks: []int{1}, LastTokens: []int{3}, OutputLength: []int{2}}
	for name, change := range map[string]func(*Knobs){
		"speedup_ratio":          func(k *Knobs) { k.SpeedupRatio = 0 },
		"prefix_root_multiplier": func(k *Knobs) { k.PrefixRootMultiplier = 0 },
		"image_share":            func(k *Knobs) { k.ImageShare = 1.5 },
		"osl_multiplier":         func(k *Knobs) { k.OSLMultiplier = math.NaN() },
	} {
		k := DefaultKnobs()
		change(&k)
		_, err := Synthesize(tree, k)
		var ke *ErrKnob
		require.ErrorAs(t, err, &ke, name)
		require.Equal(t, name, ke.Knob)
	}
	out, err := Synthesize(tree, DefaultKnobs())
	require.NoError(t, err)
	require.Equal(t, 3, out[0].InputLength)
}

// The trace reader never panics; what it accepts is valid.
func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 10, "hash_ids": [1], "media": [{"modality": "image", "id": "x", "offset": 0, "tokens": 6}]}` + "\n\n"))
	f.Add([]byte("{}\n{\"timestamp\": 1e308}"))
	f.Add([]byte(`{"timestamp": 0, "input_length": 10, "hash_ids": [1], "media": [{"modality": "video", "id": "v", "offset": 2, "tokens": 8, "frames": 30, "fps": 2.5}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadTrace(bytes.NewReader(data), DefaultLimits())
		if err != nil {
			return
		}
		for _, r := range recs {
			if err := r.check(DefaultLimits()); err != nil {
				t.Fatal(err)
			}
		}
		if tree, err := BuildTree(recs, 512); err == nil {
			if err := tree.Check(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// The core tree of a small trace built by hand (4-token blocks): the unary chain 1→2 that
// every sharing request walks becomes one segment; the chain 4→5 does not, as a request stops
// at 4; blocks only one request used are stripped, their counts kept per request; a request
// sharing nothing ends at the root.
func TestBuildTreeByHand(t *testing.T) {
	rec := func(ts float64, in int, ids ...int64) Record {
		return Record{Timestamp: ts, InputLength: in, OutputLength: int(ts) + 1, HashIDs: ids}
	}
	recs := []Record{
		rec(0, 14, 1, 2, 3, 10), // shared 1 2 3, unique 10
		rec(2, 13, 1, 2, 3, 11),
		rec(5, 17, 1, 2, 4, 5, 12), // shared 1 2 4 5, unique 12
		rec(9, 16, 1, 2, 4, 5),     // nothing unique
		rec(10, 9, 1, 2, 4),
		rec(14, 6, 20, 21), // nothing shared
	}
	tree, err := BuildTree(recs, 4)
	require.NoError(t, err)
	require.NoError(t, tree.Check())
	// root → {1 2} → {3}, {4} → {5}
	require.Equal(t, []Node{
		{Count: 6, End: 1, Children: []int32{1}, Ends: []int32{5}},
		{Blocks: 2, Count: 5, Children: []int32{2, 3}},
		{Blocks: 1, Count: 2, End: 2, Ends: []int32{0, 1}},
		{Blocks: 1, Count: 3, End: 1, Children: []int32{4}, Ends: []int32{4}},
		{Blocks: 1, Count: 2, End: 2, Ends: []int32{2, 3}},
	}, tree.Nodes)
	require.Equal(t, 5, tree.SharedBlocks())
	require.Equal(t, []int{1, 1, 1, 0, 0, 2}, tree.UniqueBlocks)
	require.Equal(t, []int{2, 1, 1, 4, 1, 2}, tree.LastTokens)
	require.Equal(t, []int{1, 3, 6, 10, 11, 15}, tree.OutputLength)
	require.Equal(t, []float64{2, 3, 4, 1, 4}, tree.Gaps)

	// A block following two different blocks, or repeating in a request, is not a tree.
	for _, c := range []struct {
		recs []Record
		want ErrNotATree
	}{
		{[]Record{rec(0, 8, 1, 2), rec(1, 8, 3, 2)}, ErrNotATree{Request: 1, ID: 2, Parents: [2]int64{1, 3}}},
		{[]Record{rec(0, 4, 7), rec(1, 8, 1, 7)}, ErrNotATree{Request: 1, ID: 7, Parents: [2]int64{-1, 1}}},
		{[]Record{rec(0, 12, 1, 2, 1)}, ErrNotATree{Request: 0, ID: 1, Parents: [2]int64{-1, 2}}},
	} {
		_, err := BuildTree(c.recs, 4)
		var nt *ErrNotATree
		require.ErrorAs(t, err, &nt)
		require.Equal(t, c.want, *nt)
	}
}
