package tokenizer

import "unicode/utf8"

// The byte-level alphabet of GPT-2 (and every byte-level BPE since): each byte is written as one
// printable character, so vocabulary entries are strings of these characters. Printable bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes take the characters
// from U+0100 on, in byte order.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	next := rune(256)
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelDecode turns a vocabulary string back into the bytes it stands for. ok is false when
// a character is outside the alphabet; the Hugging Face decoder then uses the string's own UTF-8
// bytes for the whole token.
func byteLevelDecode(s string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(s))
	for _, r := range s {
		b, in := runeToByte[r]
		if !in {
			return nil, false
		}
		raw = append(raw, b)
	}
	return raw, true
}

// byteLevelEncode writes raw bytes in the byte-level alphabet (for Token and error messages).
func byteLevelEncode(raw string) string {
	out := make([]byte, 0, 2*len(raw))
	for i := 0; i < len(raw); i++ {
		out = utf8.AppendRune(out, byteToRune[raw[i]])
	}
	return string(out)
}

// appendLossy appends b as UTF-8, writing U+FFFD for each maximal invalid subsequence — the
// substitution Rust's String::from_utf8_lossy (and so Hugging Face's decoders) makes. Go's own
// conversions differ: strings.ToValidUTF8 replaces a whole run with one U+FFFD, and ranging over
// a string gives one U+FFFD per byte.
func appendLossy(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		n, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			n = 1
		case c == 0xE0:
			n, lo = 2, 0xA0
		case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
			n = 2
		case c == 0xED:
			n, hi = 2, 0x9F
		case c == 0xF0:
			n, lo = 3, 0x90
		case c >= 0xF1 && c <= 0xF3:
			n = 3
		case c == 0xF4:
			n, hi = 3, 0x8F
		}
		j := i + 1
		for k := 0; k < n; k++ {
			if j >= len(b) || b[j] < lo || b[j] > hi {
				break
			}
			j++
			lo, hi = 0x80, 0xBF // only the second byte has a narrower range
		}
		if n > 0 && j == i+1+n {
			dst = append(dst, b[i:j]...)
		} else {
			dst = append(dst, "\uFFFD"...)
		}
		i = j
	}
	return dst
}
