package jinja

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Values are Go values with Python semantics:
//
//	nil (None), bool, int64, float64, string, List, Tuple, *Dict, *Namespace, Undefined,
//	*macro, *loopState, fn (builtins and bound methods).
//
// Data given to Render (FromGo) becomes these types.
type Value = any

// List is a Python list; Tuple prints as a tuple.
type (
	List  []Value
	Tuple []Value
)

// Undefined is a missing variable, attribute or item: it prints as "", is false, iterates as
// empty, and raises an error on anything else (Jinja's default Undefined).
type Undefined struct{ Name string }

// Dict is an insertion-ordered dict with string, integer, boolean or None keys.
type Dict struct {
	keys  []Value
	vals  []Value
	index map[Value]int
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{index: map[Value]int{}} }

func hashKey(k Value) (Value, error) {
	switch v := k.(type) {
	case nil, string, int64:
		return v, nil
	case bool:
		if v {
			return int64(1), nil
		}
		return int64(0), nil
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<62 {
			return int64(v), nil
		}
		return v, nil
	case Tuple:
		return fmt.Sprint(v), nil
	}
	return nil, fmt.Errorf("unhashable type: '%s'", typeName(k))
}

// Set sets key to v.
func (d *Dict) Set(k, v Value) error {
	h, err := hashKey(k)
	if err != nil {
		return err
	}
	if i, ok := d.index[h]; ok {
		d.vals[i] = v
		return nil
	}
	d.index[h] = len(d.keys)
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
	return nil
}

// Get returns the value of key.
func (d *Dict) Get(k Value) (Value, bool) {
	h, err := hashKey(k)
	if err != nil {
		return nil, false
	}
	i, ok := d.index[h]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// Namespace is the mutable object namespace() makes.
type Namespace struct{ attrs *Dict }

// FromGo converts JSON-like Go data (what encoding/json produces: map[string]any, []any,
// string, float64, bool, nil; also int, int64, []string, map[string]string) into template
// values. Maps are ordered by key, since Go maps have no order; use *Dict or OrderedMap to keep
// one.
func FromGo(v any) (Value, error) {
	switch x := v.(type) {
	case nil, bool, string, int64, float64, *Dict, List, Tuple, Undefined:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case []any:
		out := make(List, len(x))
		for i, e := range x {
			c, err := FromGo(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case []string:
		out := make(List, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			c, err := FromGo(x[k])
			if err != nil {
				return nil, err
			}
			_ = d.Set(k, c)
		}
		return d, nil
	case map[string]string:
		m := make(map[string]any, len(x))
		for k, s := range x {
			m[k] = s
		}
		return FromGo(m)
	case OrderedMap:
		d := NewDict()
		for _, kv := range x {
			c, err := FromGo(kv.Value)
			if err != nil {
				return nil, err
			}
			_ = d.Set(kv.Key, c)
		}
		return d, nil
	}
	return nil, fmt.Errorf("jinja: cannot use %T as a template value", v)
}

// OrderedMap is a map with an order, for FromGo.
type OrderedMap []KeyValue

// KeyValue is one entry of an OrderedMap.
type KeyValue struct {
	Key   string
	Value any
}

func typeName(v Value) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case List:
		return "list"
	case Tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *Namespace:
		return "Namespace"
	case Undefined:
		return "Undefined"
	case *macro:
		return "Macro"
	case *loopState:
		return "LoopContext"
	case fn:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

// truth is Python's bool().
func truth(v Value) bool {
	switch x := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case List:
		return len(x) > 0
	case Tuple:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// str is Python's str() as Jinja prints a value.
func str(v Value) string {
	switch x := v.(type) {
	case string:
		return x
	case Undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr().
func repr(v Value) string {
	var b strings.Builder
	writeRepr(&b, v)
	return b.String()
}

func writeRepr(b *strings.Builder, v Value) {
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(formatFloat(x))
	case string:
		writeStrRepr(b, x)
	case Undefined:
		b.WriteString("")
	case List:
		writeSeq(b, "[", "]", x, false)
	case Tuple:
		writeSeq(b, "(", ")", x, len(x) == 1)
	case *Dict:
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, k)
			b.WriteString(": ")
			writeRepr(b, x.vals[i])
		}
		b.WriteByte('}')
	case *Namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.attrs)
		b.WriteString(">")
	default:
		fmt.Fprintf(b, "<%s>", typeName(v))
	}
}

func writeSeq(b *strings.Builder, open, close string, items []Value, trailingComma bool) {
	b.WriteString(open)
	for i, e := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		writeRepr(b, e)
	}
	if trailingComma {
		b.WriteByte(',')
	}
	b.WriteString(close)
}

// writeStrRepr quotes like Python: single quotes unless the text has ' and no ".
func writeStrRepr(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteByte(q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
}

// formatFloat is Python's repr of a float: the shortest round-trip digits, in exponent form
// below 1e-4 and from 1e16 on, and always with a fraction or exponent.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-4 || abs >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		mant, exp, _ := strings.Cut(s, "e")
		sign := exp[0]
		digits := strings.TrimLeft(exp[1:], "0")
		if len(digits) < 2 {
			digits = strings.Repeat("0", 2-len(digits)) + digits
		}
		return mant + "e" + string(sign) + digits
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// equal is Python's ==.
func equal(a, b Value) bool {
	an, aNum := number(a)
	bn, bNum := number(b)
	if aNum && bNum {
		return an == bn
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case List:
		y, ok := b.(List)
		return ok && equalSeq(x, y)
	case Tuple:
		y, ok := b.(Tuple)
		return ok && equalSeq(x, y)
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for i, k := range x.keys {
			v, ok := y.Get(k)
			if !ok || !equal(x.vals[i], v) {
				return false
			}
		}
		return true
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	}
	return a == b
}

func equalSeq(x, y []Value) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !equal(x[i], y[i]) {
			return false
		}
	}
	return true
}

// number returns v as a float for numeric comparisons (bool counts, as in Python).
func number(v Value) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// compare is Python's <, <=, >, >= as -1, 0, 1; mixed types are an error.
func compare(a, b Value) (int, error) {
	if an, ok := number(a); ok {
		if bn, ok := number(b); ok {
			return cmpFloat(an, bn), nil
		}
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil
		}
	case List:
		if y, ok := b.(List); ok {
			return compareSeq(x, y)
		}
	case Tuple:
		if y, ok := b.(Tuple); ok {
			return compareSeq(x, y)
		}
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareSeq(x, y []Value) (int, error) {
	for i := 0; i < len(x) && i < len(y); i++ {
		if equal(x[i], y[i]) {
			continue
		}
		return compare(x[i], y[i])
	}
	return cmpFloat(float64(len(x)), float64(len(y))), nil
}
