package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// A splitter cuts normalized text into pre-tokens: it calls emit with each piece, in order.
// The pieces are then byte-level BPE'd one by one.
type splitter interface {
	split(s string, emit func(piece string) error) error
}

// A matcher finds the regex matches of a Split pre-tokenizer: fn gets the byte range of each
// match, in order, never overlapping.
type matcher interface {
	matches(s string, fn func(start, end int) error) error
}

// The Split patterns of the families this package knows by heart. Their matches are computed by
// scanner, a hand-written matcher exactly equivalent to the regex (Oniguruma, leftmost-first
// alternation with backtracking and a negative lookahead), several times faster than a
// backtracking regex engine (see BenchmarkPreTokenize); any other pattern runs on regexp2.
const (
	// Qwen2, Qwen2.5, Qwen3 (and their VL/Audio models): one digit a piece.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama-3, 3.1, 3.2, 3.3: up to three digits a piece.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// GPT-2: the pattern of the ByteLevel pre-tokenizer with use_regex.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// scanner matches one of the three patterns above. maxDigits is how many \p{N} one piece may
// hold (0: unbounded); gpt2 selects the GPT-2 alternation.
type scanner struct {
	maxDigits int
	gpt2      bool
}

func scannerFor(pattern string) (scanner, bool) {
	switch pattern {
	case patternQwen2:
		return scanner{maxDigits: 1}, true
	case patternLlama3:
		return scanner{maxDigits: 3}, true
	case patternGPT2:
		return scanner{gpt2: true}, true
	}
	return scanner{}, false
}

func (sc scanner) matches(s string, fn func(start, end int) error) error {
	for i := 0; i < len(s); {
		n := sc.match(s, i)
		if err := fn(i, i+n); err != nil {
			return err
		}
		i += n
	}
	return nil
}

// split makes scanner the Split pre-tokenizer (Isolated) of its pattern: the matches tile the
// text, so each match is a piece. Splitting here rather than through splitPre spares the
// callback splitPre passes to its matcher, which would escape and cost an allocation per call.
func (sc scanner) split(s string, emit func(string) error) error {
	return sc.matches(s, func(a, b int) error { return emit(s[a:b]) })
}

// Character classes as Oniguruma defines them for these patterns: \p{L} and \p{N} are the
// Unicode general categories, \s is White_Space (which is what unicode.IsSpace tests).
func isL(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clsL != 0
	}
	return unicode.IsLetter(r)
}

func isN(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clsN != 0
	}
	return unicode.IsNumber(r)
}

func isS(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clsS != 0
	}
	return unicode.IsSpace(r)
}

const (
	clsL = 1 << iota
	clsN
	clsS
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range utf8.RuneSelf {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = clsL
		case c >= '0' && c <= '9':
			t[c] = clsN
		case c == ' ', c >= '\t' && c <= '\r':
			t[c] = clsS
		}
	}
	return t
}()

func decode(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// match returns the length of the piece that starts at i (always > 0 when i < len(s)): the
// first alternative of the pattern that matches there, as the regex engine would pick it.
func (sc scanner) match(s string, i int) int {
	r, w := decode(s, i)
	// 's 't 're 've 'm 'll 'd (the Llama-3 / Qwen2 patterns ignore ASCII case; Oniguruma does
	// not fold non-ASCII letters such as U+017F into them, as the vectors confirm).
	if r == '\'' {
		if n := contraction(s[i+1:], !sc.gpt2); n > 0 {
			return 1 + n
		}
	}
	if sc.gpt2 {
		return sc.matchGPT2(s, i, r, w)
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(r) {
		return w + letters(s, i+w)
	}
	if r != '\r' && r != '\n' && !isN(r) {
		if r2, _ := decode(s, i+w); r2 >= 0 && isL(r2) {
			return w + letters(s, i+w)
		}
	}
	// \p{N} or \p{N}{1,3}
	if isN(r) {
		n := w
		for k := 1; k < sc.maxDigits; k++ {
			r2, w2 := decode(s, i+n)
			if r2 < 0 || !isN(r2) {
				break
			}
			n += w2
		}
		return n
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r == ' ' {
		j++
	}
	if k := others(s, j); k > j {
		for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		return k - i
	}
	// What is left starts with whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
	end, lastNL := i, -1
	for end < len(s) {
		r2, w2 := decode(s, end)
		if !isS(r2) {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastNL = end
		}
		end += w2
	}
	if lastNL >= 0 {
		return lastNL + 1 - i
	}
	return spaceRun(s, i, end, w)
}

// matchGPT2 is the GPT-2 alternation after the contractions:
// ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
func (sc scanner) matchGPT2(s string, i int, r rune, w int) int {
	j, rj := i, r
	if r == ' ' {
		j++
		rj, _ = decode(s, j)
	}
	switch {
	case rj < 0:
	case isL(rj):
		return letters0(s, j) - i
	case isN(rj):
		k := j
		for {
			r2, w2 := decode(s, k)
			if r2 < 0 || !isN(r2) {
				break
			}
			k += w2
		}
		return k - i
	case !isS(rj):
		return others(s, j) - i
	}
	end := i
	for end < len(s) {
		r2, w2 := decode(s, end)
		if !isS(r2) {
			break
		}
		end += w2
	}
	return spaceRun(s, i, end, w)
}

// letters0 returns the end of the \p{L}+ run that starts at j.
func letters0(s string, j int) int {
	for j < len(s) {
		r, w := decode(s, j)
		if !isL(r) {
			break
		}
		j += w
	}
	return j
}

// letters returns the length of the \p{L}* run at j (used where one letter is known to follow).
func letters(s string, j int) int {
	return letters0(s, j) - j
}

// others returns the end of the [^\s\p{L}\p{N}]+ run at j (j itself when there is none).
func others(s string, j int) int {
	for j < len(s) {
		r, w := decode(s, j)
		if isS(r) || isL(r) || isN(r) {
			break
		}
		j += w
	}
	return j
}

// spaceRun applies `\s+(?!\S)|\s+` to the whitespace run s[i:end] (w: width of its first
// character): the whole run at the end of the text; otherwise the run less its last character,
// so that character can lead the next piece; a single character stands alone.
func spaceRun(s string, i, end, w int) int {
	if end == len(s) {
		return end - i
	}
	if end-i > w {
		_, lw := utf8.DecodeLastRuneInString(s[i:end])
		return end - lw - i
	}
	return w
}

// contraction returns the length of the contraction suffix at the start of s (after the
// apostrophe): s, t, m, d, re, ve, ll; foldCase accepts ASCII upper case too.
func contraction(s string, foldCase bool) int {
	lower := func(k int) byte {
		if k >= len(s) {
			return 0
		}
		c := s[k]
		if foldCase && c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		return c
	}
	switch c := lower(0); c {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if lower(1) == 'e' {
			return 2
		}
	case 'l':
		if lower(1) == 'l' {
			return 2
		}
	}
	return 0
}
