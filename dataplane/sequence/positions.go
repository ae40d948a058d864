// Package sequence is the layout of a merged sequence: the one Modality type, the model's
// placeholder tokens, the position map that says where each row of the merged sequence comes
// from (a text token's embedding or a media item's feature row), and Merge, which writes the
// sequence with the native kernel.
package sequence

import (
	"errors"
	"fmt"
)

// Modality is the kind of a media item.
type Modality uint8

const (
	Image Modality = iota + 1
	Video
	Audio
)

func (m Modality) String() string {
	switch m {
	case Image:
		return "image"
	case Video:
		return "video"
	case Audio:
		return "audio"
	}
	return fmt.Sprintf("modality(%d)", uint8(m))
}

// ParseModality reads the names String writes.
func ParseModality(s string) (Modality, error) {
	for _, m := range []Modality{Image, Video, Audio} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown modality %q (want image, video or audio)", s)
}

// MarshalText and UnmarshalText write and read the names, for JSON files (traces).
func (m Modality) MarshalText() ([]byte, error) {
	if _, err := ParseModality(m.String()); err != nil {
		return nil, err
	}
	return []byte(m.String()), nil
}

func (m *Modality) UnmarshalText(b []byte) error {
	v, err := ParseModality(string(b))
	if err == nil {
		*m = v
	}
	return err
}

// NoPlaceholder marks a modality the model has no placeholder token for.
const NoPlaceholder int32 = -1

// Placeholders are the model's placeholder token ids per modality (NoPlaceholder: none).
type Placeholders struct {
	Image, Video, Audio int32
}

// ID is the placeholder token of m, or NoPlaceholder.
func (p Placeholders) ID(m Modality) int32 {
	switch m {
	case Image:
		return p.Image
	case Video:
		return p.Video
	case Audio:
		return p.Audio
	}
	return NoPlaceholder
}

// ModalityOf is the modality whose placeholder tok is, or 0 for a text token.
func (p Placeholders) ModalityOf(tok int32) Modality {
	switch {
	case tok == NoPlaceholder:
		return 0
	case tok == p.Image:
		return Image
	case tok == p.Video:
		return Video
	case tok == p.Audio:
		return Audio
	}
	return 0
}

// Validate rejects placeholder sets that would make a token ambiguous.
func (p Placeholders) Validate() error {
	ids := []int32{p.Image, p.Video, p.Audio}
	for i, a := range ids {
		if a < NoPlaceholder {
			return fmt.Errorf("placeholder token for %v is %d: want a token id or %d for none", Modality(i+1), a, NoPlaceholder)
		}
		for j, b := range ids[:i] {
			if a != NoPlaceholder && a == b {
				return fmt.Errorf("%v and %v share placeholder token %d", Modality(j+1), Modality(i+1), a)
			}
		}
	}
	return nil
}

// PlaceholderStyle says how a prompt marks where media goes.
type PlaceholderStyle uint8

const (
	// PlaceholderSingle: one placeholder token per item, expanded to the item's token count
	// in the merged sequence (the seed's style).
	PlaceholderSingle PlaceholderStyle = iota
	// PlaceholderExpanded: each item already occupies a run of exactly its token count (vLLM's
	// style); adjacent items of one modality share one run, split in item order.
	PlaceholderExpanded
)

func (s PlaceholderStyle) String() string {
	if s == PlaceholderExpanded {
		return "expanded"
	}
	return "single"
}

// MaxItemTokens bounds one media item's token count (a 1-hour video at 2 fps with 256
// tokens a frame is ~1.8M); larger counts are refused as malformed.
const MaxItemTokens = 1 << 24

// MediaItem is one media item of a request, in prompt order.
type MediaItem struct {
	ID       string // the request's id for the item (a content uuid or hash), for messages and lookups
	Modality Modality
	Tokens   int // exact number of feature rows the encoder produces for it
}

// MediaSpan places item Item (its index in the request's items, which is also the placeholder
// index) in the merged sequence at rows [Start, End). Pos is where its placeholder (the first
// one, for the expanded style) sits in the input tokens.
type MediaSpan struct {
	Item     int
	MediaID  string
	Modality Modality
	Pos      int
	Start    int
	End      int
}

// PositionMap says where every row of a merged sequence comes from: media rows from Spans (in
// order), all others text rows, filled in order from TextIDs.
type PositionMap struct {
	Len     int
	Spans   []MediaSpan
	TextIDs []int32
}

// The kinds of placeholder mismatch; a *PositionError unwraps to one of them.
var (
	ErrExtraPlaceholder   = errors.New("placeholder without a media item")
	ErrMissingPlaceholder = errors.New("media item without a placeholder")
	ErrRunLength          = errors.New("placeholder run length differs from its media item's token count")
	ErrModalityMismatch   = errors.New("placeholder modality differs from its media item's")
	ErrUnknownModality    = errors.New("media item of a modality the model has no placeholder for")
	ErrTokenCount         = errors.New("media item token count out of range")
)

// PositionError is a mismatch between a prompt's placeholders and its media items. Pos is the
// token position it concerns (-1: none), Item the media item (-1: none).
type PositionError struct {
	Kind     error
	Pos      int
	Item     int
	Modality Modality // the placeholder's modality, where there is a placeholder
	Got      int      // ErrRunLength: placeholders found; ErrTokenCount: the count
	Want     int      // ErrRunLength: the item's token count
	Detail   string
}

func (e *PositionError) Unwrap() error { return e.Kind }

func (e *PositionError) Error() string {
	s := e.Kind.Error()
	if e.Pos >= 0 {
		s += fmt.Sprintf(" at token %d", e.Pos)
	}
	if e.Item >= 0 {
		s += fmt.Sprintf(" (media item %d)", e.Item)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// BuildPositionMap matches the placeholders in tokens with items, in prompt order: the k-th
// placeholder (of any modality) belongs to the k-th item, which must have its modality. It
// returns the map or the first mismatch as a *PositionError naming the position and item.
func BuildPositionMap(tokens []int32, ph Placeholders, style PlaceholderStyle, items []MediaItem) (*PositionMap, error) {
	if err := ph.Validate(); err != nil {
		return nil, err
	}
	merged := len(tokens)
	for i, it := range items {
		if ph.ID(it.Modality) == NoPlaceholder {
			return nil, &PositionError{Kind: ErrUnknownModality, Pos: -1, Item: i,
				Detail: fmt.Sprintf("%v has no placeholder token", it.Modality)}
		}
		if it.Tokens <= 0 || it.Tokens > MaxItemTokens {
			return nil, &PositionError{Kind: ErrTokenCount, Pos: -1, Item: i, Got: it.Tokens,
				Detail: fmt.Sprintf("%d tokens, want 1..%d", it.Tokens, MaxItemTokens)}
		}
		if style == PlaceholderSingle {
			merged += it.Tokens - 1
		}
	}

	pm := &PositionMap{Len: merged, Spans: make([]MediaSpan, 0, len(items)), TextIDs: make([]int32, 0, merged)}
	row := 0
	for pos := 0; pos < len(tokens); {
		m := ph.ModalityOf(tokens[pos])
		if m == 0 {
			pm.TextIDs = append(pm.TextIDs, tokens[pos])
			pos++
			row++
			continue
		}
		k := len(pm.Spans)
		if k == len(items) {
			return nil, extraPlaceholder(tokens, pos, style, pm.Spans, items, m)
		}
		it := items[k]
		if it.Modality != m {
			return nil, &PositionError{Kind: ErrModalityMismatch, Pos: pos, Item: k, Modality: m,
				Detail: fmt.Sprintf("%v placeholder, item is %v", m, it.Modality)}
		}
		width := 1
		if style == PlaceholderExpanded {
			run := 0
			for pos+run < len(tokens) && run < it.Tokens && tokens[pos+run] == tokens[pos] {
				run++
			}
			if run < it.Tokens {
				return nil, &PositionError{Kind: ErrRunLength, Pos: pos, Item: k, Modality: m, Got: run, Want: it.Tokens,
					Detail: fmt.Sprintf("%d %v placeholders, item has %d tokens", run, m, it.Tokens)}
			}
			width = it.Tokens
		}
		pm.Spans = append(pm.Spans, MediaSpan{Item: k, MediaID: it.ID, Modality: m, Pos: pos, Start: row, End: row + it.Tokens})
		pos += width
		row += it.Tokens
	}
	if k := len(pm.Spans); k < len(items) {
		return nil, &PositionError{Kind: ErrMissingPlaceholder, Pos: -1, Item: k,
			Detail: fmt.Sprintf("%d placeholders for %d media items; %v item %q has none", k, len(items), items[k].Modality, items[k].ID)}
	}
	return pm, nil
}

// extraPlaceholder explains a placeholder at pos left over after the last item: in the
// expanded style, one that continues the last item's run makes the run too long.
func extraPlaceholder(tokens []int32, pos int, style PlaceholderStyle, spans []MediaSpan, items []MediaItem, m Modality) error {
	if style == PlaceholderExpanded && len(spans) > 0 {
		last := spans[len(spans)-1]
		if width := last.End - last.Start; last.Pos+width == pos && tokens[last.Pos] == tokens[pos] {
			run := width
			for p := pos; p < len(tokens) && tokens[p] == tokens[pos]; p++ {
				run++
			}
			return &PositionError{Kind: ErrRunLength, Pos: last.Pos, Item: last.Item, Modality: m, Got: run, Want: width,
				Detail: fmt.Sprintf("%d %v placeholders, item has %d tokens", run, m, width)}
		}
	}
	return &PositionError{Kind: ErrExtraPlaceholder, Pos: pos, Item: -1, Modality: m,
		Detail: fmt.Sprintf("%v placeholder, but the request has %d media items", m, len(items))}
}
