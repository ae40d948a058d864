package worker

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
)

// Handoff is how an HTTP engine gets a request with media (text-only requests go as token ids
// in every mode). What vLLM does with each: transfer/NOTES.md; the engine flags: README "vLLM".
type Handoff uint8

const (
	// HandoffEmbeds sends the merged sequence as prompt_embeds to /v1/completions (vLLM
	// --enable-prompt-embeds). The engine hashes its blocks by their bytes.
	HandoffEmbeds Handoff = iota
	// HandoffEC writes each item's features where vLLM's shared-storage EC connector reads
	// them (the daemon does it before Generate) and sends the chat request, its media parts
	// carrying the items' identifiers as uuids, to /v1/chat/completions: the engine finds the
	// files by those identifiers and skips its encoder.
	HandoffEC
	// HandoffTokens sends the chat request with its media and uuids, as HandoffEC does, to an
	// engine that encodes the media itself; no features are sent.
	HandoffTokens
)

var handoffNames = [...]string{HandoffEmbeds: "embeds", HandoffEC: "ec", HandoffTokens: "tokens"}

func (h Handoff) String() string {
	if int(h) < len(handoffNames) {
		return handoffNames[h]
	}
	return fmt.Sprintf("handoff(%d)", h)
}

// ParseHandoff reads "embeds", "ec" or "tokens".
func ParseHandoff(s string) (Handoff, error) {
	for h, name := range handoffNames {
		if s == name {
			return Handoff(h), nil
		}
	}
	return 0, fmt.Errorf("hand-off %q: want embeds, ec or tokens", s)
}

// SendsChat reports whether a request with media goes to the engine as the client's chat (with
// the media and their identifiers) rather than as embeddings.
func (h Handoff) SendsChat() bool { return h == HandoffEC || h == HandoffTokens }

// chatMessages are the request's messages as vLLM's /v1/chat/completions takes them: text parts
// as they came, each media part that is still in the request (req.Media, matched by its
// source) as vLLM's content part with the span's identifier as its "uuid" (the bytes as the
// client gave them: a data: or http(s) URL, or input_audio's base64; none when the client
// named a cached item by uuid alone, which vLLM accepts for items its processor cache holds).
// A media part dropped from the request (text_fallback) is left out.
func chatMessages(req *Request) ([]map[string]any, error) {
	ids := make(map[*openai.Media]string, len(req.Media))
	for _, sp := range req.Media {
		if sp.Src == nil {
			return nil, fmt.Errorf("worker: media span [%d, %d) has no source part", sp.Start, sp.End)
		}
		ids[sp.Src] = sp.ID
	}
	out := make([]map[string]any, 0, len(req.Messages))
	for _, m := range req.Messages {
		msg := map[string]any{"role": m.Role}
		switch {
		case len(m.Parts) == 0:
			msg["content"] = nil
		case len(m.Parts) == 1 && m.Parts[0].IsText:
			msg["content"] = m.Parts[0].Text
		default:
			parts := make([]map[string]any, 0, len(m.Parts))
			for _, p := range m.Parts {
				if p.IsText {
					parts = append(parts, map[string]any{"type": "text", "text": p.Text})
					continue
				}
				id, ok := ids[p.Media]
				if !ok {
					continue // dropped from the request
				}
				part, err := mediaPart(p.Media, id)
				if err != nil {
					return nil, err
				}
				parts = append(parts, part)
			}
			msg["content"] = parts
		}
		out = append(out, msg)
	}
	return out, nil
}

// mediaPart is one media item as vLLM's chat content part.
func mediaPart(m *openai.Media, id string) (map[string]any, error) {
	url := func(field string) map[string]any {
		if m.URL == "" {
			return map[string]any{"type": field, field: nil, "uuid": id}
		}
		return map[string]any{"type": field, field: map[string]string{"url": m.URL}, "uuid": id}
	}
	switch m.Modality {
	case sequence.Image:
		return url("image_url"), nil
	case sequence.Video:
		if m.Frames != nil {
			return nil, fmt.Errorf("worker: %s: a video given as pictures has no form vLLM's chat endpoint takes", m.Path)
		}
		return url("video_url"), nil
	case sequence.Audio:
		if m.Data != nil {
			return map[string]any{"type": "input_audio", "uuid": id,
				"input_audio": map[string]string{"data": base64.StdEncoding.EncodeToString(m.Data), "format": m.Format}}, nil
		}
		return url("audio_url"), nil
	}
	return nil, fmt.Errorf("worker: %s: modality %v", m.Path, m.Modality)
}

// chatBody turns a completions body (every sampling field the engine takes, already encoded,
// without prompt or prompt_embeds) into the chat body: the same fields and the messages.
func chatBody(completion []byte, req *Request) ([]byte, error) {
	msgs, err := chatMessages(req)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(completion, &fields); err != nil {
		return nil, err
	}
	if fields["messages"], err = json.Marshal(msgs); err != nil {
		return nil, err
	}
	return json.Marshal(fields)
}
