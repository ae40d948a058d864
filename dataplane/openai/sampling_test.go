package openai

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const chatMsgs = `"messages":[{"role":"user","content":"hi"}]`

// Every forwarded field, as a client writes it, arrives in Sampling as vLLM means it.
func TestParseSamplingFields(t *testing.T) {
	body := `{` + chatMsgs + `, "max_completion_tokens": 50, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
		"min_p": 0.05, "seed": -3, "stop": ["x", "y"], "stop_token_ids": [2, 7], "include_stop_str_in_output": true,
		"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
		"logit_bias": {"50256": -100, "7": 2.5}, "allowed_token_ids": [1, 2, 3], "bad_words": ["darn"],
		"min_tokens": 4, "ignore_eos": true, "skip_special_tokens": false, "spaces_between_special_tokens": false,
		"logprobs": true, "top_logprobs": 3, "user": "u-1", "n": 1, "parallel_tool_calls": false, "tool_choice": "none",
		"response_format": {"type": "json_schema", "json_schema": {"name": "point", "schema": {"type": "object"}}},
		"structured_outputs": {"regex": "[a-z]+"}, "request_id": "req-1:a.b_c",
		"use_beam_search": false, "add_generation_prompt": true, "best_of": 1, "echo": false}`
	req, err := ParseChat([]byte(body), DefaultLimits())
	require.NoError(t, err)
	s := req.Sampling
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	seed, no := int64(-3), false
	require.Equal(t, Sampling{MaxTokens: 50, Temperature: f(0.7), TopP: f(0.9), TopK: i(40), MinP: f(0.05), Seed: &seed,
		Stop: []string{"x", "y"}, StopTokenIDs: []int32{2, 7}, IncludeStopStrInOutput: true, PresencePenalty: f(0.5),
		FrequencyPenalty: f(-0.5), RepetitionPenalty: f(1.1), LogitBias: map[int32]float64{50256: -100, 7: 2.5},
		AllowedTokenIDs: []int32{1, 2, 3}, BadWords: []string{"darn"}, MinTokens: 4, IgnoreEOS: true,
		SkipSpecialTokens: &no, SpacesBetweenSpecialTokens: &no, Logprobs: i(3),
		ResponseFormat:    json.RawMessage(`{"type":"json_schema","json_schema":{"name":"point","schema":{"type":"object"}}}`),
		StructuredOutputs: json.RawMessage(`{"regex":"[a-z]+"}`)}, s)
	require.Equal(t, "req-1:a.b_c", req.Ext.RequestID)
	require.Equal(t, []string{"temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
		"include_stop_str_in_output", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
		"allowed_token_ids", "bad_words", "min_tokens", "ignore_eos", "skip_special_tokens",
		"spaces_between_special_tokens", "logprobs", "response_format", "structured_outputs"}, s.Given())

	// chat: logprobs true alone is the sampled token's logprob (top_logprobs 0); false is none.
	req, err = ParseChat([]byte(`{`+chatMsgs+`,"logprobs":true}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, 0, *req.Sampling.Logprobs)
	req, err = ParseChat([]byte(`{`+chatMsgs+`,"logprobs":false,"top_logprobs":0,"response_format":{"type":"text"}}`), DefaultLimits())
	require.NoError(t, err)
	require.Nil(t, req.Sampling.Logprobs)
	require.Nil(t, req.Sampling.ResponseFormat, "text is no constraint")
	require.Empty(t, req.Sampling.Given())

	// completions: logprobs is a count; echo and add_special_tokens are the daemon's.
	c, err := ParseCompletion([]byte(`{"prompt":"x","logprobs":2,"add_special_tokens":false,"response_format":{"type":"json_object"}}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, 2, *c.Sampling.Logprobs)
	require.False(t, c.AddSpecialTokens)
	require.JSONEq(t, `{"type":"json_object"}`, string(c.Sampling.ResponseFormat))
	c, err = ParseCompletion([]byte(`{"prompt":"x","echo":true}`), DefaultLimits())
	require.NoError(t, err)
	require.True(t, c.Echo)
	require.True(t, c.AddSpecialTokens)
	p, err := ParsePretokenized([]byte(`{"token_ids":[1],"logprobs":0,"seed":9}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, 0, *p.Sampling.Logprobs)
	require.Equal(t, []string{"seed", "logprobs"}, p.Sampling.Given())

	// Values that ask for nothing are not "given".
	neutral, err := ParseChat([]byte(`{`+chatMsgs+`,"temperature":1,"top_p":1,"top_k":-1,"min_p":0,"presence_penalty":0,
		"frequency_penalty":0,"repetition_penalty":1,"stop":[],"logit_bias":{},"min_tokens":0,"skip_special_tokens":true}`), DefaultLimits())
	require.NoError(t, err)
	require.Empty(t, neutral.Sampling.Given())
}

// A bad value is a *RequestError naming the field.
func TestParseSamplingErrors(t *testing.T) {
	f := func(fields, param, msg string) {
		t.Helper()
		_, err := ParseChat([]byte(`{`+chatMsgs+`,`+fields+`}`), DefaultLimits())
		var re *RequestError
		require.True(t, errors.As(err, &re), "%s: %v", fields, err)
		require.Equal(t, param, re.Param, "%s: %v", fields, err)
		require.Contains(t, re.Message, msg, fields)
	}
	f(`"temperature":-0.1`, "temperature", "want 0..2")
	f(`"top_k":-2`, "top_k", "want -1 or 0")
	f(`"top_k":1.5`, "top_k", "want an integer")
	f(`"min_p":1.5`, "min_p", "want 0..1")
	f(`"presence_penalty":2.5`, "presence_penalty", "want -2..2")
	f(`"frequency_penalty":-3`, "frequency_penalty", "want -2..2")
	f(`"repetition_penalty":0`, "repetition_penalty", "0 < repetition_penalty")
	f(`"seed":"7"`, "seed", "want an integer")
	f(`"stop":5`, "stop", "want a string or a list")
	f(`"stop_token_ids":[1,-1]`, "stop_token_ids[1]", "out of range")
	f(`"stop_token_ids":"1"`, "stop_token_ids", "want an array")
	f(`"allowed_token_ids":[4294967296]`, "allowed_token_ids[0]", "out of range")
	f(`"logit_bias":{"abc":1}`, "logit_bias", `key "abc" is not a token id`)
	f(`"logit_bias":{"5":101}`, "logit_bias", "want -100..100")
	f(`"logit_bias":[1]`, "logit_bias", "want an object")
	f(`"bad_words":"x"`, "bad_words", "want an array")
	f(`"max_tokens":5,"min_tokens":6`, "min_tokens", "want 0..max_tokens")
	f(`"min_tokens":-1`, "min_tokens", "want 0..max_tokens")
	f(`"ignore_eos":1`, "ignore_eos", "want true or false")
	f(`"skip_special_tokens":"no"`, "skip_special_tokens", "want true or false")
	f(`"logprobs":3`, "logprobs", "want true or false")
	f(`"top_logprobs":2`, "top_logprobs", "needs logprobs: true")
	f(`"logprobs":true,"top_logprobs":21`, "top_logprobs", "want 0..20")
	f(`"logprobs":true,"top_logprobs":-1`, "top_logprobs", "want 0..20")
	f(`"response_format":"json"`, "response_format", "want an object")
	f(`"response_format":{"type":"yaml"}`, "response_format.type", `"yaml"`)
	f(`"response_format":{"type":"json_schema"}`, "response_format.json_schema", "needs json_schema")
	f(`"response_format":{"type":"json_schema","json_schema":{"schema":{}}}`, "response_format.json_schema.name", "needs a name")
	f(`"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":[1]}}`, "response_format.json_schema.schema", "want a JSON schema object")
	f(`"structured_outputs":{"json":{},"regex":"a"}`, "structured_outputs", "one kind")
	f(`"structured_outputs":[1]`, "structured_outputs", "want an object")
	f(`"user":7`, "user", "want a string")
	f(`"user":"`+strings.Repeat("u", 1025)+`"`, "user", "at most 1024")
	f(`"request_id":"has space"`, "request_id", "want 1..128")
	f(`"request_id":"`+strings.Repeat("r", 129)+`"`, "request_id", "want 1..128")
	f(`"tool_choice":"auto"`, "tool_choice", "needs tools")
	f(`"tool_choice":{"type":"function","function":{"name":"f"}}`, "tool_choice", "needs tools")
	f(`"parallel_tool_calls":"yes"`, "parallel_tool_calls", "want true or false")
	f(`"n":3`, "n", "only n = 1")
	_, err := ParseChat([]byte(`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`), DefaultLimits())
	require.ErrorContains(t, err, "messages[0].tool_calls: tool calls are not supported")

	for body, msg := range map[string]string{
		`{"prompt":"x","logprobs":true}`:           "logprobs: want an integer",
		`{"prompt":"x","logprobs":21}`:             "logprobs: 21 (want 0..20)",
		`{"prompt":"x","logprobs":1,"echo":true}`:  "echo: echo with logprobs is not supported",
		`{"prompt":"x","add_special_tokens":"no"}`: "add_special_tokens: want true or false",
		`{"prompt":"x","suffix":"end"}`:            "suffix: not supported",
		`{"prompt":"x","prompt_embeds":"AAAA"}`:    "prompt_embeds: clients send media",
	} {
		_, err := ParseCompletion([]byte(body), DefaultLimits())
		require.ErrorContains(t, err, msg, body)
	}
}

// Every refused field is a 400 naming it unless its value asks for nothing; tools says why.
func TestRefusedFields(t *testing.T) {
	chatOnly := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeFor[rawRefused](), reflect.TypeFor[rawChatRefused]()} {
		for i := range typ.NumField() {
			name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
			_, ok := refusals[name]
			require.True(t, ok, "%s has no refusal entry", name)
			chatOnly[name] = typ == reflect.TypeFor[rawChatRefused]()
		}
	}
	require.Len(t, chatOnly, len(refusals), "every refusal entry has a field")
	for name, r := range refusals {
		body := `{` + chatMsgs + `,"` + name + `":{"x":1}}`
		_, err := ParseChat([]byte(body), DefaultLimits())
		var re *RequestError
		require.True(t, errors.As(err, &re), "%s: %v", name, err)
		require.Equal(t, name, re.Param)
		require.Equal(t, r.why, re.Message)
		for _, n := range r.neutral {
			v, _ := json.Marshal(n)
			_, err := ParseChat([]byte(`{`+chatMsgs+`,"`+name+`":`+string(v)+`}`), DefaultLimits())
			require.NoError(t, err, "%s: %s asks for nothing", name, v)
		}
		_, err = ParseChat([]byte(`{`+chatMsgs+`,"`+name+`":null}`), DefaultLimits())
		require.NoError(t, err, name)
		if !chatOnly[name] {
			_, err := ParseCompletion([]byte(`{"prompt":"x","`+name+`":{"x":1}}`), DefaultLimits())
			require.ErrorContains(t, err, name+": ", "completions refuse %s too", name)
		}
	}
	_, err := ParseChat([]byte(`{`+chatMsgs+`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`), DefaultLimits())
	require.ErrorContains(t, err, "tools: tool calls are not supported: vLLM parses tool calls")
}

func TestRequestIDOK(t *testing.T) {
	for _, id := range []string{"a", "req-123", "0f8fad5b-d9cb-469f-a165-70867728950e", "trace:span.1_2", strings.Repeat("x", 128)} {
		require.True(t, RequestIDOK(id), id)
	}
	for _, id := range []string{"", "a b", "a/b", "a\"b", "a\nb", "é", strings.Repeat("x", 129), "a;b", "<script>"} {
		require.False(t, RequestIDOK(id), id)
	}
}

type logprobsCase struct {
	Name   string `json:"name"`
	K      int    `json:"k"`
	Chunks []struct {
		Text     string             `json:"text"`
		Logprobs CompletionLogprobs `json:"logprobs"`
	} `json:"chunks"`
	Text       string             `json:"text"`
	Completion CompletionLogprobs `json:"completion"`
	Chat       json.RawMessage    `json:"chat"`
}

func loadLogprobs(t *testing.T) []logprobsCase {
	t.Helper()
	raw, err := os.ReadFile("testdata/logprobs.json")
	require.NoError(t, err)
	var cases []logprobsCase
	require.NoError(t, json.Unmarshal(raw, &cases))
	require.NotEmpty(t, cases)
	return cases
}

// The chunks the engine streams add up to the whole completion's logprobs, and the chat
// layout made from them is what vLLM's chat endpoint answers (testdata/gen_logprobs.py).
func TestLogprobsAsVLLMWritesThem(t *testing.T) {
	for _, c := range loadLogprobs(t) {
		var all CompletionLogprobs
		for _, ch := range c.Chunks {
			require.NoError(t, ch.Logprobs.Check())
			all.Append(&ch.Logprobs)
		}
		require.Equal(t, c.Completion, all, c.Name)
		got, err := json.Marshal(ChatLogprobsOf(&all, c.K))
		require.NoError(t, err)
		require.JSONEq(t, string(c.Chat), string(got), c.Name)

		// The alternatives keep their order through a marshal and an unmarshal.
		b, err := json.Marshal(all)
		require.NoError(t, err)
		var back CompletionLogprobs
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, all, back, c.Name)
	}
	var top TopLogprobs
	require.NoError(t, json.Unmarshal([]byte(`{"b": -1, "a": -2e-3}`), &top))
	require.Equal(t, TopLogprobs{{"b", -1}, {"a", -0.002}}, top)
	b, _ := json.Marshal(top)
	require.Equal(t, `{"b":-1,"a":-0.002}`, string(b))
	require.NoError(t, json.Unmarshal([]byte(`null`), &top))
	require.Nil(t, top)
	for _, bad := range []string{`[1]`, `{"a":"x"}`, `{"a":1`, `7`} {
		require.Error(t, json.Unmarshal([]byte(bad), &top), bad)
	}
	require.Error(t, (&CompletionLogprobs{Tokens: []string{"a"}}).Check())
}

// Any completions-layout logprobs an engine may send: an error or a conversion, never a panic.
func FuzzLogprobs(f *testing.F) {
	f.Add([]byte(`{"text_offset":[0],"token_logprobs":[null],"tokens":["a"],"top_logprobs":[{"a":-1,"b":-2}]}`))
	f.Add([]byte(`{"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]}`))
	f.Add([]byte(`{"tokens":["x"],"top_logprobs":[null],"text_offset":[3],"token_logprobs":[-9999]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var l CompletionLogprobs
		if json.Unmarshal(data, &l) != nil || l.Check() != nil {
			return
		}
		for _, k := range []int{0, 1, MaxLogprobs} {
			c := ChatLogprobsOf(&l, k)
			if len(c.Content) != len(l.Tokens) {
				t.Fatalf("%d tokens became %d", len(l.Tokens), len(c.Content))
			}
			if _, err := json.Marshal(c); err != nil {
				t.Fatal(err)
			}
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back CompletionLogprobs
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	})
}
