package transfer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// ECCacheFile is the file vLLM's shared-storage EC connector reads for one item.
func ECCacheFile(dir, mmHash string) string {
	return filepath.Join(dir, mmHash, "encoder_cache.safetensors")
}

// WriteECCache writes one item's post-projector embeddings ([num_embeds, hidden], in the
// model's dtype) where vLLM's shared-storage EC connector looks for them: one tensor named
// ec_cache in <dir>/<mm_hash>/encoder_cache.safetensors, written to a temporary name and
// renamed so a reader never sees it half written.
func WriteECCache(dir, mmHash string, m native.Matrix) error {
	if mmHash == "" || strings.ContainsAny(mmHash, `/\`) || mmHash == "." || mmHash == ".." {
		return fmt.Errorf("transfer: bad mm_hash %q for a directory name", mmHash)
	}
	if m.Rows <= 0 || m.Cols <= 0 || len(m.Data) < m.Bytes() {
		return fmt.Errorf("transfer: ec_cache of shape [%d, %d] with %d bytes", m.Rows, m.Cols, len(m.Data))
	}
	if err := os.MkdirAll(filepath.Join(dir, mmHash), 0o755); err != nil {
		return err
	}
	t := safetensors.Tensor{Name: "ec_cache", DType: safetensors.DTypeName(m.DType), Shape: []int{m.Rows, m.Cols},
		Data: m.Data[:m.Bytes()]}
	return safetensors.WriteFile(ECCacheFile(dir, mmHash), []safetensors.Tensor{t}, map[string]string{"format": "pt"})
}
