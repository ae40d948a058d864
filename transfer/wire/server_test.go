package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"dataplane/features"
)

func newStore(t testing.TB, capacity int64) *features.Store {
	t.Helper()
	s, err := features.New(features.Options{Host: features.PoolOptions{Capacity: capacity, BlockBytes: 64 << 10, Allocator: &features.MmapAllocator{}}, MaxWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// serve runs srv on a fresh listener of network and returns a client Conn to it.
func serve(t testing.TB, network string, srv *Server) *Conn {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "srv.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	nc, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc, srv.Options)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBudgetRefusal: a receiver whose feature budget cannot take an item skips its payload,
// answers with an error frame that names the budget, keeps nothing reserved, and takes the
// next item that fits on the same connection.
func TestBudgetRefusal(t *testing.T) {
	store := newStore(t, 1<<20)
	var mu sync.Mutex
	var kept []*features.Record
	srv := &Server{Handler: func(ctx context.Context, c *Conn, h *Header) error {
		req, err := store.Begin(fmt.Sprint(h.RequestID), features.Policy{})
		if err != nil {
			return err
		}
		rec, err := Admit(ctx, c, h, req, "0")
		if err != nil {
			req.Cancel()
			return c.SendError(ctx, h.RequestID, h.Key, err.Error())
		}
		mu.Lock()
		kept = append(kept, rec)
		mu.Unlock()
		return c.Send(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key}, nil) // an ack
	}}
	for _, mode := range []string{"tcp", "shm"} {
		network := map[string]string{"tcp": "tcp", "shm": "unix"}[mode]
		c := serve(t, network, srv)
		var shm *shmBuf
		if mode == "shm" {
			shm = newShmBuf(t, 4<<20)
		}
		ctx := context.Background()
		before := store.Stats().Host
		big := make([]byte, 2<<20)
		if shm != nil {
			big = shm.r.Host[:2<<20]
		}
		key := testKey
		key.Content = mode + "-big"
		if err := shm.send(ctx, c, Header{Kind: KindFeatures, RequestID: 1, Key: key, DType: DTypeBF16, Rows: 1024, Cols: 1024}, big); err != nil {
			t.Fatal(err)
		}
		h, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var re *RemoteError
		var be *features.BudgetError
		if !errors.As(h.Err(), &re) || re.RequestID != 1 || errors.As(h.Err(), &be) {
			t.Fatalf("%s: answer %+v", mode, h)
		}
		t.Logf("%s: refused: %s", mode, re.Message)
		st := store.Stats().Host
		if st.Used != before.Used || st.Reserved != 0 {
			t.Fatalf("%s: after a refusal the pool holds %d used (%d before), %d reserved", mode, st.Used, before.Used, st.Reserved)
		}
		small := big[:256<<10]
		key.Content = mode + "-small"
		if err := shm.send(ctx, c, Header{Kind: KindFeatures, RequestID: 2, Key: key, DType: DTypeBF16, Rows: 128, Cols: 1024}, small); err != nil {
			t.Fatal(err)
		}
		if h, err := c.Next(ctx); err != nil || h.Kind != KindFeatures || h.RequestID != 2 {
			t.Fatalf("%s: item that fits: %+v %v", mode, h, err)
		}
		mu.Lock()
		rec := kept[len(kept)-1]
		mu.Unlock()
		v, err := rec.Host()
		if err != nil || v.Len() != int64(len(small)) || Checksum(v.Bytes()) != Checksum(small) {
			t.Fatalf("%s: stored item: %v, %d bytes", mode, err, v.Len())
		}
	}
}

// TestReceiveIntoChecksum: a corrupted payload fails the job: the item is not in the store,
// its reservation is back, and holders see an encode error.
func TestReceiveIntoChecksum(t *testing.T) {
	store := newStore(t, 1<<20)
	req, _ := store.Begin("r", features.Policy{})
	rec, job, err := req.Admit(context.Background(), features.Item{Key: testKey, MediaID: "0", Bytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	frame := encoded(t, Header{Kind: KindFeatures, RequestID: 5, Key: testKey, DType: DTypeF16, Rows: 2, Cols: 1024}, make([]byte, 4096))
	frame[len(frame)-1] ^= 1
	raw, c := rawPair(t, Options{})
	raw.Write(frame)
	h, err := c.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := ReceiveInto(context.Background(), c, &h, job); !errors.Is(err, ErrChecksum) {
		t.Fatalf("ReceiveInto: %v", err)
	}
	<-rec.Ready()
	var ee *features.EncodeError
	if !errors.As(rec.Err(), &ee) {
		t.Fatalf("record error %v", rec.Err())
	}
	req.Cancel()
	if st := store.Stats().Host; st.Used != 0 || st.Reserved != 0 {
		t.Fatalf("pool holds %d used, %d reserved", st.Used, st.Reserved)
	}
}

// TestEncodeRequestResponse is the remote-encoding exchange the daemon builds on: A admits an
// item in its own store, sends the preprocessed input to B as a KindEncode frame, B "encodes"
// it (here: each f32 becomes bf16, a stand-in for a model) and answers with KindFeatures, which
// lands in A's job buffer. A model B does not have comes back as an error frame. A window
// bounds A's requests in flight.
func TestEncodeRequestResponse(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) { testEncodeRequestResponse(t, network) })
	}
}

func testEncodeRequestResponse(t *testing.T, network string) {
	srv := &Server{Handler: func(ctx context.Context, c *Conn, h *Header) error {
		if h.Kind != KindEncode {
			return c.SendError(ctx, h.RequestID, h.Key, fmt.Sprintf("want an encode request, got %v", h.Kind))
		}
		in := make([]byte, h.Len)
		if err := c.ReadPayload(ctx, in); err != nil {
			return c.SendError(ctx, h.RequestID, h.Key, err.Error())
		}
		if h.Key.Model != "clip-vit-l-14" {
			return c.SendError(ctx, h.RequestID, h.Key, fmt.Sprintf("no encoder for model %q", h.Key.Model))
		}
		out := make([]byte, h.Len/2)
		for i := range out[:len(out)/2] {
			bits := math.Float32bits(math.Float32frombits(binary.LittleEndian.Uint32(in[4*i:])))
			binary.LittleEndian.PutUint16(out[2*i:], uint16(bits>>16))
		}
		return c.Send(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key, DType: DTypeBF16, Rows: h.Rows, Cols: h.Cols}, out)
	}}
	cl := NewClient(serve(t, network, srv), NewWindow(4, 8<<20))
	defer cl.Close()
	store := newStore(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	const items = 6
	r := rand.New(rand.NewPCG(7, 7))
	var wg sync.WaitGroup
	for i := range items + 1 {
		key := testKey
		key.Content = fmt.Sprintf("img-%d", i)
		if i == items {
			key.Model = "whisper-tiny" // B has no such encoder
		}
		rows, cols := 1+r.IntN(64), 256
		in := make([]float32, rows*cols)
		raw := make([]byte, 4*len(in))
		for j := range in {
			in[j] = float32(r.NormFloat64())
			binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(in[j]))
		}
		wg.Add(1)
		go func() { // A's requests run concurrently; the window holds back the fifth
			defer wg.Done()
			req, _ := store.Begin(key.Content, features.Policy{})
			rec, job, err := req.Admit(ctx, features.Item{Key: key, MediaID: "0", Bytes: int64(rows * cols * 2)})
			if err != nil || job == nil {
				t.Error(err)
				return
			}
			err = cl.Call(ctx, Header{Kind: KindEncode, Key: key, DType: DTypeF32, Rows: uint32(rows), Cols: uint32(cols)}, raw,
				func(ctx context.Context, c *Conn, h *Header) error { return ReceiveInto(ctx, c, h, job) })
			<-rec.Ready()
			if i == items {
				var ee *features.EncodeError
				if !errors.Is(err, ErrRemote) || !errors.As(rec.Err(), &ee) || !errors.Is(rec.Err(), ErrRemote) {
					t.Errorf("unknown model: call %v, record error %v", err, rec.Err())
				}
				return
			}
			if err != nil {
				t.Errorf("item %d: %v", i, err)
				return
			}
			v, err := rec.Host()
			if err != nil {
				t.Errorf("item %d: %v", i, err)
				return
			}
			b := v.Bytes()
			for j, x := range in {
				if got := binary.LittleEndian.Uint16(b[2*j:]); got != uint16(math.Float32bits(x)>>16) {
					t.Errorf("item %d element %d: %#x", i, j, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	if f, b := cl.win.InFlight(); f != 0 || b != 0 {
		t.Fatalf("window holds %d frames, %d bytes after every answer", f, b)
	}
}

// TestClientFailures: a call whose context ends returns at once and its late answer is
// skipped (the next call still works); a connection that breaks fails every pending call and
// every later one.
func TestClientFailures(t *testing.T) {
	release := make(chan struct{})
	srv := &Server{Handler: func(ctx context.Context, c *Conn, h *Header) error {
		if h.Text == "slow" {
			<-release
		}
		if h.Text == "hang up" {
			return errors.New("hanging up")
		}
		return c.Send(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key}, []byte(h.Text))
	}}
	cl := NewClient(serve(t, "tcp", srv), NewWindow(8, 1<<20))
	defer cl.Close()
	echo := func(want string) Recv {
		return func(ctx context.Context, c *Conn, h *Header) error {
			got := make([]byte, h.Len)
			if err := c.ReadPayload(ctx, got); err != nil {
				return err
			}
			if string(got) != want {
				return fmt.Errorf("answer %q, want %q", got, want)
			}
			return nil
		}
	}
	ctx := context.Background()
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := cl.Call(short, Header{Kind: KindEncode, Key: testKey, Text: "slow"}, []byte("x"), echo("slow")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow call: %v", err)
	}
	cl.mu.Lock()
	left := len(cl.pending)
	cl.mu.Unlock()
	close(release)
	if left != 0 {
		t.Fatalf("%d abandoned calls still pending: an answer that never came would keep them", left)
	}
	if err := cl.Call(ctx, Header{Kind: KindEncode, Key: testKey, Text: "next"}, []byte("x"), echo("next")); err != nil {
		t.Fatalf("call after an abandoned one: %v", err)
	}
	if err := cl.Call(ctx, Header{Kind: KindEncode, Key: testKey, Text: "hang up"}, []byte("x"), echo("")); err == nil {
		t.Fatal("a call whose server hung up succeeded")
	}
	if err := cl.Call(ctx, Header{Kind: KindEncode, Key: testKey, Text: "after"}, []byte("x"), echo("after")); err == nil {
		t.Fatal("a call on a dead connection succeeded")
	}
}

// TestWindow: Acquire waits while the window is full and wakes on Release; a frame larger
// than the window goes alone; a deadline ends the wait.
func TestWindow(t *testing.T) {
	w := NewWindow(2, 100)
	ctx := context.Background()
	if err := w.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w.Acquire(short, 60); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("over the byte window: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- w.Acquire(ctx, 500) }() // larger than the window: waits for an empty one
	time.Sleep(10 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("a frame over the window went beside another: %v", err)
	default:
	}
	w.Release(60)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if f, b := w.InFlight(); f != 1 || b != 500 {
		t.Fatalf("in flight %d, %d", f, b)
	}
	w.Release(500)
}

// A connection that sends no frame for IdleTimeout is closed, quietly (no error frame), and
// its slot goes to a connection waiting in the backlog.
func TestServerIdleTimeout(t *testing.T) {
	srv := &Server{MaxConns: 1, IdleTimeout: 100 * time.Millisecond, Handler: func(ctx context.Context, c *Conn, h *Header) error {
		return c.Send(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key}, []byte("ok"))
	}}
	idle := serve(t, "tcp", srv) // holds the only slot, and says nothing
	start := time.Now()
	idle.Net().SetReadDeadline(start.Add(5 * time.Second)) //nolint:errcheck // a failure must not hang
	n, err := idle.Net().Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want a quiet close", n, err)
	}
	if took := time.Since(start); took < 100*time.Millisecond || took > 5*time.Second {
		t.Fatalf("idle connection closed after %v, want about 100ms", took)
	}
	nc, err := net.Dial("tcp", idle.Net().RemoteAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	cl := NewClient(NewConn(nc, srv.Options), NewWindow(1, 1<<20))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = cl.Call(ctx, Header{Kind: KindEncode, Key: testKey}, []byte("x"), func(ctx context.Context, c *Conn, h *Header) error {
		return c.Discard(ctx)
	})
	if err != nil {
		t.Fatalf("a connection after the idle one left: %v", err)
	}
}
