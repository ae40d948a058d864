package tokenizer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Encoding text whose words are all in the word cache allocates nothing when the caller's
// buffer has room: the daemon tokenizes every text-only request this way.
func TestEncodeCacheHitAllocatesNothing(t *testing.T) {
	const text = "The quick brown fox jumps over the lazy dog. It was 1999, and the fox (a red one) said: \"hello, world!\""
	for _, name := range []string{"qwen2-small", "llama3-small"} {
		tk := plainTokenizer(t, name)
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
}
