package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"dataplane/bench/synth"
)

func init() {
	register(command{"synth", "synthesize a request trace from a Mooncake-style trace (dataplane synth -h)", synthCommand})
}

const synthUsage = `Usage: dataplane synth --trace IN.jsonl [--out OUT.jsonl] [knobs]
       dataplane synth fleet --prefill N --decode M --zones Z [...]   (a --worker-labels file; -h)

Learns IN (Mooncake JSONL: timestamp, input_length, output_length, hash_ids of 512-token
blocks) as a core radix tree of shared prefix blocks plus the distributions of everything
else, and samples a new trace from it (stdout unless --out). The knobs scale one thing each;
the multimodal ones add image, video and audio items. A summary (source vs synthesized:
prefix-cache hit ratio, ISL, OSL) goes to stderr.

Flags:
`

func synthCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "fleet" {
		return synthFleet(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, synthUsage); fs.PrintDefaults() }
	k := synth.DefaultKnobs()
	in := fs.String("trace", "", "source trace (JSONL)")
	out := fs.String("out", "", "where to write the synthesized trace (default: stdout)")
	blockSize := fs.Int("block-size", 512, "tokens per hash id in the source trace")
	fs.IntVar(&k.Requests, "requests", 0, "requests to synthesize (0: as many as the source)")
	fs.Uint64Var(&k.Seed, "seed", 0, "random seed (0: random; the summary says which)")
	fs.Float64Var(&k.PrefixLenMultiplier, "prefix-len-multiplier", k.PrefixLenMultiplier, "scale shared prefix lengths")
	fs.IntVar(&k.PrefixRootMultiplier, "prefix-root-multiplier", k.PrefixRootMultiplier, "independent copies of the prefix tree (less sharing)")
	fs.Float64Var(&k.PromptLenMultiplier, "prompt-len-multiplier", k.PromptLenMultiplier, "scale each request's unshared prompt blocks")
	fs.Float64Var(&k.OSLMultiplier, "osl-multiplier", k.OSLMultiplier, "scale output lengths")
	fs.Float64Var(&k.SpeedupRatio, "speedup-ratio", k.SpeedupRatio, "divide inter-arrival times (2: twice the request rate)")
	fs.Float64Var(&k.ImageShare, "image-share", 0, "share of requests with an image")
	fs.Float64Var(&k.VideoShare, "video-share", 0, "share of requests with a video")
	fs.Float64Var(&k.AudioShare, "audio-share", 0, "share of requests with an audio clip")
	fs.IntVar(&k.ImageTokens, "image-tokens", k.ImageTokens, "tokens per image")
	fs.IntVar(&k.VideoTokens, "video-tokens", k.VideoTokens, "tokens per video (0: ceil(frames / video-pool) x video-frame-tokens, the daemon's count)")
	fs.IntVar(&k.VideoFrames, "video-frames", k.VideoFrames, "frames sampled per video (the encoder's work)")
	fs.Float64Var(&k.VideoFPS, "video-fps", k.VideoFPS, "their rate (a video lasts frames / fps)")
	fs.IntVar(&k.VideoPool, "video-pool", k.VideoPool, "frames sharing one set of tokens (Qwen2-VL's temporal patch: 2)")
	fs.IntVar(&k.VideoFrameTokens, "video-frame-tokens", k.VideoFrameTokens, "tokens per pooled frame group (256: a 448x448 frame after Qwen2-VL's 2x2 merge)")
	fs.IntVar(&k.AudioTokens, "audio-tokens", k.AudioTokens, "tokens per audio clip")
	fs.Float64Var(&k.MediaReuse, "media-reuse", 0, "probability an item repeats one from the same conversation")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if *in == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "synth: --trace is required (and nothing else after the flags)")
		return errUsage
	}
	if k.Seed == 0 {
		k.Seed = randSeed()
	}
	recs, tree, err := loadTrace(*in, *blockSize)
	if err != nil {
		return err
	}
	res, err := synth.Synthesize(tree, k)
	if err != nil {
		return err
	}
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := synth.WriteTrace(w, res); err != nil {
		return err
	}
	describe := func(name string, r []synth.Record) {
		isl, osl := synth.Lengths(r)
		a, b := synth.Summarize(isl), synth.Summarize(osl)
		dur := 0.0
		if len(r) > 0 {
			dur = (r[len(r)-1].Timestamp - r[0].Timestamp) / 1000
		}
		fmt.Fprintf(stderr, "%-12s %6d requests over %7.0f s, hit ratio %.3f, ISL mean/p50/p90 %6.0f/%6.0f/%6.0f, OSL %4.0f/%4.0f/%4.0f\n",
			name, len(r), dur, synth.HitRatio(r), a.Mean, a.P50, a.P90, b.Mean, b.P50, b.P90)
	}
	describe("source", recs)
	describe("synthesized", res)
	fmt.Fprintf(stderr, "seed %d; core tree: %d segments, %d shared blocks\n", k.Seed, len(tree.Nodes)-1, tree.SharedBlocks())
	return nil
}

func loadTrace(path string, blockSize int) ([]synth.Record, *synth.Tree, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	lim := synth.DefaultLimits()
	lim.BlockSize = blockSize
	recs, err := synth.ReadTrace(f, lim)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	tree, err := synth.BuildTree(recs, blockSize)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, tree, nil
}
