package worker

import (
	"encoding/json"
	"strconv"

	"dataplane/dataplane/openai"
)

// sampling are the sampling and output fields of the engine's /v1/completions request, with
// vLLM's names (vllm/entrypoints/openai/completion/protocol.py CompletionRequest at 002032ee;
// response_format is taken there too, as on chat). Fields not given are left out: the
// engine's defaults (its generation_config's, in vLLM) apply.
type sampling struct {
	MaxTokens                  int                `json:"max_tokens,omitempty"`
	Temperature                *float64           `json:"temperature,omitempty"`
	TopP                       *float64           `json:"top_p,omitempty"`
	TopK                       *int               `json:"top_k,omitempty"`
	MinP                       *float64           `json:"min_p,omitempty"`
	Seed                       *int64             `json:"seed,omitempty"`
	Stop                       []string           `json:"stop,omitempty"`
	StopTokenIDs               []int32            `json:"stop_token_ids,omitempty"`
	IncludeStopStrInOutput     bool               `json:"include_stop_str_in_output,omitempty"`
	PresencePenalty            *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty           *float64           `json:"frequency_penalty,omitempty"`
	RepetitionPenalty          *float64           `json:"repetition_penalty,omitempty"`
	LogitBias                  map[string]float64 `json:"logit_bias,omitempty"`
	AllowedTokenIDs            []int32            `json:"allowed_token_ids,omitempty"`
	BadWords                   []string           `json:"bad_words,omitempty"`
	MinTokens                  int                `json:"min_tokens,omitempty"`
	IgnoreEOS                  bool               `json:"ignore_eos,omitempty"`
	SkipSpecialTokens          *bool              `json:"skip_special_tokens,omitempty"`
	SpacesBetweenSpecialTokens *bool              `json:"spaces_between_special_tokens,omitempty"`
	Logprobs                   *int               `json:"logprobs,omitempty"`
	ResponseFormat             json.RawMessage    `json:"response_format,omitempty"`
	StructuredOutputs          json.RawMessage    `json:"structured_outputs,omitempty"`
}

func samplingOf(s *openai.Sampling) sampling {
	out := sampling{MaxTokens: s.MaxTokens, Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP,
		Seed: s.Seed, Stop: s.Stop, StopTokenIDs: s.StopTokenIDs, IncludeStopStrInOutput: s.IncludeStopStrInOutput,
		PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty, RepetitionPenalty: s.RepetitionPenalty,
		AllowedTokenIDs: s.AllowedTokenIDs, BadWords: s.BadWords, MinTokens: s.MinTokens, IgnoreEOS: s.IgnoreEOS,
		SkipSpecialTokens: s.SkipSpecialTokens, SpacesBetweenSpecialTokens: s.SpacesBetweenSpecialTokens,
		Logprobs: s.Logprobs, ResponseFormat: s.ResponseFormat, StructuredOutputs: s.StructuredOutputs}
	if len(s.LogitBias) > 0 {
		out.LogitBias = make(map[string]float64, len(s.LogitBias))
		for id, b := range s.LogitBias {
			out.LogitBias[strconv.Itoa(int(id))] = b
		}
	}
	return out
}
