package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A worker stopped and another started under its name at another address (a planner's scale
// down and up): the request that finds the old address refused gets the new one from the
// router's fleet; other failures, and an address the fleet still lists, are not retried.
func TestRoutedFollowsAReusedWorkerName(t *testing.T) {
	live := httptest.NewServer(http.NotFoundHandler())
	defer live.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	var endpoint atomic.Value
	endpoint.Store(gone)
	router := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode([]map[string]string{{"name": "p-0", "endpoint": endpoint.Load().(string)}})
	}))
	defer router.Close()

	r := newRouted(http.DefaultClient, []string{router.URL}, "t")
	ctx := context.Background()
	ep, err := r.endpoint(ctx, router.URL, "p-0")
	require.NoError(t, err)
	require.Equal(t, gone, ep)
	_, dialErr := http.Get(gone + "/v1/completions")
	require.Error(t, dialErr)

	_, ok := r.stale(ctx, router.URL, gone, dialErr)
	require.False(t, ok, "the fleet still lists the old address: nothing to retry")
	endpoint.Store(live.URL)
	_, ok = r.stale(ctx, router.URL, live.URL, errors.New("502 Bad Gateway"))
	require.False(t, ok, "not a connection failure")
	fresh, ok := r.stale(ctx, router.URL, gone, dialErr)
	require.True(t, ok)
	require.Equal(t, live.URL, fresh)
	ep, err = r.endpoint(ctx, router.URL, "p-0")
	require.NoError(t, err)
	require.Equal(t, live.URL, ep, "cached")
}
