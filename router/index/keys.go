package index

import "slices"

// Index keys: where a block's entry lives in the index.
//
// A lookup walks a prompt's blocks in order, and with entries placed by their own hash every
// block is a cache miss of its own into a table far larger than the caches (a 4K-token prompt:
// 256 misses, which a core overlaps only about ten at a time). Index keys place the entries of
// consecutive blocks side by side instead. Blocks are taken in groups of up to keyGroup; a
// group's home is the low 32 bits of its first block's sequence hash, aligned down to keyGroup,
// and the block at position j of the group gets home + j. A key is the block's sequence hash
// with its low 32 bits replaced by that: the index picks shard and slot from those bits, so a
// group fills one run of adjacent slots (four cache lines for a one-word, one-tier index, on one
// page: homes are aligned so that a group's slots start a line) and a 256-block lookup misses
// about 16 pages instead of 256.
//
// Branches. Conversations that branch from a shared prefix in the middle of a group would all
// want the same slots for the rest of that group, and linear probing would line them up one
// after another for every lookup to scan. So a block that continues a group (its child key) is
// stored under that key only when no other child key with the same home is in the table (a
// sibling, whichever came first); otherwise it goes to its branch key: a home of its own, from
// its own hash, at the same position, and the rest of the group follows it there. A branch key
// has bit 63 set (child keys have it clear), so it is never taken for a sibling. The index
// decides this when it first stores a block (Index.Store returns the keys it chose), and a
// lookup that meets a sibling where a child key would be (or nothing) looks for the block's
// branch key instead. A block's position in its group is its position in the sequence modulo
// keyGroup whatever branched, so a branch changes the keys of the rest of its group only: the
// groups after it start where ChainKeys says, and a lookup's prefetches for them stay right.
// The key of a block therefore depends on its parent's key, and a block keeps its key while
// anybody holds it.
//
// Identity: two blocks share a key only when their homes and the high bits of their sequence
// hashes agree (31 bits for child and branch keys, 32 for a group's first block), so a false
// match needs a 31-bit collision between blocks that want the same slot, and costs at worst one
// overestimated overlap.

const (
	// keyGroup is how many blocks a group has. A lookup reads one summary per group (summary.go)
	// and each on a page of its own, so larger groups mean fewer pages; but it walks a group
	// where a conversation branches, and a branch moves the rest of its group (more for larger
	// groups). Measured against 8 and 32 (NOTES.md): 16.
	keyGroup    = 16
	keyHomeMask = 1<<32 - 1
	keyPosMask  = keyGroup - 1 // a key's position in its group
	branchBit   = 1 << 63      // set in branch keys, clear in child keys
	// childID is the bits of its sequence hash that a child key keeps (the rest: its home and
	// position, and a clear branch bit).
	childID = ^uint64(keyHomeMask | branchBit)
	// pushSlots is how many slots after a one-word group a lookup prefetches with it: two lines,
	// where a collision in the linear-probing table pushes a group.
	pushSlots = 8
)

// OwnKey is the key of a block that starts a group: its sequence hash, aligned down to keyGroup.
func OwnKey(seq uint64) uint64 { return keyOf(seq &^ keyPosMask) }

// ChildKey is the key of a block with sequence hash seq that continues the group of its parent,
// whose key is parent (0: the block starts a sequence); OwnKey when the parent's group is full
// or there is no parent.
func ChildKey(parent, seq uint64) uint64 {
	if parent != 0 && parent&keyPosMask != keyPosMask {
		return seq&childID | (parent+1)&keyHomeMask
	}
	return OwnKey(seq)
}

// BranchKey is the key of a block with sequence hash seq whose child key child (one that
// continues a group) is taken by a sibling: its own hash's home, child's position.
func BranchKey(child, seq uint64) uint64 {
	return (seq|branchBit)&^keyPosMask | child&keyPosMask
}

// keyPos is a key's position in its group.
func keyPos(key uint64) int { return int(key & keyPosMask) }

// continues reports whether key is a child key: one that continues its parent's group (not a
// group's first block, not a branch key).
func continues(key uint64) bool { return key&keyPosMask != 0 && key&branchBit == 0 }

// ChainKeys appends the keys a sequence's blocks (sequence hashes, first block first) have
// when none of them branched off a sibling: where a lookup looks first, and what a writer
// tries first. It is ChildKey applied down the chain, written group by group so that no key
// waits for the one before it (a lookup computes 256 of them).
func ChainKeys(dst, seqs []uint64) []uint64 {
	n := len(dst)
	dst = slices.Grow(dst, len(seqs))[:n+len(seqs)]
	fillKeys(dst[n:], seqs)
	return dst
}

// fillKeys sets each out[i] to the key ChainKeys gives seqs[i], where seqs[0] starts a group
// (a sequence's first block, or any group's: a group's keys depend on its own blocks only).
func fillKeys(out, seqs []uint64) {
	seqs = seqs[:len(out)]
	g := 0
	for ; g+keyGroup <= len(out); g += keyGroup {
		o, s := out[g:g+keyGroup:g+keyGroup], seqs[g:g+keyGroup:g+keyGroup]
		o[0] = OwnKey(s[0])
		const id = childID
		home := o[0] & keyHomeMask // aligned: home + j is home | j
		o[1], o[2], o[3] = s[1]&id|home|1, s[2]&id|home|2, s[3]&id|home|3
		o[4], o[5], o[6], o[7] = s[4]&id|home|4, s[5]&id|home|5, s[6]&id|home|6, s[7]&id|home|7
		o[8], o[9], o[10], o[11] = s[8]&id|home|8, s[9]&id|home|9, s[10]&id|home|10, s[11]&id|home|11
		o[12], o[13], o[14], o[15] = s[12]&id|home|12, s[13]&id|home|13, s[14]&id|home|14, s[15]&id|home|15
	}
	var parent uint64
	for ; g < len(out); g++ { // a group cut short by the sequence's end
		parent = ChildKey(parent, seqs[g])
		out[g] = parent
	}
}
