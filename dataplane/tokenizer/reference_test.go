package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// refModel is a deliberately plain byte-level BPE written from the algorithm's definition, used
// as a test reference and as the benchmarks' baseline: vocabulary and merges as the file writes
// them (byte-level strings), a regexp2 pre-tokenizer, and the quadratic merge loop on strings.
type refModel struct {
	vocab  map[string]int32
	ranks  map[[2]string]int
	split  regexMatcher
	ignore bool
}

func newRefModel(t testing.TB, file string) *refModel {
	var doc struct {
		Model struct {
			Vocab        map[string]int32 `json:"vocab"`
			Merges       json.RawMessage  `json:"merges"`
			IgnoreMerges bool             `json:"ignore_merges"`
		} `json:"model"`
		PreTokenizer struct {
			Pretokenizers []struct {
				Pattern map[string]string `json:"pattern"`
			} `json:"pretokenizers"`
		} `json:"pre_tokenizer"`
	}
	require.NoError(t, json.Unmarshal(mustRead(t, file), &doc))
	m := &refModel{vocab: doc.Model.Vocab, ranks: map[[2]string]int{}, ignore: doc.Model.IgnoreMerges}
	var pairs [][2]string
	if json.Unmarshal(doc.Model.Merges, &pairs) != nil {
		var lines []string
		require.NoError(t, json.Unmarshal(doc.Model.Merges, &lines))
		for _, l := range lines {
			a, b, _ := strings.Cut(l, " ")
			pairs = append(pairs, [2]string{a, b})
		}
	}
	for i, p := range pairs {
		if _, dup := m.ranks[p]; !dup {
			m.ranks[p] = i
		}
	}
	var err error
	m.split, err = newRegexMatcher(doc.PreTokenizer.Pretokenizers[0].Pattern["Regex"])
	require.NoError(t, err)
	return m
}

// word merges one pre-token given as raw bytes.
func (m *refModel) word(dst []int32, raw string) []int32 {
	syms := make([]string, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		syms = append(syms, string(byteToRune[raw[i]]))
	}
	if id, ok := m.vocab[strings.Join(syms, "")]; ok && m.ignore {
		return append(dst, id)
	}
	for len(syms) > 1 {
		best, bestRank := -1, 0
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := m.ranks[[2]string{syms[i], syms[i+1]}]; ok && (best < 0 || r < bestRank) {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		syms[best] += syms[best+1]
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	for _, s := range syms {
		dst = append(dst, m.vocab[s])
	}
	return dst
}

// encode handles plain text (no added tokens, no normalization needed).
func (m *refModel) encode(dst []int32, text string) []int32 {
	_ = m.split.matches(text, func(a, b int) error {
		dst = m.word(dst, text[a:b])
		return nil
	})
	return dst
}

func TestBPEMatchesReference(t *testing.T) {
	r := newRand(t)
	for _, name := range []string{"qwen2-small", "llama3-small"} {
		tk := loadTokenizer(t, "testdata/"+name)
		ref := newRefModel(t, "testdata/"+name+"/tokenizer.json")
		alphabet := []string{"a", "b", "e", "t", "h", "in", "er", "th", " ", "=", "\u00e9", "\u4e00", "1"}
		sc := new(bpeScratch)
		for range 3000 {
			var b strings.Builder
			n := 1 + r.IntN(80) // crosses naiveMax: both merge paths
			for b.Len() < n {
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			w := b.String()
			want := ref.word(nil, w)
			require.Equal(t, want, tk.model.appendWord(nil, w), "%s: word %q", name, w)
			if len(w) > 1 {
				require.Equal(t, want, tk.model.mergeHeap(nil, w, sc), "%s: heap merge of %q", name, w)
				require.Equal(t, want, tk.model.mergeNaive(nil, w, sc), "%s: scan merge of %q", name, w)
			}
		}
	}
}

// plainTokenizer is a small tokenizer without the test-only added tokens of qwen2-small
// ("word", "<<", ... occur in real text; the reference has no added tokens).
func plainTokenizer(t testing.TB, name string) *Tokenizer {
	file := "testdata/" + name + "/tokenizer.json"
	var doc struct {
		AddedTokens []json.RawMessage `json:"added_tokens"`
	}
	require.NoError(t, json.Unmarshal(mustRead(t, file), &doc))
	keep := doc.AddedTokens
	if name == "qwen2-small" {
		keep = keep[:26] // Qwen3's own
	}
	b, err := json.Marshal(keep)
	require.NoError(t, err)
	return patchedTokenizer(t, file, map[string]json.RawMessage{"added_tokens": b})
}

func TestEncodeMatchesReferenceOnRealText(t *testing.T) {
	v := readVectors(t, "qwen2-small")
	for _, name := range []string{"qwen2-small", "llama3-small"} {
		tk := plainTokenizer(t, name)
		ref := newRefModel(t, "testdata/"+name+"/tokenizer.json")
		for _, rt := range v.Real {
			text := realText(t, rt.Path, rt.Bytes, rt.SHA256)
			got, err := tk.Encode(text)
			require.NoError(t, err)
			require.Equal(t, ref.encode(nil, text), got, "%s on %s", name, rt.Name)
		}
	}
}

// TestScannerMatchesRegex compares the hand-written pre-tokenizer with regexp2 running the
// pattern itself, on random strings drawn from the character classes the patterns care about.
func TestScannerMatchesRegex(t *testing.T) {
	r := newRand(t)
	pieces := []string{"a", "Z", "\u00e9", "\u4e2d", "\u0663", "\u2167", "7", "'", "'s", "'S", "'ll", "'Re", "'ve", "'d", "'m", "'t",
		" ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\v", "\f", "\u001c", "\u200b",
		".", "!", "(", "\u0301", "\U0001F600", "-", "_", "\ue000"}
	for _, pattern := range []string{patternQwen2, patternLlama3, patternGPT2} {
		sc, ok := scannerFor(pattern)
		require.True(t, ok)
		re, err := newRegexMatcher(pattern)
		require.NoError(t, err)
		for range 4000 {
			var b strings.Builder
			for range r.IntN(14) {
				b.WriteString(pieces[r.IntN(len(pieces))])
			}
			s := b.String()
			require.Equal(t, matchList(t, re, s), matchList(t, sc, s), "pattern %s on %q", pattern, s)
		}
	}
}

func matchList(t testing.TB, m matcher, s string) [][2]int {
	var out [][2]int
	require.NoError(t, m.matches(s, func(a, b int) error {
		out = append(out, [2]int{a, b})
		return nil
	}))
	return out
}

func TestAppendLossy(t *testing.T) {
	// Expected outputs follow the W3C/Unicode "maximal subpart" substitution that Rust's
	// String::from_utf8_lossy implements.
	f := func(in, want string) {
		t.Helper()
		got := string(appendLossy(nil, []byte(in)))
		require.Equal(t, want, got, "%x", in)
		require.True(t, utf8.ValidString(got))
	}
	f("abc", "abc")
	f("\xe2\x82\xac", "\u20ac")
	f("\xe2\x82", "\ufffd")                 // truncated 3-byte sequence: one replacement
	f("\xe2\x82A", "\ufffdA")               // ... before ASCII
	f("\x80\x80", "\ufffd\ufffd")           // lone continuation bytes: one each
	f("\xf0\x9f\x98", "\ufffd")             // truncated 4-byte sequence
	f("\xed\xa0\x80", "\ufffd\ufffd\ufffd") // a surrogate: E D's second byte must be 80-9F
	f("\xc0\xaf", "\ufffd\ufffd")           // overlong lead: invalid alone
	f("\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd")
	f("\xff", "\ufffd")
}

// clearCache empties the word cache (benchmarks of the cold path).
func (m *bpe) clearCache() {
	for i := range m.cache.slots {
		m.cache.slots[i].Store(nil)
	}
}
