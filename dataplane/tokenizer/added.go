package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: matched in the text before
// pre-tokenization and emitted as one id.
type addedToken struct {
	id         int32
	content    string
	special    bool // skipped by Decode with SkipSpecialTokens
	singleWord bool // only where no word character touches it
	lstrip     bool // swallows the whitespace on its left
	rstrip     bool // swallows the whitespace on its right
	normalized bool // matched in the normalized text (else in the raw text)
}

// addedMatcher finds added tokens the way Hugging Face's Aho-Corasick automaton does with
// leftmost-longest semantics: the earliest match, the longest of those starting there, then on
// from its end. Added tokens are few (26 in Qwen2, 256 in Llama-3), so a byte trie with a
// first-byte filter is enough.
type addedMatcher struct {
	nodes []trieNode
	first [256]bool
	token []*addedToken // by pattern index
}

type trieNode struct {
	edges   []trieEdge
	pattern int32 // index into token, -1 if no pattern ends here
}

type trieEdge struct {
	b    byte
	node int32
}

func newAddedMatcher() *addedMatcher {
	return &addedMatcher{nodes: []trieNode{{pattern: -1}}}
}

func (m *addedMatcher) add(pattern string, t *addedToken) {
	if pattern == "" {
		return
	}
	n := int32(0)
	for i := 0; i < len(pattern); i++ {
		next := m.child(n, pattern[i])
		if next < 0 {
			next = int32(len(m.nodes))
			m.nodes = append(m.nodes, trieNode{pattern: -1})
			m.nodes[n].edges = append(m.nodes[n].edges, trieEdge{b: pattern[i], node: next})
		}
		n = next
	}
	if m.nodes[n].pattern < 0 { // the first token with this text wins, as in the automaton
		m.nodes[n].pattern = int32(len(m.token))
		m.token = append(m.token, t)
	}
	m.first[pattern[0]] = true
}

// child is node n's child for byte b, or -1.
func (m *addedMatcher) child(n int32, b byte) int32 {
	for _, e := range m.nodes[n].edges {
		if e.b == b {
			return e.node
		}
	}
	return -1
}

func (m *addedMatcher) empty() bool { return len(m.token) == 0 }

// longestAt returns the longest pattern that starts at s[i:], or (nil, 0).
func (m *addedMatcher) longestAt(s string, i int) (*addedToken, int) {
	var best *addedToken
	bestLen := 0
	n := int32(0)
	for j := i; j < len(s); j++ {
		next := m.child(n, s[j])
		if next < 0 {
			break
		}
		n = next
		if p := m.nodes[n].pattern; p >= 0 {
			best, bestLen = m.token[p], j+1-i
		}
	}
	return best, bestLen
}

// split cuts s into text pieces and added tokens, applying each token's flags exactly as
// Hugging Face's AddedVocabulary::find_matches does: a single_word match touching a word
// character is dropped (and the search goes on after it), lstrip and rstrip widen a match over
// whitespace (never back into an earlier match).
func (m *addedMatcher) split(s string, text func(string) error, token func(*addedToken) error) error {
	if m.empty() {
		if s == "" {
			return nil
		}
		return text(s)
	}
	done := 0 // end of the last emitted piece
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		t, n := m.longestAt(s, i)
		if t == nil {
			i++
			continue
		}
		start, stop := i, i+n
		i = stop
		if t.singleWord && (endsWithWord(s[:start]) || startsWithWord(s[stop:])) {
			continue
		}
		if t.lstrip {
			start = max(trailingSpaceStart(s[:start]), done)
		}
		if t.rstrip {
			stop += leadingSpaceLen(s[stop:]) // the search still goes on from the match's own end
		}
		if start > done {
			if err := text(s[done:start]); err != nil {
				return err
			}
		}
		if err := token(t); err != nil {
			return err
		}
		done = stop
	}
	if done < len(s) {
		return text(s[done:])
	}
	return nil
}

// isWordChar is \w of Rust's regex crate (which Hugging Face uses for single_word): Alphabetic,
// marks, decimal digits, connector punctuation and the joiners.
func isWordChar(r rune) bool {
	if r < utf8.RuneSelf {
		return r == '_' || asciiClass[r]&(clsL|clsN) != 0
	}
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// trailingSpaceStart is where the whitespace at the end of s begins.
func trailingSpaceStart(s string) int {
	for len(s) > 0 {
		r, w := utf8.DecodeLastRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[:len(s)-w]
	}
	return len(s)
}

// leadingSpaceLen is the length of the whitespace at the start of s.
func leadingSpaceLen(s string) int {
	n := 0
	for n < len(s) {
		r, w := utf8.DecodeRuneInString(s[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += w
	}
	return n
}
