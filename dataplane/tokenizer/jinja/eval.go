package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Limits bound one Render. Zero fields take the defaults of DefaultLimits.
type Limits struct {
	// MaxOutputBytes bounds the output and every string or list built on the way. Default 16 MiB.
	MaxOutputBytes int
	// MaxSteps bounds evaluated nodes and loop iterations. Default 10,000,000.
	MaxSteps int
	// MaxCallDepth bounds nested macro calls. Default 64.
	MaxCallDepth int
}

// DefaultLimits returns the defaults documented on Limits.
func DefaultLimits() Limits {
	return Limits{MaxOutputBytes: 16 << 20, MaxSteps: 10_000_000, MaxCallDepth: 64}
}

// Env is what a template may use beyond its variables.
type Env struct {
	Limits Limits
	// Now is what strftime_now formats; nil means time.Now.
	Now func() time.Time
}

// Render runs the template with vars (values of FromGo's types; see FromGo) and returns the
// text. Errors are *Error; a raise_exception call gives one with Raised set.
func (t *Template) Render(vars map[string]Value, env Env) (string, error) {
	l := env.Limits
	d := DefaultLimits()
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxSteps <= 0 {
		l.MaxSteps = d.MaxSteps
	}
	if l.MaxCallDepth <= 0 {
		l.MaxCallDepth = d.MaxCallDepth
	}
	r := &renderer{limits: l, now: env.Now}
	if r.now == nil {
		r.now = time.Now
	}
	root := &scope{vars: map[string]Value{}}
	for k, v := range vars {
		root.vars[k] = v
	}
	r.root = root
	var out strings.Builder
	if err := r.exec(t.body, root, &out); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", &Error{Msg: "break or continue outside a loop"}
		}
		return "", err
	}
	return out.String(), nil
}

type renderer struct {
	limits Limits
	steps  int
	depth  int
	now    func() time.Time
	root   *scope
}

type scope struct {
	vars   map[string]Value
	parent *scope
}

func (s *scope) lookup(name string) (Value, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

func (s *scope) child() *scope { return &scope{vars: map[string]Value{}, parent: s} }

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

func (r *renderer) step(p pos) error {
	r.steps++
	if r.steps > r.limits.MaxSteps {
		return &Error{Pos: p, Msg: fmt.Sprintf("more than %d steps", r.limits.MaxSteps)}
	}
	return nil
}

func (r *renderer) sizeCheck(p pos, n int) error {
	if n > r.limits.MaxOutputBytes {
		return &Error{Pos: p, Msg: fmt.Sprintf("value or output over %d bytes", r.limits.MaxOutputBytes)}
	}
	return nil
}

func (r *renderer) exec(nodes []node, s *scope, out *strings.Builder) error {
	for _, n := range nodes {
		if err := r.execOne(n, s, out); err != nil {
			return err
		}
		if err := r.sizeCheck(pos{}, out.Len()); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) execOne(n node, s *scope, out *strings.Builder) error {
	switch n := n.(type) {
	case *textNode:
		out.WriteString(n.s)
	case *outputNode:
		v, err := r.eval(n.x, s)
		if err != nil {
			return err
		}
		out.WriteString(str(v))
	case *ifNode:
		for i, c := range n.conds {
			v, err := r.eval(c, s)
			if err != nil {
				return err
			}
			if truth(v) {
				return r.exec(n.bodies[i], s, out)
			}
		}
		return r.exec(n.els, s, out)
	case *forNode:
		return r.execFor(n, s, out)
	case *setNode:
		return r.execSet(n, s)
	case *macroNode:
		s.vars[n.name] = &macro{node: n, r: r}
	case *loopCtlNode:
		if n.isBreak {
			return errBreak
		}
		return errContinue
	}
	return nil
}

func (r *renderer) execSet(n *setNode, s *scope) error {
	var v Value
	if n.body != nil {
		var b strings.Builder
		if err := r.exec(n.body, s, &b); err != nil {
			return err
		}
		v = b.String()
	} else {
		var err error
		if v, err = r.eval(n.x, s); err != nil {
			return err
		}
	}
	if n.attr != "" {
		obj, _ := s.lookup(n.targets[0])
		ns, ok := obj.(*Namespace)
		if !ok {
			return &Error{Pos: n.p, Msg: fmt.Sprintf("cannot assign attribute on non-namespace object %s", n.targets[0])}
		}
		return ns.attrs.Set(n.attr, v)
	}
	if len(n.targets) == 1 {
		s.vars[n.targets[0]] = v
		return nil
	}
	items, err := r.iterate(n.p, v)
	if err != nil {
		return err
	}
	if len(items) != len(n.targets) {
		return &Error{Pos: n.p, Msg: fmt.Sprintf("cannot unpack %d values into %d names", len(items), len(n.targets))}
	}
	for i, name := range n.targets {
		s.vars[name] = items[i]
	}
	return nil
}

// loopState is the loop variable.
type loopState struct {
	index0, length int
	items          []Value
}

func (r *renderer) execFor(n *forNode, s *scope, out *strings.Builder) error {
	v, err := r.eval(n.iter, s)
	if err != nil {
		return err
	}
	all, err := r.iterate(n.p, v)
	if err != nil {
		return err
	}
	items := all
	if n.filter != nil {
		items = nil
		for _, it := range all {
			fs := s.child()
			if err := bindTargets(n, fs, it); err != nil {
				return err
			}
			ok, err := r.eval(n.filter, fs)
			if err != nil {
				return err
			}
			if truth(ok) {
				items = append(items, it)
			}
		}
	}
	if len(items) == 0 {
		return r.exec(n.els, s, out)
	}
	loop := &loopState{length: len(items), items: items}
	for i, it := range items {
		if err := r.step(n.p); err != nil {
			return err
		}
		loop.index0 = i
		body := s.child()
		body.vars["loop"] = loop
		if err := bindTargets(n, body, it); err != nil {
			return err
		}
		err := r.exec(n.body, body, out)
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

func bindTargets(n *forNode, s *scope, it Value) error {
	if len(n.targets) == 1 {
		s.vars[n.targets[0]] = it
		return nil
	}
	var items []Value
	switch x := it.(type) {
	case List:
		items = x
	case Tuple:
		items = x
	default:
		return &Error{Pos: n.p, Msg: fmt.Sprintf("cannot unpack %s into %d names", typeName(it), len(n.targets))}
	}
	if len(items) != len(n.targets) {
		return &Error{Pos: n.p, Msg: fmt.Sprintf("cannot unpack %d values into %d names", len(items), len(n.targets))}
	}
	for i, name := range n.targets {
		s.vars[name] = items[i]
	}
	return nil
}

// iterate lists what a for loop over v visits.
func (r *renderer) iterate(p pos, v Value) ([]Value, error) {
	items, err := iterValues(v)
	if err != nil {
		return nil, &Error{Pos: p, Msg: err.Error()}
	}
	return items, nil
}

// ---- expressions ----

func (r *renderer) eval(e expr, s *scope) (Value, error) {
	if err := r.step(e.at()); err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		if v, ok := s.lookup(e.name); ok {
			return v, nil
		}
		if g, ok := r.global(e.name); ok {
			return g, nil
		}
		return Undefined{Name: e.name}, nil
	case *listExpr:
		items := make([]Value, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it, s)
			if err != nil {
				return nil, err
			}
			items[i] = v
		}
		if e.tuple {
			return Tuple(items), nil
		}
		return List(items), nil
	case *dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], s)
			if err != nil {
				return nil, err
			}
			v, err := r.eval(e.vals[i], s)
			if err != nil {
				return nil, err
			}
			if err := d.Set(k, v); err != nil {
				return nil, &Error{Pos: e.p, Msg: err.Error()}
			}
		}
		return d, nil
	case *attrExpr:
		obj, err := r.eval(e.obj, s)
		if err != nil {
			return nil, err
		}
		return r.getAttr(e.p, obj, e.name)
	case *itemExpr:
		obj, err := r.eval(e.obj, s)
		if err != nil {
			return nil, err
		}
		k, err := r.eval(e.key, s)
		if err != nil {
			return nil, err
		}
		return r.getItem(e.p, obj, k)
	case *sliceExpr:
		return r.evalSlice(e, s)
	case *callExpr:
		return r.evalCall(e, s)
	case *filterExpr:
		return r.evalFilter(e, s)
	case *testExpr:
		return r.evalTest(e, s)
	case *unaryExpr:
		return r.evalUnary(e, s)
	case *binaryExpr:
		return r.evalBinary(e, s)
	case *compareExpr:
		return r.evalCompare(e, s)
	case *condExpr:
		c, err := r.eval(e.cond, s)
		if err != nil {
			return nil, err
		}
		if truth(c) {
			return r.eval(e.yes, s)
		}
		if e.no == nil {
			return Undefined{}, nil
		}
		return r.eval(e.no, s)
	}
	return nil, &Error{Pos: e.at(), Msg: fmt.Sprintf("cannot evaluate %T", e)}
}

func undefErr(p pos, v Value) error {
	u := v.(Undefined)
	if u.Name == "" {
		return &Error{Pos: p, Msg: "undefined value"}
	}
	return &Error{Pos: p, Msg: fmt.Sprintf("'%s' is undefined", u.Name)}
}

// getAttr is obj.name: a method or attribute first, then an item (Jinja's getattr order).
func (r *renderer) getAttr(p pos, obj Value, name string) (Value, error) {
	switch x := obj.(type) {
	case Undefined:
		return nil, undefErr(p, obj)
	case *Dict:
		if m, ok := r.method(p, obj, name); ok {
			return m, nil
		}
		if v, ok := x.Get(name); ok {
			return v, nil
		}
		return Undefined{Name: name}, nil
	case *Namespace:
		if v, ok := x.attrs.Get(name); ok {
			return v, nil
		}
		return Undefined{Name: name}, nil
	case *loopState:
		return x.attr(p, name)
	}
	if m, ok := r.method(p, obj, name); ok {
		return m, nil
	}
	if unsafeMethods[name] {
		return nil, &Error{Pos: p, Msg: fmt.Sprintf("access to attribute '%s' of '%s' object is unsafe", name, typeName(obj))}
	}
	if obj == nil {
		return Undefined{Name: name}, nil
	}
	return Undefined{Name: name}, nil
}

// getItem is obj[key]: an item first, then an attribute.
func (r *renderer) getItem(p pos, obj, key Value) (Value, error) {
	switch x := obj.(type) {
	case Undefined:
		return nil, undefErr(p, obj)
	case *Dict:
		if v, ok := x.Get(key); ok {
			return v, nil
		}
	case List, Tuple, string:
		i, ok := key.(int64)
		if b, isBool := key.(bool); isBool {
			i, ok = boolInt(b), true
		}
		if !ok {
			break
		}
		var n int
		switch y := x.(type) {
		case List:
			n = len(y)
		case Tuple:
			n = len(y)
		case string:
			rs := []rune(y)
			n = len(rs)
			if i < 0 {
				i += int64(n)
			}
			if i < 0 || i >= int64(n) {
				return Undefined{}, nil
			}
			return string(rs[i]), nil
		}
		if i < 0 {
			i += int64(n)
		}
		if i < 0 || i >= int64(n) {
			return Undefined{}, nil
		}
		if l, ok := x.(List); ok {
			return l[i], nil
		}
		return x.(Tuple)[i], nil
	}
	if name, ok := key.(string); ok {
		return r.getAttr(p, obj, name)
	}
	return Undefined{}, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (r *renderer) evalSlice(e *sliceExpr, s *scope) (Value, error) {
	obj, err := r.eval(e.obj, s)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.lo, e.hi, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, s)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := v.(int64)
		if !ok {
			return nil, &Error{Pos: e.p, Msg: "slice indices must be integers or None"}
		}
		bounds[i] = &n
	}
	var items []Value
	var runes []rune
	kind := 0
	switch x := obj.(type) {
	case List:
		items = x
	case Tuple:
		items, kind = x, 1
	case string:
		runes, kind = []rune(x), 2
	case Undefined:
		return nil, undefErr(e.p, obj)
	default:
		return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("'%s' object is not subscriptable", typeName(obj))}
	}
	n := len(items)
	if kind == 2 {
		n = len(runes)
	}
	idx, err := sliceIndices(n, bounds)
	if err != nil {
		return nil, &Error{Pos: e.p, Msg: err.Error()}
	}
	switch kind {
	case 2:
		var b strings.Builder
		for _, i := range idx {
			b.WriteRune(runes[i])
		}
		return b.String(), nil
	case 1:
		out := make(Tuple, len(idx))
		for k, i := range idx {
			out[k] = items[i]
		}
		return out, nil
	}
	out := make(List, len(idx))
	for k, i := range idx {
		out[k] = items[i]
	}
	return out, nil
}

// sliceIndices is Python's slice.indices, listed.
func sliceIndices(n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, fmt.Errorf("slice step cannot be zero")
	}
	clamp := func(v *int64, def int64, lo, hi int64) int64 {
		if v == nil {
			return def
		}
		x := *v
		if x < 0 {
			x += int64(n)
			if x < lo {
				x = lo
			}
		} else if x > hi {
			x = hi
		}
		return x
	}
	var out []int
	if step > 0 {
		start, stop := clamp(b[0], 0, 0, int64(n)), clamp(b[1], int64(n), 0, int64(n))
		for i := start; i < stop; i += step {
			out = append(out, int(i))
		}
	} else {
		start, stop := clamp(b[0], int64(n)-1, -1, int64(n)-1), clamp(b[1], -1, -1, int64(n)-1)
		if b[1] == nil {
			stop = -1
		}
		for i := start; i > stop; i += step {
			out = append(out, int(i))
		}
	}
	return out, nil
}

func (r *renderer) evalArgs(args []expr, kwargs []kwarg, s *scope) ([]Value, map[string]Value, error) {
	vals := make([]Value, len(args))
	for i, a := range args {
		v, err := r.eval(a, s)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	var kw map[string]Value
	if len(kwargs) > 0 {
		kw = make(map[string]Value, len(kwargs))
		for _, k := range kwargs {
			v, err := r.eval(k.v, s)
			if err != nil {
				return nil, nil, err
			}
			kw[k.name] = v
		}
	}
	return vals, kw, nil
}

func (r *renderer) evalCall(e *callExpr, s *scope) (Value, error) {
	f, err := r.eval(e.fn, s)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(e.args, e.kwargs, s)
	if err != nil {
		return nil, err
	}
	switch f := f.(type) {
	case fn:
		v, err := f(args, kw)
		if err != nil {
			var je *Error
			if errors.As(err, &je) {
				if je.Pos.line == 0 {
					je.Pos = e.p
				}
				return nil, je
			}
			return nil, &Error{Pos: e.p, Msg: err.Error()}
		}
		return v, nil
	case *macro:
		return f.call(e.p, args, kw)
	case Undefined:
		return nil, undefErr(e.p, f)
	}
	return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("'%s' object is not callable", typeName(f))}
}

// macro is a {% macro %} bound to the renderer that defined it.
type macro struct {
	node *macroNode
	r    *renderer
}

func (m *macro) call(p pos, args []Value, kw map[string]Value) (Value, error) {
	r := m.r
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > r.limits.MaxCallDepth {
		return nil, &Error{Pos: p, Msg: fmt.Sprintf("macro calls nested more than %d deep", r.limits.MaxCallDepth)}
	}
	if len(args) > len(m.node.params) {
		return nil, &Error{Pos: p, Msg: fmt.Sprintf("macro '%s' takes at most %d arguments", m.node.name, len(m.node.params))}
	}
	s := r.root.child()
	for i, name := range m.node.params {
		switch v, ok := kw[name]; {
		case i < len(args):
			s.vars[name] = args[i]
		case ok:
			s.vars[name] = v
		case m.node.defaults[i] != nil:
			d, err := r.eval(m.node.defaults[i], s)
			if err != nil {
				return nil, err
			}
			s.vars[name] = d
		default:
			s.vars[name] = Undefined{Name: name}
		}
	}
	var b strings.Builder
	if err := r.exec(m.node.body, s, &b); err != nil {
		return nil, err
	}
	return b.String(), nil
}

func (r *renderer) evalUnary(e *unaryExpr, s *scope) (Value, error) {
	x, err := r.eval(e.x, s)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "not":
		return !truth(x), nil
	case "-":
		switch v := x.(type) {
		case int64:
			return -v, nil
		case float64:
			return -v, nil
		case bool:
			return -boolInt(v), nil
		}
	case "+":
		switch v := x.(type) {
		case int64, float64:
			return v, nil
		case bool:
			return boolInt(v), nil
		}
	}
	if _, ok := x.(Undefined); ok {
		return nil, undefErr(e.p, x)
	}
	return nil, &Error{Pos: e.p, Msg: fmt.Sprintf("bad operand type for unary %s: '%s'", e.op, typeName(x))}
}

func (r *renderer) evalBinary(e *binaryExpr, s *scope) (Value, error) {
	l, err := r.eval(e.l, s)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truth(l) {
			return l, nil
		}
		return r.eval(e.r, s)
	case "or":
		if truth(l) {
			return l, nil
		}
		return r.eval(e.r, s)
	}
	rv, err := r.eval(e.r, s)
	if err != nil {
		return nil, err
	}
	if e.op == "~" {
		out := str(l) + str(rv)
		return out, r.sizeCheck(e.p, len(out))
	}
	v, err := arith(e.op, l, rv, r.limits.MaxOutputBytes)
	if err != nil {
		if _, ok := l.(Undefined); ok {
			return nil, undefErr(e.p, l)
		}
		if _, ok := rv.(Undefined); ok {
			return nil, undefErr(e.p, rv)
		}
		return nil, &Error{Pos: e.p, Msg: err.Error()}
	}
	return v, nil
}

// arith is Python's + - * / // % ** on the types templates use. Integers are int64; an
// overflow is an error (Python would go on with big integers).
func arith(op string, a, b Value, maxBytes int) (Value, error) {
	ai, aInt := intLike(a)
	bi, bInt := intLike(b)
	if aInt && bInt {
		return intArith(op, ai, bi)
	}
	af, aNum := number(a)
	bf, bNum := number(b)
	if aNum && bNum {
		return floatArith(op, af, bf)
	}
	switch op {
	case "+":
		switch x := a.(type) {
		case string:
			if y, ok := b.(string); ok {
				if len(x)+len(y) > maxBytes {
					return nil, fmt.Errorf("string over %d bytes", maxBytes)
				}
				return x + y, nil
			}
			return nil, fmt.Errorf("can only concatenate str (not \"%s\") to str", typeName(b))
		case List:
			if y, ok := b.(List); ok {
				if len(x)+len(y) > maxBytes {
					return nil, fmt.Errorf("list over %d items", maxBytes)
				}
				return append(append(List{}, x...), y...), nil
			}
		case Tuple:
			if y, ok := b.(Tuple); ok {
				return append(append(Tuple{}, x...), y...), nil
			}
		}
	case "*":
		seq, n := a, b
		if _, ok := intLike(a); ok {
			seq, n = b, a
		}
		k, ok := intLike(n)
		if !ok {
			break
		}
		k = max(k, 0)
		switch x := seq.(type) {
		case string:
			if int64(len(x))*k > int64(maxBytes) {
				return nil, fmt.Errorf("string over %d bytes", maxBytes)
			}
			return strings.Repeat(x, int(k)), nil
		case List:
			if int64(len(x))*k > int64(maxBytes) {
				return nil, fmt.Errorf("list over %d items", maxBytes)
			}
			var out List
			for range k {
				out = append(out, x...)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(a), typeName(b))
}

func intLike(v Value) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		return boolInt(x), true
	}
	return 0, false
}

var errOverflow = errors.New("integer overflow (integers are 64-bit here)")

func intArith(op string, a, b int64) (Value, error) {
	switch op {
	case "+":
		c := a + b
		if (c > a) != (b > 0) {
			return nil, errOverflow
		}
		return c, nil
	case "-":
		c := a - b
		if (c < a) != (b > 0) {
			return nil, errOverflow
		}
		return c, nil
	case "*":
		if a != 0 && b != 0 {
			c := a * b
			if c/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
				return nil, errOverflow
			}
			return c, nil
		}
		return int64(0), nil
	case "/":
		if b == 0 {
			return nil, errors.New("division by zero")
		}
		return float64(a) / float64(b), nil
	case "//", "%":
		if b == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) {
			q--
			m += b
		}
		if op == "//" {
			return q, nil
		}
		return m, nil
	case "**":
		if b < 0 {
			return math.Pow(float64(a), float64(b)), nil
		}
		out := int64(1)
		for range b {
			next := out * a
			if a != 0 && next/a != out {
				return nil, errOverflow
			}
			out = next
		}
		return out, nil
	}
	return nil, fmt.Errorf("bad operator %s", op)
}

func floatArith(op string, a, b float64) (Value, error) {
	switch op {
	case "+":
		return a + b, nil
	case "-":
		return a - b, nil
	case "*":
		return a * b, nil
	case "/":
		if b == 0 {
			return nil, errors.New("float division by zero")
		}
		return a / b, nil
	case "//":
		if b == 0 {
			return nil, errors.New("float floor division by zero")
		}
		return math.Floor(a / b), nil
	case "%":
		if b == 0 {
			return nil, errors.New("float modulo")
		}
		m := math.Mod(a, b)
		if m != 0 && (m < 0) != (b < 0) {
			m += b
		}
		return m, nil
	case "**":
		return math.Pow(a, b), nil
	}
	return nil, fmt.Errorf("bad operator %s", op)
}

func (r *renderer) evalCompare(e *compareExpr, s *scope) (Value, error) {
	l, err := r.eval(e.first, s)
	if err != nil {
		return nil, err
	}
	for i, op := range e.ops {
		rv, err := r.eval(e.rest[i], s)
		if err != nil {
			return nil, err
		}
		ok, err := compareOp(op, l, rv)
		if err != nil {
			return nil, &Error{Pos: e.p, Msg: err.Error()}
		}
		if !ok {
			return false, nil
		}
		l = rv
	}
	return true, nil
}

func compareOp(op string, a, b Value) (bool, error) {
	switch op {
	case "==":
		return equal(a, b), nil
	case "!=":
		return !equal(a, b), nil
	case "in":
		return contained(a, b)
	case "not in":
		in, err := contained(a, b)
		return !in, err
	}
	c, err := compare(a, b)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	}
	return c >= 0, nil
}

// contained is Python's "a in b".
func contained(a, b Value) (bool, error) {
	switch x := b.(type) {
	case string:
		s, ok := a.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(a))
		}
		return strings.Contains(x, s), nil
	case List:
		return inSeq(a, x), nil
	case Tuple:
		return inSeq(a, x), nil
	case *Dict:
		_, ok := x.Get(a)
		return ok, nil
	case Undefined:
		return false, fmt.Errorf("'%s' is undefined", x.Name)
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(b))
}

func inSeq(a Value, items []Value) bool {
	for _, it := range items {
		if equal(a, it) {
			return true
		}
	}
	return false
}

func (l *loopState) attr(p pos, name string) (Value, error) {
	i, n := l.index0, l.length
	switch name {
	case "index":
		return int64(i + 1), nil
	case "index0":
		return int64(i), nil
	case "revindex":
		return int64(n - i), nil
	case "revindex0":
		return int64(n - i - 1), nil
	case "first":
		return i == 0, nil
	case "last":
		return i == n-1, nil
	case "length":
		return int64(n), nil
	case "depth":
		return int64(1), nil
	case "depth0":
		return int64(0), nil
	case "previtem":
		if i == 0 {
			return Undefined{Name: "previtem"}, nil
		}
		return l.items[i-1], nil
	case "nextitem":
		if i == n-1 {
			return Undefined{Name: "nextitem"}, nil
		}
		return l.items[i+1], nil
	case "cycle":
		return fn(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) == 0 {
				return nil, errors.New("no items for cycling given")
			}
			return args[i%len(args)], nil
		}), nil
	}
	return Undefined{Name: name}, nil
}
