package features

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParsePolicy(t *testing.T) {
	ok := func(in string, want Policy) {
		t.Helper()
		got, err := ParsePolicy(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	ok("", Policy{})
	ok("discard", Policy{})
	ok("keep", Policy{Kind: KeepForReuse, TTL: DefaultKeepTTL})
	ok("keep:90s", Policy{Kind: KeepForReuse, TTL: 90 * time.Second})
	ok("keep:24h", Policy{Kind: KeepForReuse, TTL: 24 * time.Hour})
	ok("until-done", Policy{Kind: KeepUntilDone})
	bad := func(in, want string) {
		t.Helper()
		_, err := ParsePolicy(in)
		require.ErrorIs(t, err, ErrInvalid, in)
		require.ErrorContains(t, err, want, in)
	}
	bad("keep:", "TTL")
	bad("keep:0s", "outside")
	bad("keep:-1m", "outside")
	bad("keep:25h", "outside")
	bad("keep:soon", "TTL")
	bad("discard:1m", "only keep takes a TTL")
	bad("until-done:1m", "only keep takes a TTL")
	bad("KEEP", "want discard")
	bad("cache", "want discard")
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"", "discard", "keep", "keep:90s", "keep:1h30m", "until-done", "keep:", "keep:-5s", "x:y:z", "keep:9999999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		require.NoError(t, p.validate())
		again, err := ParsePolicy(p.String())
		require.NoError(t, err, "String() of %q = %q", s, p.String())
		require.Equal(t, p, again)
	})
}

func TestLegalTransitions(t *testing.T) {
	// The lifecycle as the issue states it, edge by edge; everything else is illegal.
	want := map[[2]State]bool{}
	chain := []State{StateEncoding, StateEncodedHost, StateStagedDevice, StateMerged, StatePrefilled}
	for i := 0; i+1 < len(chain); i++ {
		want[[2]State{chain[i], chain[i+1]}] = true
	}
	want[[2]State{StateEncodedHost, StateMerged}] = true // no device: skip staging
	want[[2]State{StateEncoding, StateDiscarded}] = true // failed or abandoned
	for _, s := range chain[1:] {
		want[[2]State{s, StateCached}] = true
		want[[2]State{s, StateDiscarded}] = true
	}
	want[[2]State{StateCached, StateEncodedHost}] = true // reuse
	want[[2]State{StateCached, StateDiscarded}] = true   // evicted or expired
	for _, from := range AllStates {
		for _, to := range AllStates {
			require.Equal(t, want[[2]State{from, to}], Legal(from, to), "%v → %v", from, to)
		}
	}
	require.False(t, Legal(0, StateEncoding))
	require.False(t, Legal(StateDiscarded+1, StateEncoding))
	require.Equal(t, "STAGED_DEVICE", StateStagedDevice.String())
}
