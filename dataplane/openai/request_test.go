package openai

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	fastjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"

	"dataplane/dataplane/sequence"
)

func TestParseChatMultimodal(t *testing.T) {
	wav := base64.StdEncoding.EncodeToString([]byte("RIFF....WAVE"))
	body := `{
		"model": "llava",
		"messages": [
			{"role": "system", "content": "be brief"},
			{"role": "user", "content": [
				{"type": "text", "text": "compare"},
				{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "img-1"},
				{"type": "image_url", "uuid": "img-2"},
				{"type": "input_audio", "input_audio": {"data": "` + wav + `", "format": "WAV"}},
				{"type": "video_url", "video_url": {"url": "file:///media/clip.mp4"}}
			]},
			{"role": "assistant", "content": null}
		],
		"stream": true, "stream_options": {"include_usage": true},
		"max_completion_tokens": 64, "temperature": 0.2, "stop": "\n\n", "seed": 7,
		"cache_policy": "keep:10m", "cache_salt": "tenant-a", "text_fallback": true, "priority": "batch",
		"unknown_field": {"ignored": true}
	}`
	req, err := ParseChat([]byte(body), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, "llava", req.Model)
	require.True(t, req.Stream)
	require.True(t, req.IncludeUsage)
	require.Equal(t, 64, req.Sampling.MaxTokens)
	require.Equal(t, []string{"\n\n"}, req.Sampling.Stop)
	require.Equal(t, Extensions{CachePolicy: "keep:10m", TextFallback: true, CacheSalt: "tenant-a", Priority: "batch"}, req.Ext)
	require.Len(t, req.Messages, 3)
	require.Len(t, req.Media, 4)
	require.Equal(t, Media{Modality: sequence.Image, URL: "data:image/png;base64,AAAA", UUID: "img-1", Path: "messages[1].content[1]"}, *req.Media[0])
	require.Equal(t, Media{Modality: sequence.Image, UUID: "img-2", Path: "messages[1].content[2]"}, *req.Media[1])
	require.Equal(t, []byte("RIFF....WAVE"), req.Media[2].Data)
	require.Equal(t, "wav", req.Media[2].Format)
	require.Equal(t, sequence.Video, req.Media[3].Modality)
	require.Same(t, req.Media[0], req.Messages[1].Parts[1].Media, "messages and the media list share items")
	require.True(t, req.Messages[1].Parts[0].IsText)
	require.Empty(t, req.Messages[2].Parts)
}

// Each bad request is a *RequestError whose param names the offending part.
func TestParseChatErrors(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxMediaItems = 2
	f := func(body, param, msg string) {
		t.Helper()
		_, err := ParseChat([]byte(body), lim)
		var re *RequestError
		require.True(t, errors.As(err, &re), "%v", err)
		require.Equal(t, param, re.Param, "%v", err)
		require.Contains(t, re.Message, msg)
	}
	user := func(parts string) string { return `{"messages":[{"role":"user","content":[` + parts + `]}]}` }
	f(``, "", "empty request body")
	f(`[1]`, "", "not a JSON object")
	f(`{"messages": [`, "", "malformed JSON")
	f(`{"messages": "hi"}`, "messages", "want an array, got string")
	f(`{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}`, "max_tokens", "want an integer, got string")
	f(`{"messages": []}`, "messages", "at least one message")
	f(`{"messages":[{"role":"wizard","content":"x"}]}`, "messages[0].role", `role "wizard"`)
	f(`{"messages":[{"role":"user"}]}`, "messages[0].content", "content is required")
	f(`{"messages":[{"role":"user","content":5}]}`, "messages[0].content", "want a string or an array")
	f(user(`{"type":"text"}`), "messages[0].content[0].text", "needs text")
	f(user(`{"text":"x"}`), "messages[0].content[0].type", "needs a type")
	f(user(`{"type":"image"}`), "messages[0].content[0].type", `unsupported content part type "image"`)
	f(user(`{"type":"image_url","image_url":{"url":"  "}}`), "messages[0].content[0].image_url.url", "needs image_url.url")
	f(user(`{"type":"video_url"}`), "messages[0].content[0].video_url.url", "needs video_url.url")
	f(user(`{"type":"input_audio","input_audio":{"data":"%%%","format":"wav"}}`), "messages[0].content[0].input_audio.data", "bad base64")
	f(user(`{"type":"input_audio","input_audio":{"data":"AAAA"}}`), "messages[0].content[0].input_audio.format", "needs a format")
	f(user(`{"type":"image_url","uuid":"a"},{"type":"image_url","uuid":"b"},{"type":"image_url","uuid":"c"}`),
		"messages[0].content[2]", "more than 2 media items")
	f(`{"messages":[{"role":"system","content":[{"type":"image_url","uuid":"a"}]}]}`, "messages[0].content[0]", "only allowed in user messages")
	f(user(`{"type":"image_url","uuid":"`+strings.Repeat("u", MaxUUIDBytes+1)+`"}`), "messages[0].content[0].uuid", "1025 bytes, at most 1024")
	f(`{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, "max_tokens", "want 1..")
	f(`{"messages":[{"role":"user","content":"x"}],"temperature":3}`, "temperature", "want 0..2")
	f(`{"messages":[{"role":"user","content":"x"}],"top_p":0}`, "top_p", "0 < top_p <= 1")
	f(`{"messages":[{"role":"user","content":"x"}],"n":2}`, "n", "only n = 1")
	f(`{"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}`, "stop", "at most 4")
	f(`{"messages":[{"role":"user","content":"x"}],"stream_options":{}}`, "stream_options", "only allowed with stream")
	f(`{"messages":[{"role":"user","content":"x"}],"priority":"urgent"}`, "priority", `"urgent"`)
}

func TestParseCompletion(t *testing.T) {
	req, err := ParseCompletion([]byte(`{"model":"m","prompt":"Once upon"}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, "Once upon", req.Prompt)
	require.Equal(t, 16, req.Sampling.MaxTokens, "OpenAI's default")
	req, err = ParseCompletion([]byte(`{"prompt":[[1,2,3]],"max_tokens":5}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 3}, req.PromptIDs)
	req, err = ParseCompletion([]byte(`{"prompt":["one"]}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, "one", req.Prompt)
	require.False(t, req.IncludeUsage)
	req, err = ParseCompletion([]byte(`{"prompt":"x","stream":true,"stream_options":{"include_usage":true}}`), DefaultLimits())
	require.NoError(t, err)
	require.True(t, req.IncludeUsage)
	for body, msg := range map[string]string{
		`{}`:                              "prompt is required",
		`{"prompt":["a","b"]}`:            "batches are not supported",
		`{"prompt":[1,-2]}`:               "token id -2 out of range",
		`{"prompt":{"x":1}}`:              "want a string or a list of token ids",
		`{"prompt":"x","max_tokens":-1}`:  "want 1..",
		`{"prompt":"x","max_tokens":"5"}`: "max_tokens: want an integer",
		`{"prompt":"x","stream_options":{"include_usage":true}}`: "only allowed with stream",
	} {
		_, err := ParseCompletion([]byte(body), DefaultLimits())
		require.ErrorContains(t, err, msg, body)
	}
}

func TestParsePretokenized(t *testing.T) {
	req, err := ParsePretokenized([]byte(`{"token_ids":[1,99,2],"media":[{"modality":"image","data":"AAEC","uuid":"u"},
		{"modality":"audio","url":"file:///a.wav"}],"placeholder_style":"expanded","max_tokens":3}`), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, []int32{1, 99, 2}, req.TokenIDs)
	require.Equal(t, "expanded", req.Style)
	require.Equal(t, []byte{0, 1, 2}, req.Media[0].Data)
	require.Equal(t, "media[1]", req.Media[1].Path)
	for body, want := range map[string]string{
		`{"media":[]}`: "token_ids is required",
		`{"token_ids":[1],"placeholder_style":"dense"}`:                                               `"dense"`,
		`{"token_ids":[1],"n":2}`:                                                                     "only n = 1",
		`{"token_ids":[1],"media":[{"modality":"smell","uuid":"x"}]}`:                                 `media[0].modality: modality "smell"`,
		`{"token_ids":[1],"media":[{"modality":"image","uuid":"` + strings.Repeat("u", 2000) + `"}]}`: "media[0].uuid: 2000 bytes, at most 1024",
		`{"token_ids":[1],"media":[{"modality":"image"}]}`:                                            "media[0]: a media item needs url, data or a uuid",
		`{"token_ids":[1],"media":[{"modality":"image","url":"x","data":"AA"}]}`:                      "media[0]: give url or data, not both",
	} {
		_, err := ParsePretokenized([]byte(body), DefaultLimits())
		require.ErrorContains(t, err, want, body)
	}
}

// Any body: a request or a *RequestError, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}},{"type":"text","text":"x"}]}]}`))
	f.Add([]byte(`{"prompt":[[1,2]],"stop":["a"]}`))
	f.Add([]byte(`{"token_ids":[5],"media":[{"modality":"audio","data":"AAAA"}]}`))
	// the sampling and output fields, forwarded or refused
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2,"logit_bias":{"5":-1},` +
		`"stop_token_ids":[1],"top_k":5,"min_p":0.1,"repetition_penalty":1.2,"min_tokens":1,"max_tokens":4,"ignore_eos":true,` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{}}},"tool_choice":"none","user":"u"}`))
	f.Add([]byte(`{"prompt":"x","logprobs":3,"echo":false,"structured_outputs":{"choice":["a","b"]},"request_id":"r-1",` +
		`"skip_special_tokens":false,"bad_words":["b"],"allowed_token_ids":[3],"presence_penalty":1,"seed":-1}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":"a","tool_calls":[]}],"tools":null,"use_beam_search":false,"best_of":1,"echo":true}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(s *Sampling, err error) {
			if err == nil {
				s.Given()
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not a *RequestError", err)
			}
		}
		var s Sampling
		c, err := ParseChat(body, DefaultLimits())
		if err == nil {
			s = c.Sampling
		}
		check(&s, err)
		p, err := ParseCompletion(body, DefaultLimits())
		if err == nil {
			s = p.Sampling
		}
		check(&s, err)
		pt, err := ParsePretokenized(body, DefaultLimits())
		if err == nil {
			s = pt.Sampling
		}
		check(&s, err)
	})
}

// unquote's fast path (no escapes, valid UTF-8: the bytes between the quotes) decodes every
// string literal as encoding/json does.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`""`, `"The quick brown fox"`, `"caf\u00e9 \"q\" \\ \/"`, "\"caf\xc3\xa9\"", "\"bad \xff utf8\"",
		`"\ud83d\ude00"`, `"<&>"`, "\"\u2028\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, lit []byte) {
		var want string
		if json.Unmarshal(lit, &want) != nil || len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
			return // not a bare string literal: unquote is only given checked ones
		}
		got, err := unquote(lit)
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
}

// decodeBodies are request bodies for the decode tests: valid ones of each endpoint, and the
// edges where two JSON decoders may part (case-insensitive names, duplicate keys, escapes,
// invalid UTF-8, numbers out of range, trailing data, type errors).
var decodeBodies = []string{
	`{"prompt":"The quick brown fox","max_tokens":1}`,
	`{"prompt":"a","max_tokens":"x"}`,
	`{"prompt":"b"}` + "\n",
	`{"prompt":"c","stream":true,"stream_options":{"include_usage":true}}`,
	`{"prompt":"d"} {"prompt":"e"}`,
	`{"prompt":"f"`,
	`  {"prompt":[1,2],"echo":true}  `,
	`{"prompt":"g","max_tokens":2}x`,
	`[]`, ``, `{"PROMPT":"case","Max_Tokens":3,"mAx_tOkEnS":4}`,
	`{"prompt":"h","temperature":0.5,"seed":7,"add_special_tokens":false}`,
	`{"prompt":"i","max_tokens":1e2}`, `{"prompt":"j","max_tokens":99999999999999999999}`,
	`{"prompt":"k\u00e9\ud83d\ude00\/","prompt":"dup"}`, "{\"prompt\":\"\xff\xfe\"}",
	`{"prompt":"l","logprobs":3,"stop":["a","b"],"n":null,"best_of":1}`,
	`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_completion_tokens":8,"temperature":0.7}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}],"logprobs":true,"top_logprobs":2}`,
	`{"messages":{"role":"user"}}`, `{"messages":[{"role":1}]}`,
	`{"prompt_token_ids":[1,2,3],"media":[{"modality":"image","data":"AAAA","format":"png"}],"style":"qwen2-vl"}`,
	`{"prompt":"m","tools":[],"tool_choice":"none","parallel_tool_calls":false,"response_format":{"type":"text"}}`,
}

// decodeTargets are the bodies' Go types, one of each endpoint's.
var decodeTargets = []func() any{
	func() any { return new(rawCompletion) },
	func() any { return new(rawChat) },
	func() any { return new(rawPretokenized) },
}

// decode's fast decoder (segmentio's) gives what encoding/json gives whenever it accepts a
// body, and decode answers as encoding/json alone would: the same fields, or the same error.
func TestDecodeMatchesStd(t *testing.T) {
	for _, b := range decodeBodies {
		for _, target := range decodeTargets {
			checkFastDecode(t, []byte(b), target)
			want, got := target(), target()
			werr := stdDecode([]byte(b), want)
			gerr := decode([]byte(b), got)
			require.Equal(t, werr, gerr, "%q", b)
			if werr == nil {
				require.Equal(t, want, got, "%q", b)
			}
		}
	}
}

// The same, fuzzed, on each endpoint's body type.
func FuzzDecodeMatchesStd(f *testing.F) {
	for _, b := range decodeBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, target := range decodeTargets {
			checkFastDecode(t, body, target)
		}
	})
}

// checkFastDecode fails t when the fast decoder accepts body but encoding/json does not, or
// decodes it differently.
func checkFastDecode(t *testing.T, body []byte, target func() any) {
	t.Helper()
	fast, std := target(), target()
	if fastjson.Unmarshal(body, fast) != nil {
		return // decode falls back to encoding/json
	}
	if err := json.Unmarshal(body, std); err != nil {
		t.Fatalf("%q into %T: the fast decoder accepts it, encoding/json says %v", body, fast, err)
	}
	if !reflect.DeepEqual(std, fast) {
		t.Fatalf("%q into %T: encoding/json %+v, the fast decoder %+v", body, fast, std, fast)
	}
}

// stdDecode is decode with encoding/json alone: what decode must answer.
func stdDecode(body []byte, v any) error { return decodeWith(body, v, nil) }
