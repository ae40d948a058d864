package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/tokenizer/jinja"
)

// chat.json holds the built-in templates rendered by Python Jinja2 configured as transformers
// configures it (testdata/gen/render.py), for a set of conversations.
type chatVectors struct {
	Generator string `json:"generator"`
	Now       string `json:"now"`
	Cases     []struct {
		Template            string         `json:"template"`
		Conversation        string         `json:"conversation"`
		AddGenerationPrompt bool           `json:"add_generation_prompt"`
		Kwargs              map[string]any `json:"kwargs"`
		Out                 *string        `json:"out"`
		Error               string         `json:"error"`
	} `json:"cases"`
}

type chatCase struct {
	Name     string `json:"name"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// toMessages turns the generator's template-form messages into Messages.
func toMessages(t *testing.T, c chatCase) []Message {
	var out []Message
	for _, m := range c.Messages {
		msg := Message{Role: m.Role}
		if err := json.Unmarshal(m.Content, &msg.Content); err != nil {
			var parts []map[string]string
			require.NoError(t, json.Unmarshal(m.Content, &parts))
			msg.Parts = []Part{}
			for _, p := range parts {
				msg.Parts = append(msg.Parts, Part{Type: p["type"], Text: p["text"], Ref: p[p["type"]]})
			}
		}
		out = append(out, msg)
	}
	return out
}

func TestChatTemplatesMatchJinja2(t *testing.T) {
	var v chatVectors
	b, err := os.ReadFile("testdata/vectors/chat.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &v))
	var cases []chatCase
	b, err = os.ReadFile("testdata/gen/chat_cases.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &cases))
	convs := map[string]chatCase{}
	for _, c := range cases {
		convs[c.Name] = c
	}
	now, err := time.Parse("2006-01-02T15:04:05", v.Now)
	require.NoError(t, err)
	tk := loadTokenizer(t, "testdata/qwen2-small")
	byFile := map[string]string{}
	for name, file := range builtinFiles {
		byFile[file] = name
	}
	t.Logf("%d renderings from %s", len(v.Cases), v.Generator)
	for i, c := range v.Cases {
		vars := map[string]any{"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": nil}
		for k, x := range c.Kwargs {
			vars[k] = x
		}
		got, err := tk.ApplyChatTemplate(toMessages(t, convs[c.Conversation]), ChatOptions{
			Builtin: byFile[c.Template], AddGenerationPrompt: c.AddGenerationPrompt, Format: FormatParts,
			Vars: vars, Now: func() time.Time { return now },
		})
		if c.Out == nil {
			require.Error(t, err, "case %d %s/%s: Jinja2 says %s", i, c.Template, c.Conversation, c.Error)
			require.ErrorIs(t, err, ErrTemplate)
			continue
		}
		require.NoError(t, err, "case %d %s/%s", i, c.Template, c.Conversation)
		require.Equal(t, *c.Out, got, "case %d %s/%s agp=%v", i, c.Template, c.Conversation, c.AddGenerationPrompt)
	}
}

func TestChatModelTemplateAndPlaceholders(t *testing.T) {
	tk := loadTokenizer(t, "testdata/qwen2-small") // Qwen3's own template (string content)
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Parts: []Part{{Type: "image", Ref: "u1"}, {Type: "text", Text: "What is it?"}, {Type: "image"}}},
	}
	_, err := tk.ApplyChatTemplate(msgs, ChatOptions{})
	require.ErrorIs(t, err, ErrTemplate, "string-content template and no placeholder text for images")
	require.ErrorContains(t, err, "message 1: part 0")

	vision := "<|vision_start|><|image_pad|><|vision_end|>"
	got, err := tk.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true, Placeholders: map[string]string{"image": vision}})
	require.NoError(t, err)
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + vision + "\n" + vision + "\nWhat is it?<|im_end|>\n<|im_start|>assistant\n"
	require.Equal(t, want, got)

	// Qwen2-VL's template loops over content: parts go in as they are, placeholders in order.
	got, err = tk.ApplyChatTemplate(msgs, ChatOptions{Builtin: "qwen2-vl", AddGenerationPrompt: true})
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"+vision+"What is it?"+vision+"<|im_end|>\n<|im_start|>assistant\n", got)

	ids, err := tk.EncodeChat(msgs, ChatOptions{Builtin: "qwen2-vl"})
	require.NoError(t, err)
	pad, err := tk.Placeholder("<|image_pad|>")
	require.NoError(t, err)
	n := 0
	for _, id := range ids {
		if id == pad {
			n++
		}
	}
	require.Equal(t, 2, n, "one <|image_pad|> per image")

	require.False(t, builtins["qwen3"].LoopsOver("content"))
	require.False(t, builtins["llama3"].LoopsOver("content"))
	for _, name := range []string{"qwen2-vl", "qwen2-audio", "llava"} {
		require.True(t, builtins[name].LoopsOver("content"), name)
	}
}

func TestChatErrors(t *testing.T) {
	tk := loadTokenizer(t, "testdata/qwen2-small")
	_, err := tk.ApplyChatTemplate(nil, ChatOptions{Builtin: "nope"})
	require.ErrorIs(t, err, ErrTemplate)
	require.ErrorContains(t, err, "nope")
	_, err = tk.ApplyChatTemplate(nil, ChatOptions{Name: "tool_use"})
	require.ErrorIs(t, err, ErrTemplate)
	_, err = tk.ApplyChatTemplate([]Message{{Role: "user", Parts: []Part{{Type: "pdf"}}}}, ChatOptions{Builtin: "qwen2-vl"})
	require.ErrorContains(t, err, `unknown type "pdf"`)

	// raise_exception keeps the template's message.
	f := Files{Tokenizer: mustRead(t, "testdata/qwen2-small/tokenizer.json"),
		Config: []byte(`{"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"}`)}
	tk2, err := New(f, Options{})
	require.NoError(t, err)
	_, err = tk2.ApplyChatTemplate([]Message{{Role: "assistant"}}, ChatOptions{})
	var je *jinja.Error
	require.ErrorAs(t, err, &je)
	require.True(t, je.Raised)
	require.Equal(t, "first must be user", je.Msg)

	// An unsupported construct fails with its name, when the template is used.
	f.Config = []byte(`{"chat_template": "{% include 'x.jinja' %}"}`)
	tk3, err := New(f, Options{})
	require.NoError(t, err)
	_, err = tk3.ApplyChatTemplate(nil, ChatOptions{})
	require.ErrorIs(t, err, ErrTemplate)
	require.ErrorContains(t, err, "include")

	// Render limits hold.
	f.Config = []byte(`{"chat_template": "{% for i in range(1000000) %}{{ i }}{% endfor %}"}`)
	tk4, err := New(f, Options{})
	require.NoError(t, err)
	_, err = tk4.ApplyChatTemplate(nil, ChatOptions{Limits: jinja.Limits{MaxSteps: 10000}})
	require.ErrorContains(t, err, "steps")
	require.True(t, errors.Is(err, ErrTemplate))
	_, err = tk4.ApplyChatTemplate(nil, ChatOptions{Limits: jinja.Limits{MaxOutputBytes: 1000}})
	require.ErrorContains(t, err, "bytes")
}

func TestChatTemplateFromFiles(t *testing.T) {
	tpl := "{% for m in messages %}[{{ m.role }}]{% endfor %}"
	base := mustRead(t, "testdata/qwen2-small/tokenizer.json")
	for name, f := range map[string]Files{
		"config string": {Tokenizer: base, Config: []byte(`{"chat_template": ` + quote(tpl) + `}`)},
		"config list":   {Tokenizer: base, Config: []byte(`{"chat_template": [{"name": "default", "template": ` + quote(tpl) + `}, {"name": "rag", "template": "x"}]}`)},
		"jinja file":    {Tokenizer: base, ChatTemplate: []byte(tpl)},
		"json file":     {Tokenizer: base, ChatTemplate: []byte(`{"chat_template": ` + quote(tpl) + `}`)},
	} {
		tk, err := New(f, Options{})
		require.NoError(t, err, name)
		got, err := tk.ApplyChatTemplate([]Message{{Role: "user"}, {Role: "assistant"}}, ChatOptions{})
		require.NoError(t, err, name)
		require.Equal(t, "[user][assistant]", got, name)
	}
	tk, err := New(Files{Tokenizer: base}, Options{})
	require.NoError(t, err)
	got, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, ChatOptions{AddGenerationPrompt: true})
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", got, "no template: the chatml built-in")
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func mustRead(t testing.TB, p string) []byte {
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}
