package features

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A reuse hit costs one allocation: the hold that ties the request to the shared record (the
// request's and the record's hold lists grow only now and then). No memory is reserved, no
// record made, nothing copied.
func TestReuseHitAllocatesOneHold(t *testing.T) {
	s := newTestStore(t, 16, 0, newClock())
	owner, _ := s.Begin("owner", Policy{})
	it := item("cat", 4*kib)
	rec := admitEncode(t, owner, it, 7)
	r, err := s.Begin("reader", Policy{})
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		got, job, err := r.Admit(context.Background(), it)
		if err != nil || job != nil || got != rec {
			t.Fatalf("not a hit: %v %v", err, job)
		}
	})
	require.Equal(t, 1.0, allocs)
	r.Cancel()
	owner.Cancel()
}
