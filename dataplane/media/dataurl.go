package media

import (
	"dataplane/dataplane/sequence"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// ErrDataURL is what every data-URL error unwraps to.
var ErrDataURL = errors.New("bad data URL")

// DataURLError says what is wrong with a data URL and where (a byte offset into it).
type DataURLError struct {
	Offset int
	Msg    string
	// TooLarge: the data is over the limit (the rest are malformed URLs).
	TooLarge bool
}

func (e *DataURLError) Error() string {
	return fmt.Sprintf("media: data URL: %s (at byte %d): %v", e.Msg, e.Offset, ErrDataURL)
}

func (e *DataURLError) Unwrap() []error {
	if e.TooLarge {
		return []error{ErrDataURL, ErrTooLarge}
	}
	return []error{ErrDataURL}
}

// ErrTooLarge is what a data URL over its limit wraps (a 413, where a malformed one is a 400).
var ErrTooLarge = errors.New("media larger than the limit")

// DataURL is a parsed RFC 2397 URL: data:[<media type>][;base64],<data>.
type DataURL struct {
	MediaType string            // lowercased type/subtype ("text/plain" when omitted)
	Params    map[string]string // parameters other than base64 (names lowercased)
	Base64    bool
	Data      []byte
}

// Modality is what the media type's top level says (image/*, audio/*, video/*), or 0.
func (d *DataURL) Modality() sequence.Modality {
	t, _, _ := strings.Cut(d.MediaType, "/")
	m, _ := sequence.ParseModality(t)
	return m
}

// ParseDataURL parses a data URL whose decoded data may hold at most maxBytes bytes; the limit
// is checked from the encoded length before decoding. Base64 may omit padding and may be
// URL-safe; non-base64 data is percent-decoded.
func ParseDataURL(s string, maxBytes int) (*DataURL, error) {
	bad := func(at int, format string, args ...any) (*DataURL, error) {
		return nil, &DataURLError{Offset: at, Msg: fmt.Sprintf(format, args...)}
	}
	tooLarge := func(at int, format string, args ...any) (*DataURL, error) {
		return nil, &DataURLError{Offset: at, Msg: fmt.Sprintf(format, args...) + " (--max-media-bytes)", TooLarge: true}
	}
	const scheme = "data:"
	if len(s) < len(scheme) || !strings.EqualFold(s[:len(scheme)], scheme) {
		return bad(0, "does not start with %q", scheme)
	}
	comma := strings.IndexByte(s, ',')
	if comma < 0 {
		return bad(len(s), "no comma before the data")
	}
	d := &DataURL{MediaType: "text/plain", Params: map[string]string{}}
	head := s[len(scheme):comma]
	at := len(scheme)
	for i, part := range strings.Split(head, ";") {
		switch {
		case i == 0:
			if part != "" {
				typ, sub, ok := strings.Cut(part, "/")
				if !ok || !token(typ) || !token(sub) {
					return bad(at, "media type %q is not type/subtype", part)
				}
				d.MediaType = strings.ToLower(part)
			}
		case strings.EqualFold(part, "base64"):
			if d.Base64 {
				return bad(at, "base64 given twice")
			}
			d.Base64 = true
		default:
			k, v, ok := strings.Cut(part, "=")
			if !ok || !token(k) {
				return bad(at, "parameter %q is not name=value", part)
			}
			d.Params[strings.ToLower(k)] = v
		}
		at += len(part) + 1
	}
	body := s[comma+1:]
	if d.Base64 {
		if max := (maxBytes + 2) / 3 * 4; len(body) > max+3 { // +3: tolerate stray padding
			return tooLarge(comma+1, "%d base64 characters decode to more than %d bytes", len(body), maxBytes)
		}
		enc := base64.StdEncoding
		if strings.ContainsAny(body, "-_") {
			enc = base64.URLEncoding
		}
		trimmed := strings.TrimRight(body, "=")
		data, err := enc.WithPadding(base64.NoPadding).Strict().DecodeString(trimmed)
		if err != nil {
			var ce base64.CorruptInputError
			off := 0
			if errors.As(err, &ce) {
				off = int(ce)
			}
			return bad(comma+1+off, "bad base64: %v", err)
		}
		if len(data) > maxBytes {
			return tooLarge(comma+1, "%d bytes, limit %d", len(data), maxBytes)
		}
		d.Data = data
		return d, nil
	}
	if len(body) > 3*maxBytes {
		return tooLarge(comma+1, "data longer than %d bytes", maxBytes)
	}
	data := make([]byte, 0, min(len(body), maxBytes))
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c == '%' {
			if i+2 >= len(body) || unhex(body[i+1]) < 0 || unhex(body[i+2]) < 0 {
				return bad(comma+1+i, "bad percent-escape")
			}
			c = byte(unhex(body[i+1])<<4 | unhex(body[i+2]))
			i += 2
		}
		if len(data) == maxBytes {
			return tooLarge(comma+1+i, "more than %d bytes", maxBytes)
		}
		data = append(data, c)
	}
	d.Data = data
	return d, nil
}

// token reports whether s is a non-empty RFC 2045 token.
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?=`, c) >= 0 {
			return false
		}
	}
	return true
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
