package sequence

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// A generated prompt: the merged layout is drawn first (the truth), then written out as token
// sequences in both placeholder styles.
type promptCase struct {
	ph       Placeholders
	items    []MediaItem
	single   []int32 // one placeholder per item
	expanded []int32 // a run of Tokens placeholders per item
	want     PositionMap
	posExp   []int // each item's position in expanded
}

const textVocab = 1000 // text ids are below; placeholders are 1000+

func genPrompt(r *rand.Rand) *promptCase {
	c := &promptCase{ph: Placeholders{Image: NoPlaceholder, Video: NoPlaceholder, Audio: NoPlaceholder}}
	// A random subset of modalities has placeholder tokens, with random distinct ids.
	ids := r.Perm(10)
	var mods []Modality
	for i, m := range []Modality{Image, Video, Audio} {
		if r.IntN(4) > 0 {
			id := int32(textVocab + ids[i])
			switch m {
			case Image:
				c.ph.Image = id
			case Video:
				c.ph.Video = id
			case Audio:
				c.ph.Audio = id
			}
			mods = append(mods, m)
		}
	}
	text := func() {
		for range r.IntN(4) * r.IntN(3) { // often none: adjacent items, items at the ends
			id := int32(r.IntN(textVocab))
			c.single = append(c.single, id)
			c.expanded = append(c.expanded, id)
			c.want.TextIDs = append(c.want.TextIDs, id)
			c.want.Len++
		}
	}
	text()
	if len(mods) > 0 {
		for k := range r.IntN(7) {
			m := mods[r.IntN(len(mods))]
			it := MediaItem{ID: fmt.Sprintf("m%d", k), Modality: m, Tokens: 1 + r.IntN(12)}
			c.items = append(c.items, it)
			c.want.Spans = append(c.want.Spans, MediaSpan{Item: k, MediaID: it.ID, Modality: m, Pos: len(c.single),
				Start: c.want.Len, End: c.want.Len + it.Tokens})
			c.posExp = append(c.posExp, len(c.expanded))
			c.single = append(c.single, c.ph.ID(m))
			for range it.Tokens {
				c.expanded = append(c.expanded, c.ph.ID(m))
			}
			c.want.Len += it.Tokens
			text()
		}
	}
	return c
}

// wantFor is the expected map for a style (only the placeholder positions differ).
func (c *promptCase) wantFor(style PlaceholderStyle) *PositionMap {
	w := c.want
	w.Spans = slices.Clone(c.want.Spans)
	if style == PlaceholderExpanded {
		for i := range w.Spans {
			w.Spans[i].Pos = c.posExp[i]
		}
	}
	if w.Spans == nil {
		w.Spans = []MediaSpan{}
	}
	if w.TextIDs == nil {
		w.TextIDs = []int32{}
	}
	return &w
}

func (c *promptCase) tokens(style PlaceholderStyle) []int32 {
	if style == PlaceholderExpanded {
		return c.expanded
	}
	return c.single
}

var styles = []PlaceholderStyle{PlaceholderSingle, PlaceholderExpanded}

func TestPositionMapRandomPrompts(t *testing.T) {
	r := newRand(t)
	for i := range 5000 {
		c := genPrompt(r)
		for _, style := range styles {
			got, err := BuildPositionMap(c.tokens(style), c.ph, style, c.items)
			require.NoError(t, err, "case %d, %v", i, style)
			require.Equal(t, c.wantFor(style), got, "case %d, %v: tokens %v items %v", i, style, c.tokens(style), c.items)
		}
	}
}

// Random damage to a valid prompt always gives an error of a kind the damage can cause,
// naming a position and an item inside the prompt.
func TestPositionMapRandomMismatches(t *testing.T) {
	r := newRand(t)
	type damage struct {
		name  string
		style PlaceholderStyle
		apply func(c *promptCase, tokens []int32) ([]int32, bool)
		kinds []error
	}
	placeholderAt := func(tokens []int32, c *promptCase) []int {
		var at []int
		for i, tok := range tokens {
			if c.ph.ModalityOf(tok) != 0 {
				at = append(at, i)
			}
		}
		return at
	}
	damages := []damage{
		{"drop a placeholder", PlaceholderSingle, func(c *promptCase, tokens []int32) ([]int32, bool) {
			at := placeholderAt(tokens, c)
			if len(at) == 0 {
				return nil, false
			}
			i := at[r.IntN(len(at))]
			return slices.Delete(tokens, i, i+1), true
		}, []error{ErrMissingPlaceholder, ErrModalityMismatch}},
		{"add a placeholder", PlaceholderSingle, func(c *promptCase, tokens []int32) ([]int32, bool) {
			if len(c.items) == 0 {
				return nil, false
			}
			return slices.Insert(tokens, r.IntN(len(tokens)+1), c.ph.ID(c.items[r.IntN(len(c.items))].Modality)), true
		}, []error{ErrExtraPlaceholder, ErrModalityMismatch}},
		{"shorten a run", PlaceholderExpanded, func(c *promptCase, tokens []int32) ([]int32, bool) {
			if len(c.items) == 0 {
				return nil, false
			}
			k := r.IntN(len(c.items))
			return slices.Delete(tokens, c.posExp[k], c.posExp[k]+1), true
		}, []error{ErrRunLength, ErrModalityMismatch, ErrMissingPlaceholder}},
		{"lengthen a run", PlaceholderExpanded, func(c *promptCase, tokens []int32) ([]int32, bool) {
			if len(c.items) == 0 {
				return nil, false
			}
			k := r.IntN(len(c.items))
			return slices.Insert(tokens, c.posExp[k], tokens[c.posExp[k]]), true
		}, []error{ErrRunLength, ErrModalityMismatch, ErrExtraPlaceholder}},
	}
	for _, d := range damages {
		tried := 0
		for range 3000 {
			c := genPrompt(r)
			tokens, ok := d.apply(c, slices.Clone(c.tokens(d.style)))
			if !ok {
				continue
			}
			tried++
			_, err := BuildPositionMap(tokens, c.ph, d.style, c.items)
			var pe *PositionError
			require.True(t, errors.As(err, &pe), "%s: tokens %v items %v: got %v", d.name, tokens, c.items, err)
			require.True(t, slices.ContainsFunc(d.kinds, func(k error) bool { return errors.Is(err, k) }), "%s: %v", d.name, err)
			require.True(t, pe.Pos >= -1 && pe.Pos < len(tokens) && pe.Item >= -1 && pe.Item < len(c.items), "%s: %+v", d.name, pe)
			require.True(t, pe.Pos >= 0 || pe.Item >= 0, "%s: names neither position nor item: %v", d.name, err)
		}
		require.Greater(t, tried, 1000, d.name)
	}
}

func TestPositionMapErrors(t *testing.T) {
	ph := Placeholders{Image: 90, Video: 91, Audio: NoPlaceholder}
	img := func(n int) MediaItem { return MediaItem{ID: "img", Modality: Image, Tokens: n} }
	vid := func(n int) MediaItem { return MediaItem{ID: "vid", Modality: Video, Tokens: n} }
	f := func(style PlaceholderStyle, tokens []int32, items []MediaItem, kind error, pos, item int, msg string) {
		t.Helper()
		_, err := BuildPositionMap(tokens, ph, style, items)
		require.ErrorIs(t, err, kind)
		var pe *PositionError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, pos, pe.Pos, "position")
		require.Equal(t, item, pe.Item, "item")
		require.EqualError(t, err, msg)
	}
	f(PlaceholderSingle, []int32{1, 90, 2, 90}, []MediaItem{img(4)}, ErrExtraPlaceholder, 3, -1,
		"placeholder without a media item at token 3: image placeholder, but the request has 1 media items")
	f(PlaceholderSingle, []int32{1, 90, 2}, []MediaItem{img(4), vid(8)}, ErrMissingPlaceholder, -1, 1,
		`media item without a placeholder (media item 1): 1 placeholders for 2 media items; video item "vid" has none`)
	f(PlaceholderSingle, []int32{1, 91, 2}, []MediaItem{img(4)}, ErrModalityMismatch, 1, 0,
		"placeholder modality differs from its media item's at token 1 (media item 0): video placeholder, item is image")
	f(PlaceholderSingle, []int32{1, 90}, []MediaItem{{ID: "a", Modality: Audio, Tokens: 3}}, ErrUnknownModality, -1, 0,
		"media item of a modality the model has no placeholder for (media item 0): audio has no placeholder token")
	f(PlaceholderSingle, []int32{1, 90}, []MediaItem{{ID: "x", Modality: 9, Tokens: 3}}, ErrUnknownModality, -1, 0,
		"media item of a modality the model has no placeholder for (media item 0): modality(9) has no placeholder token")
	f(PlaceholderSingle, []int32{90}, []MediaItem{img(0)}, ErrTokenCount, -1, 0,
		"media item token count out of range (media item 0): 0 tokens, want 1..16777216")
	f(PlaceholderExpanded, []int32{5, 90, 90, 90, 6}, []MediaItem{img(4)}, ErrRunLength, 1, 0,
		"placeholder run length differs from its media item's token count at token 1 (media item 0): 3 image placeholders, item has 4 tokens")
	f(PlaceholderExpanded, []int32{5, 90, 90, 90, 90, 90, 6}, []MediaItem{img(4)}, ErrRunLength, 1, 0,
		"placeholder run length differs from its media item's token count at token 1 (media item 0): 5 image placeholders, item has 4 tokens")
	f(PlaceholderExpanded, []int32{90, 90, 90, 91}, []MediaItem{img(2), img(2)}, ErrRunLength, 2, 1,
		"placeholder run length differs from its media item's token count at token 2 (media item 1): 1 image placeholders, item has 2 tokens")
	f(PlaceholderExpanded, []int32{90, 90, 1, 90}, []MediaItem{img(2)}, ErrExtraPlaceholder, 3, -1,
		"placeholder without a media item at token 3: image placeholder, but the request has 1 media items")

	_, err := BuildPositionMap(nil, Placeholders{Image: 5, Video: 5, Audio: NoPlaceholder}, PlaceholderSingle, nil)
	require.EqualError(t, err, "image and video share placeholder token 5")
	_, err = BuildPositionMap(nil, Placeholders{Image: -3, Video: 1, Audio: 2}, PlaceholderSingle, nil)
	require.EqualError(t, err, "placeholder token for image is -3: want a token id or -1 for none")
}

// expand writes a map back out as tokens in a style: the inverse of BuildPositionMap.
func expand(pm *PositionMap, ph Placeholders, style PlaceholderStyle) []int32 {
	var out []int32
	text, row := 0, 0
	for _, s := range pm.Spans {
		for ; row < s.Start; row++ {
			out = append(out, pm.TextIDs[text])
			text++
		}
		n := 1
		if style == PlaceholderExpanded {
			n = s.End - s.Start
		}
		for range n {
			out = append(out, ph.ID(s.Modality))
		}
		row = s.End
	}
	return append(out, pm.TextIDs[text:]...)
}

// Arbitrary tokens and items: never a panic; a map that is returned is consistent and
// expands back to exactly the input tokens.
func FuzzBuildPositionMap(f *testing.F) {
	f.Add([]byte{0, 1, 2, 7, 3}, []byte{0x13})
	f.Add([]byte{1, 1, 7, 7, 7, 8, 8, 2}, []byte{0x03, 0x12})
	f.Add([]byte{0, 9, 9, 7}, []byte{0x31, 0x05})
	f.Fuzz(func(t *testing.T, tokenBytes, itemBytes []byte) {
		ph := Placeholders{Image: 7, Video: 8, Audio: 9}
		style := PlaceholderSingle
		if len(itemBytes) > 0 && itemBytes[0]&0x80 != 0 {
			style = PlaceholderExpanded
		}
		tokens := make([]int32, len(tokenBytes))
		for i, b := range tokenBytes {
			tokens[i] = int32(b % 12)
		}
		items := make([]MediaItem, len(itemBytes))
		for i, b := range itemBytes {
			items[i] = MediaItem{ID: fmt.Sprint(i), Modality: Modality(b >> 4 & 3), Tokens: int(b&0x0f) - 1}
		}
		pm, err := BuildPositionMap(tokens, ph, style, items)
		if err != nil {
			var pe *PositionError
			if !errors.As(err, &pe) || pe.Pos < -1 || pe.Pos >= len(tokens) || pe.Item < -1 || pe.Item >= len(items) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		rows := len(pm.TextIDs)
		for i, s := range pm.Spans {
			if s.Item != i || s.Modality != items[i].Modality || s.End-s.Start != items[i].Tokens {
				t.Fatalf("span %d = %+v for item %+v", i, s, items[i])
			}
			rows += s.End - s.Start
		}
		if len(pm.Spans) != len(items) || rows != pm.Len {
			t.Fatalf("%d spans for %d items, %d rows for length %d", len(pm.Spans), len(items), rows, pm.Len)
		}
		if back := expand(pm, ph, style); !slices.Equal(back, tokens) {
			t.Fatalf("map expands to %v, input %v", back, tokens)
		}
	})
}

func TestModalityText(t *testing.T) {
	for _, m := range []Modality{Image, Video, Audio} {
		b, err := m.MarshalText()
		require.NoError(t, err)
		var got Modality
		require.NoError(t, got.UnmarshalText(b))
		require.Equal(t, m, got)
	}
	var m Modality
	require.ErrorContains(t, m.UnmarshalText([]byte("smell")), `unknown modality "smell"`)
	_, err := Modality(0).MarshalText()
	require.Error(t, err, "the zero value is no modality")
}
