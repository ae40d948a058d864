package main

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The house rules of DESIGN.md, checked on the packages' own imports (tests aside): imports go
// down (cmd → bench → dataplane/... → transfer, features, cuda → router/..., native); the
// index is standard library only; fasthttp stays at the edges.
func TestImportsGoDown(t *testing.T) {
	const module = "dataplane/"
	// may lists, per area, the areas of ours a package there may import (its own included).
	routers := []string{"router", "router/index", "router/kvevents", "router/httpapi"}
	below := func(areas ...string) []string { return append(areas, append(routers, "native")...) }
	may := map[string][]string{
		"cmd":             below("cmd", "bench", "dataplane", "transfer", "features", "cuda"),
		"bench":           below("bench", "dataplane", "transfer", "features", "cuda"),
		"dataplane":       below("dataplane", "transfer", "features", "cuda"),
		"transfer":        below("transfer", "features"),
		"features":        {"features", "native"},
		"cuda":            {"cuda", "native"},
		"router/httpapi":  {"router/httpapi", "router/kvevents", "router", "router/index", "native"},
		"router/kvevents": {"router/kvevents", "router", "router/index", "native"},
		"router":          {"router", "router/index", "native"},
		"router/index":    {"router/index"},
		"native":          {"native"},
	}
	areaOf := func(pkg string) string {
		rel := strings.TrimPrefix(pkg, module)
		for _, a := range []string{"router/httpapi", "router/kvevents", "router/index"} {
			if rel == a || strings.HasPrefix(rel, a+"/") {
				return a
			}
		}
		first, _, _ := strings.Cut(rel, "/")
		return first
	}
	fasthttpUsers := []string{"dataplane/cmd/dataplane", "dataplane/dataplane/api", "dataplane/router/httpapi"}

	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	checked := 0
	require.NoError(t, filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); name == "testdata" || name == "build" || (strings.HasPrefix(name, ".") && dir != root) {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(dir, 0)
		if err != nil { // no Go files here
			return nil
		}
		rel, _ := filepath.Rel(root, dir)
		pkg := module + filepath.ToSlash(rel)
		area := areaOf(pkg)
		allowed, known := may[area]
		require.True(t, known, "%s is in no area of DESIGN.md's layout", pkg)
		for _, imp := range p.Imports {
			switch {
			case strings.HasPrefix(imp, module):
				require.Contains(t, allowed, areaOf(imp), "%s imports %s: imports only go down", pkg, imp)
			case area == "router/index":
				require.NotContains(t, strings.SplitN(imp, "/", 2)[0], ".", "router/index imports only the standard library, not %s", imp)
			case strings.HasPrefix(imp, "github.com/valyala/fasthttp"):
				require.True(t, slices.Contains(fasthttpUsers, pkg), "%s imports fasthttp: only %v may", pkg, fasthttpUsers)
			}
		}
		checked++
		return nil
	}))
	require.Greater(t, checked, 30, "the walk found the packages")
	_, err = os.Stat(filepath.Join(root, "router", "index"))
	require.NoError(t, err)
}
