package openai

import (
	"testing"
	"time"
)

// BenchmarkDecode: a request body into its raw struct, by decode (segmentio's decoder first)
// beside encoding/json alone in the same loop; x-std is encoding/json's time over decode's.
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name, body string
		target     func() any
	}{
		{"completion", `{"prompt":"The quick brown fox jumps over the lazy dog.","max_tokens":1}`, func() any { return new(rawCompletion) }},
		{"chat-2-messages", `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},` +
			`{"role":"user","content":"The quick brown fox jumps over the lazy dog."}],"max_tokens":16,"temperature":0.7}`,
			func() any { return new(rawChat) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			fast, std := c.target(), c.target()
			var fastTime, stdTime time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := decode(body, fast); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := stdDecode(body, std); err != nil {
					b.Fatal(err)
				}
				fastTime, stdTime = fastTime+t1.Sub(t0), stdTime+time.Since(t1)
			}
			b.ReportMetric(float64(fastTime.Nanoseconds())/float64(b.N), "decode-ns/op")
			b.ReportMetric(float64(stdTime.Nanoseconds())/float64(b.N), "std-ns/op")
			b.ReportMetric(float64(stdTime)/float64(fastTime), "x-std")
		})
	}
}
