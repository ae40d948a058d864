package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// Completion.AppendJSON writes what encoding/json writes (the reference), for any strings
// (HTML characters, control characters, invalid UTF-8, U+2028), counts, and with or without
// each optional part.
func FuzzCompletionJSON(f *testing.F) {
	f.Add("cmpl-1", "mock", " t1 t2", "length", 3, 1, 2, true, false, false, true)
	f.Add("a\"<b>&\\c\x00\x1f\x7f", "m\u2028\u2029é", "bad \xff\xfe utf8 \U0001F600", "", -1, 0, 1<<40, false, true, true, false)
	f.Add("", "", "\b\f\n\r\t", "stop", 0, 0, 0, true, true, false, true)
	f.Fuzz(func(t *testing.T, id, model, text, finish string, prompt, cached, created int, usage, details, logprobs, choices bool) {
		c := Completion{ID: id, Object: "text_completion", Created: int64(created), Model: model}
		if choices {
			ch := CompletionChoice{Index: prompt & 3, Text: text}
			if finish != "" {
				ch.FinishReason = &finish
			}
			if logprobs {
				lp := -0.5
				ch.Logprobs = &CompletionLogprobs{TextOffset: []int{0}, TokenLogprobs: []*float64{&lp}, Tokens: []string{text},
					TopLogprobs: []TopLogprobs{nil}}
			}
			c.Choices = []CompletionChoice{ch, {Text: finish}}
		}
		if usage {
			c.Usage = &Usage{PromptTokens: prompt, CompletionTokens: cached, TotalTokens: prompt + cached}
			if details {
				c.Usage.PromptTokensDetails = &PromptTokensDetails{CachedTokens: cached}
			}
		}
		want, err := json.Marshal(c)
		require.NoError(t, err)
		got, err := c.AppendJSON([]byte("prefix"))
		require.NoError(t, err)
		require.Equal(t, "prefix"+string(want), string(got))
	})
}
