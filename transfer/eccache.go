package transfer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"dataplane/features"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// vLLM's shared-storage EC connector (ECSharedStorageConnector, renamed ECExampleConnector)
// reads an item's encoder output from <shared_storage_path>/<identifier>/encoder_cache.safetensors,
// one tensor named ec_cache, where the identifier is the item's uuid when the request gave one
// (NOTES.md §2).

// Modes of what the daemon writes for the engine to read: the engine may run as another user.
// The top directory is group-writable because vLLM creates <identifier>/ folders itself when
// it looks up an item that has none (NOTES.md §2).
const (
	ECFileMode os.FileMode = 0o644
	ECItemMode os.FileMode = 0o755
	ECDirMode  os.FileMode = 0o775
)

// ECFileName is the file's name inside an item's folder.
const ECFileName = "encoder_cache.safetensors"

// ECCacheFile is the file vLLM's shared-storage EC connector reads for one item.
func ECCacheFile(dir, mmHash string) string {
	return filepath.Join(dir, mmHash, ECFileName)
}

// ECName is the identifier the daemon gives an item in the EC hand-off (the uuid it sends, so
// vLLM's identifier and the folder's name): the hex SHA-256 of the feature-store key's fields,
// each as a little-endian u32 length and its bytes. Two tenants (salts) never share a name;
// 64 hex digits are what router.MediaHash shortens (Dynamo's rule for vLLM digests).
func ECName(k features.Key) string {
	h := sha256.New()
	var n [4]byte
	for _, f := range [...]string{k.Salt, k.Content, k.Model, k.Preprocess} {
		binary.LittleEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])      //nolint:errcheck // a hash.Hash never fails
		h.Write([]byte(f)) //nolint:errcheck
	}
	return hex.EncodeToString(h.Sum(nil))
}

// isECName reports whether name could be a folder this package writes (64 lower-case hex
// digits), so that cleaning a directory never touches anything else.
func isECName(name string) bool {
	if len(name) != 2*sha256.Size {
		return false
	}
	for _, c := range name {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// WriteECCache writes one item's post-projector embeddings ([num_embeds, hidden], in the
// model's dtype) where vLLM's shared-storage EC connector looks for them: one tensor named
// ec_cache in <dir>/<mm_hash>/encoder_cache.safetensors, readable by other users (ECItemMode,
// ECFileMode whatever the umask), written to a temporary name and renamed so a reader never
// sees it half written. It returns the file's size. The file is not synced: it is read from
// the page cache by an engine on the same host, and a crash loses nothing the daemon still
// relies on (OpenECDir clears the directory).
func WriteECCache(dir, mmHash string, m native.Matrix) (int64, error) {
	if mmHash == "" || strings.ContainsAny(mmHash, `/\`) || mmHash == "." || mmHash == ".." {
		return 0, fmt.Errorf("transfer: bad mm_hash %q for a directory name", mmHash)
	}
	if m.Rows <= 0 || m.Cols <= 0 || len(m.Data) < m.Bytes() {
		return 0, fmt.Errorf("transfer: ec_cache of shape [%d, %d] with %d bytes", m.Rows, m.Cols, len(m.Data))
	}
	item := filepath.Join(dir, mmHash)
	if err := os.Mkdir(item, ECItemMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, err
	}
	if err := os.Chmod(item, ECItemMode); err != nil { // the umask cut it
		return 0, err
	}
	tmp, err := os.CreateTemp(item, "."+ECFileName+".tmp-*")
	if err != nil {
		return 0, err
	}
	t := safetensors.Tensor{Name: "ec_cache", DType: safetensors.DTypeName(m.DType), Shape: []int{m.Rows, m.Cols},
		Data: m.Data[:m.Bytes()]}
	err = tmp.Chmod(ECFileMode)
	if err == nil {
		err = safetensors.Write(tmp, []safetensors.Tensor{t}, map[string]string{"format": "pt"})
	}
	var size int64
	if err == nil {
		var st os.FileInfo
		if st, err = tmp.Stat(); err == nil {
			size = st.Size()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(item, ECFileName))
	}
	if err != nil {
		os.Remove(tmp.Name()) //nolint:errcheck // already failing
		return 0, err
	}
	return size, nil
}
