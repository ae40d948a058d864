package tokenizer

import (
	"embed"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"dataplane/dataplane/tokenizer/jinja"
)

// Message is one OpenAI-style chat message. Content is a string (Parts nil) or a list of parts.
type Message struct {
	Role    string // "system", "user", "assistant", "tool"
	Content string // used when Parts is nil
	Parts   []Part
	// Extra are further fields the template may read (tool_calls, reasoning_content, name),
	// as JSON-like values (see jinja.FromGo).
	Extra map[string]any
}

// Part is one content part: text, or a media item that the template turns into the model's
// placeholder tokens.
type Part struct {
	Type string // "text", "image", "video" or "audio"
	Text string // for "text"
	Ref  string // for media: a URL or uuid, given to the template as the part's Type key
}

// ContentFormat is how list contents reach the template.
type ContentFormat int

const (
	// FormatAuto (the default) gives parts to templates that loop over a message's content
	// (Qwen2-VL, Qwen2-Audio, LLaVA) and flattens them into a string for the others (Llama-3,
	// Qwen3), as vLLM decides.
	FormatAuto ContentFormat = iota
	// FormatParts always gives the list: {"type": "text", "text": ...}, {"type": "image",
	// "image": ref}, ...
	FormatParts
	// FormatString always flattens: the placeholder texts of the media parts (one a line, in
	// order), then the text parts joined with "\n" — vLLM's rule for string-content templates.
	FormatString
)

// ChatOptions choose the template and what it is given. Zero values are the defaults.
type ChatOptions struct {
	// Builtin names a built-in template (see Builtins) to use instead of the model's; the
	// model's is used when empty, and the "chatml" built-in when the model has none.
	Builtin string
	// Name picks one of the model's named templates; "" is "default".
	Name string
	// AddGenerationPrompt ends the prompt with the assistant's turn header.
	AddGenerationPrompt bool
	Format              ContentFormat
	// Placeholders is the text a media part becomes when content is flattened, by part type,
	// e.g. {"image": "<|vision_start|><|image_pad|><|vision_end|>"} (FormatString/FormatAuto).
	Placeholders map[string]string
	// Vars are further template variables (tools, add_vision_id, enable_thinking, ...); they
	// override the defaults (bos_token, eos_token, pad_token, unk_token, tools: none).
	Vars map[string]any
	// Limits bound the rendering (jinja.DefaultLimits when zero).
	Limits jinja.Limits
	// Now is strftime_now's clock (time.Now when nil).
	Now func() time.Time
}

// The built-in templates: the published chat templates of the families this package serves,
// for models whose tokenizer_config.json has none (or to override it with --chat-template).
//
//go:embed templates/*.jinja
var builtinFS embed.FS

var builtins = map[string]*jinja.Template{}

// builtinFiles maps built-in names to their files.
var builtinFiles = map[string]string{
	"chatml":      "chatml.jinja",      // ChatML with string content (the classic Qwen/OpenAI layout)
	"llama3":      "llama3.jinja",      // Meta-Llama-3-8B-Instruct
	"qwen3":       "qwen3.jinja",       // Qwen3 (thinking, tools)
	"qwen2-vl":    "qwen2_vl.jinja",    // Qwen2-VL / Qwen2.5-VL Instruct
	"qwen2-audio": "qwen2_audio.jinja", // Qwen2-Audio-7B-Instruct
	"llava":       "llava.jinja",       // llava-hf LLaVA-1.5
}

func init() {
	for name, file := range builtinFiles {
		src, err := builtinFS.ReadFile(path.Join("templates", file))
		if err != nil {
			panic(err) // embedded at build time: cannot happen
		}
		tpl, err := jinja.Parse(string(src))
		if err != nil {
			panic(fmt.Sprintf("built-in template %s: %v", name, err)) // covered by tests
		}
		builtins[name] = tpl
	}
}

// Builtins lists the built-in template names.
func Builtins() []string {
	names := make([]string, 0, len(builtinFiles))
	for n := range builtinFiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// parsedTemplate is a model template parsed at load (err kept for ApplyChatTemplate).
type parsedTemplate struct {
	tpl *jinja.Template
	err error
}

func (t *Tokenizer) template(o ChatOptions) (*jinja.Template, error) {
	if o.Builtin != "" {
		tpl, ok := builtins[o.Builtin]
		if !ok {
			return nil, fmt.Errorf("%w: no built-in template %q (have %s)", ErrTemplate, o.Builtin, strings.Join(Builtins(), ", "))
		}
		return tpl, nil
	}
	name := o.Name
	if name == "" {
		name = "default"
	}
	p, ok := t.templates[name]
	switch {
	case ok && p.err != nil:
		return nil, fmt.Errorf("%w: template %q: %w", ErrTemplate, name, p.err)
	case ok:
		return p.tpl, nil
	case o.Name == "" && len(t.templates) == 0:
		return builtins["chatml"], nil
	}
	return nil, fmt.Errorf("%w: the model has no chat template named %q", ErrTemplate, name)
}

func (t *Tokenizer) parseTemplates() {
	t.templates = map[string]parsedTemplate{}
	for name, src := range t.config.ChatTemplates {
		tpl, err := jinja.Parse(src)
		t.templates[name] = parsedTemplate{tpl: tpl, err: err}
	}
}

// ApplyChatTemplate renders messages into the prompt text, with the model's placeholders where
// media parts are. Errors wrap ErrTemplate; a template's raise_exception message is kept.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, o ChatOptions) (string, error) {
	tpl, err := t.template(o)
	if err != nil {
		return "", err
	}
	parts := o.Format == FormatParts || (o.Format == FormatAuto && tpl.LoopsOver("content"))
	list := make(jinja.List, len(msgs))
	for i, m := range msgs {
		d, err := messageValue(m, parts, o.Placeholders)
		if err != nil {
			return "", fmt.Errorf("%w: message %d: %w", ErrTemplate, i, err)
		}
		list[i] = d
	}
	vars := map[string]jinja.Value{
		"messages":              list,
		"add_generation_prompt": o.AddGenerationPrompt,
		"tools":                 nil,
		"documents":             nil,
	}
	for k, v := range map[string]string{"bos_token": t.config.BOS, "eos_token": t.config.EOS, "pad_token": t.config.PAD, "unk_token": t.config.UNK} {
		if v != "" {
			vars[k] = v
		}
	}
	for k, v := range o.Vars {
		x, err := jinja.FromGo(v)
		if err != nil {
			return "", fmt.Errorf("%w: variable %s: %w", ErrTemplate, k, err)
		}
		vars[k] = x
	}
	out, err := tpl.Render(vars, jinja.Env{Limits: o.Limits, Now: o.Now})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return out, nil
}

// EncodeChat renders messages and encodes the prompt (without adding special tokens: the
// template writes them, as transformers' apply_chat_template(tokenize=True) does).
func (t *Tokenizer) EncodeChat(msgs []Message, o ChatOptions) ([]int32, error) {
	text, err := t.ApplyChatTemplate(msgs, o)
	if err != nil {
		return nil, err
	}
	return t.Encode(text)
}

var mediaTypes = map[string]bool{"image": true, "video": true, "audio": true}

// messageValue is the dict the template sees for m.
func messageValue(m Message, parts bool, placeholders map[string]string) (*jinja.Dict, error) {
	d := jinja.NewDict()
	_ = d.Set("role", m.Role)
	switch {
	case m.Parts == nil:
		_ = d.Set("content", m.Content)
	case parts:
		list := make(jinja.List, len(m.Parts))
		for i, p := range m.Parts {
			pd := jinja.NewDict()
			_ = pd.Set("type", p.Type)
			switch {
			case p.Type == "text":
				_ = pd.Set("text", p.Text)
			case mediaTypes[p.Type]:
				_ = pd.Set(p.Type, p.Ref)
			default:
				return nil, fmt.Errorf("part %d: unknown type %q (text, image, video, audio)", i, p.Type)
			}
			list[i] = pd
		}
		_ = d.Set("content", list)
	default:
		var media, texts []string
		for i, p := range m.Parts {
			switch {
			case p.Type == "text":
				texts = append(texts, p.Text)
			case mediaTypes[p.Type]:
				ph, ok := placeholders[p.Type]
				if !ok {
					return nil, fmt.Errorf("part %d: the template takes string content and no placeholder text is set for %s", i, p.Type)
				}
				media = append(media, ph)
			default:
				return nil, fmt.Errorf("part %d: unknown type %q (text, image, video, audio)", i, p.Type)
			}
		}
		text := strings.Join(texts, "\n")
		if len(media) > 0 {
			text = strings.Join(media, "\n") + "\n" + text
		}
		_ = d.Set("content", text)
	}
	keys := make([]string, 0, len(m.Extra))
	for k := range m.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, err := jinja.FromGo(m.Extra[k])
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", k, err)
		}
		_ = d.Set(k, v)
	}
	return d, nil
}
