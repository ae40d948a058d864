//go:build !race

package api

// raceEnabled: see race_test.go.
const raceEnabled = false
