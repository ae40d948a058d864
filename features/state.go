package features

import "fmt"

// State is where a record is in its life. A record moves forward along
//
//	ENCODING → ENCODED_HOST → [STAGED_DEVICE] → MERGED → PREFILLED
//
// (the device step is optional: a CPU-only node merges from host memory), becomes CACHED
// when its last holder lets it go with a keep policy, comes back to ENCODED_HOST on a reuse
// hit, and ends DISCARDED. A shared record shows the furthest step any holder has reached
// since it was last (re)acquired; each request's own progress is checked separately.
type State uint8

const (
	StateEncoding     State = iota + 1 // bytes reserved at the estimate; the encoder is writing
	StateEncodedHost                   // features complete in host memory
	StateStagedDevice                  // also copied to device staging memory
	StateMerged                        // merged into a request's sequence
	StatePrefilled                     // the LLM worker has prefilled the sequence
	StateCached                        // no holder; kept for reuse until evicted or expired
	StateDiscarded                     // gone: every byte is back in its pool
)

// numStates sizes per-state tables (index by State; 0 is unused).
const numStates = int(StateDiscarded) + 1

// AllStates lists the states in lifecycle order.
var AllStates = []State{StateEncoding, StateEncodedHost, StateStagedDevice, StateMerged, StatePrefilled, StateCached, StateDiscarded}

var stateNames = [numStates]string{"", "ENCODING", "ENCODED_HOST", "STAGED_DEVICE", "MERGED", "PREFILLED", "CACHED", "DISCARDED"}

func (s State) String() string {
	if int(s) < numStates && s != 0 {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// legal[from][to] is true for the record transitions the lifecycle allows.
var legal = func() (t [numStates][numStates]bool) {
	for _, e := range [][2]State{
		{StateEncoding, StateEncodedHost}, {StateEncoding, StateDiscarded},
		{StateEncodedHost, StateStagedDevice}, {StateEncodedHost, StateMerged},
		{StateStagedDevice, StateMerged}, {StateMerged, StatePrefilled},
		{StateCached, StateEncodedHost},
	} {
		t[e[0]][e[1]] = true
	}
	for _, from := range []State{StateEncodedHost, StateStagedDevice, StateMerged, StatePrefilled} {
		t[from][StateCached] = true
		t[from][StateDiscarded] = true
	}
	t[StateCached][StateDiscarded] = true
	return t
}()

// Legal reports whether a record may move from one state to the other.
func Legal(from, to State) bool {
	return int(from) < numStates && int(to) < numStates && legal[from][to]
}
