//go:build !race

package tokenizer

// raceEnabled: see race_test.go.
const raceEnabled = false
