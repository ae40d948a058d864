package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// minimal is a valid byte-level tokenizer.json: the 256 byte tokens, one merge, one special
// token.
func minimal(t testing.TB, edit func(doc map[string]any)) []byte {
	vocab := map[string]any{}
	for b := range 256 {
		vocab[string(byteToRune[b])] = b
	}
	vocab["ab"] = 256
	doc := map[string]any{
		"added_tokens": []any{map[string]any{"id": 257, "content": "<s>", "special": true}},
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternQwen2}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{"a b"}},
	}
	if edit != nil {
		edit(doc)
	}
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	return b
}

func model(doc map[string]any) map[string]any { return doc["model"].(map[string]any) }

func TestLoadMinimal(t *testing.T) {
	tk, err := New(Files{Tokenizer: minimal(t, nil)}, Options{})
	require.NoError(t, err)
	ids, err := tk.Encode("ab<s>ba")
	require.NoError(t, err)
	require.Equal(t, []int32{256, 257, 'b', 'a'}, ids)
	// merges in the pair form load the same model
	tk2, err := New(Files{Tokenizer: minimal(t, func(d map[string]any) { model(d)["merges"] = []any{[]any{"a", "b"}} })}, Options{})
	require.NoError(t, err)
	ids2, err := tk2.Encode("ab<s>ba")
	require.NoError(t, err)
	require.Equal(t, ids, ids2)
}

func TestLoadErrors(t *testing.T) {
	f := func(name string, kind error, wantIn string, edit func(doc map[string]any)) {
		t.Helper()
		_, err := New(Files{Tokenizer: minimal(t, edit)}, Options{})
		require.ErrorIs(t, err, kind, name)
		var le *LoadError
		require.ErrorAs(t, err, &le, name)
		require.Contains(t, err.Error(), wantIn, name)
	}
	f("wordpiece", ErrUnsupported, "model.type", func(d map[string]any) { model(d)["type"] = "WordPiece" })
	f("no model", ErrFormat, "model", func(d map[string]any) { delete(d, "model") })
	f("byte fallback", ErrUnsupported, "byte_fallback", func(d map[string]any) { model(d)["byte_fallback"] = true })
	f("missing byte", ErrFormat, "byte 0x41", func(d map[string]any) { delete(model(d)["vocab"].(map[string]any), "A") })
	f("negative id", ErrFormat, "outside", func(d map[string]any) { model(d)["vocab"].(map[string]any)["x"] = -1 })
	f("merge not in vocab", ErrFormat, "merges[0]", func(d map[string]any) { model(d)["merges"] = []any{"a c"} })
	f("merge with 3 parts", ErrFormat, "merges[0]", func(d map[string]any) { model(d)["merges"] = []any{"a b c"} })
	f("merge pair of 3", ErrFormat, "merges[0]", func(d map[string]any) { model(d)["merges"] = []any{[]any{"a", "b", "c"}} })
	f("merges not a list", ErrFormat, "merges", func(d map[string]any) { model(d)["merges"] = "a b" })
	f("metaspace", ErrUnsupported, "pre_tokenizer.type", func(d map[string]any) { d["pre_tokenizer"] = map[string]any{"type": "Metaspace"} })
	f("bad regex", ErrUnsupported, "pattern.Regex", func(d map[string]any) {
		d["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(unclosed"}, "behavior": "Isolated"}
	})
	f("merged behavior", ErrUnsupported, "behavior", func(d map[string]any) {
		d["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "MergedWithNext"}
	})
	f("lowercase normalizer", ErrUnsupported, "normalizer.type", func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Lowercase"} })
	f("wordpiece decoder", ErrUnsupported, "decoder.type", func(d map[string]any) { d["decoder"] = map[string]any{"type": "WordPiece"} })
	f("normalizer not an object", ErrFormat, "normalizer", func(d map[string]any) { d["normalizer"] = 3 })

	_, err := New(Files{Tokenizer: []byte("{not json")}, Options{})
	require.ErrorIs(t, err, ErrFormat)
	_, err = New(Files{Tokenizer: minimal(t, nil), Config: []byte(`{"bos_token": 3}`)}, Options{})
	require.ErrorIs(t, err, ErrFormat)
	require.ErrorContains(t, err, "tokenizer_config.json: bos_token")
	_, err = New(Files{Tokenizer: minimal(t, nil)}, Options{MaxFileBytes: 100})
	require.ErrorIs(t, err, ErrFormat)
	_, err = Load(t.TempDir(), Options{})
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestUnsupportedPostProcessorOnlyWhenUsed(t *testing.T) {
	tk, err := New(Files{Tokenizer: minimal(t, func(d map[string]any) { d["post_processor"] = map[string]any{"type": "RobertaProcessing"} })}, Options{})
	require.NoError(t, err)
	_, err = tk.Encode("ab")
	require.NoError(t, err)
	_, err = tk.AppendEncode(nil, "ab", EncodeOptions{AddSpecialTokens: true})
	require.ErrorIs(t, err, ErrUnsupported)
}

func TestLimitsAndBadInput(t *testing.T) {
	tk, err := Load("testdata/qwen2-small", Options{MaxInputBytes: 64, MaxTokens: 10})
	require.NoError(t, err)
	_, err = tk.Encode(strings.Repeat("x", 65))
	var le *LimitError
	require.ErrorAs(t, err, &le)
	require.Equal(t, "input bytes", le.What)
	_, err = tk.Encode("1 2 3 4 5 6 7 8 9 10 11")
	require.ErrorAs(t, err, &le)
	require.Equal(t, "tokens", le.What)
	dst := []int32{42}
	out, err := tk.AppendEncode(dst, strings.Repeat("9", 11), EncodeOptions{})
	require.ErrorIs(t, err, ErrLimit)
	require.Equal(t, []int32{42}, out, "dst comes back as it was")

	_, err = tk.Encode("ok \xff bad")
	var ie *InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 3, ie.Offset)

	_, err = tk.Decode([]int32{1, 2, 999999}, DecodeOptions{})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 2, ie.Offset)
	_, err = tk.Decode(make([]int32, 11), DecodeOptions{})
	require.ErrorIs(t, err, ErrLimit)
	_, err = tk.Token(-1)
	require.ErrorIs(t, err, ErrInput)
}

func TestLookups(t *testing.T) {
	tk := loadTokenizer(t, "testdata/qwen2-small")
	for name, want := range map[string]int32{"<|image_pad|>": 10268, "<|video_pad|>": 10269, "<|vision_start|>": 10265, "<|AUDIO|>": 10282, "<image>": 10285} {
		id, err := tk.Placeholder(name)
		require.NoError(t, err)
		require.Equal(t, want, id, name)
		tok, err := tk.Token(id)
		require.NoError(t, err)
		require.Equal(t, name, tok)
		require.True(t, tk.IsSpecial(id))
	}
	_, err := tk.Placeholder("<|IMAGE|>")
	var ue *UnknownTokenError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "<|IMAGE|>", ue.Token)
	require.ErrorContains(t, err, "placeholder")

	id, err := tk.TokenID("\u0120world") // "Ġworld": the vocabulary's spelling of " world"
	require.NoError(t, err)
	require.Equal(t, int32(1879), id)
	tok, err := tk.Token(1879)
	require.NoError(t, err)
	require.Equal(t, "\u0120world", tok)
	require.False(t, tk.IsSpecial(1879))
	require.Equal(t, 10256+39, tk.VocabSize(), "41 added tokens, of which \"word\" and \"<<\" are vocabulary tokens")

	c := tk.Config()
	require.Equal(t, "<|im_end|>", c.EOS)
	require.Equal(t, "<|endoftext|>", c.PAD)
	require.Contains(t, c.ChatTemplates["default"], "<|im_start|>")
}

func TestLoadFromDirWithSpecialTokensMap(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), minimal(t, nil), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "special_tokens_map.json"), []byte(`{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "<s>"}`), 0o644))
	tk, err := Load(dir, Options{})
	require.NoError(t, err)
	require.Equal(t, "<s>", tk.Config().BOS)
	require.Equal(t, "<s>", tk.Config().EOS, "tokenizer_config.json wins")
}

// TestConcurrentEncode runs Encode from several goroutines (run with -race) and checks every
// result against a sequential run.
func TestConcurrentEncode(t *testing.T) {
	tk := loadTokenizer(t, "testdata/qwen2-small")
	v := readVectors(t, "qwen2-small")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(v.Encode); i += 4 {
				got, err := tk.Encode(v.Encode[i].Text)
				if err == nil && !equalIDs(got, v.Encode[i].IDs) {
					err = errors.New("mismatch on " + v.Encode[i].Text)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
