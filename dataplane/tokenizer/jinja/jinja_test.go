package jinja

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testdata vectors come from Python Jinja2 configured as transformers configures it (see
// ../testdata/gen/render.py), not from this package.
type caseFile struct {
	Generator string `json:"generator"`
	Now       string `json:"now"`
	Cases     []struct {
		Template string          `json:"template"`
		Context  json.RawMessage `json:"context"`
		Out      *string         `json:"out"`
		Error    string          `json:"error"`
	} `json:"cases"`
}

// deviations are the vectors where this interpreter knowingly differs from Python.
var deviations = map[string]string{
	"{{ 10000000000 * 10000000000 }}": "integers are 64-bit: overflow is an error, not a big integer",
	"{{ '%s'|format(1) }}":            "the format filter (Python %-formatting) is not implemented",
}

func fixedNow(t *testing.T, s string) func() time.Time {
	now, err := time.Parse("2006-01-02T15:04:05", s)
	require.NoError(t, err)
	return func() time.Time { return now }
}

func TestConformance(t *testing.T) {
	b, err := os.ReadFile("../testdata/vectors/jinja.json")
	require.NoError(t, err)
	var f caseFile
	require.NoError(t, json.Unmarshal(b, &f))
	t.Logf("%d cases from %s", len(f.Cases), f.Generator)
	env := Env{Now: fixedNow(t, f.Now)}
	for i, c := range f.Cases {
		if why, ok := deviations[c.Template]; ok {
			t.Logf("case %d %q: known deviation: %s", i, c.Template, why)
			continue
		}
		vars := contextVars(t, c.Context)
		got, err := render(c.Template, vars, env)
		if c.Out == nil {
			if err == nil {
				t.Errorf("case %d %q: want an error like %q, got output %q", i, c.Template, c.Error, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("case %d %q: %v (want %q)", i, c.Template, err, *c.Out)
			continue
		}
		if got != *c.Out {
			t.Errorf("case %d %q:\n got  %q\n want %q", i, c.Template, got, *c.Out)
		}
	}
}

func render(src string, vars map[string]Value, env Env) (string, error) {
	tpl, err := Parse(src)
	if err != nil {
		return "", err
	}
	return tpl.Render(vars, env)
}

func contextVars(t *testing.T, raw json.RawMessage) map[string]Value {
	v, err := ParseJSON(raw)
	require.NoError(t, err)
	d := v.(*Dict)
	vars := map[string]Value{}
	for i, k := range d.keys {
		vars[k.(string)] = d.vals[i]
	}
	return vars
}
