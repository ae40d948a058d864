//go:build race

package tokenizer

// raceEnabled: the race detector is on, and sync.Pool drops a quarter of what is put back, so
// allocation counts are not this build's to check (make test counts them again without it).
const raceEnabled = true
