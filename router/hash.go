package router

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Block hashing in Dynamo's scheme (lib/kv-router protocols.rs), so hashes agree with Dynamo
// routers and with anything else that follows it:
//
//	seed     = 1337 (+ xxh3(lora_name, seed 0)) (+ xxh3(cache_salt, seed 1))   wrapping adds
//	local[i] = xxh3(tokens of block i as LE u32 ‖ sorted media hashes overlapping it as LE u64, seed)
//	seq[0]   = local[0]
//	seq[i]   = xxh3(LE u64 seq[i-1] ‖ LE u64 local[i], 1337)
//
// Only full blocks are hashed. The index is keyed by index keys derived from seq hashes
// (router/index/keys.go).

// HashSeed is Dynamo's XXH3 seed for block and chain hashes.
const HashSeed uint64 = 1337

// Media is one multimodal item of a prompt: its content hash and the token positions its
// placeholder tokens occupy. Every full block that overlaps [Offset, Offset+Length) gets Hash
// appended before hashing, so equal tokens with different images hash apart.
type Media struct {
	Hash   uint64
	Offset int
	Length int
}

// SeedFor mixes a LoRA adapter name and a cache salt into the block-hash seed (empty strings
// mean none).
func SeedFor(lora, salt string) uint64 {
	seed := HashSeed
	if lora != "" {
		seed += xxh3.HashStringSeed(lora, 0)
	}
	if salt != "" {
		seed += xxh3.HashStringSeed(salt, 1)
	}
	return seed
}

// ErrBadMedia reports a media item whose token range is not inside the prompt.
type ErrBadMedia struct {
	Item           int
	Offset, Length int
	Tokens         int
}

func (e *ErrBadMedia) Error() string {
	return fmt.Sprintf("media item %d: tokens [%d, %d+%d) not inside the %d-token prompt",
		e.Item, e.Offset, e.Offset, e.Length, e.Tokens)
}

// Hasher computes block hashes. Its scratch buffer makes it cheap to reuse and unsafe to share
// between goroutines; the zero value is not usable, call NewHasher.
type Hasher struct {
	blockSize int
	buf       []byte
	mm        []uint64
}

// ErrBlockSize reports a block size that is not positive.
type ErrBlockSize int

func (e ErrBlockSize) Error() string { return fmt.Sprintf("block size %d: must be positive", int(e)) }

// NewHasher returns a hasher for blocks of blockSize tokens.
func NewHasher(blockSize int) (*Hasher, error) {
	if blockSize <= 0 {
		return nil, ErrBlockSize(blockSize)
	}
	return &Hasher{blockSize: blockSize, buf: make([]byte, 0, 4*blockSize+64)}, nil
}

// BlockSize is the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Local appends the local hash of every full block of tokens to dst. media may be nil; an item
// outside the prompt is an *ErrBadMedia.
func (h *Hasher) Local(dst []uint64, tokens []uint32, seed uint64, media []Media) ([]uint64, error) {
	for i, m := range media {
		if m.Offset < 0 || m.Length <= 0 || m.Offset > len(tokens) || m.Length > len(tokens)-m.Offset {
			return dst, &ErrBadMedia{Item: i, Offset: m.Offset, Length: m.Length, Tokens: len(tokens)}
		}
	}
	bs := h.blockSize
	// Media in order of both start and end (the usual: items one after another, or a prompt_embeds
	// request's one entry per block) are passed by a cursor, so a long prompt's blocks do not
	// each scan every item.
	ordered := true
	for i := 1; i < len(media) && ordered; i++ {
		ordered = media[i].Offset >= media[i-1].Offset && media[i].Offset+media[i].Length >= media[i-1].Offset+media[i-1].Length
	}
	lo := 0
	for start := 0; start+bs <= len(tokens); start += bs {
		if ordered {
			for lo < len(media) && media[lo].Offset+media[lo].Length <= start {
				lo++
			}
		}
		dst = append(dst, h.block(tokens[start:start+bs], start, seed, media[lo:], ordered))
	}
	return dst, nil
}

// block hashes one block whose first token is at position start, with the media overlapping it
// (ordered: media are in order of start, so none after the first that starts past the block do).
func (h *Hasher) block(tokens []uint32, start int, seed uint64, media []Media, ordered bool) uint64 {
	h.mm = h.mm[:0]
	end := start + len(tokens)
	for _, m := range media {
		if m.Offset < end && m.Offset+m.Length > start {
			h.mm = append(h.mm, m.Hash)
		} else if ordered && m.Offset >= end {
			break
		}
	}
	return h.hashBlock(tokens, seed)
}

// LocalBlock hashes one block whose overlapping media hashes are already known (a KV event's
// extra keys list them per block). media is not modified.
func (h *Hasher) LocalBlock(tokens []uint32, seed uint64, media []uint64) uint64 {
	h.mm = append(h.mm[:0], media...)
	return h.hashBlock(tokens, seed)
}

// littleEndian: the host's uint32s are already the little-endian bytes the hash is defined on.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// hashBlock hashes tokens followed by the media hashes in h.mm, sorted.
func (h *Hasher) hashBlock(tokens []uint32, seed uint64) uint64 {
	if littleEndian && len(h.mm) == 0 && len(tokens) > 0 {
		// No copy: hash the tokens' own memory.
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)), seed)
	}
	b := h.buf[:0]
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	if len(h.mm) > 1 {
		slices.Sort(h.mm)
	}
	for _, v := range h.mm {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	h.buf = b
	return xxh3.HashSeed(b, seed)
}

// ChainHash is the sequence hash of a block whose parent block has sequence hash parent.
func ChainHash(parent, local uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	binary.LittleEndian.PutUint64(b[8:], local)
	return xxh3.HashSeed(b[:], HashSeed)
}

// Chain turns local hashes into sequence hashes in place. parent is the sequence hash of the
// block before local[0]; hasParent false means local[0] starts a sequence.
func Chain(local []uint64, parent uint64, hasParent bool) {
	for i, l := range local {
		if i > 0 || hasParent {
			local[i] = ChainHash(parent, l)
		}
		parent = local[i]
	}
}

// Sequence appends the sequence hashes of every full block of a prompt to dst: what the index is
// queried with (Index.Match).
func (h *Hasher) Sequence(dst []uint64, tokens []uint32, seed uint64, media []Media) ([]uint64, error) {
	n := len(dst)
	dst, err := h.Local(dst, tokens, seed, media)
	if err != nil {
		return dst, err
	}
	Chain(dst[n:], 0, false)
	return dst, nil
}

// MediaHash maps a media identifier to the 64-bit hash appended to block hashes, as Dynamo's
// hash_mm_identifier does: vLLM's 64-hex-digit digests keep their first 16 hex digits; other
// identifiers (user uuids) are hashed with XXH3.
func MediaHash(id string) uint64 {
	if IsMediaDigest(id) {
		v, _ := strconv.ParseUint(id[:16], 16, 64)
		return v
	}
	return xxh3.HashString(id)
}

// EmbedsDigestHash maps the SHA-256 digest vLLM keys a prompt_embeds block by (the block's
// slice of the tensor: transfer.BlockDigest; a bin entry of the block's extra keys in its KV
// events) to the 64-bit hash appended to that block: XXH3-64 of the 32 bytes, seed 0. A
// request sent as prompt_embeds is hashed with tokens of zeros (what vLLM hashes for it) and
// each full block's digest hash, so its blocks meet the ones its engine stored.
func EmbedsDigestHash(digest []byte) uint64 { return xxh3.Hash(digest) }

// IsMediaDigest reports whether a media identifier is one of vLLM's digests (64 hex digits),
// which MediaHash shortens rather than hashes.
func IsMediaDigest(id string) bool {
	if len(id) != 64 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}
