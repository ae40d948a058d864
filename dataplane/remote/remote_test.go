package remote

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/memory"
	"dataplane/features"
	"dataplane/router/fleet"
	"dataplane/transfer/wire"
)

func enc(name string, spt float64, models ...string) fleet.Worker {
	w := fleet.Worker{Name: name, Role: fleet.Encoder, Transfer: "tcp://127.0.0.1:1"}
	for _, m := range models {
		w.Encodes = append(w.Encodes, fleet.EncoderModel{Model: m, Modality: "image", SecondsPerToken: spt})
	}
	return w
}

// Candidates: only encoders of the model, soonest done first; a report ages; work this daemon
// sent counts until it is back; itself, non-encoders and encoders without an address are not in.
func TestCatalog(t *testing.T) {
	c := NewCatalog("me")
	require.True(t, c.Join(enc("fast", 1e-3, "m")))
	require.True(t, c.Join(enc("slow", 4e-3, "m")))
	require.True(t, c.Join(enc("other", 1e-4, "n")))
	require.False(t, c.Join(enc("me", 1e-4, "m")))
	require.False(t, c.Join(fleet.Worker{Name: "llm", Role: fleet.Aggregated, Transfer: "tcp://x:1"}))
	noAddr := enc("noaddr", 1e-4, "m")
	noAddr.Transfer = ""
	require.False(t, c.Join(noAddr))
	require.Equal(t, 3, c.Len())

	now := time.Now()
	got := c.Candidates("m", "image", 1000, 8, now)
	require.Len(t, got, 2)
	require.Equal(t, "fast", got[0].Name)
	require.Equal(t, time.Second, got[0].Encode)
	require.Equal(t, 4*time.Second, got[1].Encode)
	require.Empty(t, c.Candidates("m", "audio", 1000, 8, now))

	// fast reports 5 s queued: slow (4 s) is first now; the report ages with time.
	c.Report("fast", fleet.Load{EncodeSeconds: 5})
	got = c.Candidates("m", "image", 1000, 8, time.Now())
	require.Equal(t, "slow", got[0].Name)
	got = c.Candidates("m", "image", 1000, 8, time.Now().Add(4500*time.Millisecond))
	require.Equal(t, "fast", got[0].Name)
	require.Less(t, got[0].Queue, time.Second)

	// Work sent to slow counts until it is back.
	done := c.Sent("slow", 3*time.Second)
	got = c.Candidates("m", "image", 1000, 8, time.Now().Add(10*time.Second))
	require.Equal(t, "fast", got[0].Name)
	require.Equal(t, 3*time.Second, got[1].Queue)
	done()
	done() // once
	got = c.Candidates("m", "image", 1000, 1, time.Now().Add(10*time.Second))
	require.Len(t, got, 1)
	require.Zero(t, got[0].Queue)

	c.Leave("fast")
	require.Equal(t, "slow", c.Candidates("m", "image", 1, 8, time.Now())[0].Name)
}

// fakeBackend encodes by writing a known pattern; it takes 4-float inputs.
type fakeBackend struct{ calls atomic.Int64 }

func (b *fakeBackend) InputFloats(it Item, frames int) (int, error) {
	if it.Model != "m" {
		return 0, errors.New("model " + it.Model)
	}
	return 4, nil
}

func (b *fakeBackend) Encode(_ context.Context, it Item, in []encoder.Input) ([]byte, func(), error) {
	b.calls.Add(1)
	out := make([]byte, it.Bytes())
	for i := range out {
		out[i] = byte(int(in[0].Data[0]) + i)
	}
	return out, func() {}, nil
}

func startServer(t *testing.T, b Backend) string { return startServerWith(t, b, ServerOptions{}) }

func startServerWith(t *testing.T, b Backend, o ServerOptions) string {
	srv := NewServer(b, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return "tcp://" + ln.Addr().String()
}

// A round trip: two inputs out, the features in place; then refusals that keep the connection
// (a wrong input size), a bad address, a buffer too small.
func TestClientServer(t *testing.T) {
	b := &fakeBackend{}
	addr := startServer(t, b)
	c := NewClient(ClientOptions{})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	it := Item{Key: features.Key{Content: "k", Model: "m"}, Model: "m", Modality: "image", Tokens: 3, Hidden: 2, DType: wire.DTypeBF16}
	in := []encoder.Input{{Data: []float32{7, 0, 0, 0}}, {Data: []float32{1, 2, 3, 4}}}
	dst := make([]byte, it.Bytes())
	require.NoError(t, c.Encode(ctx, addr, it, in, dst))
	for i := range dst {
		require.Equal(t, byte(7+i), dst[i])
	}
	require.Equal(t, int64(1), b.calls.Load())

	err := c.Encode(ctx, addr, it, []encoder.Input{{Data: []float32{1, 2, 3}}}, dst)
	require.ErrorIs(t, err, wire.ErrRemote)
	require.ErrorContains(t, err, "the encoder takes 4 f32 values")
	bad := it
	bad.Model = "x"
	require.ErrorContains(t, c.Encode(ctx, addr, bad, in, dst), "model x")
	require.NoError(t, c.Encode(ctx, addr, it, in, dst), "the connection is still in step")
	require.Equal(t, int64(2), b.calls.Load())

	require.ErrorIs(t, c.Encode(ctx, "http://x", it, in, dst), ErrAddress)
	require.ErrorContains(t, c.Encode(ctx, addr, it, in, dst[:5]), "5 bytes for 3 features")
	require.ErrorContains(t, c.Encode(ctx, addr, it, nil, dst), "0 inputs")
}

// With the daemon's memory budget, a peer's inputs are reserved on it: an item whose inputs
// do not fit is refused (the requester encodes elsewhere), the connection stays in step, and
// everything reserved is given back.
func TestServerInputsOnTheBudget(t *testing.T) {
	budget, err := memory.New(memory.Options{Capacity: 20, MaxWait: -1}) // one 16-byte input, not two
	require.NoError(t, err)
	b := &fakeBackend{}
	addr := startServerWith(t, b, ServerOptions{Budget: budget})
	c := NewClient(ClientOptions{})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	it := Item{Key: features.Key{Content: "k", Model: "m"}, Model: "m", Modality: "image", Tokens: 3, Hidden: 2, DType: wire.DTypeBF16}
	dst := make([]byte, it.Bytes())
	one, two := []encoder.Input{{Data: []float32{7, 0, 0, 0}}}, []encoder.Input{{Data: []float32{7, 0, 0, 0}}, {Data: []float32{1, 2, 3, 4}}}
	require.NoError(t, c.Encode(ctx, addr, it, one, dst))
	err = c.Encode(ctx, addr, it, two, dst)
	require.ErrorIs(t, err, wire.ErrRemote)
	require.ErrorContains(t, err, "a peer's encoder inputs")
	require.NoError(t, c.Encode(ctx, addr, it, one, dst), "in step, and the budget given back")
	require.Equal(t, int64(2), b.calls.Load())
	require.Eventually(t, func() bool { return budget.Stats().Used == 0 }, 5*time.Second, time.Millisecond,
		"given back once the server's handler ends (after its answer)")
	require.Equal(t, int64(16), budget.Stats().Peak)
}

// idleCount is how many idle connections the client keeps, and for how many addresses.
func (c *Client) idleCount() (conns, addrs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.idle {
		conns += len(l)
	}
	return conns, len(c.idle)
}

// Connections idle for IdleTimeout are closed: one taken for a call is replaced by a fresh
// one, and those of an address not used again (an encoder gone, a pod's old IP) go at the next
// call to any address, with the address.
func TestClientIdleTimeout(t *testing.T) {
	a, b := startServer(t, &fakeBackend{}), startServer(t, &fakeBackend{})
	c := NewClient(ClientOptions{IdleTimeout: 100 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	it := Item{Key: features.Key{Content: "k", Model: "m"}, Model: "m", Modality: "image", Tokens: 3, Hidden: 2, DType: wire.DTypeBF16}
	in := []encoder.Input{{Data: []float32{7, 0, 0, 0}}}
	dst := make([]byte, it.Bytes())
	require.NoError(t, c.Encode(ctx, a, it, in, dst))
	require.NoError(t, c.Encode(ctx, b, it, in, dst))
	conns, addrs := c.idleCount()
	require.Equal(t, 2, conns)
	require.Equal(t, 2, addrs)
	c.mu.Lock()
	staleA, staleB := c.idle[a][0].conn, c.idle[b][0].conn
	c.mu.Unlock()

	time.Sleep(150 * time.Millisecond)
	require.NoError(t, c.Encode(ctx, b, it, in, dst), "a fresh connection for the stale one")
	conns, addrs = c.idleCount()
	require.Equal(t, 1, conns)
	require.Equal(t, 1, addrs, "a's address forgotten")
	c.mu.Lock()
	require.NotSame(t, staleB, c.idle[b][0].conn, "b's stale connection not reused")
	c.mu.Unlock()
	for _, stale := range []*wire.Conn{staleA, staleB} {
		require.ErrorIs(t, stale.Close(), net.ErrClosed, "an idle connection past the timeout was closed")
	}
}

// With Wire.Compress the server's features travel compressed (the answer's header says so)
// and arrive intact through a Client, which needs no option to read them.
func TestCompressedFeatures(t *testing.T) {
	addr := startServerWith(t, &fakeBackend{}, ServerOptions{Wire: wire.Options{Compress: wire.CompressZstd}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	it := Item{Key: features.Key{Content: "k", Model: "m"}, Model: "m", Modality: "image", Tokens: 64, Hidden: 256, DType: wire.DTypeBF16}
	in := encoder.Input{Data: []float32{5, 0, 0, 0}}

	nc, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	require.NoError(t, err)
	conn := wire.NewConn(nc, wire.Options{})
	defer conn.Close()
	m := meta{Model: "m", Modality: "image", Tokens: it.Tokens, Hidden: it.Hidden, DType: uint8(it.DType), Inputs: 1}
	require.NoError(t, conn.Send(ctx, wire.Header{Kind: wire.KindEncode, RequestID: 1, Key: it.Key, DType: wire.DTypeF32, Rows: 1, Cols: 4, Text: m.text()}, floats(in)))
	h, err := conn.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, wire.FlagZstd, h.Flags)
	require.Less(t, h.CompressedLen, h.Len)

	c := NewClient(ClientOptions{Wire: wire.Options{Compress: wire.CompressS2}})
	defer c.Close()
	dst := make([]byte, it.Bytes())
	require.NoError(t, c.Encode(ctx, addr, it, []encoder.Input{in}, dst))
	for i := range dst {
		require.Equal(t, byte(5+i), dst[i])
	}
}

// Frames out of step (an item's second input missing, a meta that does not parse) make the
// server say why and hang up: the client sees the reason.
func TestServerOutOfStep(t *testing.T) {
	addr := startServer(t, &fakeBackend{})
	nc, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	require.NoError(t, err)
	conn := wire.NewConn(nc, wire.Options{})
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := meta{Model: "m", Modality: "image", Tokens: 1, Hidden: 1, DType: uint8(wire.DTypeF32), Inputs: 2}
	payload := floats(encoder.Input{Data: []float32{1, 2, 3, 4}})
	h := wire.Header{Kind: wire.KindEncode, RequestID: 9, DType: wire.DTypeF32, Rows: 1, Cols: 4, Text: m.text()}
	require.NoError(t, conn.Send(ctx, h, payload))
	h.RequestID = 10 // another request before the first one's second input
	require.NoError(t, conn.Send(ctx, h, payload))
	got, err := conn.Next(ctx)
	require.NoError(t, err)
	require.ErrorContains(t, got.Err(), "want input 1 of 2 of request 9")
	_, err = conn.Next(ctx)
	require.Error(t, err, "hung up")

	nc, err = net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	require.NoError(t, err)
	conn = wire.NewConn(nc, wire.Options{})
	defer conn.Close()
	h.Text = "{not json"
	require.NoError(t, conn.Send(ctx, h, payload))
	got, err = conn.Next(ctx)
	require.NoError(t, err)
	require.ErrorContains(t, got.Err(), "encode frame text")
}

// FuzzEncodeMeta: an encode frame's text either parses into an item within the limits or is an
// error; never a panic.
func FuzzEncodeMeta(f *testing.F) {
	f.Add(`{"model":"m","modality":"image","tokens":3,"hidden":2,"dtype":3,"input":0,"inputs":1,"left_ms":5}`)
	f.Add(`{"model":"m","tokens":-1}`)
	f.Add(`{"inputs":257,"input":300}`)
	f.Add(`not json`)
	s := &Server{}
	f.Fuzz(func(t *testing.T, text string) {
		var m meta
		it, err := s.parse(&wire.Header{Text: text}, &m)
		if err != nil {
			return
		}
		if it.Tokens < 1 || it.Tokens > MaxTokens || it.Hidden < 1 || it.Hidden > MaxHidden || it.DType.Size() == 0 ||
			m.Inputs < 1 || m.Inputs > MaxInputs || m.Input < 0 || m.Input >= m.Inputs || it.Bytes() <= 0 {
			t.Fatalf("accepted %q: %+v %+v", text, it, m)
		}
	})
}
