package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzEncode: any text either encodes (and decodes back to itself: byte-level BPE is lossless
// and the small tokenizer's added tokens decode to their text, except where NFC changed it) or
// fails with a typed error; never a panic.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello world", "<|im_start|>user\nhi<|im_end|>", "caf\u00e9 e\u0301", "\xff\xfe", "  \n\n\t x", "'s'LL 123456", "<mask> [END]  word <<<", "\U0001F600\u200d"} {
		f.Add(s)
	}
	tk, err := Load("testdata/llama3-small", Options{MaxInputBytes: 1 << 16})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := tk.Encode(s)
		if !utf8.ValidString(s) {
			require.ErrorIs(t, err, ErrInput)
			return
		}
		if len(s) > 1<<16 {
			require.ErrorIs(t, err, ErrLimit)
			return
		}
		require.NoError(t, err)
		back, err := tk.Decode(ids, DecodeOptions{})
		require.NoError(t, err)
		require.Equal(t, s, back) // llama3-small has no normalizer
	})
}

// FuzzLoad: mutated tokenizer files load or fail with a typed error.
func FuzzLoad(f *testing.F) {
	f.Add(string(minimal(f, nil)))
	f.Add(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`)
	f.Add(`{"model": {"vocab": {}, "merges": [["a", "b"]]}, "added_tokens": [{"content": "x"}]}`)
	f.Add(`{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?=a)"}, "behavior": "Removed"}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		tk, err := New(Files{Tokenizer: []byte(doc)}, Options{MaxInputBytes: 256})
		if err != nil {
			require.True(t, strings.Contains(err.Error(), "tokenizer"), err.Error())
			return
		}
		for _, s := range []string{"hello world", "ab<s>ba", " x\n"} {
			if ids, err := tk.Encode(s); err == nil {
				_, err = tk.Decode(ids, DecodeOptions{})
				require.NoError(t, err)
			}
		}
	})
}

// FuzzScanner: the hand-written pre-tokenizer agrees with regexp2 running the pattern itself.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{"Hello, world!", "I'm  here\n\n ok", "x\u00a0\u3000y", "'S'LL'Ve", " (\t)\r\n", "12345 \u0663\u0664"} {
		f.Add(s)
	}
	type pair struct {
		sc scanner
		re regexMatcher
	}
	var pairs []pair
	for _, p := range []string{patternQwen2, patternLlama3, patternGPT2} {
		sc, _ := scannerFor(p)
		re, err := newRegexMatcher(p)
		require.NoError(f, err)
		pairs = append(pairs, pair{sc, re})
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || strings.ContainsAny(s, "\u017f\u212a") {
			return // Encode rejects invalid UTF-8; regexp2 folds ſ and K into (?i) s and k, Oniguruma does not
		}
		for _, p := range pairs {
			require.Equal(t, matchList(t, p.re, s), matchList(t, p.sc, s), "%q", s)
		}
	})
}
