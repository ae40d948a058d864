//go:build amd64 || arm64

package index

// prefetch asks the CPU to start loading the cache line at each address and returns at once.
// The index issues one per block of a query before probing, so the blocks' cache misses overlap
// instead of queueing one behind another (a 4K-token lookup is ~256 misses into a table far
// larger than the caches). Addresses are only hints: nothing is read through them.
//
//go:noescape
func prefetch(addrs []uintptr)
