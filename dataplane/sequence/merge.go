package sequence

import (
	"errors"
	"fmt"

	"dataplane/native"
)

// ErrFeatureRows: a media item's features do not have the rows its placeholder expects.
var ErrFeatureRows = errors.New("media features do not match the position map")

// Merge writes the merged [pm.Len, d] sequence into dst: text rows gathered from
// table ([vocab, d]), and the rows of features[i] for media item i at its span. dst may be any
// memory the caller owns (a feature-store view); dtypes may differ and are converted to dst's.
// threads <= 0 uses native.DefaultThreads().
func Merge(dst native.Matrix, pm *PositionMap, table native.Matrix, features []native.Matrix, threads int) error {
	if dst.Rows != pm.Len {
		return fmt.Errorf("%w: destination has %d rows, the merged sequence %d", ErrFeatureRows, dst.Rows, pm.Len)
	}
	if len(features) != len(pm.Spans) {
		return fmt.Errorf("%w: %d feature buffers for %d media items", ErrFeatureRows, len(features), len(pm.Spans))
	}
	spans := make([]native.Span, len(pm.Spans))
	for i, s := range pm.Spans {
		f := features[s.Item]
		if f.Rows != s.End-s.Start {
			return fmt.Errorf("%w: media item %d (%v %q) has %d feature rows, its placeholder %d",
				ErrFeatureRows, s.Item, s.Modality, s.MediaID, f.Rows, s.End-s.Start)
		}
		spans[i] = native.Span{Row: s.Start, Src: f}
	}
	return native.Merge(&native.MergeInput{Dst: dst, Table: table, TextIDs: pm.TextIDs, Spans: spans, Threads: threads})
}
