package jinja

import (
	"testing"
)

// FuzzTemplate: any template parses or fails with an *Error, and renders within its limits or
// fails with an *Error; never a panic, never a hang.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"{% for m in messages %}{{ m.role }}: {{ m.content | trim }}{% endfor %}",
		"{% set ns = namespace(n=0) %}{% for x in range(3) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
		"{{ 'a' ~ [1, 2]|tojson ~ {'k': none}|tojson(indent=2) }}",
		"{% macro m(a, b=2) %}{{ a * b }}{% endmacro %}{{ m(3) }}{{ m('x', 4) }}",
		"{%- if x is defined and x[::-1].startswith('a') -%}yes{%- else -%}{{ raise_exception('no') }}{%- endif %}",
		"{{ (((((1))))) }}{{ -1 ** 2 }}{{ 7 // 0 }}",
		"{% for a, b in d.items() if a != 'x' %}{{ loop.index }}{{ a }}{% else %}none{% endfor %}",
	} {
		f.Add(s)
	}
	msgs, _ := ParseJSON([]byte(`[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "x"}]}]`))
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("parse error of type %T: %v", err, err)
			}
			return
		}
		d := NewDict()
		_ = d.Set("x", "abc")
		_, err = tpl.Render(map[string]Value{"messages": msgs, "d": d, "x": "ab"}, Env{Limits: Limits{MaxOutputBytes: 1 << 16, MaxSteps: 100_000}})
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("render error of type %T: %v", err, err)
			}
		}
	})
}
