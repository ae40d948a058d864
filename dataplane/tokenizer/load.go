package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// The shape of tokenizer.json (Hugging Face tokenizers' serialization), as far as it is read.
type fileJSON struct {
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         *modelJSON      `json:"model"`
}

type addedJSON struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string           `json:"type"`
	Vocab                   map[string]int64 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
}

// component is the common head of normalizers, pre-tokenizers, decoders and post-processors.
type component struct {
	Type string `json:"type"`
}

const maxID = 1 << 24 // ids beyond this are a malformed file, not a vocabulary

type loader struct {
	file string
}

func (l loader) errf(kind error, path, format string, args ...any) error {
	return &LoadError{File: l.file, Path: path, Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// parseModel builds the BPE model: vocabulary by raw bytes, merges by id pair.
func (l loader) parseModel(m *modelJSON, t *Tokenizer) error {
	if m == nil {
		return l.errf(ErrFormat, "model", "missing")
	}
	if m.Type != "" && m.Type != "BPE" {
		return l.errf(ErrUnsupported, "model.type", "%q (only BPE is implemented)", m.Type)
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return l.errf(ErrUnsupported, "model.dropout", "BPE dropout is for training")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return l.errf(ErrUnsupported, "model.continuing_subword_prefix", "%q", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return l.errf(ErrUnsupported, "model.end_of_word_suffix", "%q", *m.EndOfWordSuffix)
	case m.ByteFallback:
		return l.errf(ErrUnsupported, "model.byte_fallback", "byte fallback belongs to SentencePiece-style BPE, not byte-level BPE")
	}
	if len(m.Vocab) == 0 {
		return l.errf(ErrFormat, "model.vocab", "empty")
	}
	b := &bpe{vocab: make(map[string]int32, len(m.Vocab)), ignoreMerges: m.IgnoreMerges}
	b.cache.seed = maphash.MakeSeed()
	for i := range b.byteID {
		b.byteID[i] = -1
	}
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxID {
			return l.errf(ErrFormat, "model.vocab", "token %q has id %d outside [0, %d)", tok, id, maxID)
		}
		t.setToken(int32(id), tok)
		raw, ok := byteLevelDecode(tok)
		if !ok {
			continue // not in the byte-level alphabet: no input can produce it
		}
		b.vocab[string(raw)] = int32(id)
		if len(raw) == 1 {
			b.byteID[raw[0]] = int32(id)
		}
	}
	for i, id := range b.byteID {
		if id < 0 {
			return l.errf(ErrFormat, "model.vocab", "no token for byte 0x%02x (%q): not a byte-level vocabulary", i, string(byteToRune[i]))
		}
	}
	merges, err := l.parseMerges(m.Merges)
	if err != nil {
		return err
	}
	b.merges = make(map[uint64]merge, len(merges))
	for rank, pair := range merges {
		ids := [3]int64{}
		for k, s := range []string{pair[0], pair[1], pair[0] + pair[1]} {
			id, ok := m.Vocab[s]
			if !ok {
				return l.errf(ErrFormat, fmt.Sprintf("model.merges[%d]", rank), "token %q is not in the vocabulary", s)
			}
			ids[k] = id
		}
		key := pairKey(int32(ids[0]), int32(ids[1]))
		if _, dup := b.merges[key]; !dup { // the first (lowest) rank of a repeated pair counts
			b.merges[key] = merge{rank: int32(rank), id: int32(ids[2])}
		}
	}
	t.model = b
	return nil
}

// parseMerges accepts both forms tokenizers writes: ["a b", ...] (before 0.20) and
// [["a", "b"], ...] (since, so tokens may contain spaces).
func (l loader) parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, l.errf(ErrFormat, "model.merges", "not a list: %v", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, l.errf(ErrFormat, fmt.Sprintf("model.merges[%d]", i), "%q is not two tokens separated by one space", s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, l.errf(ErrFormat, fmt.Sprintf("model.merges[%d]", i), "neither \"a b\" nor [\"a\", \"b\"]")
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// normalizer rewrites text before pre-tokenization (Qwen2: NFC).
type normalizer func(string) string

func (l loader) parseNormalizer(raw json.RawMessage, path string) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c struct {
		component
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, l.errf(ErrFormat, path, "%v", err)
	}
	forms := map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}
	if f, ok := forms[c.Type]; ok {
		return f.String, nil
	}
	if c.Type != "Sequence" {
		return nil, l.errf(ErrUnsupported, path+".type", "normalizer %q (implemented: NFC, NFD, NFKC, NFKD, Sequence)", c.Type)
	}
	var seq []normalizer
	for i, sub := range c.Normalizers {
		n, err := l.parseNormalizer(sub, fmt.Sprintf("%s.normalizers[%d]", path, i))
		if err != nil {
			return nil, err
		}
		if n != nil {
			seq = append(seq, n)
		}
	}
	return func(s string) string {
		for _, n := range seq {
			s = n(s)
		}
		return s
	}, nil
}

func (l loader) parsePreTokenizer(raw json.RawMessage, path string) (splitter, error) {
	if isNull(raw) {
		return seqPre(nil), nil
	}
	var c struct {
		component
		Pretokenizers  []json.RawMessage `json:"pretokenizers"`
		Pattern        map[string]string `json:"pattern"`
		Behavior       string            `json:"behavior"`
		Invert         bool              `json:"invert"`
		AddPrefixSpace bool              `json:"add_prefix_space"`
		UseRegex       *bool             `json:"use_regex"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, l.errf(ErrFormat, path, "%v", err)
	}
	switch c.Type {
	case "Sequence":
		var seq seqPre
		for i, sub := range c.Pretokenizers {
			p, err := l.parsePreTokenizer(sub, fmt.Sprintf("%s.pretokenizers[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if bl, ok := p.(byteLevelPre); ok && !bl.addPrefixSpace && !bl.useRegex {
				continue // the byte mapping is implicit: a step that does nothing else is dropped
			}
			seq = append(seq, p)
		}
		if len(seq) == 1 {
			return seq[0], nil // saves a closure per piece
		}
		return seq, nil
	case "ByteLevel":
		useRegex := c.UseRegex == nil || *c.UseRegex // tokenizers' default is true
		return byteLevelPre{addPrefixSpace: c.AddPrefixSpace, useRegex: useRegex}, nil
	case "Split":
		if c.Invert {
			return nil, l.errf(ErrUnsupported, path+".invert", "inverted Split")
		}
		var removed bool
		switch c.Behavior {
		case "Isolated":
		case "Removed":
			removed = true
		default:
			return nil, l.errf(ErrUnsupported, path+".behavior", "%q (implemented: Isolated, Removed)", c.Behavior)
		}
		if s, ok := c.Pattern["String"]; ok {
			return splitPre{m: literalMatcher(s), removed: removed}, nil
		}
		pattern, ok := c.Pattern["Regex"]
		if !ok {
			return nil, l.errf(ErrFormat, path+".pattern", "neither Regex nor String")
		}
		if sc, ok := scannerFor(pattern); ok {
			if removed {
				return splitPre{m: sc, removed: true}, nil
			}
			return sc, nil // Isolated: see scanner.split
		}
		m, err := newRegexMatcher(pattern)
		if err != nil {
			return nil, l.errf(ErrUnsupported, path+".pattern.Regex", "%v", err)
		}
		return splitPre{m: m, removed: removed}, nil
	}
	return nil, l.errf(ErrUnsupported, path+".type", "pre-tokenizer %q (implemented: Sequence, Split, ByteLevel)", c.Type)
}

// literalMatcher is a Split pattern given as a plain string.
type literalMatcher string

func (lit literalMatcher) matches(s string, fn func(start, end int) error) error {
	if lit == "" {
		return nil
	}
	for i := 0; ; {
		k := strings.Index(s[i:], string(lit))
		if k < 0 {
			return nil
		}
		if err := fn(i+k, i+k+len(lit)); err != nil {
			return err
		}
		i += k + len(lit)
	}
}

// parseDecoder accepts ByteLevel (alone or in a Sequence); no decoder joins tokens with spaces,
// as tokenizers does.
func (l loader) parseDecoder(raw json.RawMessage, t *Tokenizer) error {
	if isNull(raw) {
		return nil
	}
	var c struct {
		component
		Decoders []json.RawMessage `json:"decoders"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return l.errf(ErrFormat, "decoder", "%v", err)
	}
	switch {
	case c.Type == "ByteLevel":
		t.byteLevelDecoder = true
		return nil
	case c.Type == "Sequence" && len(c.Decoders) == 1:
		return l.parseDecoder(c.Decoders[0], t)
	}
	return l.errf(ErrUnsupported, "decoder.type", "decoder %q (implemented: ByteLevel)", c.Type)
}

// postStep is one item of a TemplateProcessing "single" template: the text's ids (ids == nil) or
// a special token's ids.
type postStep struct {
	ids      []int32
	sequence bool
}

// parsePostProcessor reads what Encode needs to add special tokens. A processor it does not
// implement is no load error (most callers never add special tokens): it is kept as the error
// that AppendEncode returns when asked to add them.
func (l loader) parsePostProcessor(raw json.RawMessage, path string) ([]postStep, error) {
	if isNull(raw) {
		return []postStep{{sequence: true}}, nil
	}
	var c struct {
		component
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct{ ID string } `json:"SpecialToken"`
			Sequence     *struct{ ID string } `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int64 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, l.errf(ErrFormat, path, "%v", err)
	}
	switch c.Type {
	case "ByteLevel": // offsets only
		return []postStep{{sequence: true}}, nil
	case "Sequence":
		steps := []postStep{{sequence: true}}
		for i, sub := range c.Processors {
			s, err := l.parsePostProcessor(sub, fmt.Sprintf("%s.processors[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if len(s) != 1 || !s[0].sequence { // at most one processor may add tokens
				if len(steps) != 1 || !steps[0].sequence {
					return nil, l.errf(ErrUnsupported, path, "two processors that add tokens")
				}
				steps = s
			}
		}
		return steps, nil
	case "TemplateProcessing":
		var steps []postStep
		for i, it := range c.Single {
			switch {
			case it.Sequence != nil:
				steps = append(steps, postStep{sequence: true})
			case it.SpecialToken != nil:
				st, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, l.errf(ErrFormat, fmt.Sprintf("%s.single[%d]", path, i), "special token %q not in special_tokens", it.SpecialToken.ID)
				}
				ids := make([]int32, len(st.IDs))
				for k, id := range st.IDs {
					if id < 0 || id >= maxID {
						return nil, l.errf(ErrFormat, path+".special_tokens", "id %d", id)
					}
					ids[k] = int32(id)
				}
				steps = append(steps, postStep{ids: ids})
			default:
				return nil, l.errf(ErrFormat, fmt.Sprintf("%s.single[%d]", path, i), "neither Sequence nor SpecialToken")
			}
		}
		return steps, nil
	}
	return nil, l.errf(ErrUnsupported, path+".type", "post-processor %q (implemented: TemplateProcessing, ByteLevel, Sequence)", c.Type)
}

// parseAdded registers the added tokens. Like tokenizers, it ignores the ids the file gives a
// token that the model vocabulary lacks and numbers such tokens from the vocabulary size on,
// in file order (for files tokenizers wrote itself the two agree).
func (l loader) parseAdded(list []addedJSON, t *Tokenizer, vocab map[string]int64) error {
	t.addedByContent = map[string]*addedToken{}
	t.addedByID = map[int32]*addedToken{}
	maxAdded := int32(-1)
	for i, a := range list {
		if a.Content == "" {
			continue
		}
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		tok := &addedToken{content: a.Content, special: a.Special, singleWord: a.SingleWord,
			lstrip: a.LStrip, rstrip: a.RStrip, normalized: normalized}
		if old, dup := t.addedByContent[a.Content]; dup {
			tok.id = old.id // a repeated token keeps its id and takes the later flags
			*old = *tok
			continue
		}
		switch id, inVocab := vocab[a.Content]; {
		case inVocab:
			tok.id = int32(id)
		case maxAdded < 0:
			tok.id = int32(len(vocab))
		case maxAdded >= int32(len(vocab)):
			tok.id = maxAdded + 1
		default:
			tok.id = int32(len(vocab))
		}
		if tok.id >= maxID {
			return l.errf(ErrFormat, fmt.Sprintf("added_tokens[%d]", i), "id beyond %d", maxID)
		}
		maxAdded = max(maxAdded, tok.id)
		t.addedByContent[a.Content] = tok
		t.addedByID[tok.id] = tok
		t.added = append(t.added, tok)
	}
	// Special tokens first, then the others, each in file order: the automaton's pattern order.
	t.rawAdded, t.normAdded = newAddedMatcher(), newAddedMatcher()
	for _, special := range []bool{true, false} {
		for _, tok := range t.added {
			if tok.special != special {
				continue
			}
			t.setToken(tok.id, tok.content)
			if tok.normalized {
				p := tok.content
				if t.normalize != nil {
					p = t.normalize(p)
				}
				t.normAdded.add(p, tok)
			} else {
				t.rawAdded.add(tok.content, tok)
			}
		}
	}
	return nil
}
