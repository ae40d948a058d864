package jinja

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer works in two steps: split splits the source into text, {{ }}, {% %} and {# #}
// segments and applies whitespace control (the - and + modifiers, and the trim_blocks and
// lstrip_blocks settings that Hugging Face renders chat templates with); tokens then cuts the
// inside of a tag into expression tokens.

type segKind uint8

const (
	segText segKind = iota
	segExpr         // {{ ... }}
	segStmt         // {% ... %}
)

type segment struct {
	kind segKind
	text string // the text, or the inside of the tag
	pos  pos    // where it starts
}

type pos struct{ line, col int }

// lineCol returns the 1-based line and column (in characters) of byte offset off in src.
func lineCol(src string, off int) pos {
	line := 1 + strings.Count(src[:off], "\n")
	start := strings.LastIndexByte(src[:off], '\n') + 1
	return pos{line: line, col: 1 + utf8.RuneCountInString(src[start:off])}
}

// split cuts src into segments. Comments vanish (with their whitespace control applied); a
// {% raw %} block becomes text.
func split(src string) ([]segment, error) {
	var segs []segment
	var text strings.Builder
	textStart := 0
	i := 0
	trimNext := false // the previous tag ended with -: strip all leading whitespace of the text
	trimNL := false   // the previous tag was a block: drop one newline (trim_blocks)
	flush := func() {
		if text.Len() > 0 {
			segs = append(segs, segment{kind: segText, text: text.String(), pos: lineCol(src, textStart)})
		}
		text.Reset()
	}
	for i < len(src) {
		open := indexOpen(src, i)
		chunk := src[i:]
		if open >= 0 {
			chunk = src[i:open]
		}
		if trimNext {
			chunk = strings.TrimLeftFunc(chunk, unicode.IsSpace)
		} else if trimNL {
			if strings.HasPrefix(chunk, "\r\n") {
				chunk = chunk[2:]
			} else if strings.HasPrefix(chunk, "\n") {
				chunk = chunk[1:]
			}
		}
		trimNext, trimNL = false, false
		if open < 0 {
			if text.Len() == 0 {
				textStart = len(src) - len(chunk)
			}
			text.WriteString(chunk)
			break
		}
		kind := src[open+1] // '{', '%' or '#'
		body := open + 2
		mod := byte(0)
		if body < len(src) && (src[body] == '-' || (src[body] == '+' && kind != '{')) {
			mod = src[body]
			body++
		}
		switch {
		case mod == '-':
			chunk = strings.TrimRightFunc(chunk, unicode.IsSpace)
		case mod == 0 && kind != '{' && lineStartBefore(src, open):
			chunk = strings.TrimRight(chunk, " \t") // lstrip_blocks
		}
		if text.Len() == 0 {
			textStart = open - len(chunk)
		}
		text.WriteString(chunk)

		closer := map[byte]string{'{': "}}", '%': "%}", '#': "#}"}[kind]
		end, inner, rmod, err := findClose(src, body, closer, kind)
		if err != nil {
			return nil, err
		}
		trimNext = rmod == '-'
		trimNL = kind != '{' && rmod != '+' && rmod != '-'
		p := lineCol(src, open)
		switch kind {
		case '#':
		case '{':
			flush()
			segs = append(segs, segment{kind: segExpr, text: inner, pos: p})
		case '%':
			if isRaw(inner) {
				rawEnd, after, err := findEndRaw(src, end)
				if err != nil {
					return nil, &Error{Pos: p, Msg: "unclosed {% raw %}"}
				}
				if text.Len() == 0 {
					textStart = end
				}
				text.WriteString(src[end:rawEnd])
				i = after
				continue
			}
			flush()
			segs = append(segs, segment{kind: segStmt, text: inner, pos: p})
		}
		i = end
	}
	flush()
	// keep_trailing_newline is off: one newline at the very end of the template is dropped.
	if n := len(segs); n > 0 && segs[n-1].kind == segText {
		t := segs[n-1].text
		if strings.HasSuffix(t, "\r\n") {
			t = t[:len(t)-2]
		} else if strings.HasSuffix(t, "\n") {
			t = t[:len(t)-1]
		}
		segs[n-1].text = t
	}
	return segs, nil
}

// indexOpen finds the next {{, {% or {#.
func indexOpen(src string, i int) int {
	for {
		k := strings.IndexByte(src[i:], '{')
		if k < 0 || i+k+1 >= len(src) {
			return -1
		}
		if c := src[i+k+1]; c == '{' || c == '%' || c == '#' {
			return i + k
		}
		i += k + 1
	}
}

// lineStartBefore reports whether only spaces and tabs stand between the start of the line and
// offset off.
func lineStartBefore(src string, off int) bool {
	for j := off - 1; j >= 0; j-- {
		switch src[j] {
		case ' ', '\t':
			continue
		case '\n', '\r':
			return true
		default:
			return false
		}
	}
	return true
}

// findClose finds the end of a tag whose inside starts at body: quoted strings are skipped so
// a "%}" inside a string does not end the tag. It returns the offset after the closer, the
// inside, and the closer's modifier (- or +, else 0).
func findClose(src string, body int, closer string, kind byte) (end int, inner string, mod byte, err error) {
	if kind == '#' {
		k := strings.Index(src[body:], "#}")
		if k < 0 {
			return 0, "", 0, &Error{Pos: lineCol(src, body-2), Msg: "unclosed comment"}
		}
		in := src[body : body+k]
		if strings.HasSuffix(in, "-") {
			mod = '-'
		}
		return body + k + 2, "", mod, nil
	}
	var quote byte
	depth := 0 // open brackets: "}}" closes a {{ }} only outside a dict literal
	for j := body; j < len(src); j++ {
		c := src[j]
		switch {
		case quote != 0:
			if c == '\\' {
				j++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case kind == '{' && (c == '{' || c == '[' || c == '('):
			depth++
		case kind == '{' && depth > 0 && (c == '}' || c == ']' || c == ')'):
			depth--
		case strings.HasPrefix(src[j:], closer):
			in := src[body:j]
			if strings.HasSuffix(in, "-") || strings.HasSuffix(in, "+") {
				mod = in[len(in)-1]
				in = in[:len(in)-1]
			}
			return j + len(closer), in, mod, nil
		}
	}
	if quote != 0 {
		return 0, "", 0, &Error{Pos: lineCol(src, body-2), Msg: "unterminated string"}
	}
	return 0, "", 0, &Error{Pos: lineCol(src, body-2), Msg: "unclosed tag, expected " + closer}
}

func isRaw(inner string) bool { return strings.TrimSpace(inner) == "raw" }

// findEndRaw finds {% endraw %} (with optional - modifiers) after off.
func findEndRaw(src string, off int) (rawEnd, after int, err error) {
	for j := off; ; {
		k := strings.Index(src[j:], "{%")
		if k < 0 {
			return 0, 0, &Error{}
		}
		start := j + k
		in := src[start+2:]
		in = strings.TrimPrefix(in, "-")
		trimmed := strings.TrimLeft(in, " \t\r\n")
		if strings.HasPrefix(trimmed, "endraw") {
			rest := strings.TrimLeft(trimmed[len("endraw"):], " \t\r\n")
			rest = strings.TrimPrefix(rest, "-")
			if strings.HasPrefix(rest, "%}") {
				return start, len(src) - len(rest) + 2, nil
			}
		}
		j = start + 2
	}
}
