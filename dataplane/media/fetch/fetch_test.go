package fetch

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The address filter as a function: no connection is made.
func TestForbidden(t *testing.T) {
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"} {
		require.Empty(t, Forbidden(netip.MustParseAddr(a)), a)
	}
	for a, why := range map[string]string{
		"127.0.0.1": "loopback", "127.8.9.1": "loopback", "::1": "loopback",
		"10.1.2.3": "private", "172.16.0.1": "private", "172.31.255.255": "private", "192.168.1.1": "private", "fc00::1": "private", "fd12::1": "private",
		"169.254.169.254": "link-local", "fe80::1": "link-local",
		"0.0.0.0": "unspecified", "::": "unspecified", "0.1.2.3": "this network",
		"100.64.0.1": "carrier-grade NAT", "224.0.0.1": "multicast", "ff02::1": "multicast", "255.255.255.255": "broadcast",
		"::ffff:10.0.0.1": "private", "::ffff:127.0.0.1": "loopback", "64:ff9b::a00:1": "NAT64", "2002:a00:1::": "6to4",
		"2001:0:4136:e378::1": "Teredo", "192.0.2.5": "documentation", "198.18.0.1": "benchmarking", "240.1.2.3": "reserved",
	} {
		require.Contains(t, Forbidden(netip.MustParseAddr(a)), why, a)
	}
	f, err := New(Options{HTTP: true})
	require.NoError(t, err)
	require.ErrorIs(t, f.checkDial("tcp", "10.0.0.5:80", nil), ErrForbidden)
	require.ErrorContains(t, f.checkDial("tcp6", "[fe80::1]:443", nil), "fe80::1 is link-local")
	require.NoError(t, f.checkDial("tcp", "8.8.8.8:443", nil))
	require.ErrorIs(t, f.checkDial("tcp", "garbage", nil), ErrForbidden)
}

func TestHTTP(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/img", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "PNGDATA") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 2000)) }) //nolint:errcheck
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for range 10 { // chunked: no Content-Length
			w.Write(make([]byte, 300)) //nolint:errcheck
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/to-file", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	srv := httptest.NewServer(mux) // 127.0.0.1
	defer srv.Close()
	ctx := context.Background()

	strict, err := New(Options{HTTP: true})
	require.NoError(t, err)
	_, err = strict.Fetch(ctx, srv.URL+"/img")
	require.ErrorIs(t, err, ErrForbidden, "loopback refused by default")
	require.ErrorContains(t, err, "127.0.0.1 is loopback")

	f, err := New(Options{HTTP: true, AllowPrivateNetworks: true, MaxBytes: 1000})
	require.NoError(t, err)
	b, err := f.Fetch(ctx, srv.URL+"/img")
	require.NoError(t, err)
	require.Equal(t, "PNGDATA", string(b))
	_, err = f.Fetch(ctx, srv.URL+"/nope")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.Fetch(ctx, srv.URL+"/big")
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = f.Fetch(ctx, srv.URL+"/stream")
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = f.Fetch(ctx, srv.URL+"/to-file")
	require.ErrorIs(t, err, ErrScheme)
	_, err = f.Fetch(ctx, srv.URL+"/loop")
	require.ErrorContains(t, err, "more than 3 redirects")

	off, err := New(Options{})
	require.NoError(t, err)
	_, err = off.Fetch(ctx, srv.URL+"/img")
	require.ErrorIs(t, err, ErrScheme)
	for _, u := range []string{"ftp://x/y", "gopher://x", "data:,abc", "::bad"} {
		_, err = f.Fetch(ctx, u)
		require.ErrorIs(t, err, ErrScheme, u)
	}
}

func TestFile(t *testing.T) {
	root := t.TempDir()
	media := filepath.Join(root, "media")
	require.NoError(t, os.MkdirAll(filepath.Join(media, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(media, "sub", "a.png"), []byte("A"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "secret"), []byte("S"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(media, "big.bin"), make([]byte, 100), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(root, "secret"), filepath.Join(media, "escape")))
	require.NoError(t, os.Symlink(filepath.Join(media, "sub", "a.png"), filepath.Join(media, "inside")))

	f, err := New(Options{FileDir: media, MaxBytes: 50})
	require.NoError(t, err)
	ctx := context.Background()
	for _, u := range []string{"file://" + filepath.Join(media, "sub", "a.png"), "file://" + filepath.Join(media, "inside")} {
		b, err := f.Fetch(ctx, u)
		require.NoError(t, err, u)
		require.Equal(t, "A", string(b))
	}
	bad := func(u string, kind error, msg string) {
		t.Helper()
		_, err := f.Fetch(ctx, u)
		require.ErrorIs(t, err, kind, u)
		require.ErrorContains(t, err, msg)
	}
	bad("file://"+filepath.Join(media, "..", "secret"), ErrForbidden, "outside the media directory")
	bad("file://"+filepath.Join(media, "escape"), ErrForbidden, "outside the media directory")
	bad("file://"+filepath.Join(media, "missing.png"), ErrNotFound, "missing.png")
	bad("file://"+filepath.Join(media, "sub"), ErrNotFound, "not a regular file")
	bad("file://"+filepath.Join(media, "big.bin"), ErrTooLarge, "100 bytes, the limit is 50")
	bad("file://otherhost/etc/passwd", ErrForbidden, `host "otherhost"`)
	bad("file:sub/a.png", ErrForbidden, "must be absolute")

	off, err := New(Options{})
	require.NoError(t, err)
	_, err = off.Fetch(ctx, "file://"+filepath.Join(media, "sub", "a.png"))
	require.ErrorIs(t, err, ErrScheme)
	require.True(t, Within("/a/b", "/a/b/c"))
	require.False(t, Within("/a/b", "/a/bc"))
	require.False(t, Within("/a/b", "/a"))
}

// A FIFO in the media directory is refused at once, not opened and waited on for a writer
// (it used to block forever); so is one swapped in after the type check (open alone).
func TestFileFIFO(t *testing.T) {
	media := t.TempDir()
	fifo := filepath.Join(media, "pipe.png")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	f, err := New(Options{FileDir: media})
	require.NoError(t, err)
	within := func(name string, fn func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Second):
			t.Fatalf("%s: still blocked after 1 s", name)
			return nil
		}
	}
	err = within("fetch", func() error { _, err := f.Fetch(context.Background(), "file://"+fifo); return err })
	require.ErrorIs(t, err, ErrNotRegular)
	require.ErrorIs(t, err, ErrNotFound, "the API answers 404")
	require.ErrorContains(t, err, "pipe.png is a FIFO")
	err = within("open", func() error { fd, err := f.open("pipe.png"); _ = fd; return err })
	require.ErrorIs(t, err, ErrNotRegular)
	require.ErrorContains(t, err, "is a FIFO")
}

// A path outside the directory gets one answer whether it exists or not, lexically outside or
// through a symlink that leads out; only a path inside may be "not found".
func TestFileOutsideSameAnswer(t *testing.T) {
	root := t.TempDir()
	media := filepath.Join(root, "media")
	require.NoError(t, os.MkdirAll(filepath.Join(media, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "secret"), []byte("S"), 0o644))
	require.NoError(t, os.Symlink(root, filepath.Join(media, "out")))
	f, err := New(Options{FileDir: media})
	require.NoError(t, err)
	answer := func(path string) error {
		_, err := f.Fetch(context.Background(), "file://"+path)
		return err
	}
	for _, pair := range [][2]string{
		{filepath.Join(root, "secret"), filepath.Join(root, "no-such-file")},
		{"/etc/passwd", "/etc/no-such-file"},
		{filepath.Join(media, "..", "secret"), filepath.Join(media, "..", "no-such-file")},
		{filepath.Join(media, "out", "secret"), filepath.Join(media, "out", "no-such-file")},
		{filepath.Join(media, "out", "media", "..", "secret"), filepath.Join(media, "out", "no-dir", "no-such-file")},
	} {
		exists, missing := answer(pair[0]), answer(pair[1])
		require.ErrorIs(t, exists, ErrForbidden, pair[0])
		require.ErrorIs(t, missing, ErrForbidden, pair[1])
		require.NotErrorIs(t, missing, ErrNotFound, pair[1])
		require.Equal(t, strings.Replace(exists.Error(), pair[0], "PATH", 1), strings.Replace(missing.Error(), pair[1], "PATH", 1))
		require.Equal(t, fmt.Sprintf("address not allowed: %s is outside the media directory", pair[0]), exists.Error())
	}
	// Inside: missing is "not found", also through a symlink that stays inside.
	require.NoError(t, os.Symlink(filepath.Join(media, "sub"), filepath.Join(media, "in")))
	for _, p := range []string{filepath.Join(media, "no-such-file"), filepath.Join(media, "in", "no-such-file"), filepath.Join(media, "no-dir", "x")} {
		require.ErrorIs(t, answer(p), ErrNotFound, p)
	}
}

// Media from many hosts (each a client's choice) leaves at most maxIdle idle connections in
// all, not maxIdlePerHost per host.
func TestIdleConnectionsBounded(t *testing.T) {
	var open atomic.Int64
	hosts := maxIdle + 20
	f, err := New(Options{HTTP: true, AllowPrivateNetworks: true})
	require.NoError(t, err)
	for range hosts {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "x") }))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				open.Add(1)
			case http.StateClosed, http.StateHijacked:
				open.Add(-1)
			}
		}
		srv.Start()
		defer srv.Close()
		_, err := f.Fetch(context.Background(), srv.URL+"/img")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return open.Load() <= maxIdle }, 5*time.Second, 10*time.Millisecond,
		"%d connections open after fetches from %d hosts", open.Load(), hosts)
}
