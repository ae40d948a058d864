package jinja

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// fn is a builtin function or a bound method.
type fn func(args []Value, kw map[string]Value) (Value, error)

// maxRange bounds the list range() builds.
const maxRange = 1 << 20

func (r *renderer) global(name string) (Value, bool) {
	switch name {
	case "range":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			var b [3]int64
			b[2] = 1
			switch len(args) {
			case 1:
				n, ok := intLike(args[0])
				if !ok {
					return nil, errors.New("range() needs integers")
				}
				b[1] = n
			case 2, 3:
				for i, a := range args {
					n, ok := intLike(a)
					if !ok {
						return nil, errors.New("range() needs integers")
					}
					b[i] = n
				}
			default:
				return nil, errors.New("range() takes 1 to 3 arguments")
			}
			if b[2] == 0 {
				return nil, errors.New("range() arg 3 must not be zero")
			}
			var out List
			for i := b[0]; (b[2] > 0 && i < b[1]) || (b[2] < 0 && i > b[1]); i += b[2] {
				if len(out) >= maxRange {
					return nil, fmt.Errorf("range() over %d items", maxRange)
				}
				out = append(out, i)
			}
			return out, nil
		}), true
	case "namespace", "dict":
		isNS := name == "namespace"
		return fn(func(args []Value, kw map[string]Value) (Value, error) {
			d := NewDict()
			for _, a := range args {
				src, ok := a.(*Dict)
				if !ok {
					return nil, fmt.Errorf("%s() takes a dict and keyword arguments", name)
				}
				for i, k := range src.keys {
					_ = d.Set(k, src.vals[i])
				}
			}
			keys := make([]string, 0, len(kw))
			for k := range kw {
				keys = append(keys, k)
			}
			sort.Strings(keys) // Go maps have no order; Python keeps the call's order
			for _, k := range keys {
				_ = d.Set(k, kw[k])
			}
			if isNS {
				return &Namespace{attrs: d}, nil
			}
			return d, nil
		}), true
	case "raise_exception":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			msg := ""
			if len(args) > 0 {
				msg = str(args[0])
			}
			return nil, &Error{Msg: msg, Raised: true}
		}), true
	case "strftime_now":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) != 1 {
				return nil, errors.New("strftime_now() takes one format")
			}
			f, ok := args[0].(string)
			if !ok {
				return nil, errors.New("strftime_now() format must be a string")
			}
			return strftime(r.now(), f)
		}), true
	}
	return nil, false
}

// unsafeMethods are the mutating methods the immutable sandbox refuses.
var unsafeMethods = map[string]bool{
	"append": true, "extend": true, "insert": true, "pop": true, "remove": true, "clear": true,
	"sort": true, "reverse": true, "update": true, "setdefault": true, "popitem": true, "add": true,
	"discard": true,
}

func argStr(args []Value, i int, def string) (string, bool, error) {
	if i >= len(args) || args[i] == nil {
		return def, false, nil
	}
	s, ok := args[i].(string)
	if !ok {
		return "", false, fmt.Errorf("expected a string argument, got %s", typeName(args[i]))
	}
	return s, true, nil
}

// method returns obj.name as a bound method when obj's type has it.
func (r *renderer) method(p pos, obj Value, name string) (Value, bool) {
	switch x := obj.(type) {
	case string:
		return stringMethod(x, name)
	case *Dict:
		switch name {
		case "items":
			return fn(func([]Value, map[string]Value) (Value, error) {
				out := make(List, x.Len())
				for i, k := range x.keys {
					out[i] = Tuple{k, x.vals[i]}
				}
				return out, nil
			}), true
		case "keys":
			return fn(func([]Value, map[string]Value) (Value, error) { return List(append([]Value(nil), x.keys...)), nil }), true
		case "values":
			return fn(func([]Value, map[string]Value) (Value, error) { return List(append([]Value(nil), x.vals...)), nil }), true
		case "get":
			return fn(func(args []Value, _ map[string]Value) (Value, error) {
				if len(args) == 0 {
					return nil, errors.New("get() needs a key")
				}
				if v, ok := x.Get(args[0]); ok {
					return v, nil
				}
				if len(args) > 1 {
					return args[1], nil
				}
				return nil, nil
			}), true
		}
	case List, Tuple:
		items := seqOf(obj)
		switch name {
		case "index":
			return fn(func(args []Value, _ map[string]Value) (Value, error) {
				for i, it := range items {
					if len(args) > 0 && equal(it, args[0]) {
						return int64(i), nil
					}
				}
				return nil, errors.New("value is not in list")
			}), true
		case "count":
			return fn(func(args []Value, _ map[string]Value) (Value, error) {
				n := int64(0)
				for _, it := range items {
					if len(args) > 0 && equal(it, args[0]) {
						n++
					}
				}
				return n, nil
			}), true
		}
	}
	return nil, false
}

func seqOf(v Value) []Value {
	switch x := v.(type) {
	case List:
		return x
	case Tuple:
		return x
	}
	return nil
}

func stringMethod(s, name string) (Value, bool) {
	strip := func(f func(string, string) string, ws func(string, func(rune) bool) string) fn {
		return func(args []Value, _ map[string]Value) (Value, error) {
			chars, given, err := argStr(args, 0, "")
			if err != nil {
				return nil, err
			}
			if !given {
				return ws(s, unicode.IsSpace), nil
			}
			return f(s, chars), nil
		}
	}
	simple := func(f func(string) Value) fn {
		return func([]Value, map[string]Value) (Value, error) { return f(s), nil }
	}
	switch name {
	case "strip":
		return strip(strings.Trim, strings.TrimFunc), true
	case "lstrip":
		return strip(strings.TrimLeft, strings.TrimLeftFunc), true
	case "rstrip":
		return strip(strings.TrimRight, strings.TrimRightFunc), true
	case "upper":
		return simple(func(s string) Value { return strings.ToUpper(s) }), true
	case "lower":
		return simple(func(s string) Value { return strings.ToLower(s) }), true
	case "title":
		return simple(func(s string) Value { return title(s) }), true
	case "capitalize":
		return simple(func(s string) Value { return capitalize(s) }), true
	case "swapcase":
		return simple(func(s string) Value {
			return strings.Map(func(r rune) rune {
				if unicode.IsUpper(r) {
					return unicode.ToLower(r)
				}
				return unicode.ToUpper(r)
			}, s)
		}), true
	case "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper":
		return simple(func(s string) Value { return strIs(name, s) }), true
	case "splitlines":
		return simple(func(s string) Value {
			var out List
			for _, l := range strings.FieldsFunc(strings.ReplaceAll(s, "\r\n", "\n"), func(r rune) bool { return r == '\n' || r == '\r' }) {
				out = append(out, l)
			}
			return out
		}), true
	case "startswith", "endswith":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s() needs an argument", name)
			}
			var cands []Value
			switch a := args[0].(type) {
			case string:
				cands = []Value{a}
			case Tuple, List:
				cands = seqOf(a)
			default:
				return nil, fmt.Errorf("%s() argument must be str or a tuple of str", name)
			}
			for _, c := range cands {
				cs, ok := c.(string)
				if !ok {
					return nil, fmt.Errorf("%s() argument must be str or a tuple of str", name)
				}
				if (name == "startswith" && strings.HasPrefix(s, cs)) || (name == "endswith" && strings.HasSuffix(s, cs)) {
					return true, nil
				}
			}
			return false, nil
		}), true
	case "split", "rsplit":
		return fn(func(args []Value, kw map[string]Value) (Value, error) {
			sep, given, err := argStr(args, 0, "")
			if err != nil {
				return nil, err
			}
			if v, ok := kw["sep"]; ok {
				if sep, given = str(v), v != nil; !given {
					sep = ""
				}
			}
			maxSplit := int64(-1)
			if len(args) > 1 {
				if n, ok := intLike(args[1]); ok {
					maxSplit = n
				}
			}
			if v, ok := kw["maxsplit"]; ok {
				if n, ok := intLike(v); ok {
					maxSplit = n
				}
			}
			return pySplit(s, sep, given, maxSplit, name == "rsplit")
		}), true
	case "replace":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) < 2 {
				return nil, errors.New("replace() needs two arguments")
			}
			o, ok1 := args[0].(string)
			n, ok2 := args[1].(string)
			if !ok1 || !ok2 {
				return nil, errors.New("replace() arguments must be str")
			}
			count := int64(-1)
			if len(args) > 2 {
				count, _ = intLike(args[2])
			}
			return strings.Replace(s, o, n, int(count)), nil
		}), true
	case "find", "count", "index", "rfind":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			sub, _, err := argStr(args, 0, "")
			if err != nil {
				return nil, err
			}
			var i int
			switch name {
			case "count":
				return int64(strings.Count(s, sub)), nil
			case "rfind":
				i = strings.LastIndex(s, sub)
			default:
				i = strings.Index(s, sub)
			}
			if i < 0 && name == "index" {
				return nil, errors.New("substring not found")
			}
			if i >= 0 {
				i = len([]rune(s[:i]))
			}
			return int64(i), nil
		}), true
	case "join":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) != 1 {
				return nil, errors.New("join() takes one argument")
			}
			items, err := iterValues(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				p, ok := it.(string)
				if !ok {
					return nil, fmt.Errorf("sequence item %d: expected str instance, %s found", i, typeName(it))
				}
				parts[i] = p
			}
			return strings.Join(parts, s), nil
		}), true
	}
	return nil, false
}

func strIs(name, s string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
				return false
			}
		case "isspace":
			if !unicode.IsSpace(r) {
				return false
			}
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		}
	}
	return cased || (name != "islower" && name != "isupper")
}

// pySplit is Python's str.split / rsplit.
func pySplit(s, sep string, given bool, maxSplit int64, fromRight bool) (Value, error) {
	var parts []string
	switch {
	case given && sep == "":
		return nil, errors.New("empty separator")
	case given && !fromRight:
		parts = strings.SplitN(s, sep, int(maxSplit+1))
		if maxSplit < 0 {
			parts = strings.Split(s, sep)
		}
	case given:
		parts = strings.Split(s, sep)
		if maxSplit >= 0 && int64(len(parts)) > maxSplit+1 {
			head := strings.Join(parts[:int64(len(parts))-maxSplit], sep)
			parts = append([]string{head}, parts[int64(len(parts))-maxSplit:]...)
		}
	default:
		fields := strings.FieldsFunc(s, unicode.IsSpace)
		if maxSplit >= 0 && int64(len(fields)) > maxSplit+1 {
			// rare in templates: split the first maxSplit fields and keep the rest as is
			if fromRight {
				return nil, errors.New("rsplit() with maxsplit and no separator is not supported")
			}
			rest := s
			fields = fields[:0]
			for k := int64(0); k < maxSplit; k++ {
				rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
				i := strings.IndexFunc(rest, unicode.IsSpace)
				fields = append(fields, rest[:i])
				rest = rest[i:]
			}
			fields = append(fields, strings.TrimLeftFunc(rest, unicode.IsSpace))
		}
		parts = fields
	}
	out := make(List, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func title(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return b.String()
}

func capitalize(s string) string {
	for i, r := range s {
		if i == 0 {
			return string(unicode.ToUpper(r)) + strings.ToLower(s[len(string(r)):])
		}
	}
	return s
}

// iterValues lists a value as a filter iterates it.
func iterValues(v Value) ([]Value, error) {
	switch x := v.(type) {
	case List:
		return x, nil
	case Tuple:
		return x, nil
	case *Dict:
		return append([]Value(nil), x.keys...), nil
	case string:
		out := make([]Value, 0, len(x))
		for _, c := range x {
			out = append(out, string(c))
		}
		return out, nil
	case Undefined:
		return nil, nil
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

// strftime formats t with the C directives templates use.
func strftime(t interface {
	Format(string) string
	YearDay() int
}, f string) (Value, error) {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		layout, ok := map[byte]string{'d': "02", 'm': "01", 'Y': "2006", 'y': "06", 'H': "15", 'M': "04", 'S': "05",
			'b': "Jan", 'B': "January", 'a': "Mon", 'A': "Monday", 'p': "PM", 'I': "03"}[f[i]]
		switch {
		case ok:
			b.WriteString(t.Format(layout))
		case f[i] == 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case f[i] == '%':
			b.WriteByte('%')
		default:
			return nil, fmt.Errorf("strftime_now: directive %%%c is not supported", f[i])
		}
	}
	return b.String(), nil
}

// ---- filters ----

func (r *renderer) evalFilter(e *filterExpr, s *scope) (Value, error) {
	x, err := r.eval(e.x, s)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(e.args, e.kwargs, s)
	if err != nil {
		return nil, err
	}
	f, ok := filters[e.name]
	if !ok {
		return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("unsupported filter '%s'", e.name)}
	}
	v, err := f(r, x, args, kw)
	if err != nil {
		var je *Error
		if errors.As(err, &je) {
			return nil, je
		}
		if _, undef := x.(Undefined); undef {
			return nil, undefErr(e.p, x)
		}
		return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("filter '%s': %v", e.name, err)}
	}
	if sv, ok := v.(string); ok {
		if err := r.sizeCheck(e.p, len(sv)); err != nil {
			return nil, err
		}
	}
	return v, nil
}

type filterFn func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error)

// arg returns the i-th positional argument or the keyword argument name, else def.
func arg(args []Value, kw map[string]Value, i int, name string, def Value) Value {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kw[name]; ok {
		return v
	}
	return def
}

var filters map[string]filterFn

func init() {
	filters = map[string]filterFn{
		"trim": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			if c := arg(args, kw, 0, "chars", nil); c != nil {
				return strings.Trim(str(x), str(c)), nil
			}
			return strings.TrimFunc(str(x), unicode.IsSpace), nil
		},
		"upper": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			return strings.ToUpper(str(x)), nil
		},
		"lower": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			return strings.ToLower(str(x)), nil
		},
		"title": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) { return title(str(x)), nil },
		"capitalize": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			return capitalize(str(x)), nil
		},
		"string": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) { return str(x), nil },
		"safe":   func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) { return str(x), nil },
		"length": filterLength,
		"count":  filterLength,
		"wordcount": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			return int64(len(strings.FieldsFunc(str(x), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' }))), nil
		},
		"replace": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			count := int64(-1)
			if c, ok := intLike(arg(args, kw, 2, "count", nil)); ok {
				count = c
			}
			return strings.Replace(str(x), str(arg(args, kw, 0, "old", "")), str(arg(args, kw, 1, "new", "")), int(count)), nil
		},
		"default": filterDefault,
		"d":       filterDefault,
		"first": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			items, err := iterValues(x)
			if err != nil || len(items) == 0 {
				return Undefined{Name: "first"}, err
			}
			return items[0], nil
		},
		"last": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			items, err := iterValues(x)
			if err != nil || len(items) == 0 {
				return Undefined{Name: "last"}, err
			}
			return items[len(items)-1], nil
		},
		"list": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			items, err := iterValues(x)
			return List(append([]Value{}, items...)), err
		},
		"reverse": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			if s, ok := x.(string); ok {
				rs := []rune(s)
				for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
					rs[i], rs[j] = rs[j], rs[i]
				}
				return string(rs), nil
			}
			items, err := iterValues(x)
			out := make(List, len(items))
			for i, it := range items {
				out[len(items)-1-i] = it
			}
			return out, err
		},
		"join": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			items, err := iterValues(x)
			if err != nil {
				return nil, err
			}
			if a := arg(args, kw, 1, "attribute", nil); a != nil {
				if items, err = r.mapAttr(items, a, nil); err != nil {
					return nil, err
				}
			}
			parts := make([]string, len(items))
			for i, it := range items {
				parts[i] = str(it)
			}
			return strings.Join(parts, str(arg(args, kw, 0, "d", ""))), nil
		},
		"abs": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			switch v := x.(type) {
			case int64:
				if v < 0 {
					return -v, nil
				}
				return v, nil
			case float64:
				return math.Abs(v), nil
			case bool:
				return boolInt(v), nil
			}
			return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(x))
		},
		"int": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			def := arg(args, kw, 0, "default", int64(0))
			switch v := x.(type) {
			case int64:
				return v, nil
			case bool:
				return boolInt(v), nil
			case float64:
				if math.IsNaN(v) || math.IsInf(v, 0) {
					return def, nil
				}
				return int64(v), nil
			case string:
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n, nil
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					return int64(f), nil
				}
			}
			return def, nil
		},
		"float": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			def := arg(args, kw, 0, "default", 0.0)
			if f, ok := number(x); ok {
				return f, nil
			}
			if s, ok := x.(string); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
					return f, nil
				}
			}
			return def, nil
		},
		"round": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			f, ok := number(x)
			if !ok {
				return nil, fmt.Errorf("round() of %s", typeName(x))
			}
			prec, _ := intLike(arg(args, kw, 0, "precision", int64(0)))
			method := str(arg(args, kw, 1, "method", "common"))
			p := math.Pow(10, float64(prec))
			switch method {
			case "common": // Python's round: halves to even
				return math.RoundToEven(f*p) / p, nil
			case "floor":
				return math.Floor(f*p) / p, nil
			case "ceil":
				return math.Ceil(f*p) / p, nil
			}
			return nil, fmt.Errorf("method must be common, floor or ceil")
		},
		"sum": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			items, err := iterValues(x)
			if err != nil {
				return nil, err
			}
			if a := arg(args, kw, 0, "attribute", nil); a != nil {
				if items, err = r.mapAttr(items, a, nil); err != nil {
					return nil, err
				}
			}
			var total Value = arg(args, kw, 1, "start", int64(0))
			for _, it := range items {
				if total, err = arith("+", total, it, r.limits.MaxOutputBytes); err != nil {
					return nil, err
				}
			}
			return total, nil
		},
		"min":    func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) { return extreme(x, -1) },
		"max":    func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) { return extreme(x, 1) },
		"unique": filterUnique,
		"sort":   filterSort,
		"items": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			d, ok := x.(*Dict)
			if !ok {
				if _, undef := x.(Undefined); undef {
					return List{}, nil
				}
				return nil, fmt.Errorf("can only get item pairs from a mapping")
			}
			out := make(List, d.Len())
			for i, k := range d.keys {
				out[i] = Tuple{k, d.vals[i]}
			}
			return out, nil
		},
		"dictsort": func(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
			d, ok := x.(*Dict)
			if !ok {
				return nil, fmt.Errorf("dictsort needs a dict")
			}
			out := make(List, d.Len())
			for i, k := range d.keys {
				out[i] = Tuple{k, d.vals[i]}
			}
			var err error
			sort.SliceStable(out, func(i, j int) bool {
				c, e := compare(foldKey(out[i].(Tuple)[0]), foldKey(out[j].(Tuple)[0]))
				if e != nil {
					err = e
				}
				return c < 0
			})
			return out, err
		},
		"indent": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			w := arg(args, kw, 0, "width", int64(4))
			pad := str(w)
			if n, ok := intLike(w); ok {
				pad = strings.Repeat(" ", int(max(n, 0)))
			}
			first := truth(arg(args, kw, 1, "first", false))
			blank := truth(arg(args, kw, 2, "blank", false))
			lines := strings.Split(str(x), "\n")
			for i, l := range lines {
				if (i == 0 && !first) || (l == "" && !blank) {
					continue
				}
				lines[i] = pad + l
			}
			return strings.Join(lines, "\n"), nil
		},
		"batch": func(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			items, err := iterValues(x)
			if err != nil {
				return nil, err
			}
			n, ok := intLike(arg(args, kw, 0, "linecount", nil))
			if !ok || n <= 0 {
				return nil, fmt.Errorf("batch needs a positive size")
			}
			var out List
			for i := 0; i < len(items); i += int(n) {
				out = append(out, List(append([]Value{}, items[i:min(i+int(n), len(items))]...)))
			}
			return out, nil
		},
		"tojson": filterToJSON,
		"map":    filterMap,
		"select": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			return r.selectBy(x, args, false, false)
		},
		"reject": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			return r.selectBy(x, args, true, false)
		},
		"selectattr": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			return r.selectBy(x, args, false, true)
		},
		"rejectattr": func(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
			return r.selectBy(x, args, true, true)
		},
		"attr": func(r *renderer, x Value, args []Value, _ map[string]Value) (Value, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("attr needs a name")
			}
			return r.getAttr(pos{}, x, str(args[0]))
		},
	}
}

func filterLength(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
	switch v := x.(type) {
	case string:
		return int64(len([]rune(v))), nil
	case List:
		return int64(len(v)), nil
	case Tuple:
		return int64(len(v)), nil
	case *Dict:
		return int64(v.Len()), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, fmt.Errorf("object of type '%s' has no len()", typeName(x))
}

func filterDefault(_ *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
	def := arg(args, kw, 0, "default_value", "")
	boolean := truth(arg(args, kw, 1, "boolean", false))
	if _, undef := x.(Undefined); undef || (boolean && !truth(x)) {
		return def, nil
	}
	return x, nil
}

func foldKey(v Value) Value {
	if s, ok := v.(string); ok {
		return strings.ToLower(s)
	}
	return v
}

func extreme(x Value, sign int) (Value, error) {
	items, err := iterValues(x)
	if err != nil || len(items) == 0 {
		return Undefined{}, err
	}
	best := items[0]
	for _, it := range items[1:] {
		c, err := compare(foldKey(it), foldKey(best))
		if err != nil {
			return nil, err
		}
		if c*sign > 0 {
			best = it
		}
	}
	return best, nil
}

func filterUnique(_ *renderer, x Value, _ []Value, _ map[string]Value) (Value, error) {
	items, err := iterValues(x)
	if err != nil {
		return nil, err
	}
	var out List
	for _, it := range items {
		if !inSeq(foldKey(it), mapSlice(out, foldKey)) {
			out = append(out, it)
		}
	}
	return out, nil
}

func mapSlice(items []Value, f func(Value) Value) []Value {
	out := make([]Value, len(items))
	for i, it := range items {
		out[i] = f(it)
	}
	return out
}

func filterSort(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
	items, err := iterValues(x)
	if err != nil {
		return nil, err
	}
	out := List(append([]Value{}, items...))
	reverse := truth(arg(args, kw, 0, "reverse", false))
	caseSensitive := truth(arg(args, kw, 1, "case_sensitive", false))
	keys := append([]Value{}, out...)
	if a := arg(args, kw, 2, "attribute", nil); a != nil {
		if keys, err = r.mapAttr(out, a, nil); err != nil {
			return nil, err
		}
	}
	if !caseSensitive {
		keys = mapSlice(keys, foldKey)
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	var cmpErr error
	sort.SliceStable(idx, func(i, j int) bool {
		c, e := compare(keys[idx[i]], keys[idx[j]])
		if e != nil {
			cmpErr = e
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	sorted := make(List, len(out))
	for i, k := range idx {
		sorted[i] = out[k]
	}
	return sorted, cmpErr
}

// mapAttr looks up a (dotted) attribute on each item.
func (r *renderer) mapAttr(items []Value, attr Value, def Value) ([]Value, error) {
	out := make([]Value, len(items))
	for i, it := range items {
		v := it
		for _, part := range strings.Split(str(attr), ".") {
			var err error
			if n, e := strconv.Atoi(part); e == nil {
				v, err = r.getItem(pos{}, v, int64(n))
			} else {
				v, err = r.getItem(pos{}, v, part)
			}
			if err != nil {
				return nil, err
			}
		}
		if _, undef := v.(Undefined); undef && def != nil {
			v = def
		}
		out[i] = v
	}
	return out, nil
}

func filterMap(r *renderer, x Value, args []Value, kw map[string]Value) (Value, error) {
	items, err := iterValues(x)
	if err != nil {
		return nil, err
	}
	if a, ok := kw["attribute"]; ok {
		out, err := r.mapAttr(items, a, kw["default"])
		return List(out), err
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("map needs a filter name or attribute=")
	}
	name := str(args[0])
	f, ok := filters[name]
	if !ok {
		return nil, &Error{Msg: fmt.Sprintf("unsupported filter '%s'", name)}
	}
	out := make(List, len(items))
	for i, it := range items {
		if out[i], err = f(r, it, args[1:], nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// selectBy is select / reject / selectattr / rejectattr.
func (r *renderer) selectBy(x Value, args []Value, reject, byAttr bool) (Value, error) {
	items, err := iterValues(x)
	if err != nil {
		return nil, err
	}
	var out List
	for _, it := range items {
		v, rest := it, args
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("missing attribute name")
			}
			vs, err := r.mapAttr([]Value{it}, args[0], nil)
			if err != nil {
				return nil, err
			}
			v, rest = vs[0], args[1:]
		}
		var ok bool
		if len(rest) == 0 {
			ok = truth(v)
		} else {
			t, found := tests[str(rest[0])]
			if !found {
				return nil, &Error{Msg: fmt.Sprintf("unsupported test '%s'", str(rest[0]))}
			}
			if ok, err = t(v, rest[1:]); err != nil {
				return nil, err
			}
		}
		if ok != reject {
			out = append(out, it)
		}
	}
	return out, nil
}

// ---- tests ----

func (r *renderer) evalTest(e *testExpr, s *scope) (Value, error) {
	x, err := r.eval(e.x, s)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(e.args, nil, s)
	if err != nil {
		return nil, err
	}
	t, ok := tests[e.name]
	if !ok {
		return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("unsupported test '%s'", e.name)}
	}
	v, err := t(x, args)
	if err != nil {
		return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("test '%s': %v", e.name, err)}
	}
	return v != e.negate, nil
}

type testFn func(x Value, args []Value) (bool, error)

var tests map[string]testFn

func cmpTest(op string) testFn {
	return func(x Value, args []Value) (bool, error) {
		if len(args) != 1 {
			return false, fmt.Errorf("needs one argument")
		}
		return compareOp(op, x, args[0])
	}
}

func init() {
	isType := func(f func(Value) bool) testFn { return func(x Value, _ []Value) (bool, error) { return f(x), nil } }
	tests = map[string]testFn{
		"defined":   isType(func(x Value) bool { _, u := x.(Undefined); return !u }),
		"undefined": isType(func(x Value) bool { _, u := x.(Undefined); return u }),
		"none":      isType(func(x Value) bool { return x == nil }),
		"string":    isType(func(x Value) bool { _, ok := x.(string); return ok }),
		"number": isType(func(x Value) bool {
			switch x.(type) {
			case int64, float64, bool:
				return true
			}
			return false
		}),
		"integer": isType(func(x Value) bool { _, ok := x.(int64); return ok }),
		"float":   isType(func(x Value) bool { _, ok := x.(float64); return ok }),
		"boolean": isType(func(x Value) bool { _, ok := x.(bool); return ok }),
		"true":    isType(func(x Value) bool { return x == true }),
		"false":   isType(func(x Value) bool { return x == false }),
		"mapping": isType(func(x Value) bool { _, ok := x.(*Dict); return ok }),
		"iterable": isType(func(x Value) bool {
			switch x.(type) {
			case List, Tuple, *Dict, string:
				return true
			}
			return false
		}),
		"sequence": isType(func(x Value) bool {
			switch x.(type) {
			case List, Tuple, *Dict, string:
				return true
			}
			return false
		}),
		"callable": isType(func(x Value) bool {
			switch x.(type) {
			case fn, *macro:
				return true
			}
			return false
		}),
		"lower": isType(func(x Value) bool { s, ok := x.(string); return ok && s == strings.ToLower(s) }),
		"upper": isType(func(x Value) bool { s, ok := x.(string); return ok && s == strings.ToUpper(s) }),
		"odd": func(x Value, _ []Value) (bool, error) {
			n, ok := intLike(x)
			return ok && n%2 != 0, nil
		},
		"even": func(x Value, _ []Value) (bool, error) {
			n, ok := intLike(x)
			return ok && n%2 == 0, nil
		},
		"divisibleby": func(x Value, args []Value) (bool, error) {
			n, ok1 := intLike(x)
			if len(args) != 1 {
				return false, fmt.Errorf("needs one argument")
			}
			d, ok2 := intLike(args[0])
			if !ok1 || !ok2 || d == 0 {
				return false, fmt.Errorf("needs non-zero integers")
			}
			return n%d == 0, nil
		},
		"sameas": func(x Value, args []Value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("needs one argument")
			}
			switch a := args[0].(type) {
			case nil, bool:
				return x == a, nil
			}
			return equal(x, args[0]) && typeName(x) == typeName(args[0]), nil
		},
		"in": func(x Value, args []Value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("needs one argument")
			}
			return contained(x, args[0])
		},
	}
	for _, names := range [][]string{{"==", "eq", "equalto"}, {"!=", "ne"}, {"<", "lt", "lessthan"}, {"<=", "le"}, {">", "gt", "greaterthan"}, {">=", "ge"}} {
		for _, n := range names {
			tests[n] = cmpTest(names[0])
		}
	}
}
