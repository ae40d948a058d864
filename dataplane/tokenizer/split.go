package tokenizer

import (
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// splitPre is the Split pre-tokenizer: the text between matches and (unless removed) the
// matches themselves become pieces. Behaviors "Isolated" and "Removed" are supported.
type splitPre struct {
	m       matcher
	removed bool
}

func (p splitPre) split(s string, emit func(string) error) error {
	prev := 0
	err := p.m.matches(s, func(a, b int) error {
		if a > prev {
			if err := emit(s[prev:a]); err != nil {
				return err
			}
		}
		prev = b
		if p.removed {
			return nil
		}
		return emit(s[a:b])
	})
	if err != nil {
		return err
	}
	if prev < len(s) {
		return emit(s[prev:])
	}
	return nil
}

// byteLevelPre is the ByteLevel pre-tokenizer. Mapping bytes to the byte-level alphabet is
// implicit here (the BPE works on raw bytes); what remains is the optional leading space and,
// with use_regex, the GPT-2 split.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
}

func (p byteLevelPre) split(s string, emit func(string) error) error {
	if p.addPrefixSpace && (len(s) == 0 || s[0] != ' ') {
		s = " " + s
	}
	if !p.useRegex {
		return emit(s)
	}
	return scanner{gpt2: true}.split(s, emit)
}

// seqPre runs pre-tokenizers one after the other, each on the pieces of the one before.
type seqPre []splitter

func (q seqPre) split(s string, emit func(string) error) error {
	if len(q) == 0 {
		return emit(s)
	}
	return q[0].split(s, func(piece string) error { return q[1:].split(piece, emit) })
}

// regexMatcher runs a Split pattern that has no scanner on regexp2, a backtracking engine with
// lookaround (Go's regexp has none). Its semantics are .NET's, which agree with Oniguruma's on
// the classes these patterns use; its case folding is culture-based, so exotic folds in (?i)
// groups can differ.
type regexMatcher struct {
	re *regexp2.Regexp
}

// regexTimeout bounds one regexp2 search (a pathological pattern must not hang a request).
const regexTimeout = 2 * time.Second

func newRegexMatcher(pattern string) (regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return regexMatcher{}, err
	}
	re.MatchTimeout = regexTimeout
	return regexMatcher{re: re}, nil
}

func (m regexMatcher) matches(s string, fn func(start, end int) error) error {
	// regexp2 reports rune offsets; walk the string alongside to turn them into byte offsets.
	runePos, bytePos := 0, 0
	toByte := func(r int) int {
		for runePos < r {
			_, w := utf8.DecodeRuneInString(s[bytePos:])
			bytePos += w
			runePos++
		}
		return bytePos
	}
	match, err := m.re.FindStringMatch(s)
	for ; err == nil && match != nil; match, err = m.re.FindNextMatch(match) {
		if match.Length == 0 {
			continue // an empty match makes no piece
		}
		a := toByte(match.Index)
		b := toByte(match.Index + match.Length)
		if ferr := fn(a, b); ferr != nil {
			return ferr
		}
	}
	if err != nil {
		return &InputError{Offset: bytePos, Msg: "pre-tokenizer regex: " + err.Error()}
	}
	return nil
}
