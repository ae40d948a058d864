// Package remote encodes media on other daemons. A daemon offers its encoders to the fleet
// (Server) and sends items to the encoders the fleet announces (Client, Catalog), over the
// feature transfer protocol (transfer/wire): the item's preprocessed inputs go out as encode
// frames, its features come back as one features frame, read straight into the feature-store
// memory the requesting daemon admitted for them. It knows frames, connections and costs;
// what encoding means (models, feature store, encoder pool) is the daemon's, behind Backend.
package remote

import (
	"encoding/json"
	"fmt"
	"time"
	"unsafe"

	"dataplane/dataplane/encoder"
	"dataplane/features"
	"dataplane/transfer/wire"
)

// Item is what an encoder needs to know of an item besides its inputs.
type Item struct {
	Key      features.Key // the feature-store key: the encoder's own cache is consulted with it
	Model    string       // the daemon's model name (both ends must run the same)
	Modality string       // "image", "video", "audio"
	Tokens   int          // feature rows, every input together
	Hidden   int          // feature width
	DType    wire.DType   // of the features
}

// Bytes is the size of the item's features.
func (it Item) Bytes() int64 { return int64(it.Tokens) * int64(it.Hidden) * int64(it.DType.Size()) }

// meta is an encode frame's text: the item and which of its inputs this frame carries.
type meta struct {
	Model    string `json:"model"`
	Modality string `json:"modality"`
	Tokens   int    `json:"tokens"`
	Hidden   int    `json:"hidden"`
	DType    uint8  `json:"dtype"`
	Input    int    `json:"input"`  // from 0
	Inputs   int    `json:"inputs"` // how many frames carry this item's inputs
	Frames   int    `json:"frames,omitempty"`
	// LeftMS is how long the requester waits for the features, from when it sent the frame.
	LeftMS int64 `json:"left_ms"`
}

// Limits on what a requester may ask of an encoder.
const (
	MaxInputs = 256     // inputs of one item (a video's frame groups)
	MaxTokens = 1 << 20 // feature rows of one item
	MaxHidden = 1 << 16
)

func (m *meta) item(key features.Key) (Item, error) {
	it := Item{Key: key, Model: m.Model, Modality: m.Modality, Tokens: m.Tokens, Hidden: m.Hidden, DType: wire.DType(m.DType)}
	switch {
	case m.Inputs < 1 || m.Inputs > MaxInputs || m.Input < 0 || m.Input >= m.Inputs:
		return it, fmt.Errorf("input %d of %d: want 0 <= input < inputs <= %d", m.Input, m.Inputs, MaxInputs)
	case m.Tokens < 1 || m.Tokens > MaxTokens:
		return it, fmt.Errorf("tokens %d: want 1 to %d", m.Tokens, MaxTokens)
	case m.Hidden < 1 || m.Hidden > MaxHidden:
		return it, fmt.Errorf("hidden %d: want 1 to %d", m.Hidden, MaxHidden)
	case it.DType.Size() == 0:
		return it, fmt.Errorf("dtype %v: not a feature dtype", it.DType)
	case m.Frames < 0 || m.LeftMS < 0:
		return it, fmt.Errorf("frames %d, left_ms %d: negative", m.Frames, m.LeftMS)
	}
	return it, nil
}

func (m *meta) text() string {
	b, _ := json.Marshal(m) // plain fields: cannot fail
	return string(b)
}

// floats views an input's data as bytes (the payload is written from it, no copy).
func floats(in encoder.Input) []byte {
	if len(in.Data) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&in.Data[0])), len(in.Data)*4)
}

// leftMS is the time to deadline in milliseconds (0 without one: the encoder's own limit applies).
func leftMS(deadline time.Time, ok bool) int64 {
	if !ok {
		return 0
	}
	return max(time.Until(deadline).Milliseconds(), 1)
}
