package dataplane

import (
	"embed"
	"fmt"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/dataplane/tokenizer"
)

// The demo tokenizer: Qwen3's byte-level BPE trimmed to its first 10,000 merges, with the
// Qwen2-VL and Qwen2-Audio placeholder tokens (derived from dataplane/tokenizer's test data).
//
//go:embed demo/tokenizer/tokenizer.json demo/tokenizer/tokenizer_config.json
var demoTokenizer embed.FS

// TokenizerOptions choose the tokenizer, its chat template and the media placeholders.
type TokenizerOptions struct {
	Dir string // a model directory with tokenizer.json ("": the embedded demo tokenizer)
	// ChatTemplate names a built-in template (chatml, llama3, qwen3, qwen2-vl, qwen2-audio,
	// llava); "": the tokenizer's own, or chatml when it has none.
	ChatTemplate string
	// ImageToken, VideoToken and AudioToken are the placeholder tokens ("": the first of the
	// usual ones the tokenizer has).
	ImageToken, VideoToken, AudioToken string
}

// DefaultTokenizerOptions: the demo tokenizer with the chatml template.
func DefaultTokenizerOptions() TokenizerOptions { return TokenizerOptions{} }

// placeholderNames are the usual placeholder tokens by modality, tried in order.
var placeholderNames = map[sequence.Modality][]string{
	sequence.Image: {"<|image_pad|>", "<image>", "<IMG_CONTEXT>", "<|image|>"},
	sequence.Video: {"<|video_pad|>", "<video>"},
	sequence.Audio: {"<|AUDIO|>", "<|audio_pad|>", "<audio>"},
}

// Tok is the tokenizer with the daemon's choices: template, placeholder ids, and how a media
// part reads when a template takes plain strings.
type Tok struct {
	*tokenizer.Tokenizer
	opts     TokenizerOptions
	ph       sequence.Placeholders
	phText   map[string]string // part type → text, for templates that take strings
	tokNames map[sequence.Modality]string
}

// LoadTokenizer loads the tokenizer and resolves the placeholder tokens.
func LoadTokenizer(o TokenizerOptions) (*Tok, error) {
	var t *tokenizer.Tokenizer
	var err error
	if o.Dir == "" {
		f := tokenizer.Files{}
		if f.Tokenizer, err = demoTokenizer.ReadFile("demo/tokenizer/tokenizer.json"); err == nil {
			f.Config, err = demoTokenizer.ReadFile("demo/tokenizer/tokenizer_config.json")
		}
		if err == nil {
			t, err = tokenizer.New(f, tokenizer.DefaultOptions())
		}
	} else {
		t, err = tokenizer.Load(o.Dir, tokenizer.DefaultOptions())
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	none := sequence.NoPlaceholder
	k := &Tok{Tokenizer: t, opts: o, ph: sequence.Placeholders{Image: none, Video: none, Audio: none},
		phText: map[string]string{}, tokNames: map[sequence.Modality]string{}}
	given := map[sequence.Modality]string{sequence.Image: o.ImageToken, sequence.Video: o.VideoToken, sequence.Audio: o.AudioToken}
	for _, mod := range []sequence.Modality{sequence.Image, sequence.Video, sequence.Audio} {
		names := placeholderNames[mod]
		if given[mod] != "" {
			names = []string{given[mod]}
		}
		for _, name := range names {
			id, err := t.Placeholder(name)
			if err != nil {
				if given[mod] != "" {
					return nil, fmt.Errorf("--%s-token: %w", mod, err)
				}
				continue
			}
			k.setPlaceholder(mod, id)
			k.tokNames[mod] = name
			break
		}
	}
	if err := k.ph.Validate(); err != nil {
		return nil, fmt.Errorf("tokenizer placeholders: %w", err)
	}
	// How a media part reads in a flattened prompt, with the start/end tokens its family uses.
	wrap := func(mod sequence.Modality, open, close string) {
		name, ok := k.tokNames[mod]
		if !ok {
			return
		}
		text := name
		if _, err := t.TokenID(open); err == nil {
			if _, err := t.TokenID(close); err == nil {
				text = open + name + close
			}
		}
		k.phText[mod.String()] = text
	}
	wrap(sequence.Image, "<|vision_start|>", "<|vision_end|>")
	wrap(sequence.Video, "<|vision_start|>", "<|vision_end|>")
	wrap(sequence.Audio, "<|audio_bos|>", "<|audio_eos|>")
	return k, nil
}

func (k *Tok) setPlaceholder(mod sequence.Modality, id int32) {
	switch mod {
	case sequence.Image:
		k.ph.Image = id
	case sequence.Video:
		k.ph.Video = id
	case sequence.Audio:
		k.ph.Audio = id
	}
}

// Placeholders are the placeholder token ids in use.
func (k *Tok) Placeholders() sequence.Placeholders { return k.ph }

// Chat renders messages with the chat template (a generation prompt added) and encodes them;
// each media part becomes exactly one placeholder token.
func (k *Tok) Chat(msgs []openai.Message) ([]int32, error) {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i].Role = m.Role
		if len(m.Parts) == 1 && m.Parts[0].IsText {
			tm[i].Content = m.Parts[0].Text
			continue
		}
		for _, p := range m.Parts {
			if p.IsText {
				tm[i].Parts = append(tm[i].Parts, tokenizer.Part{Type: "text", Text: p.Text})
				continue
			}
			mod := p.Media.Modality
			if k.ph.ID(mod) == sequence.NoPlaceholder {
				return nil, openai.Invalid(p.Media.Path, "the model's tokenizer has no %v placeholder token", mod)
			}
			tm[i].Parts = append(tm[i].Parts, tokenizer.Part{Type: mod.String(), Ref: p.Media.UUID})
		}
		if tm[i].Parts == nil {
			tm[i].Parts = []tokenizer.Part{} // an empty list, not a missing content
		}
	}
	ids, err := k.EncodeChat(tm, tokenizer.ChatOptions{Builtin: k.opts.ChatTemplate, AddGenerationPrompt: true,
		Placeholders: k.phText})
	if err != nil {
		return nil, openai.Invalid("messages", "chat template: %v", err)
	}
	return ids, nil
}
