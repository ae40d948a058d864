package dataplane

import (
	"strconv"
	"strings"
	"testing"

	"dataplane/features"

	"github.com/stretchr/testify/require"
)

// The uuid table is bounded in entries and in bytes, least recently used first, and its byte
// count stays the sum of what it holds through replacements and evictions.
func TestUUIDTableBounded(t *testing.T) {
	item := func(content string) knownItem {
		return knownItem{key: features.Key{Content: content, Model: "m"}, tokens: 1}
	}
	sum := func(tb *uuidTable) int {
		n := 0
		for e := tb.order.Front(); e != nil; e = e.Next() {
			n += e.Value.(*uuidEntry).size()
		}
		return n
	}

	byCount := newUUIDTable(3, 1<<20)
	for i := range 5 {
		byCount.put("", "u"+strconv.Itoa(i), item("c"))
	}
	require.Equal(t, 3, byCount.len())
	_, ok := byCount.get("", "u1")
	require.False(t, ok, "the oldest went first")

	long := strings.Repeat("x", 1000)
	bySize := newUUIDTable(1<<16, 8<<10)
	for i := range 100 {
		bySize.put("salt", long+strconv.Itoa(i), item(long))
		_, ok := bySize.get("salt", long+"0")
		require.True(t, ok, "the first, used after every put, is never the least recent")
		require.LessOrEqual(t, bySize.bytes, 8<<10)
		require.Equal(t, sum(bySize), bySize.bytes)
	}
	_, ok = bySize.get("salt", long+"1")
	require.False(t, ok, "the second went")
	require.Less(t, bySize.len(), 8, "1000-byte uuids and contents: a few fit in 8 KiB")
	require.Greater(t, bySize.len(), 1)
	bySize.put("salt", long+"99", item("short")) // a replacement changes the size
	require.Equal(t, sum(bySize), bySize.bytes)
}
