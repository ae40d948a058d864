package tokenizer

import (
	"errors"
	"fmt"
)

// Error kinds. Every error this package returns wraps exactly one of them (errors.Is).
var (
	// ErrFormat: a tokenizer file is not valid JSON of the expected shape.
	ErrFormat = errors.New("malformed tokenizer file")
	// ErrUnsupported: the file is well formed but names a component this package does not
	// implement (a WordPiece model, a Metaspace pre-tokenizer, ...).
	ErrUnsupported = errors.New("unsupported tokenizer component")
	// ErrInput: text that is not valid UTF-8, or an id outside the vocabulary.
	ErrInput = errors.New("bad tokenizer input")
	// ErrLimit: input longer than Options.MaxInputBytes or more than Options.MaxTokens tokens.
	ErrLimit = errors.New("tokenizer limit exceeded")
	// ErrUnknownToken: a token (a placeholder, a special token) is not in the vocabulary.
	ErrUnknownToken = errors.New("unknown token")
	// ErrTemplate: the chat template failed to parse or render, or no template is available.
	ErrTemplate = errors.New("chat template error")
)

// LoadError says which file and which part of it could not be used.
type LoadError struct {
	File string // "tokenizer.json", "tokenizer_config.json", ...
	Path string // where in the file, e.g. "pre_tokenizer.pretokenizers[0].pattern"
	Kind error  // ErrFormat or ErrUnsupported
	Msg  string
}

func (e *LoadError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %s: %v", e.File, e.Msg, e.Kind)
	}
	return fmt.Sprintf("%s: %s: %s: %v", e.File, e.Path, e.Msg, e.Kind)
}

func (e *LoadError) Unwrap() error { return e.Kind }

// InputError names the bad part of an Encode or Decode input.
type InputError struct {
	Offset int // byte offset in the text, or index in the id list
	Msg    string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("at %d: %s: %v", e.Offset, e.Msg, ErrInput)
}

func (e *InputError) Unwrap() error { return ErrInput }

// LimitError says which limit was exceeded.
type LimitError struct {
	What  string // "input bytes", "tokens"
	Limit int
	Got   int // how far the input got before the limit stopped it (at least Limit+1)
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %d over the limit of %d: %v", e.What, e.Got, e.Limit, ErrLimit)
}

func (e *LimitError) Unwrap() error { return ErrLimit }

// UnknownTokenError names a token that is not in the vocabulary.
type UnknownTokenError struct {
	Token string
	Use   string // what it was looked up for, e.g. "image placeholder"
}

func (e *UnknownTokenError) Error() string {
	if e.Use == "" {
		return fmt.Sprintf("%q: %v", e.Token, ErrUnknownToken)
	}
	return fmt.Sprintf("%s %q: %v", e.Use, e.Token, ErrUnknownToken)
}

func (e *UnknownTokenError) Unwrap() error { return ErrUnknownToken }
