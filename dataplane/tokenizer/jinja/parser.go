package jinja

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ---- expression tokens ----

type tokKind uint8

const (
	tEOF tokKind = iota
	tName
	tString
	tInt
	tFloat
	tOp
)

type token struct {
	kind tokKind
	text string // names, operators; the unescaped value of strings
	pos  pos
}

// operators, longest first so "**" wins over "*".
var operators = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
	"(", ")", "[", "]", "{", "}", ".", ",", ":", "|", "="}

func tokenize(src string, at pos) ([]token, error) {
	var toks []token
	line, col := at.line, at.col+2
	p := func() pos { return pos{line: line, col: col} }
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
			col++
			continue
		case c == '\n':
			i++
			line, col = line+1, 1
			continue
		case c == '\'' || c == '"':
			s, n, err := unquote(src[i:])
			if err != nil {
				return nil, &Error{Pos: p(), Msg: err.Error()}
			}
			toks = append(toks, token{kind: tString, text: s, pos: p()})
			col += utf8.RuneCountInString(src[i : i+n])
			i += n
			continue
		case c >= '0' && c <= '9':
			j := i
			isFloat := false
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
				j++
			}
			if j+1 < len(src) && src[j] == '.' && src[j+1] >= '0' && src[j+1] <= '9' {
				isFloat = true
				j++
				for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
					j++
				}
			}
			if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < len(src) && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if k < len(src) && src[k] >= '0' && src[k] <= '9' {
					isFloat = true
					for j = k; j < len(src) && src[j] >= '0' && src[j] <= '9'; j++ {
					}
				}
			}
			kind := tInt
			if isFloat {
				kind = tFloat
			}
			toks = append(toks, token{kind: kind, text: strings.ReplaceAll(src[i:j], "_", ""), pos: p()})
			col += j - i
			i = j
			continue
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			toks = append(toks, token{kind: tName, text: src[i:j], pos: p()})
			col += j - i
			i = j
			continue
		}
		matched := false
		for _, op := range operators {
			if strings.HasPrefix(src[i:], op) {
				toks = append(toks, token{kind: tOp, text: op, pos: p()})
				i += len(op)
				col += len(op)
				matched = true
				break
			}
		}
		if !matched {
			r, _ := utf8.DecodeRuneInString(src[i:])
			return nil, &Error{Pos: p(), Msg: fmt.Sprintf("unexpected character %q", r)}
		}
	}
	return append(toks, token{kind: tEOF, pos: p()}), nil
}

// unquote reads a Python string literal at the start of s: it returns the value and the
// literal's length.
func unquote(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c != '\\':
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0':
			b.WriteByte(0)
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("truncated \\%c escape", e)
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil || v > utf8.MaxRune {
				return "", 0, fmt.Errorf("bad \\%c escape", e)
			}
			b.WriteRune(rune(v))
			i += n
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

// ---- AST ----

type expr interface{ at() pos }

type (
	constExpr struct {
		p pos
		v Value
	}
	nameExpr struct {
		p    pos
		name string
	}
	listExpr struct {
		p     pos
		items []expr
		tuple bool
	}
	dictExpr struct {
		p          pos
		keys, vals []expr
	}
	attrExpr struct {
		p    pos
		obj  expr
		name string
	}
	itemExpr struct {
		p        pos
		obj, key expr
	}
	sliceExpr struct {
		p                 pos
		obj, lo, hi, step expr // nil when omitted
	}
	callExpr struct {
		p      pos
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		p      pos
		x      expr // nil inside a filter block
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		p      pos
		x      expr
		name   string
		args   []expr
		negate bool
	}
	unaryExpr struct {
		p  pos
		op string
		x  expr
	}
	binaryExpr struct {
		p    pos
		op   string
		l, r expr
	}
	compareExpr struct {
		p     pos
		first expr
		ops   []string
		rest  []expr
	}
	condExpr struct {
		p             pos
		cond, yes, no expr // no may be nil
	}
)

type kwarg struct {
	name string
	v    expr
}

func (e *constExpr) at() pos   { return e.p }
func (e *nameExpr) at() pos    { return e.p }
func (e *listExpr) at() pos    { return e.p }
func (e *dictExpr) at() pos    { return e.p }
func (e *attrExpr) at() pos    { return e.p }
func (e *itemExpr) at() pos    { return e.p }
func (e *sliceExpr) at() pos   { return e.p }
func (e *callExpr) at() pos    { return e.p }
func (e *filterExpr) at() pos  { return e.p }
func (e *testExpr) at() pos    { return e.p }
func (e *unaryExpr) at() pos   { return e.p }
func (e *binaryExpr) at() pos  { return e.p }
func (e *compareExpr) at() pos { return e.p }
func (e *condExpr) at() pos    { return e.p }

type node interface{}

type (
	textNode   struct{ s string }
	outputNode struct{ x expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		p       pos
		targets []string
		iter    expr
		filter  expr
		body    []node
		els     []node
	}
	setNode struct {
		p       pos
		targets []string // one name, several for unpacking
		attr    string   // set ns.attr = ...: targets[0] is ns
		x       expr
		body    []node // block set
	}
	macroNode struct {
		p        pos
		name     string
		params   []string
		defaults []expr // per param, nil when required
		body     []node
	}
	loopCtlNode struct {
		p       pos
		isBreak bool
	}
)

// ---- parser ----

type parser struct {
	toks  []token
	i     int
	depth int
}

// maxNesting bounds expression and block nesting so hostile templates cannot exhaust the stack.
const maxNesting = 200

func (p *parser) peek() token { return p.toks[p.i] }
func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.text == op
}

func (p *parser) isName(name string) bool {
	t := p.peek()
	return t.kind == tName && t.text == name
}

func (p *parser) errf(format string, args ...any) error {
	return &Error{Pos: p.peek().pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) expectOp(op string) error {
	if !p.isOp(op) {
		return p.errf("expected %q, got %s", op, describe(p.peek()))
	}
	p.next()
	return nil
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of tag"
	case tString:
		return strconv.Quote(t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxNesting {
		return p.errf("nested more than %d deep", maxNesting)
	}
	return nil
}

// parseExpr: a conditional expression (the lowest precedence).
func (p *parser) parseExpr() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	x, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		at := p.next().pos
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var no expr
		if p.isName("else") {
			p.next()
			if no, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		x = &condExpr{p: at, cond: cond, yes: x, no: no}
	}
	return x, nil
}

func (p *parser) parseOr() (expr, error) {
	x, err := p.parseAnd()
	for err == nil && p.isName("or") {
		at := p.next().pos
		var r expr
		if r, err = p.parseAnd(); err == nil {
			x = &binaryExpr{p: at, op: "or", l: x, r: r}
		}
	}
	return x, err
}

func (p *parser) parseAnd() (expr, error) {
	x, err := p.parseNot()
	for err == nil && p.isName("and") {
		at := p.next().pos
		var r expr
		if r, err = p.parseNot(); err == nil {
			x = &binaryExpr{p: at, op: "and", l: x, r: r}
		}
	}
	return x, err
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		at := p.next().pos
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{p: at, op: "not", x: x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	x, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	c := &compareExpr{p: x.at(), first: x}
	for {
		var op string
		t := p.peek()
		switch {
		case t.kind == tOp && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">="):
			op = t.text
			p.next()
		case p.isName("in"):
			op = "in"
			p.next()
		case p.isName("not") && p.i+1 < len(p.toks) && p.toks[p.i+1].kind == tName && p.toks[p.i+1].text == "in":
			op = "not in"
			p.next()
			p.next()
		}
		if op == "" {
			break
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, r)
	}
	if len(c.ops) == 0 {
		return x, nil
	}
	return c, nil
}

func (p *parser) parseBinary(ops []string, sub func() (expr, error)) (expr, error) {
	x, err := sub()
	for err == nil {
		t := p.peek()
		if t.kind != tOp || !contains(ops, t.text) {
			break
		}
		p.next()
		var r expr
		if r, err = sub(); err == nil {
			x = &binaryExpr{p: t.pos, op: t.text, l: x, r: r}
		}
	}
	return x, err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (p *parser) parseMath1() (expr, error) {
	return p.parseBinary([]string{"+", "-"}, p.parseConcat)
}

func (p *parser) parseConcat() (expr, error) {
	return p.parseBinary([]string{"~"}, p.parseMath2)
}

func (p *parser) parseMath2() (expr, error) {
	return p.parseBinary([]string{"*", "/", "//", "%"}, p.parsePow)
}

func (p *parser) parsePow() (expr, error) {
	return p.parseBinary([]string{"**"}, func() (expr, error) { return p.parseUnary(true) })
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	var x expr
	var err error
	if p.isOp("-") || p.isOp("+") {
		t := p.next()
		if x, err = p.parseUnary(false); err != nil {
			return nil, err
		}
		x = &unaryExpr{p: t.pos, op: t.text, x: x}
	} else {
		if x, err = p.parsePrimary(); err != nil {
			return nil, err
		}
		if x, err = p.parsePostfix(x); err != nil {
			return nil, err
		}
	}
	if withFilter {
		return p.parseFilterTest(x)
	}
	return x, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tString:
		s := t.text
		for p.peek().kind == tString { // adjacent literals concatenate
			s += p.next().text
		}
		return &constExpr{p: t.pos, v: s}, nil
	case tInt:
		v, err := strconv.ParseInt(t.text, 10, 64)
		if err != nil {
			return nil, &Error{Pos: t.pos, Msg: "integer " + t.text + " is out of range"}
		}
		return &constExpr{p: t.pos, v: v}, nil
	case tFloat:
		v, err := strconv.ParseFloat(t.text, 64)
		if err != nil {
			return nil, &Error{Pos: t.pos, Msg: "bad number " + t.text}
		}
		return &constExpr{p: t.pos, v: v}, nil
	case tName:
		switch t.text {
		case "true", "True":
			return &constExpr{p: t.pos, v: true}, nil
		case "false", "False":
			return &constExpr{p: t.pos, v: false}, nil
		case "none", "None":
			return &constExpr{p: t.pos, v: nil}, nil
		}
		return &nameExpr{p: t.pos, name: t.text}, nil
	case tOp:
		switch t.text {
		case "(":
			if p.isOp(")") {
				p.next()
				return &listExpr{p: t.pos, tuple: true}, nil
			}
			x, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				items := []expr{x}
				for p.isOp(",") {
					p.next()
					if p.isOp(")") {
						break
					}
					e, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, e)
				}
				x = &listExpr{p: t.pos, items: items, tuple: true}
			}
			return x, p.expectOp(")")
		case "[":
			items, err := p.parseList("]")
			return &listExpr{p: t.pos, items: items}, err
		case "{":
			d := &dictExpr{p: t.pos}
			for !p.isOp("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return d, p.expectOp("}")
		}
	}
	return nil, &Error{Pos: t.pos, Msg: "expected an expression, got " + describe(t)}
}

// parseList reads comma-separated expressions up to the closer.
func (p *parser) parseList(closer string) ([]expr, error) {
	var items []expr
	for !p.isOp(closer) {
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return items, p.expectOp(closer)
}

func (p *parser) parsePostfix(x expr) (expr, error) {
	for {
		t := p.peek()
		switch {
		case t.kind == tOp && t.text == ".":
			p.next()
			n := p.next()
			if n.kind != tName && n.kind != tInt {
				return nil, &Error{Pos: n.pos, Msg: "expected an attribute name after '.'"}
			}
			if n.kind == tInt {
				v, _ := strconv.ParseInt(n.text, 10, 64)
				x = &itemExpr{p: n.pos, obj: x, key: &constExpr{p: n.pos, v: v}}
			} else {
				x = &attrExpr{p: n.pos, obj: x, name: n.text}
			}
		case t.kind == tOp && t.text == "[":
			p.next()
			s, err := p.parseSubscript(x, t.pos)
			if err != nil {
				return nil, err
			}
			x = s
		case t.kind == tOp && t.text == "(":
			p.next()
			c := &callExpr{p: t.pos, fn: x}
			if err := p.parseArgs(&c.args, &c.kwargs); err != nil {
				return nil, err
			}
			x = c
		default:
			return x, nil
		}
	}
}

func (p *parser) parseSubscript(obj expr, at pos) (expr, error) {
	var parts [3]expr
	k, isSlice := 0, false
	for {
		if p.isOp(":") {
			p.next()
			isSlice = true
			k++
			if k > 2 {
				return nil, p.errf("too many ':' in a slice")
			}
			continue
		}
		if p.isOp("]") {
			p.next()
			break
		}
		if parts[k] != nil {
			return nil, p.errf("expected ']'")
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		parts[k] = e
	}
	if !isSlice {
		if parts[0] == nil {
			return nil, &Error{Pos: at, Msg: "empty subscript"}
		}
		return &itemExpr{p: at, obj: obj, key: parts[0]}, nil
	}
	return &sliceExpr{p: at, obj: obj, lo: parts[0], hi: parts[1], step: parts[2]}, nil
}

// parseArgs reads call arguments after "(" up to ")".
func (p *parser) parseArgs(args *[]expr, kwargs *[]kwarg) error {
	for !p.isOp(")") {
		t := p.peek()
		if t.kind == tName && p.i+1 < len(p.toks) && p.toks[p.i+1].kind == tOp && p.toks[p.i+1].text == "=" {
			p.next()
			p.next()
			v, err := p.parseExpr()
			if err != nil {
				return err
			}
			*kwargs = append(*kwargs, kwarg{name: t.text, v: v})
		} else {
			if len(*kwargs) > 0 {
				return p.errf("positional argument after keyword argument")
			}
			v, err := p.parseExpr()
			if err != nil {
				return err
			}
			*args = append(*args, v)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return p.expectOp(")")
}

// parseFilterTest applies "| filter" and "is test" chains.
func (p *parser) parseFilterTest(x expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			n := p.next()
			if n.kind != tName {
				return nil, &Error{Pos: n.pos, Msg: "expected a filter name after '|'"}
			}
			f := &filterExpr{p: n.pos, x: x, name: n.text}
			if p.isOp("(") {
				p.next()
				if err := p.parseArgs(&f.args, &f.kwargs); err != nil {
					return nil, err
				}
			}
			x = f
		case p.isName("is"):
			p.next()
			t := &testExpr{x: x}
			if p.isName("not") {
				p.next()
				t.negate = true
			}
			n := p.next()
			if n.kind != tName && !(n.kind == tOp && contains([]string{"==", "!=", "<", "<=", ">", ">="}, n.text)) {
				return nil, &Error{Pos: n.pos, Msg: "expected a test name after 'is'"}
			}
			t.p, t.name = n.pos, n.text
			if n.kind == tName && (n.text == "none" || n.text == "true" || n.text == "false") {
				t.name = strings.ToLower(n.text)
			}
			nt := p.peek()
			switch {
			case p.isOp("("):
				p.next()
				var kw []kwarg
				if err := p.parseArgs(&t.args, &kw); err != nil {
					return nil, err
				}
			case nt.kind == tString || nt.kind == tInt || nt.kind == tFloat || (nt.kind == tOp && (nt.text == "[" || nt.text == "{")) ||
				(nt.kind == tName && !contains([]string{"else", "or", "and", "if", "is", "not", "in"}, nt.text)):
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				if a, err = p.parsePostfix(a); err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			x = t
		default:
			return x, nil
		}
	}
}
