package openai

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// Usage counts tokens as OpenAI does.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails says how many prompt tokens the engine found in its prefix cache,
	// when it says (vLLM with --enable-prompt-tokens-details; the mock engines always).
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is OpenAI's breakdown of the prompt tokens.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatCompletion is a non-streamed chat response.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // "chat.completion"
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

type ChatChoice struct {
	Index        int           `json:"index"`
	Message      ChatMessage   `json:"message"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatChunk is one streamed chat event.
type ChatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"` // "chat.completion.chunk"
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs,omitempty"`
	FinishReason *string       `json:"finish_reason"`
}

type ChatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

// Completion is a text completion response or streamed chunk (the same shape).
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// ModelList is GET /v1/models.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// Now is the Created timestamp for a response.
func Now() int64 { return time.Now().Unix() }

// AppendJSON appends c's JSON, byte for byte what json.Marshal(c) writes (FuzzCompletionJSON
// holds it to that): the completions answer is written for every request, and reflection made
// it a tenth of the text-only path's handler (issue 26). Logprobs, when there are any, are
// json.Marshal's; its error is the only one.
func (c *Completion) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, c.ID)
	b = append(b, `,"object":`...)
	b = appendJSONString(b, c.Object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, c.Created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, c.Model)
	b = append(b, `,"choices":`...)
	if c.Choices == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range c.Choices {
			ch := &c.Choices[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(ch.Index), 10)
			b = append(b, `,"text":`...)
			b = appendJSONString(b, ch.Text)
			b = append(b, `,"logprobs":`...)
			if ch.Logprobs == nil {
				b = append(b, "null"...)
			} else {
				lp, err := json.Marshal(ch.Logprobs)
				if err != nil {
					return b, err
				}
				b = append(b, lp...)
			}
			b = append(b, `,"finish_reason":`...)
			if ch.FinishReason == nil {
				b = append(b, "null"...)
			} else {
				b = appendJSONString(b, *ch.FinishReason)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if u := c.Usage; u != nil {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
		if d := u.PromptTokensDetails; d != nil {
			b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
			b = strconv.AppendInt(b, int64(d.CachedTokens), 10)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as encoding/json quotes a string by default: <, > and & escaped
// for HTML, control characters as \n, \t, ... or \u00XX, invalid UTF-8 as \ufffd, U+2028
// and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
