package tokenizer

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// Encoding text whose words are all in the word cache allocates nothing when the caller's
// buffer has room: the daemon tokenizes every text-only request this way.
func TestEncodeCacheHitAllocatesNothing(t *testing.T) {
	if raceEnabled { // a GC under -race and a loaded machine empties the pools mid-count (9 allocations seen)
		t.Skip("allocation counts are checked without -race (make test's second pass)")
	}
	const text = "The quick brown fox jumps over the lazy dog. It was 1999, and the fox (a red one) said: \"hello, world!\""
	f := func(name string, tk *Tokenizer) {
		t.Helper()
		for _, special := range []bool{false, true} {
			opts := EncodeOptions{AddSpecialTokens: special}
			want, err := tk.AppendEncode(nil, text, opts) // fills the word cache
			require.NoError(t, err)
			dst := make([]int32, 0, 2*len(want))
			allocs := testing.AllocsPerRun(100, func() {
				dst, err = tk.AppendEncode(dst[:0], text, opts)
			})
			require.NoError(t, err)
			require.Equal(t, want, dst)
			require.Zero(t, allocs, "%s, special tokens %v", name, special)
		}
	}
	f("qwen2-small", plainTokenizer(t, "qwen2-small"))
	f("llama3-small", plainTokenizer(t, "llama3-small"))
	// GPT-2's pre-tokenizer as GPT-2's own file sets it; with add_prefix_space it copies the text.
	gpt2 := map[string]json.RawMessage{
		"normalizer":    json.RawMessage(`null`),
		"pre_tokenizer": json.RawMessage(`{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}`),
	}
	f("qwen2-small with GPT-2's ByteLevel", patchedTokenizer(t, "testdata/qwen2-small/tokenizer.json", gpt2))
}
