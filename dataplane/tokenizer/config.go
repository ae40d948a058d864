package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Config is what a model's tokenizer_config.json and special_tokens_map.json say about
// special tokens and chat templates (tokenizer_config.json wins where both say something).
type Config struct {
	BOS, EOS, PAD, UNK string // special token texts ("" when not set)
	// ChatTemplates are the model's Jinja chat templates by name; the unnamed one (or the one
	// named "default") is under "default". From tokenizer_config.json's chat_template, else
	// chat_template.jinja / chat_template.json.
	ChatTemplates map[string]string
}

// configJSON is the part of tokenizer_config.json / special_tokens_map.json read here. Special
// tokens are written either as strings or as AddedToken objects.
type configJSON struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	PAD          json.RawMessage `json:"pad_token"`
	UNK          json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

func parseConfig(f Files) (Config, error) {
	c := Config{ChatTemplates: map[string]string{}}
	// special_tokens_map.json first, so tokenizer_config.json overrides it.
	for _, src := range []struct {
		name string
		data []byte
	}{{"special_tokens_map.json", f.SpecialTokensMap}, {"tokenizer_config.json", f.Config}} {
		if src.data == nil {
			continue
		}
		l := loader{file: src.name}
		var j configJSON
		if err := json.Unmarshal(src.data, &j); err != nil {
			return c, l.errf(ErrFormat, "", "%v", err)
		}
		for _, tok := range []struct {
			raw  json.RawMessage
			dst  *string
			path string
		}{{j.BOS, &c.BOS, "bos_token"}, {j.EOS, &c.EOS, "eos_token"}, {j.PAD, &c.PAD, "pad_token"}, {j.UNK, &c.UNK, "unk_token"}} {
			s, ok, err := specialTokenText(tok.raw)
			if err != nil {
				return c, l.errf(ErrFormat, tok.path, "%v", err)
			}
			if ok {
				*tok.dst = s
			}
		}
		if err := parseTemplates(j.ChatTemplate, c.ChatTemplates); err != nil {
			return c, l.errf(ErrFormat, "chat_template", "%v", err)
		}
	}
	if len(c.ChatTemplates) == 0 && f.ChatTemplate != nil {
		trimmed := bytes.TrimSpace(f.ChatTemplate)
		if len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
			// chat_template.json: {"chat_template": "..."}
			var j configJSON
			if err := json.Unmarshal(trimmed, &j); err != nil {
				return c, (loader{file: "chat_template.json"}).errf(ErrFormat, "", "%v", err)
			}
			if err := parseTemplates(j.ChatTemplate, c.ChatTemplates); err != nil {
				return c, (loader{file: "chat_template.json"}).errf(ErrFormat, "chat_template", "%v", err)
			}
		} else {
			c.ChatTemplates["default"] = string(f.ChatTemplate)
		}
	}
	return c, nil
}

// specialTokenText reads "text" or {"content": "text", ...}; ok is false for null or absent.
func specialTokenText(raw json.RawMessage) (string, bool, error) {
	if isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, fmt.Errorf("neither a string nor an object with content")
	}
	return *obj.Content, true, nil
}

// parseTemplates reads a chat_template value: one template, or a list of {name, template}.
func parseTemplates(raw json.RawMessage, into map[string]string) error {
	if isNull(raw) {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		into["default"] = s
		return nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("neither a string nor a list of {name, template}")
	}
	for _, t := range list {
		into[t.Name] = t.Template
	}
	return nil
}
