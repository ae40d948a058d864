package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unsafe"
)

// Sampling are the generation settings the daemon hands to the LLM worker: OpenAI's and vLLM's
// sampling and output fields, with vLLM's names and meanings (vllm-project/vllm
// vllm/entrypoints/openai/completion/protocol.py and chat_completion/protocol.py at 002032ee,
// CompletionRequest / ChatCompletionRequest.to_sampling_params). HTTP workers (vLLM) get them
// all; a worker that cannot honour one refuses it (worker.Checker). A nil pointer or a zero
// value is "not given": the engine's default.
type Sampling struct {
	MaxTokens   int // 0: the server's default
	Temperature *float64
	TopP        *float64
	TopK        *int // vLLM: 0 or -1 turn it off
	MinP        *float64
	Seed        *int64
	Stop        []string
	// StopTokenIDs end the generation at any of these tokens (vLLM).
	StopTokenIDs           []int32
	IncludeStopStrInOutput bool
	PresencePenalty        *float64
	FrequencyPenalty       *float64
	RepetitionPenalty      *float64
	LogitBias              map[int32]float64 // token id → bias in [-100, 100]
	AllowedTokenIDs        []int32
	BadWords               []string
	MinTokens              int
	IgnoreEOS              bool
	SkipSpecialTokens      *bool
	// SpacesBetweenSpecialTokens is vLLM's detokenizer setting.
	SpacesBetweenSpecialTokens *bool
	// Logprobs is how many alternatives come with each generated token's logprob (completions'
	// logprobs; chat's top_logprobs when logprobs is true); nil: no logprobs.
	Logprobs *int
	// ResponseFormat and StructuredOutputs are vLLM's structured-output constraints, checked
	// here and forwarded as the client wrote them (compact JSON); nil when not given
	// (response_format {"type": "text"} is no constraint: nil too).
	ResponseFormat, StructuredOutputs json.RawMessage
}

// MaxLogprobs bounds logprobs / top_logprobs: OpenAI's chat maximum and vLLM's default
// --max-logprobs.
const MaxLogprobs = 20

// maxListLen bounds stop_token_ids, allowed_token_ids, bad_words and logit_bias entries.
const maxListLen = 1024

// Given lists the fields of s that ask for something, by their wire names, in a fixed
// order: those set to a value other than the one that changes nothing (temperature 1, top_p 1,
// top_k 0 or -1, min_p 0, penalties 0 or 1, empty lists, false flags). max_tokens is never
// listed: every worker honours it. A worker that honours only some fields refuses the rest
// with this list (the engine mocker draws placeholder tokens: it honours seed and the flags
// that cannot change what it draws).
func (s *Sampling) Given() []string {
	var out []string
	add := func(set bool, name string) {
		if set {
			out = append(out, name)
		}
	}
	not := func(p *float64, v float64) bool { return p != nil && *p != v }
	add(not(s.Temperature, 1), "temperature")
	add(not(s.TopP, 1), "top_p")
	add(s.TopK != nil && *s.TopK != 0 && *s.TopK != -1, "top_k")
	add(not(s.MinP, 0), "min_p")
	add(s.Seed != nil, "seed")
	add(len(s.Stop) > 0, "stop")
	add(len(s.StopTokenIDs) > 0, "stop_token_ids")
	add(s.IncludeStopStrInOutput, "include_stop_str_in_output")
	add(not(s.PresencePenalty, 0), "presence_penalty")
	add(not(s.FrequencyPenalty, 0), "frequency_penalty")
	add(not(s.RepetitionPenalty, 1), "repetition_penalty")
	add(len(s.LogitBias) > 0, "logit_bias")
	add(len(s.AllowedTokenIDs) > 0, "allowed_token_ids")
	add(len(s.BadWords) > 0, "bad_words")
	add(s.MinTokens > 0, "min_tokens")
	add(s.IgnoreEOS, "ignore_eos")
	add(s.SkipSpecialTokens != nil && !*s.SkipSpecialTokens, "skip_special_tokens")
	add(s.SpacesBetweenSpecialTokens != nil && !*s.SpacesBetweenSpecialTokens, "spaces_between_special_tokens")
	add(s.Logprobs != nil, "logprobs")
	add(s.ResponseFormat != nil, "response_format")
	add(s.StructuredOutputs != nil, "structured_outputs")
	return out
}

// rawSampling are the sampling and output fields every generation request shares (chat's
// logprobs, a bool there, are read by ParseChat).
type rawSampling struct {
	Temperature                *float64           `json:"temperature"`
	TopP                       *float64           `json:"top_p"`
	TopK                       *int               `json:"top_k"`
	MinP                       *float64           `json:"min_p"`
	N                          *int               `json:"n"`
	Seed                       *int64             `json:"seed"`
	Stop                       json.RawMessage    `json:"stop"`
	StopTokenIDs               []int64            `json:"stop_token_ids"`
	IncludeStopStrInOutput     bool               `json:"include_stop_str_in_output"`
	PresencePenalty            *float64           `json:"presence_penalty"`
	FrequencyPenalty           *float64           `json:"frequency_penalty"`
	RepetitionPenalty          *float64           `json:"repetition_penalty"`
	LogitBias                  map[string]float64 `json:"logit_bias"`
	AllowedTokenIDs            []int64            `json:"allowed_token_ids"`
	BadWords                   []string           `json:"bad_words"`
	MinTokens                  *int               `json:"min_tokens"`
	IgnoreEOS                  bool               `json:"ignore_eos"`
	SkipSpecialTokens          *bool              `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens *bool              `json:"spaces_between_special_tokens"`
	ResponseFormat             json.RawMessage    `json:"response_format"`
	StructuredOutputs          json.RawMessage    `json:"structured_outputs"`
	// User is OpenAI's end-user tag: accepted, no effect (vLLM ignores it too).
	User *string `json:"user"`
}

// sampling checks the fields; maxTokens is max_tokens (or chat's max_completion_tokens).
func (r *rawSampling) sampling(maxTokens *int, lim Limits) (Sampling, error) {
	s := Sampling{Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK, MinP: r.MinP, Seed: r.Seed,
		IncludeStopStrInOutput: r.IncludeStopStrInOutput, PresencePenalty: r.PresencePenalty,
		FrequencyPenalty: r.FrequencyPenalty, RepetitionPenalty: r.RepetitionPenalty, IgnoreEOS: r.IgnoreEOS,
		SkipSpecialTokens: r.SkipSpecialTokens, SpacesBetweenSpecialTokens: r.SpacesBetweenSpecialTokens}
	if maxTokens != nil {
		if *maxTokens < 1 || *maxTokens > lim.MaxTokens {
			return s, Invalid("max_tokens", "%d (want 1..%d)", *maxTokens, lim.MaxTokens)
		}
		s.MaxTokens = *maxTokens
	}
	between := func(p *float64, name string, lo, hi float64) error {
		if p != nil && !(*p >= lo && *p <= hi) {
			return Invalid(name, "%v (want %v..%v)", *p, lo, hi)
		}
		return nil
	}
	for _, err := range []error{
		between(r.Temperature, "temperature", 0, 2),
		between(r.MinP, "min_p", 0, 1),
		between(r.PresencePenalty, "presence_penalty", -2, 2),
		between(r.FrequencyPenalty, "frequency_penalty", -2, 2),
	} {
		if err != nil {
			return s, err
		}
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		return s, Invalid("top_p", "%v (want 0 < top_p <= 1)", *r.TopP)
	}
	if r.TopK != nil && *r.TopK < -1 {
		return s, Invalid("top_k", "%d (want -1 or 0 for all tokens, or at least 1)", *r.TopK)
	}
	if p := r.RepetitionPenalty; p != nil && !(*p > 0 && *p <= 100) {
		return s, Invalid("repetition_penalty", "%v (want 0 < repetition_penalty <= 100)", *p)
	}
	if r.N != nil && *r.N != 1 {
		return s, Invalid("n", "%d: only n = 1 is supported", *r.N)
	}
	if r.User != nil && len(*r.User) > 1024 {
		return s, Invalid("user", "%d bytes, at most 1024", len(*r.User))
	}
	var err error
	if s.Stop, err = stopStrings(r.Stop); err != nil {
		return s, err
	}
	if s.StopTokenIDs, err = idList(r.StopTokenIDs, "stop_token_ids"); err != nil {
		return s, err
	}
	if s.AllowedTokenIDs, err = idList(r.AllowedTokenIDs, "allowed_token_ids"); err != nil {
		return s, err
	}
	if len(r.BadWords) > maxListLen {
		return s, Invalid("bad_words", "%d words, at most %d", len(r.BadWords), maxListLen)
	}
	s.BadWords = r.BadWords
	if s.LogitBias, err = logitBias(r.LogitBias); err != nil {
		return s, err
	}
	if r.MinTokens != nil {
		if *r.MinTokens < 0 || (s.MaxTokens > 0 && *r.MinTokens > s.MaxTokens) {
			return s, Invalid("min_tokens", "%d (want 0..max_tokens)", *r.MinTokens)
		}
		s.MinTokens = *r.MinTokens
	}
	if s.ResponseFormat, err = responseFormat(r.ResponseFormat); err != nil {
		return s, err
	}
	if s.StructuredOutputs, err = structuredOutputs(r.StructuredOutputs); err != nil {
		return s, err
	}
	return s, nil
}

func stopStrings(stop json.RawMessage) ([]string, error) {
	stop = bytes.TrimSpace(stop)
	switch {
	case len(stop) == 0 || string(stop) == "null":
		return nil, nil
	case stop[0] == '"':
		var one string
		if err := json.Unmarshal(stop, &one); err != nil {
			return nil, Invalid("stop", "bad string: %v", err)
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(stop, &list); err != nil {
		return nil, Invalid("stop", "want a string or a list of up to 4 strings")
	}
	if len(list) > 4 {
		return nil, Invalid("stop", "%d stop sequences, at most 4", len(list))
	}
	return list, nil
}

func idList(ids []int64, param string) ([]int32, error) {
	if len(ids) > maxListLen {
		return nil, Invalid(param, "%d token ids, at most %d", len(ids), maxListLen)
	}
	return tokenIDs(ids, param, Limits{MaxPromptIDs: maxListLen})
}

// logitBias checks OpenAI's map of token ids (as strings) to biases in [-100, 100].
func logitBias(m map[string]float64) (map[int32]float64, error) {
	if len(m) == 0 {
		return nil, nil
	}
	if len(m) > maxListLen {
		return nil, Invalid("logit_bias", "%d entries, at most %d", len(m), maxListLen)
	}
	out := make(map[int32]float64, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 {
			return nil, Invalid("logit_bias", "key %q is not a token id", k)
		}
		if math.IsNaN(v) || v < -100 || v > 100 {
			return nil, Invalid("logit_bias", "bias %v for token %d (want -100..100)", v, id)
		}
		out[int32(id)] = v
	}
	return out, nil
}

// responseFormat checks OpenAI's response_format as vLLM takes it on both endpoints (text,
// json_object, json_schema with a name and a schema object, or vLLM's structural_tag).
func responseFormat(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if raw[0] != '{' || json.Unmarshal(raw, &rf) != nil {
		return nil, Invalid("response_format", `want an object such as {"type": "json_object"}`)
	}
	switch rf.Type {
	case "text":
		return nil, nil // no constraint
	case "json_object", "structural_tag":
	case "json_schema":
		if rf.JSONSchema == nil {
			return nil, Invalid("response_format.json_schema", "a json_schema response format needs json_schema")
		}
		if rf.JSONSchema.Name == "" {
			return nil, Invalid("response_format.json_schema.name", "a json_schema needs a name")
		}
		if s := bytes.TrimSpace(rf.JSONSchema.Schema); len(s) > 0 && string(s) != "null" && s[0] != '{' {
			return nil, Invalid("response_format.json_schema.schema", "want a JSON schema object")
		}
	default:
		return nil, Invalid("response_format.type", "%q (want text, json_object, json_schema or structural_tag)", rf.Type)
	}
	return compact(raw)
}

// structuredOutputs checks vLLM's structured_outputs: an object with at most one of json,
// regex and choice (vLLM's check_structured_outputs_count).
func structuredOutputs(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var so map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &so) != nil {
		return nil, Invalid("structured_outputs", `want an object such as {"json": {...}}`)
	}
	kinds := 0
	for _, k := range []string{"json", "regex", "choice"} {
		if v, ok := so[k]; ok && string(bytes.TrimSpace(v)) != "null" {
			kinds++
		}
	}
	if kinds > 1 {
		return nil, Invalid("structured_outputs", "give one kind of constraint: json, regex or choice")
	}
	return compact(raw)
}

func compact(raw json.RawMessage) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ---- fields the daemon cannot carry ----

// refusal is a field of OpenAI's or vLLM's request that the daemon refuses unless it has a
// value that asks for nothing (neutral, as JSON decodes it: false, true, 1.0, ""...).
type refusal struct {
	neutral []any
	why     string
}

// notCarried is why most refused fields are refused.
const notCarried = "not supported: the daemon renders the prompt itself and sends the engine a completion of it, which cannot carry this field"

// refusals are the fields of vLLM's ChatCompletionRequest and CompletionRequest (and OpenAI's)
// that the daemon does not carry, by wire name. Fields neither defines are ignored, as vLLM
// ignores them.
var refusals = map[string]refusal{
	"tools": {why: "tool calls are not supported: vLLM parses tool calls (its --tool-call-parser) only in its chat endpoint, " +
		"and the daemon sends the engine a completion of the prompt it rendered, whose answer is raw text; " +
		"returning tool_calls would mean guessing the model's tool-call format"},
	"functions":                  {why: "functions (and tools) are not supported: see tools"},
	"function_call":              {why: "functions (and tools) are not supported: see tools"},
	"use_beam_search":            {neutral: []any{false}, why: notCarried},
	"best_of":                    {neutral: []any{1.0}, why: "only best_of = 1 is supported"},
	"length_penalty":             {neutral: []any{1.0}, why: "beam search is not supported"},
	"prompt_logprobs":            {why: notCarried},
	"logprob_token_ids":          {why: notCarried},
	"return_token_ids":           {neutral: []any{false}, why: notCarried},
	"return_tokens_as_token_ids": {neutral: []any{false}, why: notCarried},
	"truncate_prompt_tokens":     {why: notCarried},
	"truncation_side":            {why: notCarried},
	"kv_transfer_params":         {why: "set by the daemon's hand-off, not by clients"},
	"ec_transfer_params":         {why: "set by the daemon's hand-off, not by clients"},
	"vllm_xargs":                 {why: notCarried},
	"repetition_detection":       {why: notCarried},
	"stream_interval":            {why: notCarried},
	"watermarking":               {neutral: []any{false}, why: notCarried},
	"session_id":                 {why: notCarried},
	"thinking_token_budget":      {neutral: []any{-1.0}, why: notCarried},
	"guided_json":                {why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"guided_regex":               {why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"guided_choice":              {why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"guided_grammar":             {why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"guided_json_object":         {neutral: []any{false}, why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"guided_decoding_backend":    {why: "vLLM's guided_* fields are gone: use response_format or structured_outputs"},
	"return_prompt_text":         {neutral: []any{false}, why: notCarried},
	"return_token_offsets":       {neutral: []any{false}, why: notCarried},
	"return_mm_kwargs":           {neutral: []any{true}, why: notCarried},
	"prompt_embeds":              {why: "clients send media, not embeddings; the daemon makes the prompt's embeddings"},
	"suffix":                     {neutral: []any{""}, why: "not supported (nor by vLLM)"},
	// chat only: what the chat template is given
	"echo":                   {neutral: []any{false}, why: "vLLM's chat echo is not supported"},
	"add_generation_prompt":  {neutral: []any{true}, why: "the daemon always adds the generation prompt"},
	"continue_final_message": {neutral: []any{false}, why: notCarried},
	"add_special_tokens":     {neutral: []any{false}, why: "the chat template writes the special tokens"},
	"documents":              {why: notCarried},
	"chat_template":          {why: "the chat template is the daemon's (--chat-template)"},
	"chat_template_kwargs":   {why: notCarried},
	"mm_processor_kwargs":    {why: notCarried},
	"media_io_kwargs":        {why: notCarried},
	"reasoning_effort":       {why: notCarried},
	"include_reasoning":      {neutral: []any{true}, why: "reasoning is not parsed out of the answer: the engine's completion is raw text"},
}

// rawRefused holds the refused fields both endpoints share.
type rawRefused struct {
	Tools                  json.RawMessage `json:"tools"`
	Functions              json.RawMessage `json:"functions"`
	FunctionCall           json.RawMessage `json:"function_call"`
	UseBeamSearch          json.RawMessage `json:"use_beam_search"`
	BestOf                 json.RawMessage `json:"best_of"`
	LengthPenalty          json.RawMessage `json:"length_penalty"`
	PromptLogprobs         json.RawMessage `json:"prompt_logprobs"`
	LogprobTokenIDs        json.RawMessage `json:"logprob_token_ids"`
	ReturnTokenIDs         json.RawMessage `json:"return_token_ids"`
	ReturnTokensAsTokenIDs json.RawMessage `json:"return_tokens_as_token_ids"`
	TruncatePromptTokens   json.RawMessage `json:"truncate_prompt_tokens"`
	TruncationSide         json.RawMessage `json:"truncation_side"`
	KVTransferParams       json.RawMessage `json:"kv_transfer_params"`
	ECTransferParams       json.RawMessage `json:"ec_transfer_params"`
	VLLMXargs              json.RawMessage `json:"vllm_xargs"`
	RepetitionDetection    json.RawMessage `json:"repetition_detection"`
	StreamInterval         json.RawMessage `json:"stream_interval"`
	Watermarking           json.RawMessage `json:"watermarking"`
	SessionID              json.RawMessage `json:"session_id"`
	ThinkingTokenBudget    json.RawMessage `json:"thinking_token_budget"`
	GuidedJSON             json.RawMessage `json:"guided_json"`
	GuidedRegex            json.RawMessage `json:"guided_regex"`
	GuidedChoice           json.RawMessage `json:"guided_choice"`
	GuidedGrammar          json.RawMessage `json:"guided_grammar"`
	GuidedJSONObject       json.RawMessage `json:"guided_json_object"`
	GuidedDecodingBackend  json.RawMessage `json:"guided_decoding_backend"`
	ReturnPromptText       json.RawMessage `json:"return_prompt_text"`
	ReturnTokenOffsets     json.RawMessage `json:"return_token_offsets"`
	ReturnMMKwargs         json.RawMessage `json:"return_mm_kwargs"`
	PromptEmbeds           json.RawMessage `json:"prompt_embeds"`
	Suffix                 json.RawMessage `json:"suffix"`
}

// rawChatRefused holds the refused fields only chat has (what vLLM gives the chat template).
type rawChatRefused struct {
	Echo                 json.RawMessage `json:"echo"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	MMProcessorKwargs    json.RawMessage `json:"mm_processor_kwargs"`
	MediaIOKwargs        json.RawMessage `json:"media_io_kwargs"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	IncludeReasoning     json.RawMessage `json:"include_reasoning"`
}

// refuse returns a *RequestError for the first field of v (a struct of json.RawMessage fields
// tagged with names in refusals) that is given with a value other than null and its neutral
// ones.
func refuse[T rawRefused | rawChatRefused](v *T) error {
	// Almost every request gives none of them: then v's memory is all zero (nil slices), which
	// one comparison sees. Looking at each field by reflection cost 0.2 us a request (issue 26).
	if bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)), zeroBytes[:unsafe.Sizeof(*v)]) {
		return nil
	}
	rv := reflect.ValueOf(v).Elem()
	rt := rv.Type()
	for i := range rt.NumField() {
		raw := bytes.TrimSpace(rv.Field(i).Bytes()) // not Interface(): that copies each field to the heap
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		r, ok := refusals[name]
		if !ok {
			panic("openai: refused field " + name + " has no entry in refusals")
		}
		var got any
		_ = json.Unmarshal(raw, &got) // valid JSON: the whole body decoded
		if neutral(got, r.neutral) {
			continue
		}
		return &RequestError{Param: name, Message: r.why}
	}
	return nil
}

// zeroBytes is as large as the largest struct refuse is given.
var zeroBytes [max(unsafe.Sizeof(rawRefused{}), unsafe.Sizeof(rawChatRefused{}))]byte

func neutral(got any, values []any) bool {
	for _, n := range values {
		if reflect.DeepEqual(got, n) {
			return true
		}
	}
	return false
}

// chatLogprobs reads chat's logprobs (a bool) and top_logprobs into Sampling.Logprobs, as vLLM
// does: top_logprobs alone is refused.
func chatLogprobs(logprobs json.RawMessage, top *int) (*int, error) {
	want := false
	if l := bytes.TrimSpace(logprobs); len(l) > 0 && string(l) != "null" {
		if json.Unmarshal(l, &want) != nil {
			return nil, Invalid("logprobs", "want true or false (top_logprobs says how many alternatives)")
		}
	}
	n := 0
	if top != nil {
		if *top < 0 || *top > MaxLogprobs {
			return nil, Invalid("top_logprobs", "%d (want 0..%d)", *top, MaxLogprobs)
		}
		if *top > 0 && !want {
			return nil, Invalid("top_logprobs", "top_logprobs needs logprobs: true")
		}
		n = *top
	}
	if !want {
		return nil, nil
	}
	return &n, nil
}

// completionLogprobs reads completions' logprobs (how many alternatives).
func completionLogprobs(logprobs json.RawMessage) (*int, error) {
	l := bytes.TrimSpace(logprobs)
	if len(l) == 0 || string(l) == "null" {
		return nil, nil
	}
	var n int
	if err := json.Unmarshal(l, &n); err != nil {
		return nil, Invalid("logprobs", "want an integer 0..%d", MaxLogprobs)
	}
	if n < 0 || n > MaxLogprobs {
		return nil, Invalid("logprobs", "%d (want 0..%d)", n, MaxLogprobs)
	}
	return &n, nil
}

// RequestIDOK says whether id can be a request id: 1..128 bytes of letters, digits and
// - _ . : (it goes to logs, headers and engines unchanged).
func RequestIDOK(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// requestID checks vLLM's request_id body field.
func requestID(id *string) (string, error) {
	if id == nil {
		return "", nil
	}
	if !RequestIDOK(*id) {
		return "", Invalid("request_id", "want 1..128 letters, digits, '-', '_', '.' or ':'")
	}
	return *id, nil
}
