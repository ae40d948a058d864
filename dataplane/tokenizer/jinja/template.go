// Package jinja is a sandboxed interpreter for the subset of Jinja2 that Hugging Face chat
// templates use: text with {{ }} / {% %} / {# #}, whitespace control, the trim_blocks and
// lstrip_blocks settings of transformers' apply_chat_template; if/elif/else, for (with loop.*,
// else, an if filter, tuple unpacking), break/continue, set (names, namespace attributes,
// blocks), macros, {% generation %}, {% raw %}; Python-like expressions, filters, tests and
// str/list/dict methods (see builtins.go). Anything else fails at parse time with an *Error
// naming the construct and its line and column. Rendering is bounded by Limits.
package jinja

import (
	"fmt"
	"strings"
)

// Error is a parse or render error with its place in the template.
type Error struct {
	Pos pos
	Msg string
	// Raised is set when the template called raise_exception: Msg is its message.
	Raised bool
}

func (e *Error) Error() string {
	if e.Pos.line == 0 {
		return "jinja: " + e.Msg
	}
	return fmt.Sprintf("jinja: line %d col %d: %s", e.Pos.line, e.Pos.col, e.Msg)
}

// Template is a parsed template, safe for concurrent Render calls.
type Template struct {
	body []node
}

// Parse parses a template.
func Parse(src string) (*Template, error) {
	segs, err := split(src)
	if err != nil {
		return nil, err
	}
	b := &builder{segs: segs}
	body, end, err := b.parseBody(nil)
	if err != nil {
		return nil, err
	}
	if end != nil {
		return nil, &Error{Pos: end.pos, Msg: fmt.Sprintf("unexpected {%% %s %%}", end.name)}
	}
	return &Template{body: body}, nil
}

// builder turns segments into the statement tree.
type builder struct {
	segs  []segment
	i     int
	depth int
}

// endTag is the statement that ended a body.
type endTag struct {
	name string
	p    *parser
	pos  pos
}

// unsupported statements get a clear error rather than "unknown tag".
var unsupported = map[string]string{
	"extends": "template inheritance", "block": "template inheritance", "include": "includes",
	"import": "imports", "from": "imports", "call": "call blocks", "filter": "filter blocks",
	"with": "with blocks", "autoescape": "autoescape blocks", "do": "the do extension", "trans": "i18n",
}

// parseBody reads nodes until one of the tags in until (returned) or the end of the template.
func (b *builder) parseBody(until []string) ([]node, *endTag, error) {
	b.depth++
	defer func() { b.depth-- }()
	if b.depth > maxNesting {
		return nil, nil, &Error{Msg: fmt.Sprintf("blocks nested more than %d deep", maxNesting)}
	}
	var nodes []node
	for b.i < len(b.segs) {
		s := b.segs[b.i]
		b.i++
		switch s.kind {
		case segText:
			nodes = append(nodes, &textNode{s: s.text})
			continue
		case segExpr:
			p, err := newParser(s)
			if err != nil {
				return nil, nil, err
			}
			x, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			if err := p.end(); err != nil {
				return nil, nil, err
			}
			nodes = append(nodes, &outputNode{x: x})
			continue
		}
		p, err := newParser(s)
		if err != nil {
			return nil, nil, err
		}
		t := p.next()
		if t.kind != tName {
			return nil, nil, &Error{Pos: s.pos, Msg: "expected a statement name"}
		}
		if contains(until, t.text) {
			return nodes, &endTag{name: t.text, p: p, pos: s.pos}, nil
		}
		n, err := b.parseStmt(t.text, p, s.pos)
		if err != nil {
			return nil, nil, err
		}
		if n != nil {
			nodes = append(nodes, n)
		}
	}
	if until != nil {
		return nil, nil, &Error{Msg: fmt.Sprintf("unexpected end of template, expected {%% %s %%}", strings.Join(until, " %} or {% "))}
	}
	return nodes, nil, nil
}

func newParser(s segment) (*parser, error) {
	toks, err := tokenize(s.text, s.pos)
	if err != nil {
		return nil, err
	}
	return &parser{toks: toks}, nil
}

func (p *parser) end() error {
	if t := p.peek(); t.kind != tEOF {
		return &Error{Pos: t.pos, Msg: "unexpected " + describe(t)}
	}
	return nil
}

func (b *builder) parseStmt(name string, p *parser, at pos) (node, error) {
	switch name {
	case "if":
		return b.parseIf(p)
	case "for":
		return b.parseFor(p, at)
	case "set":
		return b.parseSet(p, at)
	case "macro":
		return b.parseMacro(p, at)
	case "break", "continue":
		return &loopCtlNode{p: at, isBreak: name == "break"}, p.end()
	case "generation":
		if err := p.end(); err != nil {
			return nil, err
		}
		body, _, err := b.parseBody([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&constExpr{v: true}}, bodies: [][]node{body}}, nil
	}
	if what, ok := unsupported[name]; ok {
		return nil, &Error{Pos: at, Msg: fmt.Sprintf("{%% %s %%}: %s are not supported", name, what)}
	}
	return nil, &Error{Pos: at, Msg: fmt.Sprintf("unknown statement {%% %s %%}", name)}
}

func (b *builder) parseIf(p *parser) (node, error) {
	n := &ifNode{}
	for {
		cond, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if err := p.end(); err != nil {
			return nil, err
		}
		body, end, err := b.parseBody([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		n.conds, n.bodies = append(n.conds, cond), append(n.bodies, body)
		switch end.name {
		case "elif":
			p = end.p
			continue
		case "else":
			if err := end.p.end(); err != nil {
				return nil, err
			}
			els, end2, err := b.parseBody([]string{"endif"})
			if err != nil {
				return nil, err
			}
			n.els = els
			return n, end2.p.end()
		}
		return n, end.p.end()
	}
}

func (b *builder) parseFor(p *parser, at pos) (node, error) {
	n := &forNode{p: at}
	for {
		t := p.next()
		if t.kind != tName {
			return nil, &Error{Pos: t.pos, Msg: "expected a loop variable name"}
		}
		n.targets = append(n.targets, t.text)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if !p.isName("in") {
		return nil, p.errf("expected 'in' in for loop")
	}
	p.next()
	var err error
	// The iterable is parsed without conditional expressions: a trailing "if" is the filter.
	if n.iter, err = p.parseOr(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		if n.filter, err = p.parseExpr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errf("recursive loops are not supported")
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, end, err := b.parseBody([]string{"else", "endfor"})
	if err != nil {
		return nil, err
	}
	n.body = body
	if end.name == "else" {
		if n.els, end, err = b.parseBody([]string{"endfor"}); err != nil {
			return nil, err
		}
	}
	return n, end.p.end()
}

func (b *builder) parseSet(p *parser, at pos) (node, error) {
	n := &setNode{p: at}
	for {
		t := p.next()
		if t.kind != tName {
			return nil, &Error{Pos: t.pos, Msg: "expected a name to set"}
		}
		n.targets = append(n.targets, t.text)
		if p.isOp(".") && len(n.targets) == 1 {
			p.next()
			a := p.next()
			if a.kind != tName {
				return nil, &Error{Pos: a.pos, Msg: "expected an attribute name"}
			}
			n.attr = a.text
			break
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if !p.isOp("=") {
		if p.peek().kind != tEOF || len(n.targets) != 1 || n.attr != "" {
			return nil, p.errf("expected '=' in set")
		}
		body, _, err := b.parseBody([]string{"endset"})
		if err != nil {
			return nil, err
		}
		n.body = body
		return n, nil
	}
	p.next()
	x, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if p.isOp(",") { // set a, b = 1, 2
		items := []expr{x}
		for p.isOp(",") {
			p.next()
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			items = append(items, e)
		}
		x = &listExpr{p: x.at(), items: items, tuple: true}
	}
	n.x = x
	return n, p.end()
}

func (b *builder) parseMacro(p *parser, at pos) (node, error) {
	t := p.next()
	if t.kind != tName {
		return nil, &Error{Pos: t.pos, Msg: "expected a macro name"}
	}
	n := &macroNode{p: at, name: t.text}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		a := p.next()
		if a.kind != tName {
			return nil, &Error{Pos: a.pos, Msg: "expected a parameter name"}
		}
		var def expr
		if p.isOp("=") {
			p.next()
			var err error
			if def, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params, n.defaults = append(n.params, a.text), append(n.defaults, def)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, _, err := b.parseBody([]string{"endmacro"})
	if err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

// LoopsOver reports whether some for loop iterates over an expression that reads an attribute
// or item called field (e.g. "for c in message['content']" or "message.content | selectattr"):
// how vLLM tells templates that take content as a list of parts from those that take a string.
func (t *Template) LoopsOver(field string) bool {
	return loopsOver(t.body, field)
}

func loopsOver(nodes []node, field string) bool {
	for _, n := range nodes {
		switch n := n.(type) {
		case *forNode:
			if readsField(n.iter, field) || loopsOver(n.body, field) || loopsOver(n.els, field) {
				return true
			}
		case *ifNode:
			for _, b := range n.bodies {
				if loopsOver(b, field) {
					return true
				}
			}
			if loopsOver(n.els, field) {
				return true
			}
		case *macroNode:
			if loopsOver(n.body, field) {
				return true
			}
		case *setNode:
			if loopsOver(n.body, field) {
				return true
			}
		}
	}
	return false
}

func readsField(e expr, field string) bool {
	switch e := e.(type) {
	case *attrExpr:
		return e.name == field || readsField(e.obj, field)
	case *itemExpr:
		if c, ok := e.key.(*constExpr); ok && c.v == field {
			return true
		}
		return readsField(e.obj, field)
	case *filterExpr:
		return readsField(e.x, field)
	case *sliceExpr:
		return readsField(e.obj, field)
	case *callExpr:
		return readsField(e.fn, field)
	}
	return false
}
