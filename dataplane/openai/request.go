// Package openai is the OpenAI-compatible wire format of the daemon's API: chat and text
// completion requests (with vLLM's multimodal content parts and per-part uuids), a
// pre-tokenized request, responses and streamed chunks. Parsing checks everything a handler
// relies on and names the offending part (messages[1].content[2].image_url.url) in a
// *RequestError; it does no I/O. The HTTP side (statuses, error bodies, SSE) is dataplane/api's.
package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	fastjson "github.com/segmentio/encoding/json"

	"dataplane/dataplane/sequence"
)

// Limits bound what one request may contain; a request beyond them is a *RequestError naming the limit.
type Limits struct {
	MaxMessages   int // messages in a chat request
	MaxParts      int // content parts in all messages together
	MaxMediaItems int // image, audio and video parts together
	MaxTokens     int // max_tokens / max_completion_tokens
	MaxPromptIDs  int // token ids in a pre-tokenized or token prompt
}

// DefaultLimits are generous for chat traffic and small enough to bound memory per request.
func DefaultLimits() Limits {
	return Limits{MaxMessages: 1024, MaxParts: 4096, MaxMediaItems: 64, MaxTokens: 1 << 20, MaxPromptIDs: 1 << 20}
}

// Media is one media item of a request, in prompt order.
type Media struct {
	Modality sequence.Modality
	// URL is where the bytes are: a data: URL, file://, http(s)://. Empty when Data is set or
	// when UUID refers to an item the server already has.
	URL string
	// Data holds bytes given inline (input_audio's base64 data, decoded); Format its format
	// ("wav", "mp3", ...).
	Data   []byte
	Format string
	// Frames are a video given as pictures (URLs, usually data: URLs), in order.
	Frames []string
	// UUID is the client's identifier for the item (vLLM's per-part "uuid"): it replaces the
	// content hash for caching, and a known uuid may come without the media.
	UUID string
	// Path is where it was in the request, for error messages: "messages[1].content[2]".
	Path string
}

// Message is one chat message; Parts keeps text and media in order.
type Message struct {
	Role  string
	Parts []Part
}

// Part is a text or a media part; exactly one of Text (with IsText) or Media is set.
type Part struct {
	IsText bool
	Text   string
	Media  *Media
}

// Extensions are dataplane's own request fields.
type Extensions struct {
	// CachePolicy: "discard" (default), "keep[:TTL]", "until-done" (see features.ParsePolicy).
	CachePolicy string
	// TextFallback lets the request continue without a media item that failed to encode.
	TextFallback bool
	// CacheSalt isolates a tenant's reuse-cache entries (vLLM's cache_salt).
	CacheSalt string
	// Priority: "interactive" (default) or "batch"; interactive work is encoded first.
	Priority string
	// RequestID is vLLM's request_id body field: the request's id when no X-Request-Id header
	// gives one ("" : none given).
	RequestID string
}

// ChatRequest is a parsed POST /v1/chat/completions.
type ChatRequest struct {
	Model        string
	Messages     []Message
	Media        []*Media // every media part, in prompt order (the same pointers as in Messages)
	Stream       bool
	IncludeUsage bool
	Sampling     Sampling
	Ext          Extensions
}

// CompletionRequest is a parsed POST /v1/completions: a text prompt or token ids.
type CompletionRequest struct {
	Model     string
	Prompt    string
	PromptIDs []int32 // set instead of Prompt when the prompt is token ids
	Stream    bool
	// IncludeUsage: stream_options.include_usage, a last chunk with the usage.
	IncludeUsage bool
	// Echo puts the prompt's text before the completion's (the daemon writes it).
	Echo bool
	// AddSpecialTokens: a text prompt is tokenized with the model's special tokens (BOS);
	// true unless the request says add_special_tokens: false.
	AddSpecialTokens bool
	Sampling         Sampling
	Ext              Extensions
}

// PretokenizedRequest is a parsed POST /v1/pretokenized: token ids with the model's
// placeholder tokens where media go (one per item, or runs already expanded to each item's
// token count, as Style says), and the media in placeholder order.
type PretokenizedRequest struct {
	Model        string
	TokenIDs     []int32
	Style        string // "single" (default) or "expanded"
	Media        []*Media
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	Sampling     Sampling
	Ext          Extensions
}

// RequestError is a request that is not valid: Param names the offending part
// ("messages[1].content[2].image_url.url"), "" the body as a whole.
type RequestError struct {
	Param   string
	Message string
}

func (e *RequestError) Error() string {
	if e.Param != "" {
		return e.Param + ": " + e.Message
	}
	return e.Message
}

// Invalid is a *RequestError about param.
func Invalid(param, format string, args ...any) *RequestError {
	return &RequestError{Param: param, Message: fmt.Sprintf(format, args...)}
}

// ---- chat ----

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// rawCommon is what every generation request carries besides its prompt.
type rawCommon struct {
	rawSampling
	rawRefused
	Model         string         `json:"model"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	MaxTokens     *int           `json:"max_tokens"`
	CachePolicy   string         `json:"cache_policy"`
	TextFallback  bool           `json:"text_fallback"`
	CacheSalt     string         `json:"cache_salt"`
	Priority      string         `json:"priority"`
	RequestID     *string        `json:"request_id"`
	// Logprobs is a bool in chat (with top_logprobs), a count in completions.
	Logprobs json.RawMessage `json:"logprobs"`
}

// check checks the common fields; maxTokens, when not nil, stands for MaxTokens (chat's
// max_completion_tokens).
func (c *rawCommon) check(maxTokens *int, lim Limits) (includeUsage bool, s Sampling, e Extensions, err error) {
	if err = refuse(&c.rawRefused); err != nil {
		return false, s, e, err
	}
	if c.StreamOptions != nil {
		if !c.Stream {
			return false, s, e, Invalid("stream_options", "stream_options is only allowed with stream: true")
		}
		includeUsage = c.StreamOptions.IncludeUsage
	}
	if maxTokens == nil {
		maxTokens = c.MaxTokens
	}
	if s, err = c.sampling(maxTokens, lim); err != nil {
		return false, s, e, err
	}
	if e, err = extensions(c.CachePolicy, c.TextFallback, c.CacheSalt, c.Priority); err != nil {
		return false, s, e, err
	}
	e.RequestID, err = requestID(c.RequestID)
	return includeUsage, s, e, err
}

type rawChat struct {
	rawCommon
	rawChatRefused
	Messages            []rawMessage    `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	TopLogprobs         *int            `json:"top_logprobs"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls is accepted: without tools it changes nothing, in vLLM either.
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
}

type rawMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type rawURL struct {
	URL string `json:"url"`
}

type rawPart struct {
	Type       string   `json:"type"`
	Text       *string  `json:"text"`
	ImageURL   *rawURL  `json:"image_url"`
	VideoURL   *rawURL  `json:"video_url"`
	Video      []string `json:"video"` // a video as a list of picture URLs (Qwen's form)
	AudioURL   *rawURL  `json:"audio_url"`
	InputAudio *struct {
		Data   string `json:"data"`
		Format string `json:"format"`
	} `json:"input_audio"`
	UUID string `json:"uuid"`
}

// maxVideoPictures bounds a video given as pictures (frame sampling keeps fewer).
const maxVideoPictures = 1024

var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// ParseChat parses and checks a chat completion request body.
func ParseChat(body []byte, lim Limits) (*ChatRequest, error) {
	var raw rawChat
	if err := decode(body, &raw); err != nil {
		return nil, err
	}
	req := &ChatRequest{Model: raw.Model, Stream: raw.Stream}
	var err error
	if req.IncludeUsage, req.Sampling, req.Ext, err = raw.check(raw.MaxCompletionTokens, lim); err != nil {
		return nil, err
	}
	if err := refuse(&raw.rawChatRefused); err != nil {
		return nil, err
	}
	if req.Sampling.Logprobs, err = chatLogprobs(raw.Logprobs, raw.TopLogprobs); err != nil {
		return nil, err
	}
	if tc := bytes.TrimSpace(raw.ToolChoice); len(tc) > 0 && string(tc) != "null" && string(tc) != `"none"` {
		return nil, Invalid("tool_choice", "tool_choice needs tools, which are not supported (see tools)")
	}
	if len(raw.Messages) == 0 {
		return nil, Invalid("messages", "at least one message is required")
	}
	if len(raw.Messages) > lim.MaxMessages {
		return nil, Invalid("messages", "%d messages, at most %d", len(raw.Messages), lim.MaxMessages)
	}
	parts := 0
	for i, rm := range raw.Messages {
		path := fmt.Sprintf("messages[%d]", i)
		if !roles[rm.Role] {
			return nil, Invalid(path+".role", "role %q (want system, developer, user, assistant or tool)", rm.Role)
		}
		if tc := bytes.TrimSpace(rm.ToolCalls); len(tc) > 0 && string(tc) != "null" && string(tc) != "[]" {
			return nil, Invalid(path+".tool_calls", "tool calls are not supported (see tools)")
		}
		m := Message{Role: rm.Role}
		content := bytes.TrimSpace(rm.Content)
		switch {
		case len(content) == 0 || string(content) == "null":
			if rm.Role != "assistant" {
				return nil, Invalid(path+".content", "content is required")
			}
		case content[0] == '"':
			var s string
			if err := json.Unmarshal(content, &s); err != nil {
				return nil, Invalid(path+".content", "bad string: %v", err)
			}
			m.Parts = []Part{{IsText: true, Text: s}}
			parts++
		case content[0] == '[':
			var rps []rawPart
			if err := json.Unmarshal(content, &rps); err != nil {
				return nil, Invalid(path+".content", "want a string or an array of content parts: %v", jsonMessage(err))
			}
			for j, rp := range rps {
				if parts++; parts > lim.MaxParts {
					return nil, Invalid("messages", "more than %d content parts", lim.MaxParts)
				}
				p, err := part(rp, fmt.Sprintf("%s.content[%d]", path, j))
				if err != nil {
					return nil, err
				}
				if p.Media != nil {
					if rm.Role != "user" {
						return nil, Invalid(p.Media.Path, "%s parts are only allowed in user messages", p.Media.Modality)
					}
					if len(req.Media) == lim.MaxMediaItems {
						return nil, Invalid(p.Media.Path, "more than %d media items in one request", lim.MaxMediaItems)
					}
					req.Media = append(req.Media, p.Media)
				}
				m.Parts = append(m.Parts, p)
			}
		default:
			return nil, Invalid(path+".content", "want a string or an array of content parts")
		}
		req.Messages = append(req.Messages, m)
	}
	return req, nil
}

// MaxUUIDBytes bounds a media item's uuid: it becomes the item's id in the feature store, which
// takes ids up to this length, and the daemon remembers up to 65,536 of them (with their
// salts) for later requests that send the uuid alone.
const MaxUUIDBytes = 1024

func checkUUID(uuid, path string) error {
	if len(uuid) > MaxUUIDBytes {
		return Invalid(path+".uuid", "%d bytes, at most %d", len(uuid), MaxUUIDBytes)
	}
	return nil
}

// part checks one content part.
func part(rp rawPart, path string) (Part, error) {
	if err := checkUUID(rp.UUID, path); err != nil {
		return Part{}, err
	}
	media := func(m sequence.Modality, ref *rawURL, field string) (Part, error) {
		url := ""
		if ref != nil {
			url = strings.TrimSpace(ref.URL)
		}
		if url == "" && rp.UUID == "" {
			return Part{}, Invalid(path+"."+field+".url", "a %s part needs %s.url (or a uuid the server has seen)", m, field)
		}
		return Part{Media: &Media{Modality: m, URL: url, UUID: rp.UUID, Path: path}}, nil
	}
	switch rp.Type {
	case "text", "input_text":
		if rp.Text == nil {
			return Part{}, Invalid(path+".text", "a text part needs text")
		}
		return Part{IsText: true, Text: *rp.Text}, nil
	case "image_url", "input_image":
		return media(sequence.Image, rp.ImageURL, "image_url")
	case "video_url":
		return media(sequence.Video, rp.VideoURL, "video_url")
	case "video": // frames as pictures
		if len(rp.Video) == 0 || len(rp.Video) > maxVideoPictures {
			return Part{}, Invalid(path+".video", "a video part needs a list of 1..%d picture URLs", maxVideoPictures)
		}
		for i, f := range rp.Video {
			if strings.TrimSpace(f) == "" {
				return Part{}, Invalid(fmt.Sprintf("%s.video[%d]", path, i), "empty picture URL")
			}
		}
		return Part{Media: &Media{Modality: sequence.Video, Frames: rp.Video, UUID: rp.UUID, Path: path}}, nil
	case "audio_url":
		return media(sequence.Audio, rp.AudioURL, "audio_url")
	case "input_audio":
		if rp.InputAudio == nil || rp.InputAudio.Data == "" {
			if rp.UUID != "" {
				return Part{Media: &Media{Modality: sequence.Audio, UUID: rp.UUID, Path: path}}, nil
			}
			return Part{}, Invalid(path+".input_audio.data", "an input_audio part needs base64 data")
		}
		data, err := decodeBase64(rp.InputAudio.Data)
		if err != nil {
			return Part{}, Invalid(path+".input_audio.data", "bad base64: %v", err)
		}
		format := strings.ToLower(rp.InputAudio.Format)
		if format == "" {
			return Part{}, Invalid(path+".input_audio.format", "an input_audio part needs a format (wav, mp3, flac, ...)")
		}
		return Part{Media: &Media{Modality: sequence.Audio, Data: data, Format: format, UUID: rp.UUID, Path: path}}, nil
	case "":
		return Part{}, Invalid(path+".type", "a content part needs a type")
	}
	return Part{}, Invalid(path+".type", "unsupported content part type %q (want text, image_url, input_audio, audio_url, video_url or video)", rp.Type)
}

// ---- completions ----

type rawCompletion struct {
	rawCommon
	Prompt           rawJSON `json:"prompt"`
	Echo             bool    `json:"echo"`
	AddSpecialTokens *bool   `json:"add_special_tokens"`
}

// completionScratches pools a completion parse's rawCompletion: it is 1.6 KB (every refused
// field), a third of what a text-only request allocated (issue 26). Nothing in it outlives the
// parse: its raw fields point into the body.
var completionScratches = sync.Pool{New: func() any { return new(rawCompletion) }}

// rawJSON is a field's JSON as it stands in the body, not copied (json.RawMessage copies): it
// is read before the parse returns, while the body is still there.
type rawJSON []byte

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// unquote decodes a JSON string literal that encoding/json has already checked. One without
// escapes, in valid UTF-8, is its bytes between the quotes (the text-only hot path: no
// second decode); anything else is decoded by encoding/json.
func unquote(lit []byte) (string, error) {
	inner := lit[1 : len(lit)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	err := json.Unmarshal(lit, &s)
	return s, err
}

// ParseCompletion parses and checks a text completion request body. The prompt is one string
// or one list of token ids (a list of one of either is accepted too).
func ParseCompletion(body []byte, lim Limits) (*CompletionRequest, error) {
	raw := completionScratches.Get().(*rawCompletion)
	defer func() {
		*raw = rawCompletion{} // nothing of it is kept: what the request keeps was copied out
		completionScratches.Put(raw)
	}()
	if err := decode(body, raw); err != nil {
		return nil, err
	}
	req := &CompletionRequest{Model: raw.Model, Stream: raw.Stream, Echo: raw.Echo, AddSpecialTokens: true}
	var err error
	if req.IncludeUsage, req.Sampling, req.Ext, err = raw.check(nil, lim); err != nil {
		return nil, err
	}
	if req.Sampling.Logprobs, err = completionLogprobs(raw.Logprobs); err != nil {
		return nil, err
	}
	if req.Echo && req.Sampling.Logprobs != nil {
		return nil, Invalid("echo", "echo with logprobs is not supported: the prompt's logprobs are not carried")
	}
	if raw.AddSpecialTokens != nil {
		req.AddSpecialTokens = *raw.AddSpecialTokens
	}
	if req.Sampling.MaxTokens == 0 {
		req.Sampling.MaxTokens = 16 // OpenAI's default for completions
	}
	p := bytes.TrimSpace(raw.Prompt)
	if len(p) > 0 && p[0] == '[' { // unwrap a batch of one
		var batch []json.RawMessage
		if json.Unmarshal(p, &batch) == nil && len(batch) == 1 {
			if inner := bytes.TrimSpace(batch[0]); len(inner) > 0 && (inner[0] == '"' || inner[0] == '[') {
				p = inner
			}
		}
	}
	switch {
	case len(p) == 0 || string(p) == "null":
		return nil, Invalid("prompt", "prompt is required")
	case p[0] == '"':
		if req.Prompt, err = unquote(p); err != nil {
			return nil, Invalid("prompt", "bad string: %v", err)
		}
	case p[0] == '[':
		var ids []int64
		if err := json.Unmarshal(p, &ids); err != nil {
			return nil, Invalid("prompt", "want a string, a list of token ids, or a list of one of either (batches are not supported): %v", jsonMessage(err))
		}
		if req.PromptIDs, err = tokenIDs(ids, "prompt", lim); err != nil {
			return nil, err
		}
	default:
		return nil, Invalid("prompt", "want a string or a list of token ids")
	}
	return req, nil
}

// ---- pre-tokenized ----

type rawPretokenized struct {
	rawCommon
	TokenIDs []int64 `json:"token_ids"`
	Style    string  `json:"placeholder_style"`
	Media    []struct {
		Modality string `json:"modality"`
		URL      string `json:"url"`
		Data     string `json:"data"` // base64
		Format   string `json:"format"`
		UUID     string `json:"uuid"`
	} `json:"media"`
}

// ParsePretokenized parses and checks a pre-tokenized request body.
func ParsePretokenized(body []byte, lim Limits) (*PretokenizedRequest, error) {
	var raw rawPretokenized
	if err := decode(body, &raw); err != nil {
		return nil, err
	}
	req := &PretokenizedRequest{Model: raw.Model, Stream: raw.Stream, Style: raw.Style}
	var err error
	if req.IncludeUsage, req.Sampling, req.Ext, err = raw.check(nil, lim); err != nil {
		return nil, err
	}
	if req.Sampling.Logprobs, err = completionLogprobs(raw.Logprobs); err != nil {
		return nil, err
	}
	switch req.Style {
	case "":
		req.Style = "single"
	case "single", "expanded":
	default:
		return nil, Invalid("placeholder_style", "%q (want single or expanded)", req.Style)
	}
	if len(raw.TokenIDs) == 0 {
		return nil, Invalid("token_ids", "token_ids is required")
	}
	if req.TokenIDs, err = tokenIDs(raw.TokenIDs, "token_ids", lim); err != nil {
		return nil, err
	}
	if len(raw.Media) > lim.MaxMediaItems {
		return nil, Invalid("media", "%d media items, at most %d", len(raw.Media), lim.MaxMediaItems)
	}
	for i, rm := range raw.Media {
		path := fmt.Sprintf("media[%d]", i)
		mod, err := sequence.ParseModality(rm.Modality)
		if err != nil {
			return nil, Invalid(path+".modality", "modality %q (want image, audio or video)", rm.Modality)
		}
		if err := checkUUID(rm.UUID, path); err != nil {
			return nil, err
		}
		m := &Media{Modality: mod, URL: strings.TrimSpace(rm.URL), UUID: rm.UUID, Format: strings.ToLower(rm.Format), Path: path}
		if rm.Data != "" {
			if m.URL != "" {
				return nil, Invalid(path, "give url or data, not both")
			}
			if m.Data, err = decodeBase64(rm.Data); err != nil {
				return nil, Invalid(path+".data", "bad base64: %v", err)
			}
		}
		if m.URL == "" && m.Data == nil && m.UUID == "" {
			return nil, Invalid(path, "a media item needs url, data or a uuid the server has seen")
		}
		req.Media = append(req.Media, m)
	}
	return req, nil
}

// ---- shared pieces ----

// decode unmarshals a JSON object body, turning syntax and type errors into *RequestErrors that say where.
//
// segmentio's decoder goes first: it decodes our bodies 4-5x as fast as encoding/json
// (BenchmarkDecode: 0.14 against 0.60 us for the text-only completion, 0.34 against 1.7 us for
// a two-message chat), to the same result (FuzzDecodeMatchesStd). A body it refuses is
// decoded again by encoding/json, from zero, and encoding/json's error is the one returned, so
// the messages clients see are unchanged.
func decode(body []byte, v any) error { return decodeWith(body, v, fastjson.Unmarshal) }

// decodeWith is decode with fast as the first decoder (nil: encoding/json alone).
func decodeWith(body []byte, v any, fast func([]byte, any) error) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return Invalid("", "empty request body: want a JSON object")
	}
	if trimmed[0] != '{' {
		return Invalid("", "request body is not a JSON object")
	}
	if fast != nil {
		if fast(body, v) == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	if err := json.Unmarshal(body, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			// encoding/json names a field of an embedded struct with the struct's type first.
			field := typeErr.Field
			for _, embedded := range []string{"rawCommon.", "rawSampling.", "rawRefused.", "rawChatRefused."} {
				field = strings.TrimPrefix(field, embedded)
			}
			return Invalid(field, "want %s, got %s", jsonKind(typeErr.Type), typeErr.Value)
		}
		return Invalid("", "malformed JSON: %v", jsonMessage(err))
	}
	return nil
}

// jsonKind names a Go type as the JSON value it decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// jsonMessage adds the byte offset to JSON syntax errors.
func jsonMessage(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("%v (at byte %d)", syn, syn.Offset)
	}
	return err.Error()
}

func extensions(policy string, fallback bool, salt, priority string) (Extensions, error) {
	switch priority {
	case "":
		priority = "interactive"
	case "interactive", "batch":
	default:
		return Extensions{}, Invalid("priority", "%q (want interactive or batch)", priority)
	}
	if len(salt) > 256 {
		return Extensions{}, Invalid("cache_salt", "%d bytes, at most 256", len(salt))
	}
	return Extensions{CachePolicy: policy, TextFallback: fallback, CacheSalt: salt, Priority: priority}, nil
}

func tokenIDs(ids []int64, param string, lim Limits) ([]int32, error) {
	if len(ids) > lim.MaxPromptIDs {
		return nil, Invalid(param, "%d token ids, at most %d", len(ids), lim.MaxPromptIDs)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<31-1 {
			return nil, Invalid(fmt.Sprintf("%s[%d]", param, i), "token id %d out of range", id)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// decodeBase64 accepts standard and URL-safe alphabets, padded or not.
func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	_, err := base64.StdEncoding.DecodeString(s)
	return nil, err
}
