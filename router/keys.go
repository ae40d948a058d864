package router

// Index keys: where a block's entry lives in the index.
//
// A lookup walks a prompt's blocks in order, and with entries placed by their own hash every
// block is a cache miss of its own into a table far larger than the caches (a 4K-token prompt:
// 256 misses, which a core overlaps only about ten at a time). Index keys place the entries of
// consecutive blocks side by side instead. A sequence's blocks are taken in groups of
// keyGroup from its first block; a group's home is the low 32 bits of its first block's
// sequence hash, aligned down to keyGroup, and block j of the group gets home + j. A key is the
// block's sequence hash with its low 32 bits replaced by that home: the index picks shard and
// slot from those bits, so a group fills one run of adjacent slots (two cache lines for a
// one-word, one-tier index) and a 256-block lookup misses about 32 times instead of 256.
//
// A key depends only on the block's chain (its group's first block and its place in the
// group): a reader computes a prompt's keys from its sequence hashes (ChainKeys), a writer a
// block's from its parent's key (ChildKey). Identity: two blocks share a key only when their
// homes and the high 32 bits of their sequence hashes agree. Blocks with the same home
// continue the same group start at the same offset, so a false match needs a 32-bit collision
// between such siblings, and costs at worst one overestimated overlap.

const (
	keyGroup    = 8 // blocks per group: 8 × 16-byte slots are two cache lines
	keyHomeMask = 1<<32 - 1
)

// ChildKey is the index key of a block with sequence hash seq whose parent block has index key
// parent; hasParent false means the block starts a sequence.
func ChildKey(parent uint64, hasParent bool, seq uint64) uint64 {
	if hasParent && parent&(keyGroup-1) != keyGroup-1 {
		return seq&^keyHomeMask | (parent+1)&keyHomeMask
	}
	return seq &^ (keyGroup - 1) // the group's first block: its own low bits, aligned, are the home
}

// ChainKeys appends the index keys of a sequence's blocks (sequence hashes, first block
// first) to dst.
func ChainKeys(dst, seqs []uint64) []uint64 {
	var parent uint64
	for i, h := range seqs {
		parent = ChildKey(parent, i > 0, h)
		dst = append(dst, parent)
	}
	return dst
}
