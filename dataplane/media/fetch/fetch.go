// Package fetch reads the media a request points at by URL: file:// only below an allowed
// directory, http(s):// only when enabled, with a size limit, a timeout, and no connection to
// a private, loopback, link-local or otherwise internal address (checked on the address
// actually dialled, so DNS rebinding cannot slip past). data: URLs are decoded by the media
// package, not here.
package fetch

import (
	"context"
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
)

// Fetcher fetches media. Safe for concurrent use.
type Fetcher struct {
	opts    Options
	fileDir string // FileDir with symlinks resolved
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
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: f.checkDial}
	f.client = &http.Client{
		Timeout: opts.Timeout,
		Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			Proxy:                 nil, // a proxy would hide the address we check
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: opts.Timeout,
			MaxIdleConnsPerHost:   4,
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
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScheme, err)
	}
	switch u.Scheme {
	case "file":
		if f.fileDir == "" {
			return nil, fmt.Errorf("%w: file:// URLs are disabled (see --media-dir)", ErrScheme)
		}
		return f.file(u)
	case "http", "https":
		if !f.opts.HTTP {
			return nil, fmt.Errorf("%w: http(s):// URLs are disabled (see --fetch-http)", ErrScheme)
		}
		return f.http(ctx, u)
	case "data":
		return nil, fmt.Errorf("%w: data: URLs are decoded by the media package", ErrScheme)
	}
	return nil, fmt.Errorf("%w: %q (want data:, file:// or http(s)://)", ErrScheme, u.Scheme)
}

// file reads a file below the allowed directory; the path must stay inside it after symlinks
// are resolved.
func (f *Fetcher) file(u *url.URL) ([]byte, error) {
	if u.Host != "" && u.Host != "localhost" {
		return nil, fmt.Errorf("%w: file:// URL with host %q", ErrForbidden, u.Host)
	}
	if u.Opaque != "" || !filepath.IsAbs(u.Path) {
		return nil, fmt.Errorf("%w: file URLs must be absolute (file:///path)", ErrForbidden)
	}
	real, err := filepath.EvalSymlinks(u.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, u.Path)
		}
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if !Within(f.fileDir, real) {
		return nil, fmt.Errorf("%w: %s is outside the media directory", ErrForbidden, u.Path)
	}
	fd, err := os.Open(real)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrNotFound, u.Path)
	}
	if st.Size() > f.opts.MaxBytes {
		return nil, fmt.Errorf("%w: %s has %d bytes, the limit is %d", ErrTooLarge, u.Path, st.Size(), f.opts.MaxBytes)
	}
	return readLimited(fd, f.opts.MaxBytes)
}

// Within reports whether path is dir or below it (both absolute and clean).
func Within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

func (f *Fetcher) http(ctx context.Context, u *url.URL) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrForbidden) || errors.Is(err, ErrScheme) {
			return nil, unwrapURLError(err)
		}
		return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
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
	return readLimited(resp.Body, f.opts.MaxBytes)
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
	}
	return b, nil
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
