//go:build !race

package router

// raceEnabled: see race_test.go.
const raceEnabled = false
