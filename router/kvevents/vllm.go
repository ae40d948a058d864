package kvevents

import (
	"fmt"
	"strconv"

	"dataplane/router"
)

// Decoding of vLLM's KV-event batches (vllm/distributed/kv_events.py), leniently: msgspec
// writes a batch as an array [ts, events, data_parallel_rank?] when its structs are array_like
// (older vLLM) or as a map {ts, events, data_parallel_rank} (newer), and each event as a tagged
// array ["BlockStored", fields...] or a map with "type". Trailing fields at their defaults may
// be missing (omit_defaults); unknown map keys and extra array fields are ignored. Events of a
// type this decoder does not know (vLLM adds types over time) are skipped whole and counted in
// Batch.Unknown; the batch's other events still apply.

// EventKind is the type of a KV event.
type EventKind uint8

// The event kinds vLLM publishes.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded KV event. Its slices (Extra's Media lists aside) are reused by the next
// DecodeBatch into the same Batch.
type Event struct {
	Kind      EventKind
	Hashes    []uint64 // the engine's block hashes: ints (low 64 bits) or the last 8 digest bytes, big-endian
	Parent    uint64   // the engine hash of the block before Hashes[0], if HasParent
	HasParent bool
	Tokens    []uint32 // BlockStored: the stored blocks' tokens, block after block
	BlockSize int
	LoraName  string // BlockStored: lora_name, or the decimal lora_id from vLLM versions without names
	Medium    string // "" when absent
	Group     int    // KV-cache group (group_idx); -1 when absent
	SpecKind  string // BlockStored: kv_cache_spec_kind, e.g. "full_attention"; "" when absent
	Window    int    // BlockStored: kv_cache_spec_sliding_window; 0 when absent
	Extra     []BlockExtra

	// A store's skipped context (skipped_* fields, README.md): the tokens of the blocks between
	// the last block vLLM announced for this request (SkippedParent, or the sequence's start
	// when !HasSkippedParent) and Parent, which vLLM did not announce, with their extra keys.
	// HasSkipped when skipped_token_ids is present.
	SkippedParent    uint64
	HasSkippedParent bool
	HasSkipped       bool
	SkippedTokens    []uint32
	SkippedExtra     []BlockExtra
}

// BlockExtra is what vLLM's extra_keys say about one stored block that changes its hash: the
// media items overlapping it (as router media hashes) and, on a sequence's first block, the
// cache salt.
type BlockExtra struct {
	Media []uint64
	Salt  string
	strs  []string // plain strings, until resolveExtras sorts them out
}

// Batch is one published message. DPRank is -1 when the batch does not carry one. Unknown
// counts the events of unknown types that were skipped (they are not in Events).
type Batch struct {
	TS      float64
	DPRank  int
	Events  []Event
	Unknown int
}

// DecodeBatch decodes a msgpack payload into b, reusing b's storage. A malformed payload is a
// *DecodeError; b's contents are then unspecified. Events without a LoRA name or extra keys
// (what a text-only engine publishes) decode without allocating once b has grown; a LoRA name
// is copied out of the payload (one allocation), and extra keys cost a few per block (their
// strings, and each block's Media, which is not reused) (TestDecodeBatchAllocs).
func DecodeBatch(payload []byte, b *Batch) error {
	r := &mpReader{b: payload}
	b.TS, b.DPRank, b.Unknown = 0, -1, 0
	b.Events = b.Events[:0]
	var err error
	switch r.kind() {
	case mpArray:
		err = decodeBatchArray(r, b)
	case mpMap:
		err = decodeBatchMap(r, b)
	default:
		err = r.fail("batch is neither an array nor a map")
	}
	if err == nil && !r.done() {
		err = r.fail("trailing bytes after the batch")
	}
	return err
}

func decodeBatchArray(r *mpReader, b *Batch) error {
	n, err := r.readLen(false)
	if err != nil {
		return err
	}
	if n < 2 {
		return r.fail(fmt.Sprintf("batch array has %d fields, want [ts, events, ...]", n))
	}
	for i := range n {
		if err := decodeBatchField(r, b, i, ""); err != nil {
			return err
		}
	}
	return nil
}

func decodeBatchMap(r *mpReader, b *Batch) error {
	n, err := r.readLen(true)
	if err != nil {
		return err
	}
	for range n {
		key, err := r.readStr()
		if err != nil {
			return err
		}
		if err := decodeBatchField(r, b, -1, string(key)); err != nil {
			return err
		}
	}
	return nil
}

// decodeBatchField decodes field pos of an array batch, or the field named key of a map batch.
func decodeBatchField(r *mpReader, b *Batch, pos int, key string) error {
	switch {
	case pos == 0 || key == "ts":
		ts, err := r.readFloat()
		b.TS = ts
		return err
	case pos == 1 || key == "events":
		n, err := r.readLen(false)
		if err != nil {
			return err
		}
		for range n {
			ev := nextEvent(b)
			if err := decodeEvent(r, ev); err != nil {
				return err
			}
			if ev.Kind == unknownKind {
				b.Events = b.Events[:len(b.Events)-1] // its storage is reused by the next event
				b.Unknown++
			}
		}
		return nil
	case pos == 2 || key == "data_parallel_rank":
		if r.readNil() {
			return nil
		}
		v, err := r.readSmallInt(0, 1<<20, "data_parallel_rank")
		b.DPRank = int(v)
		return err
	}
	return r.skip()
}

// nextEvent appends an event to b, reusing the storage of an earlier decode.
func nextEvent(b *Batch) *Event {
	if len(b.Events) < cap(b.Events) {
		b.Events = b.Events[:len(b.Events)+1]
	} else {
		b.Events = append(b.Events, Event{})
	}
	ev := &b.Events[len(b.Events)-1]
	*ev = Event{Hashes: ev.Hashes[:0], Tokens: ev.Tokens[:0], Extra: ev.Extra[:0], Group: -1,
		SkippedTokens: ev.SkippedTokens[:0], SkippedExtra: ev.SkippedExtra[:0]}
	return ev
}

// Field order of the array encoding after the tag (msgspec's array_like, older vLLM). The
// skipped_* fields exist only in the map encoding vLLM uses now, where they are named.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// unknownKind marks an event whose type the decoder does not know: decodeEvent skips its
// fields and the batch drops it.
const unknownKind EventKind = 0xff

func decodeEvent(r *mpReader, ev *Event) error {
	isMap := r.kind() == mpMap
	n, err := r.readLen(isMap)
	if err != nil {
		return err
	}
	if n == 0 {
		return r.fail("empty event")
	}
	var loraID string
	if !isMap {
		tag, err := r.readStr()
		if err != nil {
			return err
		}
		ev.setKind(tag)
		fields := storedFields
		if ev.Kind != BlockStored {
			fields = removedFields
		}
		for i := 1; i < n; i++ {
			name := ""
			if ev.Kind != AllBlocksCleared && ev.Kind != unknownKind && i-1 < len(fields) {
				name = fields[i-1]
			}
			if err := decodeEventField(r, ev, name, &loraID); err != nil {
				return err
			}
		}
	} else {
		// The type first: msgspec writes the tag field first, so this is one key; otherwise it is
		// looked for ahead, so that the fields of an unknown type are skipped unread.
		if err := peekEventType(r, n, ev); err != nil {
			return err
		}
		for range n {
			key, err := r.readStr()
			if err != nil {
				return err
			}
			if ev.Kind == unknownKind || string(key) == "type" {
				if err := r.skip(); err != nil {
					return err
				}
				continue
			}
			if err := decodeEventField(r, ev, string(key), &loraID); err != nil {
				return err
			}
		}
	}
	if ev.Kind == unknownKind {
		return nil
	}
	if ev.LoraName == "" {
		ev.LoraName = loraID
	}
	return ev.resolveExtras()
}

// peekEventType sets ev.Kind from the "type" entry of an event map of n entries whose header r
// has just read, without moving r.
func peekEventType(r *mpReader, n int, ev *Event) error {
	p := *r
	for range n {
		key, err := p.readStr()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			tag, err := p.readStr()
			if err != nil {
				return err
			}
			ev.setKind(tag)
			return nil
		}
		if err := p.skip(); err != nil {
			return err
		}
	}
	return r.fail(`event map without "type"`)
}

func (ev *Event) setKind(tag []byte) {
	switch string(tag) {
	case "BlockStored":
		ev.Kind = BlockStored
	case "BlockRemoved":
		ev.Kind = BlockRemoved
	case "AllBlocksCleared":
		ev.Kind = AllBlocksCleared
	default:
		ev.Kind = unknownKind
	}
}

func decodeEventField(r *mpReader, ev *Event, name string, loraID *string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = r.readLen(false); err != nil {
			return err
		}
		for range n {
			h, err := readHash(r)
			if err != nil {
				return err
			}
			ev.Hashes = append(ev.Hashes, h)
		}
	case "parent_block_hash":
		if r.readNil() {
			return nil
		}
		ev.Parent, err = readHash(r)
		ev.HasParent = true
	case "token_ids":
		ev.Tokens, err = readTokens(r, ev.Tokens)
	case "skipped_token_ids":
		if r.readNil() {
			return nil
		}
		ev.HasSkipped = true
		ev.SkippedTokens, err = readTokens(r, ev.SkippedTokens)
	case "skipped_parent_block_hash":
		if r.readNil() {
			return nil
		}
		ev.SkippedParent, err = readHash(r)
		ev.HasSkippedParent = true
	case "skipped_extra_keys":
		// The same per-block entries as extra_keys, for the skipped blocks.
		extra := ev.Extra
		ev.Extra = ev.SkippedExtra
		err = decodeExtraKeys(r, ev)
		ev.SkippedExtra, ev.Extra = ev.Extra, extra
	case "block_size":
		var v int64
		v, err = r.readSmallInt(1, 1<<20, "block_size")
		ev.BlockSize = int(v)
	case "lora_id":
		if r.readNil() {
			return nil
		}
		var v int64
		v, err = r.readSmallInt(-1<<62, 1<<62, "lora_id")
		*loraID = strconv.FormatInt(v, 10)
	case "medium", "lora_name", "kv_cache_spec_kind":
		if r.readNil() {
			return nil
		}
		var s []byte
		if s, err = r.readStr(); err != nil {
			return err
		}
		switch name {
		case "medium":
			ev.Medium = internMedium(s)
		case "lora_name":
			ev.LoraName = string(s)
		default:
			ev.SpecKind = internMedium(s)
		}
	case "group_idx", "kv_cache_spec_sliding_window":
		if r.readNil() {
			return nil
		}
		var v int64
		if name == "group_idx" { // literals: were name to escape, string(key) would be copied
			v, err = r.readSmallInt(0, 1<<20, "group_idx")
			ev.Group = int(v)
		} else {
			v, err = r.readSmallInt(0, 1<<40, "kv_cache_spec_sliding_window")
			ev.Window = int(v)
		}
	case "extra_keys":
		err = decodeExtraKeys(r, ev)
	default:
		err = r.skip()
	}
	return err
}

// internMedium avoids an allocation for the usual media and KV-cache spec kinds.
func internMedium(s []byte) string {
	switch string(s) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	}
	for _, k := range specKinds {
		if string(s) == k {
			return k
		}
	}
	return string(s)
}

// specKinds are the kv_cache_spec_kind values vLLM publishes (KVCacheSpecKind in
// vllm/v1/kv_cache_interface.py, README.md).
var specKinds = [...]string{"full_attention", "mla_attention", "sink_full_attention", "sliding_window",
	"sliding_window_mla", "chunked_local_attention", "mamba", "encoder_only_attention", "cross_attention", "unknown"}

// readTokens appends a token_ids list to dst.
func readTokens(r *mpReader, dst []uint32) ([]uint32, error) {
	n, err := r.readLen(false)
	if err != nil {
		return dst, err
	}
	for range n {
		v, err := r.readSmallInt(0, 1<<32-1, "token id")
		if err != nil {
			return dst, err
		}
		dst = append(dst, uint32(v))
	}
	return dst, nil
}

// readHash reads an engine block hash: an int (its low 64 bits) or a digest (its last 8 bytes,
// big-endian, which is what vLLM's int form keeps).
func readHash(r *mpReader) (uint64, error) {
	switch r.kind() {
	case mpInt:
		v, _, err := r.readInt()
		return v, err
	case mpBin, mpStr:
		b, err := r.readStr()
		if err != nil {
			return 0, err
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var v uint64
		for _, c := range b {
			v = v<<8 | uint64(c)
		}
		return v, nil
	}
	return 0, r.fail("block hash is neither an int nor bytes")
}

// decodeExtraKeys reads extra_keys: one entry per block, nil or a tuple whose items are, in
// vLLM's order, the LoRA name, media identifiers (strings, or [identifier, offset] pairs in newer
// versions), the cache salt (first block of a request only) and the prompt-embeds digest
// (bytes, router.EmbedsDigestHash). Plain strings are kept aside until the whole event is read (lora_name may follow).
func decodeExtraKeys(r *mpReader, ev *Event) error {
	if r.readNil() {
		return nil
	}
	n, err := r.readLen(false)
	if err != nil {
		return err
	}
	for range n {
		ev.Extra = append(ev.Extra, BlockExtra{})
		x := &ev.Extra[len(ev.Extra)-1]
		if r.readNil() {
			continue
		}
		m, err := r.readLen(false)
		if err != nil {
			return err
		}
		for range m {
			switch r.kind() {
			case mpStr:
				s, _ := r.readStr()
				x.strs = append(x.strs, string(s))
			case mpBin:
				// A prompt-embeds block's digest: a request the daemon sends as prompt_embeds
				// hashes the same digest into the same block (router.EmbedsDigestHash).
				b, _ := r.readStr()
				x.Media = append(x.Media, router.EmbedsDigestHash(b))
			case mpArray:
				k, err := r.readLen(false)
				if err != nil {
					return err
				}
				if k >= 1 && r.kind() == mpStr {
					s, _ := r.readStr()
					x.Media = append(x.Media, router.MediaHash(string(s)))
					k--
				}
				for range k {
					if err := r.skip(); err != nil {
						return err
					}
				}
			default:
				if err := r.skip(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// resolveExtras sorts the plain strings of each block's extra keys into the LoRA name (dropped:
// it is mixed into the seed), the salt (the last plain string of a sequence's first block that is
// not a 64-hex-digit media digest) and media identifiers (the rest), for the stored blocks and
// the skipped ones before them.
func (ev *Event) resolveExtras() error {
	resolveBlockExtras(ev.SkippedExtra, ev.LoraName, !ev.HasSkippedParent)
	resolveBlockExtras(ev.Extra, ev.LoraName, !ev.HasParent)
	return nil
}

// resolveBlockExtras resolves the extra keys of a run of blocks; first says whether extras[0] is a
// sequence's first block.
func resolveBlockExtras(extras []BlockExtra, lora string, first bool) {
	for bi := range extras {
		x := &extras[bi]
		strs := x.strs
		x.strs = nil
		if lora != "" && len(strs) > 0 && strs[0] == lora {
			strs = strs[1:]
		}
		if bi == 0 && first && len(strs) > 0 && !router.IsMediaDigest(strs[len(strs)-1]) {
			x.Salt = strs[len(strs)-1]
			strs = strs[:len(strs)-1]
		}
		for _, s := range strs {
			x.Media = append(x.Media, router.MediaHash(s))
		}
	}
}
