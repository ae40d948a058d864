package transfer

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"

	"dataplane/native"
)

// vLLM keys every full KV block of a prompt_embeds request by the SHA-256 of that block's
// slice of the tensor: the rows' raw element bytes, row-major, in the dtype the request sent
// (vllm/v1/core/kv_cache_utils.py _gen_prompt_embeds_extra_hash_keys with tensor_data; no cast
// happens before it: NOTES.md §1). For our contiguous [seq, hidden] matrix that is
// Data[start*rowBytes : end*rowBytes].

// Digest is one block's SHA-256.
type Digest = [sha256.Size]byte

// BlockDigest is the digest of rows [start, end) of m.
func BlockDigest(m native.Matrix, start, end int) (Digest, error) {
	row := m.Cols * m.DType.Size()
	if start < 0 || end <= start || end > m.Rows || len(m.Data) < end*row {
		return Digest{}, fmt.Errorf("transfer: rows [%d, %d) of a [%d, %d] matrix with %d bytes", start, end, m.Rows, m.Cols, len(m.Data))
	}
	return sha256.Sum256(m.Data[start*row : end*row]), nil
}

// RowsDigest hashes a block given as its rows in order, each a row's bytes (text rows from
// the embedding table, feature rows from an item), as BlockDigest hashes the same rows laid
// out in one matrix, without copying them together. h is reset first.
func RowsDigest(h hash.Hash, rows [][]byte) Digest {
	h.Reset()
	for _, r := range rows {
		h.Write(r) //nolint:errcheck // a hash.Hash never fails
	}
	var d Digest
	h.Sum(d[:0])
	return d
}

// BlockDigests computes the digests of the full blocks of blockSize rows of m whose index
// want(i) reports (nil: every full block) into dst[i] (len(dst) ≥ m.Rows/blockSize), on up to
// threads goroutines (SHA-256 runs at memory speed on one core; a long prompt's media blocks
// are megabytes).
func BlockDigests(m native.Matrix, blockSize, threads int, want func(block int) bool, dst []Digest) error {
	if blockSize <= 0 {
		return fmt.Errorf("transfer: block size %d", blockSize)
	}
	blocks := m.Rows / blockSize
	if len(dst) < blocks {
		return fmt.Errorf("transfer: %d digests for %d blocks", len(dst), blocks)
	}
	if len(m.Data) < m.Bytes() {
		return fmt.Errorf("transfer: a [%d, %d] %v matrix with %d bytes", m.Rows, m.Cols, m.DType, len(m.Data))
	}
	row := m.Cols * m.DType.Size()
	one := func(b int) {
		dst[b] = sha256.Sum256(m.Data[b*blockSize*row : (b+1)*blockSize*row])
	}
	threads = max(1, min(threads, blocks))
	if threads == 1 {
		for b := range blocks {
			if want == nil || want(b) {
				one(b)
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for t := range threads { // bounded: threads goroutines, each a stride of the blocks
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := t; b < blocks; b += threads {
				if want == nil || want(b) {
					one(b)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}
