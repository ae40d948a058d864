package dataplane

import (
	"container/list"
	"sync"
)

// uuidTable remembers, per tenant salt, which features a client's uuid named, so a later
// request may send the uuid without the media (as vLLM allows). It is bounded: the least
// recently used uuid goes first. Whether the features are still cached is the feature store's
// business; the table only maps names to keys.
type uuidTable struct {
	mu    sync.Mutex
	max   int
	order *list.List // of uuidKey, most recent at the front
	items map[uuidKey]*list.Element
}

type uuidKey struct{ salt, uuid string }

type uuidEntry struct {
	k uuidKey
	v knownItem
}

func newUUIDTable(max int) *uuidTable {
	return &uuidTable{max: max, order: list.New(), items: map[uuidKey]*list.Element{}}
}

func (t *uuidTable) put(salt, uuid string, v knownItem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := uuidKey{salt, uuid}
	if e, ok := t.items[k]; ok {
		e.Value.(*uuidEntry).v = v
		t.order.MoveToFront(e)
		return
	}
	t.items[k] = t.order.PushFront(&uuidEntry{k, v})
	for t.order.Len() > t.max {
		last := t.order.Back()
		delete(t.items, last.Value.(*uuidEntry).k)
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
