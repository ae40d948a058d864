package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// Logprobs come back from vLLM's /v1/completions in the completions layout (vLLM's
// CompletionLogProbs, vllm/entrypoints/openai/completion/serving.py
// _create_completion_logprobs at 030ea52e): per token its text, its logprob (null for a
// prompt token that has none), its alternatives (an object, in the engine's order: the sampled
// token first, then by rank; logprobs+1 entries at most) and its offset in the text. The chat
// layout is made from it as vLLM's chat endpoint makes its own
// (chat_completion/serving.py _create_chat_logprobs / _get_top_logprobs at 006c49d4).

// CompletionLogprobs are a completion's logprobs, or a streamed chunk's.
type CompletionLogprobs struct {
	TextOffset    []int         `json:"text_offset"`
	TokenLogprobs []*float64    `json:"token_logprobs"`
	Tokens        []string      `json:"tokens"`
	TopLogprobs   []TopLogprobs `json:"top_logprobs"`
}

// Append adds o's tokens (the next chunk's) after l's.
func (l *CompletionLogprobs) Append(o *CompletionLogprobs) {
	l.TextOffset = append(l.TextOffset, o.TextOffset...)
	l.TokenLogprobs = append(l.TokenLogprobs, o.TokenLogprobs...)
	l.Tokens = append(l.Tokens, o.Tokens...)
	l.TopLogprobs = append(l.TopLogprobs, o.TopLogprobs...)
}

// Check says whether the four lists are as long as each other (an engine's answer that is not
// cannot be converted).
func (l *CompletionLogprobs) Check() error {
	n := len(l.Tokens)
	if len(l.TextOffset) != n || len(l.TokenLogprobs) != n || len(l.TopLogprobs) != n {
		return errors.New("logprobs: tokens, token_logprobs, top_logprobs and text_offset differ in length")
	}
	return nil
}

// TokenLogprob is one alternative: a token's text and its logprob.
type TokenLogprob struct {
	Token   string
	Logprob float64
}

// TopLogprobs are one token's alternatives, written as a JSON object whose order is kept
// (Go maps lose it); nil is null.
type TopLogprobs []TokenLogprob

// MarshalJSON writes {"token": logprob, ...} in order, or null.
func (t TopLogprobs) MarshalJSON() ([]byte, error) {
	if t == nil {
		return []byte("null"), nil
	}
	b := []byte{'{'}
	for i, e := range t {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(e.Token)
		if err != nil {
			return nil, err
		}
		b = append(append(b, k...), ':')
		b = strconv.AppendFloat(b, e.Logprob, 'g', -1, 64)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads an object (keeping its order) or null.
func (t *TopLogprobs) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if string(data) == "null" {
		*t = nil
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("top_logprobs: want an object of token → logprob")
	}
	out := TopLogprobs{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		var v float64
		if err := dec.Decode(&v); err != nil {
			return errors.New("top_logprobs: a logprob is not a number")
		}
		out = append(out, TokenLogprob{Token: tok.(string), Logprob: v})
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	*t = out
	return nil
}

// ChatLogprobs are a chat answer's logprobs (OpenAI's chat layout).
type ChatLogprobs struct {
	Content []ChatLogprob `json:"content"`
}

// ChatLogprob is one generated token: its text, logprob, UTF-8 bytes and alternatives.
type ChatLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []ChatTopLogprob `json:"top_logprobs"`
}

// ChatTopLogprob is one alternative.
type ChatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// unlikely is the logprob OpenAI and vLLM write for a token that has none.
const unlikely = -9999.0

// ChatLogprobsOf writes completions-layout logprobs in the chat layout, with top alternatives
// per token (chat's top_logprobs): the first top of the token's alternatives, in the engine's
// order, as vLLM's chat endpoint takes them. (The completions layout is keyed by token text,
// so two alternatives that decode to the same text arrive as one.)
func ChatLogprobsOf(l *CompletionLogprobs, top int) *ChatLogprobs {
	out := &ChatLogprobs{Content: make([]ChatLogprob, len(l.Tokens))}
	for i, tok := range l.Tokens {
		c := ChatLogprob{Token: tok, Logprob: unlikely, Bytes: utf8Bytes(tok), TopLogprobs: []ChatTopLogprob{}}
		if i < len(l.TokenLogprobs) && l.TokenLogprobs[i] != nil {
			c.Logprob = *l.TokenLogprobs[i]
		}
		if i < len(l.TopLogprobs) {
			for _, alt := range l.TopLogprobs[i][:min(top, len(l.TopLogprobs[i]))] {
				c.TopLogprobs = append(c.TopLogprobs, ChatTopLogprob{Token: alt.Token, Logprob: alt.Logprob, Bytes: utf8Bytes(alt.Token)})
			}
		}
		out.Content[i] = c
	}
	return out
}

// utf8Bytes are s's bytes as JSON numbers (a []byte would be base64).
func utf8Bytes(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
