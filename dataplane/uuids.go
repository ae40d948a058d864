package dataplane

import (
	"container/list"
	"sync"
)

// uuidTable remembers, per tenant salt, which features a client's uuid named, so a later
// request may send the uuid without the media (as vLLM allows). It is bounded in entries and
// in bytes (uuids, salts and keys are the clients' strings, up to 1 KiB each): the least
// recently used uuid goes first. Whether the features are still cached is the feature store's
// business; the table only maps names to keys.
type uuidTable struct {
	mu              sync.Mutex
	max             int
	maxBytes, bytes int
	order           *list.List // of uuidKey, most recent at the front
	items           map[uuidKey]*list.Element
}

type uuidKey struct{ salt, uuid string }

type uuidEntry struct {
	k uuidKey
	v knownItem
}

func newUUIDTable(max, maxBytes int) *uuidTable {
	return &uuidTable{max: max, maxBytes: maxBytes, order: list.New(), items: map[uuidKey]*list.Element{}}
}

// uuidEntryOverhead is an entry's bytes besides its strings: the list element, the map slot,
// the entry and its string headers.
const uuidEntryOverhead = 256

func (e *uuidEntry) size() int {
	k := e.v.key
	return uuidEntryOverhead + len(e.k.salt) + len(e.k.uuid) + len(k.Salt) + len(k.Content) + len(k.Model) + len(k.Preprocess)
}

func (t *uuidTable) put(salt, uuid string, v knownItem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := uuidKey{salt, uuid}
	if e, ok := t.items[k]; ok {
		ue := e.Value.(*uuidEntry)
		t.bytes -= ue.size()
		ue.v = v
		t.bytes += ue.size()
		t.order.MoveToFront(e)
	} else {
		ue := &uuidEntry{k, v}
		t.items[k] = t.order.PushFront(ue)
		t.bytes += ue.size()
	}
	for t.order.Len() > 1 && (t.order.Len() > t.max || t.bytes > t.maxBytes) {
		last := t.order.Back()
		ue := last.Value.(*uuidEntry)
		delete(t.items, ue.k)
		t.bytes -= ue.size()
		t.order.Remove(last)
	}
}

func (t *uuidTable) get(salt, uuid string) (knownItem, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.items[uuidKey{salt, uuid}]
	if !ok {
		return knownItem{}, false
	}
	t.order.MoveToFront(e)
	return e.Value.(*uuidEntry).v, true
}

func (t *uuidTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}
