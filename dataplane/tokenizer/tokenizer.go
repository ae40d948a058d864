// Package tokenizer is a Hugging Face tokenizer for byte-level BPE models (the Llama-3 and
// Qwen2 families): it reads tokenizer.json, tokenizer_config.json and special_tokens_map.json,
// encodes text to exactly the ids Hugging Face tokenizers gives, decodes ids, looks up tokens and
// the models' media placeholders, and renders chat templates (see chat.go and package jinja).
//
// A Tokenizer is immutable after Load and safe for concurrent use.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"
)

// Options bound what one call may cost. Zero fields take the defaults of DefaultOptions.
type Options struct {
	// MaxInputBytes is the longest text Encode accepts. Default 8 MiB.
	MaxInputBytes int
	// MaxTokens is the most ids one Encode may produce and one Decode may take. Default 1 Mi.
	MaxTokens int
	// MaxFileBytes is the largest tokenizer file Load reads. Default 64 MiB (Llama-3's
	// tokenizer.json is 9 MB, Qwen2's 7 MB).
	MaxFileBytes int64
}

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{MaxInputBytes: 8 << 20, MaxTokens: 1 << 20, MaxFileBytes: 64 << 20}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.MaxInputBytes <= 0 {
		o.MaxInputBytes = d.MaxInputBytes
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = d.MaxTokens
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = d.MaxFileBytes
	}
	return o
}

// Tokenizer encodes and decodes text for one model.
type Tokenizer struct {
	opts      Options
	model     *bpe
	normalize normalizer // nil: none
	pre       splitter

	added          []*addedToken // file order
	addedByContent map[string]*addedToken
	addedByID      map[int32]*addedToken
	rawAdded       *addedMatcher // tokens matched in the raw text (normalized: false)
	normAdded      *addedMatcher // tokens matched in the normalized text

	// tokens[id] is the token's text as the vocabulary writes it ("" and !known[id] for holes).
	tokens []string
	known  []bool
	// decoded bytes of each id: decodeArena[decodeOff[id]:decodeOff[id+1]].
	decodeArena []byte
	decodeOff   []uint32

	byteLevelDecoder bool
	post             []postStep // what AddSpecialTokens adds around the text
	postErr          error      // set when the file's post-processor is not implemented
	encoders         sync.Pool  // *encoder, one per concurrent Encode

	config    Config
	templates map[string]parsedTemplate
}

// Files are the contents of a model's tokenizer files, for New. Tokenizer is required; the
// others may be nil.
type Files struct {
	Tokenizer        []byte // tokenizer.json
	Config           []byte // tokenizer_config.json
	SpecialTokensMap []byte // special_tokens_map.json
	ChatTemplate     []byte // chat_template.jinja or chat_template.json (newer checkpoints, processors)
}

// Load reads the tokenizer files of a Hugging Face model directory. Only tokenizer.json is
// required.
func Load(dir string, opts Options) (*Tokenizer, error) {
	opts = opts.withDefaults()
	var f Files
	read := func(name string, required bool) ([]byte, error) {
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil {
			if !required && errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		if st.Size() > opts.MaxFileBytes {
			return nil, &LoadError{File: name, Kind: ErrFormat, Msg: fmt.Sprintf("%d bytes, over MaxFileBytes %d", st.Size(), opts.MaxFileBytes)}
		}
		return os.ReadFile(p)
	}
	var err error
	if f.Tokenizer, err = read("tokenizer.json", true); err != nil {
		return nil, err
	}
	if f.Config, err = read("tokenizer_config.json", false); err != nil {
		return nil, err
	}
	if f.SpecialTokensMap, err = read("special_tokens_map.json", false); err != nil {
		return nil, err
	}
	if f.ChatTemplate, err = read("chat_template.jinja", false); err != nil {
		return nil, err
	}
	if f.ChatTemplate == nil {
		if f.ChatTemplate, err = read("chat_template.json", false); err != nil {
			return nil, err
		}
	}
	return New(f, opts)
}

// New builds a Tokenizer from file contents (see Files).
func New(f Files, opts Options) (*Tokenizer, error) {
	opts = opts.withDefaults()
	l := loader{file: "tokenizer.json"}
	for _, b := range [][]byte{f.Tokenizer, f.Config, f.SpecialTokensMap, f.ChatTemplate} {
		if int64(len(b)) > opts.MaxFileBytes {
			return nil, l.errf(ErrFormat, "", "%d bytes, over MaxFileBytes %d", len(b), opts.MaxFileBytes)
		}
	}
	var file fileJSON
	if err := json.Unmarshal(f.Tokenizer, &file); err != nil {
		return nil, l.errf(ErrFormat, "", "%v", err)
	}
	t := &Tokenizer{opts: opts}
	var err error
	if err = l.parseModel(file.Model, t); err != nil {
		return nil, err
	}
	if t.normalize, err = l.parseNormalizer(file.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if t.pre, err = l.parsePreTokenizer(file.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if err = l.parseDecoder(file.Decoder, t); err != nil {
		return nil, err
	}
	if t.post, err = l.parsePostProcessor(file.PostProcessor, "post_processor"); err != nil {
		if !errors.Is(err, ErrUnsupported) {
			return nil, err
		}
		t.postErr = err
	}
	if err = l.parseAdded(file.AddedTokens, t, file.Model.Vocab); err != nil {
		return nil, err
	}
	t.buildDecodeTable()
	if t.config, err = parseConfig(f); err != nil {
		return nil, err
	}
	t.parseTemplates()
	return t, nil
}

// setToken records id's text while loading.
func (t *Tokenizer) setToken(id int32, text string) {
	for int(id) >= len(t.tokens) {
		t.tokens = append(t.tokens, "")
		t.known = append(t.known, false)
	}
	t.tokens[id], t.known[id] = text, true
}

// buildDecodeTable precomputes the bytes each id decodes to, so Decode is a copy per id.
func (t *Tokenizer) buildDecodeTable() {
	t.decodeOff = make([]uint32, len(t.tokens)+1)
	for id, s := range t.tokens {
		raw := []byte(s)
		if t.byteLevelDecoder {
			if b, ok := byteLevelDecode(s); ok {
				raw = b
			}
		}
		t.decodeArena = append(t.decodeArena, raw...)
		t.decodeOff[id+1] = uint32(len(t.decodeArena))
	}
}

// VocabSize is one more than the largest id (model and added tokens); some ids below it may be
// unused.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token written as in the vocabulary (an added token's content, or
// a model token in the byte-level alphabet, e.g. "Ġhello").
func (t *Tokenizer) TokenID(token string) (int32, error) {
	if a, ok := t.addedByContent[token]; ok {
		return a.id, nil
	}
	if raw, ok := byteLevelDecode(token); ok {
		if id, ok := t.model.vocab[string(raw)]; ok {
			return id, nil
		}
	}
	return 0, &UnknownTokenError{Token: token}
}

// Token returns the vocabulary text of id.
func (t *Tokenizer) Token(id int32) (string, error) {
	if id < 0 || int(id) >= len(t.tokens) || !t.known[id] {
		return "", &InputError{Offset: 0, Msg: fmt.Sprintf("id %d is not in the vocabulary", id)}
	}
	return t.tokens[id], nil
}

// IsSpecial reports whether id is a special added token (Decode can skip those).
func (t *Tokenizer) IsSpecial(id int32) bool {
	a, ok := t.addedByID[id]
	return ok && a.special
}

// Placeholder returns the id of a model's placeholder token by name, e.g. "<|image_pad|>"
// (Qwen2-VL), "<|video_pad|>", "<|vision_start|>", "<|AUDIO|>" (Qwen2-Audio), "<image>" (LLaVA).
// The error names the token when the vocabulary lacks it.
func (t *Tokenizer) Placeholder(name string) (int32, error) {
	id, err := t.TokenID(name)
	if err != nil {
		return 0, &UnknownTokenError{Token: name, Use: "placeholder"}
	}
	return id, nil
}

// Config returns what tokenizer_config.json and special_tokens_map.json say.
func (t *Tokenizer) Config() Config { return t.config }

// EncodeOptions change what AppendEncode adds.
type EncodeOptions struct {
	// AddSpecialTokens wraps the text as the file's post-processor says (Llama-3: a leading
	// <|begin_of_text|>). Default false: chat templates write their special tokens themselves.
	AddSpecialTokens bool
}

// Encode returns the ids of text, without added special tokens (see AppendEncode).
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	return t.AppendEncode(nil, text, EncodeOptions{})
}

// AppendEncode appends the ids of text to dst and returns the extended slice. The text must be
// valid UTF-8 and at most Options.MaxInputBytes long; at most Options.MaxTokens ids are
// produced. On error dst is returned as it came (its spare capacity may have been written).
func (t *Tokenizer) AppendEncode(dst []int32, text string, o EncodeOptions) ([]int32, error) {
	if len(text) > t.opts.MaxInputBytes {
		return dst, &LimitError{What: "input bytes", Limit: t.opts.MaxInputBytes, Got: len(text)}
	}
	if !utf8.ValidString(text) {
		return dst, &InputError{Offset: firstInvalid(text), Msg: "text is not valid UTF-8"}
	}
	steps := []postStep{{sequence: true}}
	if o.AddSpecialTokens {
		if t.postErr != nil {
			return dst, t.postErr
		}
		steps = t.post
	}
	e := t.getEncoder(dst)
	defer t.putEncoder(e)
	for _, s := range steps {
		var err error
		if s.sequence {
			err = t.rawAdded.split(text, e.normalized, e.addedToken)
		} else {
			err = e.ids(s.ids)
		}
		if err != nil {
			return dst, err
		}
	}
	return e.out, nil
}

func firstInvalid(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, w := utf8.DecodeRuneInString(s[i:]); w == 1 {
				return i
			}
		}
	}
	return len(s)
}

// encoder carries one Encode call through the pipeline: raw added tokens, normalization,
// normalized added tokens, pre-tokenization, BPE.
//
// Encoders are pooled so that a cache hit allocates nothing: the pre-tokenizer is an interface,
// and a callback passed through an interface escapes, so a per-call encoder and its method
// value would both be heap-allocated on every call. A pooled one binds emitWord once.
type encoder struct {
	t        *Tokenizer
	out      []int32
	limit    int
	emitWord func(string) error // e.word, bound once for the pre-tokenizer
}

func (t *Tokenizer) getEncoder(dst []int32) *encoder {
	e, _ := t.encoders.Get().(*encoder)
	if e == nil {
		e = &encoder{t: t}
		e.emitWord = e.word
	}
	e.out, e.limit = dst, len(dst)+t.opts.MaxTokens
	return e
}

func (t *Tokenizer) putEncoder(e *encoder) {
	e.out = nil // the pool must not keep the caller's buffer alive
	t.encoders.Put(e)
}

func (e *encoder) full() error {
	if len(e.out) > e.limit {
		return &LimitError{What: "tokens", Limit: e.t.opts.MaxTokens, Got: len(e.out) - (e.limit - e.t.opts.MaxTokens)}
	}
	return nil
}

func (e *encoder) ids(ids []int32) error {
	e.out = append(e.out, ids...)
	return e.full()
}

func (e *encoder) addedToken(a *addedToken) error {
	e.out = append(e.out, a.id)
	return e.full()
}

// normalized handles a piece of text between raw added tokens.
func (e *encoder) normalized(s string) error {
	if e.t.normalize != nil {
		s = e.t.normalize(s)
	}
	return e.t.normAdded.split(s, e.pretokenized, e.addedToken)
}

func (e *encoder) pretokenized(s string) error {
	return e.t.pre.split(s, e.emitWord)
}

func (e *encoder) word(w string) error {
	if w == "" {
		return nil
	}
	e.out = e.t.model.appendWord(e.out, w)
	return e.full()
}

// DecodeOptions change what Decode writes.
type DecodeOptions struct {
	// SkipSpecialTokens leaves out special added tokens (<|im_end|>, ...).
	SkipSpecialTokens bool
}

// Decode returns the text of ids as tokenizers' decode does: each token's bytes (byte-level
// tokens as the bytes they stand for, other added tokens as their text), concatenated, with
// each invalid UTF-8 sequence replaced by U+FFFD. An id outside the vocabulary is an
// *InputError naming its index.
func (t *Tokenizer) Decode(ids []int32, o DecodeOptions) (string, error) {
	b, err := t.AppendDecode(nil, ids, o)
	return string(b), err
}

// AppendDecode appends the decoded bytes of ids (valid UTF-8) to dst.
func (t *Tokenizer) AppendDecode(dst []byte, ids []int32, o DecodeOptions) ([]byte, error) {
	if len(ids) > t.opts.MaxTokens {
		return dst, &LimitError{What: "tokens", Limit: t.opts.MaxTokens, Got: len(ids)}
	}
	var raw []byte
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.tokens) || !t.known[id] {
			return dst, &InputError{Offset: i, Msg: fmt.Sprintf("id %d is not in the vocabulary", id)}
		}
		if o.SkipSpecialTokens && t.IsSpecial(id) {
			continue
		}
		if !t.byteLevelDecoder && len(raw) > 0 {
			raw = append(raw, ' ') // no decoder: tokens joined with spaces
		}
		raw = append(raw, t.decodeArena[t.decodeOff[id]:t.decodeOff[id+1]]...)
	}
	return appendLossy(dst, raw), nil
}
