package main

// cases is every comparison `make bench-peers` runs, one row each: our Go benchmark (package,
// -test.bench pattern, the metric it reports) and the peer it is measured beside. A peer is
// either a script under bench/peers/ (run by python3 with --iters and --threads, one JSON
// line with ms_per_item on stdout) or, where Peer is empty, measured inside our benchmark
// itself (PeerMetric and RatioMetric name its metrics). "{isa}" in Bench is native.BestISA
// (a sub-benchmark per ISA). Fix a row here when a name changes: the names below are those of
// 2026-11-24 on the gemm and media branches (ms/item at the batch the peer uses); log-mel's
// peer and ms/item had not landed.
var cases = []Case{
	{Name: "ViT-B/16-224, batch 8, per image", Threads: 2,
		Pkg: "./dataplane/encoder", Bench: "^BenchmarkViTB16$", Benchtime: "1x", Metric: "ms/item",
		Peer: "bench/peers/vit_b16.py", Iters: 3},
	{Name: "Whisper-base encoder, 30 s", Threads: 2,
		Pkg: "./dataplane/encoder", Bench: "^BenchmarkWhisperBase30s$", Benchtime: "1x", Metric: "ms/item",
		Peer: "bench/peers/whisper_base_encoder.py", Iters: 3},
	{Name: "JPEG 1024x768 photo -> CLIP-336 tensor", Threads: 1,
		Pkg: "./dataplane/media/picture", Bench: "^BenchmarkJPEGToCLIP336$/^photo$", Benchtime: "50x", Metric: "ms/item",
		Peer: "bench/peers/clip_preprocess.py", Iters: 50},
	{Name: "log-mel, 30 s", Threads: 1,
		Pkg: "./native", Bench: "^BenchmarkLogMel30s$/^{isa}/threads=1$", Benchtime: "50x", Metric: "ms/item",
		Peer: "bench/peers/logmel.py", Iters: 50},
	{Name: "merge: gather of 32K text rows", Threads: 1,
		Pkg: "./native", Bench: "^BenchmarkMerge$/^gather-32k$/^threads=1$", Benchtime: "20x", Metric: "MB/s", Higher: true,
		PeerName: "memcpy of the same bytes", PeerMetric: "memcpy-GB/s", RatioMetric: "x-memcpy"},
	{Name: "daemon text-only path, 32 clients", Threads: 0,
		Pkg: "./cmd/dataplane", Bench: "^BenchmarkTextOnlyPath$", Benchtime: "1x", Metric: "req/s", Higher: true,
		PeerName: "fasthttp hello-world, same client", PeerMetric: "hello-req/s", RatioMetric: "x-hello"},
	// The same, as CPU time per request (client included), steadier on a shared machine.
	{Name: "daemon text-only path, CPU per request", Threads: 0,
		Pkg: "./cmd/dataplane", Bench: "^BenchmarkTextOnlyPath$", Benchtime: "1x", Metric: "cpu-us/req",
		PeerName: "fasthttp hello-world, same client", PeerMetric: "hello-cpu-us/req", RatioMetric: "x-hello-cpu"},
}
