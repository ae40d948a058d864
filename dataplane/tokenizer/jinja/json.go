package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// filterToJSON is Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys) — not Jinja's own, which escapes HTML and sorts.
func filterToJSON(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
	ensureASCII := truth(arg(nil, kw, 0, "ensure_ascii", false))
	indent := arg(args, kw, 0, "indent", nil)
	item, key := ", ", ": "
	pad := ""
	hasIndent := false
	switch v := indent.(type) {
	case nil:
	case int64:
		hasIndent, pad, item = true, strings.Repeat(" ", int(max(v, 0))), ","
	case string:
		hasIndent, pad, item = true, v, ","
	default:
		return nil, fmt.Errorf("indent must be an integer or a string")
	}
	if sep := arg(args, kw, 1, "separators", nil); sep != nil {
		pair := seqOf(sep)
		if len(pair) != 2 {
			return nil, fmt.Errorf("separators must be a pair of strings")
		}
		item, key = str(pair[0]), str(pair[1])
	}
	j := jsonWriter{ensureASCII: ensureASCII, indent: hasIndent, pad: pad, item: item, key: key,
		sortKeys: truth(arg(args, kw, 2, "sort_keys", false)), limit: r.limits.MaxOutputBytes}
	if err := j.write(x, 0); err != nil {
		return nil, err
	}
	return j.b.String(), nil
}

type jsonWriter struct {
	b              strings.Builder
	ensureASCII    bool
	indent         bool
	pad, item, key string
	sortKeys       bool
	limit          int
}

func (j *jsonWriter) newline(depth int) {
	if j.indent {
		j.b.WriteByte('\n')
		for range depth {
			j.b.WriteString(j.pad)
		}
	}
}

func (j *jsonWriter) write(v Value, depth int) error {
	if j.b.Len() > j.limit {
		return fmt.Errorf("JSON over %d bytes", j.limit)
	}
	if depth > maxNesting {
		return fmt.Errorf("JSON nested more than %d deep", maxNesting)
	}
	switch x := v.(type) {
	case nil:
		j.b.WriteString("null")
	case bool:
		j.b.WriteString(strconv.FormatBool(x))
	case int64:
		j.b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch s := formatFloat(x); s {
		case "inf":
			j.b.WriteString("Infinity")
		case "-inf":
			j.b.WriteString("-Infinity")
		case "nan":
			j.b.WriteString("NaN")
		default:
			j.b.WriteString(s)
		}
	case string:
		j.writeString(x)
	case List, Tuple:
		items := seqOf(x)
		if len(items) == 0 {
			j.b.WriteString("[]")
			return nil
		}
		j.b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				j.b.WriteString(j.item)
			}
			j.newline(depth + 1)
			if err := j.write(it, depth+1); err != nil {
				return err
			}
		}
		j.newline(depth)
		j.b.WriteByte(']')
	case *Dict:
		if x.Len() == 0 {
			j.b.WriteString("{}")
			return nil
		}
		order := make([]int, x.Len())
		for i := range order {
			order[i] = i
		}
		if j.sortKeys {
			sort.SliceStable(order, func(a, b int) bool { return str(x.keys[order[a]]) < str(x.keys[order[b]]) })
		}
		j.b.WriteByte('{')
		for n, i := range order {
			if n > 0 {
				j.b.WriteString(j.item)
			}
			j.newline(depth + 1)
			switch k := x.keys[i].(type) {
			case string:
				j.writeString(k)
			case nil:
				j.writeString("null")
			case bool:
				j.writeString(strconv.FormatBool(k))
			default:
				j.writeString(str(k))
			}
			j.b.WriteString(j.key)
			if err := j.write(x.vals[i], depth+1); err != nil {
				return err
			}
		}
		j.newline(depth)
		j.b.WriteByte('}')
	case *Namespace:
		return j.write(x.attrs, depth)
	default:
		return fmt.Errorf("Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// writeString quotes like Python's json: \" \\ \n \r \t \b \f, other controls as \u00XX, and
// with ensure_ascii every non-ASCII character as \uXXXX (surrogate pairs above U+FFFF).
func (j *jsonWriter) writeString(s string) {
	j.b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			j.b.WriteString(`\"`)
		case '\\':
			j.b.WriteString(`\\`)
		case '\n':
			j.b.WriteString(`\n`)
		case '\r':
			j.b.WriteString(`\r`)
		case '\t':
			j.b.WriteString(`\t`)
		case '\b':
			j.b.WriteString(`\b`)
		case '\f':
			j.b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (j.ensureASCII && r == 0x7f):
				fmt.Fprintf(&j.b, `\u%04x`, r)
			case j.ensureASCII && r > 0xffff:
				r -= 0x10000
				fmt.Fprintf(&j.b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			case j.ensureASCII && r > 0x7e:
				fmt.Fprintf(&j.b, `\u%04x`, r)
			default:
				j.b.WriteRune(r)
			}
		}
	}
	j.b.WriteByte('"')
}

// ParseJSON decodes JSON into template values, keeping object key order and telling integers
// (int64) from floats as Python's json module does.
func ParseJSON(data []byte) (Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSON(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("jinja: trailing data after JSON value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder, depth int) (Value, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("jinja: JSON nested more than %d deep", maxNesting)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			out := List{}
			for dec.More() {
				v, err := decodeJSON(dec, depth+1)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token()
			return out, err
		case '{':
			d := NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeJSON(dec, depth+1)
				if err != nil {
					return nil, err
				}
				_ = d.Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		}
		return nil, fmt.Errorf("jinja: unexpected %v in JSON", t)
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return nil, fmt.Errorf("jinja: JSON number %s: %w", t, err)
		}
		return f, nil
	}
	return tok, nil // string, bool, nil
}
