// Package fetch reads the media a request points at by URL: file:// only below an allowed
// directory, http(s):// only when enabled, with a size limit, a timeout, and no connection to
// a private, loopback, link-local or otherwise internal address (checked on the address
// actually dialled, so DNS rebinding cannot slip past). data: URLs are decoded by the media
// package, not here.
package fetch

import (
	"context"
	"dataplane/dataplane/media/admit"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Options configure a Fetcher. The zero value refuses everything.
type Options struct {
	// FileDir enables file:// URLs for files below this directory (symlinks resolved). Empty:
	// file:// is refused.
	FileDir string
	// HTTP enables http:// and https:// URLs.
	HTTP bool
	// AllowPrivateNetworks lets HTTP fetches reach private and loopback addresses (an
	// on-premises media server); off by default, since a client could otherwise make the
	// daemon read internal services.
	AllowPrivateNetworks bool
	// MaxBytes bounds one fetched item. Default 64 MiB.
	MaxBytes int64
	// Timeout bounds one HTTP fetch, connection to last byte. Default 20 s.
	Timeout time.Duration
}

// Errors a fetch returns; each is wrapped with the URL and the reason.
var (
	ErrScheme    = errors.New("URL scheme not allowed")
	ErrForbidden = errors.New("address not allowed")
	ErrTooLarge  = errors.New("media larger than the limit")
	ErrNotFound  = errors.New("media not found")
	ErrUpstream  = errors.New("fetching media failed")
	// ErrNotRegular: a file:// path names something other than a regular file (a directory,
	// a FIFO, a device, a socket). It wraps ErrNotFound, so callers that map ErrNotFound (the
	// API: 404) need no change, and a client learns no more than "no media there"; errors.Is
	// tells the two apart where that matters (logs).
	ErrNotRegular = fmt.Errorf("%w: not a regular file", ErrNotFound)
)

// The fetcher's idle connections: per host, in all.
const maxIdlePerHost, maxIdle = 4, 64

// Fetcher fetches media. Safe for concurrent use.
type Fetcher struct {
	opts    Options
	fileDir string // FileDir with symlinks resolved
	given   string // FileDir as configured, absolute and clean
	client  *http.Client
}

// New checks the options and builds the HTTP client.
func New(opts Options) (*Fetcher, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 64 << 20
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 20 * time.Second
	}
	f := &Fetcher{opts: opts}
	if opts.FileDir != "" {
		dir, err := filepath.EvalSymlinks(opts.FileDir)
		if err != nil {
			return nil, fmt.Errorf("fetch: file directory: %w", err)
		}
		if f.fileDir, err = filepath.Abs(dir); err != nil {
			return nil, err
		}
		if f.given, err = filepath.Abs(opts.FileDir); err != nil {
			return nil, err
		}
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: f.checkDial}
	f.client = &http.Client{
		Timeout: opts.Timeout,
		Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			Proxy:                 nil, // a proxy would hide the address we check
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: opts.Timeout,
			// Hosts are the clients' choice: idle connections (two goroutines, buffers and a
			// socket each) are kept for a few per host, few in all, and not for long.
			MaxIdleConnsPerHost: maxIdlePerHost,
			MaxIdleConns:        maxIdle,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return fmt.Errorf("%w: more than 3 redirects", ErrUpstream)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("%w: redirect to %s", ErrScheme, req.URL.Scheme)
			}
			return nil
		},
	}
	return f, nil
}

// Fetch returns the bytes rawURL points at.
func (f *Fetcher) Fetch(ctx context.Context, rawURL string) ([]byte, error) {
	b, _, err := f.FetchAdmitted(ctx, rawURL, nil)
	return b, err
}

// FetchAdmitted is Fetch with every byte admitted by take before it is allocated: the size a
// file or a response says up front, else each growth of the buffer. release gives them back
// (the caller calls it when it no longer holds the bytes; a no-op on error).
func (f *Fetcher) FetchAdmitted(ctx context.Context, rawURL string, take admit.Func) (b []byte, release func(), err error) {
	rd := &reader{take: take, what: rawURL}
	defer func() {
		if err != nil {
			rd.release()
		}
	}()
	b, err = f.fetch(ctx, rawURL, rd)
	return b, rd.release, err
}

func (f *Fetcher) fetch(ctx context.Context, rawURL string, rd *reader) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScheme, err)
	}
	switch u.Scheme {
	case "file":
		if f.fileDir == "" {
			return nil, fmt.Errorf("%w: file:// URLs are disabled (see --media-dir)", ErrScheme)
		}
		return f.file(u, rd)
	case "http", "https":
		if !f.opts.HTTP {
			return nil, fmt.Errorf("%w: http(s):// URLs are disabled (see --fetch-http)", ErrScheme)
		}
		return f.http(ctx, u, rd)
	case "data":
		return nil, fmt.Errorf("%w: data: URLs are decoded by the media package", ErrScheme)
	}
	return nil, fmt.Errorf("%w: %q (want data:, file:// or http(s)://)", ErrScheme, u.Scheme)
}

// file reads a regular file below the allowed directory. A path outside it gets the same
// answer (ErrForbidden, the same message) whether or not it exists: it is checked lexically
// first, then again after symlinks are resolved (and a path that does not resolve is forbidden
// unless what exists of it resolves inside). Only a path inside may be ErrNotFound. The type
// is checked before the file is opened, and the open itself cannot block or leave the
// directory (a FIFO or a symlink swapped in between): it is made under an os.Root with
// O_NONBLOCK, and the open file is checked again.
func (f *Fetcher) file(u *url.URL, rd *reader) ([]byte, error) {
	if u.Host != "" && u.Host != "localhost" {
		return nil, fmt.Errorf("%w: file:// URL with host %q", ErrForbidden, u.Host)
	}
	if u.Opaque != "" || !filepath.IsAbs(u.Path) {
		return nil, fmt.Errorf("%w: file URLs must be absolute (file:///path)", ErrForbidden)
	}
	forbidden := fmt.Errorf("%w: %s is outside the media directory", ErrForbidden, u.Path)
	path := filepath.Clean(u.Path)
	if !Within(f.fileDir, path) && !Within(f.given, path) {
		return nil, forbidden
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if !f.existingInside(path) {
			return nil, forbidden
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, u.Path)
	}
	if !Within(f.fileDir, real) {
		return nil, forbidden
	}
	st, err := os.Lstat(real)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, u.Path)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotRegular, u.Path, kind(st.Mode()))
	}
	rel, err := filepath.Rel(f.fileDir, real)
	if err != nil {
		return nil, forbidden
	}
	fd, err := f.open(rel)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, u.Path)
	}
	defer fd.Close()
	st, err = fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotFound, u.Path, err)
	}
	if st.Size() > f.opts.MaxBytes {
		return nil, fmt.Errorf("%w: %s has %d bytes, the limit is %d", ErrTooLarge, u.Path, st.Size(), f.opts.MaxBytes)
	}
	return rd.read(fd, f.opts.MaxBytes, st.Size())
}

// open opens rel (a path below the media directory) for reading without blocking (O_NONBLOCK:
// a FIFO opens at once instead of waiting for a writer) and without leaving the directory (an
// os.Root: no symlink is followed out of it, and the last component not at all); anything but a
// regular file is closed again and refused as ErrNotRegular.
func (f *Fetcher) open(rel string) (*os.File, error) {
	root, err := os.OpenRoot(f.fileDir)
	if err != nil {
		return nil, fmt.Errorf("%w: media directory: %v", ErrNotFound, err)
	}
	defer root.Close()
	fd, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil { // gone, or swapped for a symlink that leads out, since it was checked
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	st, err := fd.Stat()
	if err != nil || !st.Mode().IsRegular() {
		fd.Close()
		what := "file that cannot be inspected"
		if err == nil {
			what = kind(st.Mode())
		}
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotRegular, rel, what)
	}
	return fd, nil
}

// existingInside reports whether the longest existing ancestor of path (lexically inside the
// directory) resolves inside it: a missing file there may be called missing; one under a
// symlink that leads out may not (that would tell a client what exists outside).
func (f *Fetcher) existingInside(path string) bool {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return Within(f.fileDir, real)
		}
		if p == filepath.Dir(p) {
			return false
		}
	}
}

// kind names a file type for messages.
func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeSymlink != 0:
		return "symlink"
	}
	return "special file"
}

// Within reports whether path is dir or below it (both absolute and clean).
func Within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

func (f *Fetcher) http(ctx context.Context, u *url.URL, rd *reader) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrForbidden) || errors.Is(err, ErrScheme) {
			return nil, unwrapURLError(err)
		}
		return nil, fmt.Errorf("%w: %w", ErrUpstream, err) // a context error stays in the chain
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s answered 404", ErrNotFound, u.Redacted())
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w: %s answered %s", ErrUpstream, u.Redacted(), resp.Status)
	case resp.ContentLength > f.opts.MaxBytes:
		return nil, fmt.Errorf("%w: %s has %d bytes, the limit is %d", ErrTooLarge, u.Redacted(), resp.ContentLength, f.opts.MaxBytes)
	}
	return rd.read(resp.Body, f.opts.MaxBytes, resp.ContentLength)
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// reader reads a body of at most a limit, admitting its buffer before allocating it.
type reader struct {
	take     admit.Func
	what     string
	releases []func()
}

func (rd *reader) release() {
	for _, r := range rd.releases {
		r()
	}
	rd.releases = nil
}

func (rd *reader) grow(b []byte, n int) ([]byte, error) {
	rel, err := rd.take.Take(rd.what, int64(n-cap(b)))
	if err != nil {
		return nil, err
	}
	rd.releases = append(rd.releases, rel)
	next := make([]byte, len(b), n)
	copy(next, b)
	return next, nil
}

// read reads r to its end; size, when >= 0, is what r says it holds (one allocation then).
func (rd *reader) read(r io.Reader, limit, size int64) ([]byte, error) {
	first := int64(64 << 10)
	if size >= 0 {
		first = size + 1 // one more, to see the end without growing
	}
	b, err := rd.grow(nil, int(min(first, limit+1)))
	if err != nil {
		return nil, err
	}
	for {
		if len(b) == cap(b) {
			if int64(len(b)) > limit {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
			}
			if b, err = rd.grow(b, int(min(2*int64(cap(b)), limit+1))); err != nil {
				return nil, err
			}
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			if int64(len(b)) > limit {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
			}
			return b, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUpstream, err)
		}
	}
}

// checkDial runs for every connection the HTTP client makes, on the resolved address.
func (f *Fetcher) checkDial(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbidden, address)
	}
	if reason := Forbidden(ap.Addr()); reason != "" && !f.opts.AllowPrivateNetworks {
		return fmt.Errorf("%w: %s is %s", ErrForbidden, ap.Addr(), reason)
	}
	return nil
}

// Forbidden says why a daemon must not fetch from addr (a private, loopback, link-local,
// shared, multicast, reserved or unspecified address), or "" if it may.
func Forbidden(addr netip.Addr) string {
	addr = addr.Unmap() // ::ffff:10.0.0.1 is 10.0.0.1
	switch {
	case !addr.IsValid():
		return "not an address"
	case addr.IsUnspecified():
		return "unspecified"
	case addr.IsLoopback():
		return "loopback"
	case addr.IsPrivate():
		return "private"
	case addr.IsMulticast():
		return "multicast"
	case addr.IsLinkLocalUnicast():
		return "link-local (cloud metadata lives there)"
	}
	for _, p := range reserved {
		if p.prefix.Contains(addr) {
			return p.why
		}
	}
	return ""
}

var reserved = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network"`},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (carrier-grade NAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 (maps IPv4 addresses)"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (maps IPv4 addresses)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4 (maps IPv4 addresses)"},
}
