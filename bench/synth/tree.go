package synth

import (
	"fmt"
)

// Tree is what a trace teaches: the core radix tree of prefix blocks that two or more requests
// share (unary chains merged into segments, blocks only one request used stripped), and the
// empirical distributions of everything else.
type Tree struct {
	BlockSize int
	Nodes     []Node // Nodes[0] is the root: no blocks; its Count is the number of requests
	// Per request of the source trace:
	UniqueBlocks []int     // blocks after its shared prefix (the stripped unique leaf's length)
	LastTokens   []int     // tokens in its last block (1..BlockSize)
	OutputLength []int     // output_length
	Gaps         []float64 // ms to the next request (len-1 entries)
}

// Node is a segment of shared blocks.
type Node struct {
	Blocks   int     // blocks in the segment (the merged unary chain)
	Count    int     // requests whose prefix includes the whole segment
	End      int     // requests whose shared prefix ends with this segment
	Children []int32 // child segments
	// Ends lists the source requests that stopped here (len End): their unique suffixes and
	// last-block lengths are what a request stopping here samples from.
	Ends []int32
}

// ErrNotATree reports a trace whose hash ids do not form prefixes: a block id that follows two
// different blocks (or repeats within a request).
type ErrNotATree struct {
	Request int
	ID      int64
	Parents [2]int64 // -1: the start of a prompt
}

func (e *ErrNotATree) Error() string {
	return fmt.Sprintf("request %d: hash id %d follows %d here and %d elsewhere: the hash ids are not a prefix tree", e.Request, e.ID, e.Parents[1], e.Parents[0])
}

// BuildTree learns a trace (BlockSize tokens per hash id). It checks the tree property first.
func BuildTree(recs []Record, blockSize int) (*Tree, error) {
	parent := map[int64]int64{}
	count := map[int64]int{}
	for ri, r := range recs {
		prev := int64(-1)
		for _, id := range r.HashIDs {
			if id < 0 {
				return nil, &ErrTrace{ri + 1, fmt.Sprintf("hash id %d is negative", id)}
			}
			if p, ok := parent[id]; ok && p != prev {
				return nil, &ErrNotATree{Request: ri, ID: id, Parents: [2]int64{p, prev}}
			} else if !ok {
				parent[id] = prev
			}
			count[id]++
			prev = id
		}
	}
	t := &Tree{BlockSize: blockSize, Nodes: []Node{{Count: len(recs)}}}
	// children of each shared block (count ≥ 2), in first-seen order for determinism
	kids := map[int64][]int64{}
	seen := map[int64]bool{}
	for _, r := range recs {
		prev := int64(-1)
		for _, id := range r.HashIDs {
			if count[id] < 2 {
				break
			}
			if !seen[id] {
				seen[id] = true
				kids[prev] = append(kids[prev], id)
			}
			prev = id
		}
	}
	// Segments: follow unary chains whose count does not drop (nobody stops or branches off).
	segOf := map[int64]int32{} // the last block of each segment → its node
	var build func(node int32, first int64)
	build = func(node int32, first int64) {
		id, n := first, 1
		for len(kids[id]) == 1 && count[kids[id][0]] == count[id] {
			id = kids[id][0]
			n++
		}
		idx := int32(len(t.Nodes))
		t.Nodes = append(t.Nodes, Node{Blocks: n, Count: count[first]})
		t.Nodes[node].Children = append(t.Nodes[node].Children, idx)
		segOf[id] = idx
		for _, c := range kids[id] {
			build(idx, c)
		}
	}
	for _, c := range kids[-1] {
		build(0, c)
	}
	// Where each request's shared prefix ends; its unique suffix; the other distributions.
	for i, r := range recs {
		shared := 0
		for shared < len(r.HashIDs) && count[r.HashIDs[shared]] >= 2 {
			shared++
		}
		end := &t.Nodes[0]
		if shared > 0 {
			end = &t.Nodes[segOf[r.HashIDs[shared-1]]]
		}
		end.End++
		end.Ends = append(end.Ends, int32(i))
		t.UniqueBlocks = append(t.UniqueBlocks, len(r.HashIDs)-shared)
		t.LastTokens = append(t.LastTokens, r.InputLength-(len(r.HashIDs)-1)*blockSize)
		t.OutputLength = append(t.OutputLength, r.OutputLength)
		if i > 0 {
			t.Gaps = append(t.Gaps, r.Timestamp-recs[i-1].Timestamp)
		}
	}
	return t, nil
}

// Check verifies the tree's counts: every node's Count is its End plus its children's Counts.
func (t *Tree) Check() error {
	for i, n := range t.Nodes {
		sum := n.End
		if len(n.Ends) != n.End {
			return fmt.Errorf("tree node %d: %d requests end there but %d are listed", i, n.End, len(n.Ends))
		}
		for _, c := range n.Children {
			sum += t.Nodes[c].Count
		}
		if sum != n.Count {
			return fmt.Errorf("tree node %d: count %d, but %d end there or go on", i, n.Count, sum)
		}
	}
	return nil
}

// SharedBlocks is the number of blocks in the core tree.
func (t *Tree) SharedBlocks() int {
	n := 0
	for _, nd := range t.Nodes {
		n += nd.Blocks
	}
	return n
}
