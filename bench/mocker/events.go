package mocker

import (
	"encoding/binary"
	"math"
	"time"

	"dataplane/router/kvevents"
)

// KV events in vLLM's wire format (vllm/distributed/kv_events.py): one msgpack batch per engine
// step that changed the cache,
//
//	[ts, [event, ...], data_parallel_rank]                        (msgspec array_like structs)
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//	 lora_name, extra_keys]                                       (trailing defaults omitted)
//	["BlockRemoved", block_hashes, medium]
//	["AllBlocksCleared"]
//
// or, with Options.MapEvents, the newer layout of maps ({"ts", "events", "data_parallel_rank"},
// events with "type"). Block hashes are the engine's sequence hashes (Dynamo's scheme, as ints);
// extra_keys lists, per block, the media overlapping it as [identifier, offset] pairs and, on a
// sequence's first block, the cache salt: exactly what the router hashes back.

// Publisher delivers an engine's event batches. seq counts the engine's batches from 0. The
// payload is the publisher's to keep. Publish is called from the engine's loop goroutine and
// must not block for long.
type Publisher interface {
	Publish(worker string, seq uint64, payload []byte)
}

// PublisherFunc adapts a function (an in-process consumer such as kvevents.Engine.Live).
type PublisherFunc func(worker string, seq uint64, payload []byte)

func (f PublisherFunc) Publish(worker string, seq uint64, payload []byte) { f(worker, seq, payload) }

// FeedRouter is the in-process sink: every engine's batches go straight to its router engine
// (feeds[name], from kvevents.Feed.AddWorker(name)), on the engine's loop goroutine, so each
// router engine is fed by one goroutine in order, as kvevents.Engine requires. Batches from an
// engine not in feeds are dropped. feeds must not change once the fleet runs.
func FeedRouter(feeds map[string]*kvevents.Engine) Publisher {
	return PublisherFunc(func(worker string, seq uint64, payload []byte) {
		if e := feeds[worker]; e != nil {
			e.Live(seq, payload, nil)
		}
	})
}

// blockExtra is what one block's extra_keys entry lists.
type blockExtra struct {
	media []mediaKey
	salt  string
}

type mediaKey struct {
	id     string
	offset int
}

func (x *blockExtra) any() bool { return len(x.media) > 0 || x.salt != "" }

// blockExtras lists, per full prompt block, the media overlapping it and the salt (block 0);
// nil when no block has any.
func blockExtras(r *Request, blocks, bs int) []blockExtra {
	if len(r.Media) == 0 && r.Salt == "" {
		return nil
	}
	out := make([]blockExtra, blocks)
	for b := range out {
		lo, hi := b*bs, (b+1)*bs
		for i, m := range r.Media {
			if m.Offset < hi && m.Offset+m.Length > lo {
				out[b].media = append(out[b].media, mediaKey{r.MediaIDs[i], m.Offset})
			}
		}
	}
	if blocks > 0 {
		out[0].salt = r.Salt
	}
	return out
}

// eventLog collects one step's events and publishes them as a batch.
type eventLog struct {
	name      string
	rank      int
	blockSize int
	maps      bool
	pub       Publisher
	epoch     time.Time

	seq    uint64
	events []pendingEvent
	n      int // events in use
}

type pendingEvent struct {
	kind      kvevents.EventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	extras    []*blockExtra
	anyExtra  bool
}

func newEventLog(o Options, pub Publisher) *eventLog {
	return &eventLog{name: o.Name, rank: o.DPRank, blockSize: o.BlockSize, maps: o.MapEvents, pub: pub, epoch: time.Now()}
}

func (l *eventLog) next(kind kvevents.EventKind) *pendingEvent {
	if l.n == len(l.events) {
		l.events = append(l.events, pendingEvent{})
	}
	ev := &l.events[l.n]
	l.n++
	*ev = pendingEvent{kind: kind, hashes: ev.hashes[:0], tokens: ev.tokens[:0], extras: ev.extras[:0]}
	return ev
}

func (l *eventLog) last() *pendingEvent {
	if l.n == 0 {
		return nil
	}
	return &l.events[l.n-1]
}

// stored records a block stored after parent; consecutive blocks of one chain share an event.
func (l *eventLog) stored(hash, parent uint64, hasParent bool, tokens []uint32, x *blockExtra) {
	if l.pub == nil {
		return
	}
	ev := l.last()
	if ev == nil || ev.kind != kvevents.BlockStored || !hasParent || ev.hashes[len(ev.hashes)-1] != parent {
		ev = l.next(kvevents.BlockStored)
		ev.parent, ev.hasParent = parent, hasParent
	}
	ev.hashes = append(ev.hashes, hash)
	ev.tokens = append(ev.tokens, tokens...)
	ev.extras = append(ev.extras, x)
	ev.anyExtra = ev.anyExtra || x != nil
}

func (l *eventLog) removed(hash uint64) {
	if l.pub == nil {
		return
	}
	ev := l.last()
	if ev == nil || ev.kind != kvevents.BlockRemoved {
		ev = l.next(kvevents.BlockRemoved)
	}
	ev.hashes = append(ev.hashes, hash)
}

func (l *eventLog) cleared() {
	if l.pub != nil {
		l.next(kvevents.AllBlocksCleared)
	}
}

// publish sends the collected events as one batch stamped t after the epoch.
func (l *eventLog) publish(t time.Duration) {
	if l.pub == nil || l.n == 0 {
		return
	}
	ts := float64(l.epoch.Add(t).UnixNano()) / 1e9
	payload := l.encode(make([]byte, 0, 256), ts)
	l.n = 0
	l.pub.Publish(l.name, l.seq, payload)
	l.seq++
}

func (l *eventLog) encode(b []byte, ts float64) []byte {
	if l.maps {
		b = mpMapLen(b, 3)
		b = mpStr(b, "ts")
		b = mpFloat(b, ts)
		b = mpStr(b, "events")
	} else {
		b = mpArrayLen(b, 3)
		b = mpFloat(b, ts)
	}
	b = mpArrayLen(b, l.n)
	for i := range l.n {
		b = l.encodeEvent(b, &l.events[i])
	}
	if l.maps {
		b = mpStr(b, "data_parallel_rank")
	}
	return mpUint(b, uint64(l.rank))
}

func (l *eventLog) encodeEvent(b []byte, ev *pendingEvent) []byte {
	field := func(b []byte, name string) []byte {
		if l.maps {
			b = mpStr(b, name)
		}
		return b
	}
	head := func(b []byte, tag string, fields int) []byte {
		if l.maps {
			return mpStr(mpStr(mpMapLen(b, fields+1), "type"), tag)
		}
		return mpStr(mpArrayLen(b, fields+1), tag)
	}
	hashes := func(b []byte) []byte {
		b = mpArrayLen(field(b, "block_hashes"), len(ev.hashes))
		for _, h := range ev.hashes {
			b = mpUint(b, h)
		}
		return b
	}
	switch ev.kind {
	case kvevents.AllBlocksCleared:
		return head(b, "AllBlocksCleared", 0)
	case kvevents.BlockRemoved:
		b = hashes(head(b, "BlockRemoved", 2))
		return mpStr(field(b, "medium"), "GPU")
	}
	fields := 6
	if ev.anyExtra {
		fields = 8 // lora_name (nil) and extra_keys
	}
	b = hashes(head(b, "BlockStored", fields))
	b = field(b, "parent_block_hash")
	if ev.hasParent {
		b = mpUint(b, ev.parent)
	} else {
		b = mpNil(b)
	}
	b = mpArrayLen(field(b, "token_ids"), len(ev.tokens))
	for _, t := range ev.tokens {
		b = mpUint(b, uint64(t))
	}
	b = mpUint(field(b, "block_size"), uint64(l.blockSize))
	b = mpNil(field(b, "lora_id"))
	b = mpStr(field(b, "medium"), "GPU")
	if !ev.anyExtra {
		return b
	}
	b = mpNil(field(b, "lora_name"))
	b = mpArrayLen(field(b, "extra_keys"), len(ev.extras))
	for _, x := range ev.extras {
		if x == nil {
			b = mpNil(b)
			continue
		}
		n := len(x.media)
		if x.salt != "" {
			n++
		}
		b = mpArrayLen(b, n)
		for _, m := range x.media {
			b = mpUint(mpStr(mpArrayLen(b, 2), m.id), uint64(m.offset))
		}
		if x.salt != "" {
			b = mpStr(b, x.salt)
		}
	}
	return b
}

// A minimal MessagePack writer: the encodings msgspec uses for these values.

func mpNil(b []byte) []byte { return append(b, 0xc0) }

func mpUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func mpFloat(b []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}

func mpStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func mpArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func mpMapLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}
