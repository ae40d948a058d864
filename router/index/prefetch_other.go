//go:build !amd64 && !arm64

package index

// prefetch is a no-op where we have no prefetch instruction wired up.
func prefetch([]uintptr) {}
