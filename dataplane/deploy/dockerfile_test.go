package deploy

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/stretchr/testify/require"

	"dataplane/cuda"
)

// The Dockerfile cannot be built here (no Docker daemon, no registry): it is checked
// statically. BuildKit's own parser reads it (what `docker build` parses) with the lint rules
// that run at parse time (`docker build --check` runs these and more), and the checks below
// tie it to the Makefile, go.mod, the daemon's settings and the manifests.

// dockerfile is the parsed Dockerfile: its stages in order.
type dockerfile struct {
	stages []stageInfo
}

// stageInfo is what the checks read of one stage.
type stageInfo struct {
	name, base string
	runs       []string // RUN command lines (shell form: the script)
	copies     []*instructions.CopyCommand
	workdir    string
	user       string
	expose     []string
	entrypoint *instructions.ShellDependantCmdLine
	cmd        *instructions.ShellDependantCmdLine
	env        map[string]string
	health     bool
}

func (d dockerfile) stage(name string) stageInfo {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return stageInfo{}
}

// parseDockerfile parses src with BuildKit's parser and instruction parser. Parser warnings
// and lint findings are errors.
func parseDockerfile(src string) (dockerfile, error) {
	res, err := parser.Parse(strings.NewReader(src))
	if err != nil {
		return dockerfile{}, err
	}
	var problems []string
	for _, w := range res.Warnings {
		problems = append(problems, fmt.Sprintf("parser: %s", w.Short))
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		problems = append(problems, fmt.Sprintf("lint %s: %s (line %d)", rule, msg, loc[0].Start.Line))
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		return dockerfile{}, err
	}
	if len(problems) > 0 {
		return dockerfile{}, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	var d dockerfile
	for _, st := range stages {
		s := stageInfo{name: st.Name, base: st.BaseName, env: map[string]string{}}
		for _, c := range st.Commands {
			switch c := c.(type) {
			case *instructions.RunCommand:
				s.runs = append(s.runs, strings.Join(c.CmdLine, " "))
			case *instructions.CopyCommand:
				s.copies = append(s.copies, c)
			case *instructions.WorkdirCommand:
				s.workdir = c.Path
			case *instructions.UserCommand:
				s.user = c.User
			case *instructions.ExposeCommand:
				s.expose = append(s.expose, c.Ports...)
			case *instructions.EntrypointCommand:
				s.entrypoint = &c.ShellDependantCmdLine
			case *instructions.CmdCommand:
				s.cmd = &c.ShellDependantCmdLine
			case *instructions.EnvCommand:
				for _, kv := range c.Env {
					s.env[kv.Key] = kv.Value
				}
			case *instructions.HealthCheckCommand:
				s.health = true
			}
		}
		d.stages = append(d.stages, s)
	}
	return d, nil
}

func loadDockerfile(t testing.TB) dockerfile {
	t.Helper()
	src, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	d, err := parseDockerfile(string(src))
	require.NoError(t, err)
	return d
}

// The stages and their order: the CPU image is the default target (the last stage), the CUDA
// image is `--target cuda`.
func TestDockerfileStages(t *testing.T) {
	d := loadDockerfile(t)
	var names []string
	for _, s := range d.stages {
		names = append(names, s.name)
	}
	require.Equal(t, []string{"build", "cuda-build", "cuda", "runtime"}, names)
}

// Every base image is pinned by a tag (never latest, never a build argument), and the build
// and CPU runtime stages are the same Debian release, so the binary's glibc is the one it runs
// on. The Go image is the go.mod toolchain's minor version.
func TestDockerfileBaseImages(t *testing.T) {
	d := loadDockerfile(t)
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+$`)
	for _, s := range d.stages {
		require.Regexp(t, pinned, s.base, "stage %s: base image pinned by tag", s.name)
		require.NotContains(t, s.base, ":latest", s.name)
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	require.NoError(t, err)
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	require.NotNil(t, goVersion, "go.mod's go line")
	require.Equal(t, "golang:"+string(goVersion[1])+"-bookworm", d.stage("build").base)
	require.Equal(t, "debian:bookworm-slim", d.stage("runtime").base)

	cudaDevel, cudaRuntime := d.stage("cuda-build").base, d.stage("cuda").base
	require.True(t, strings.HasPrefix(cudaDevel, "nvidia/cuda:") && strings.Contains(cudaDevel, "-devel-"), cudaDevel)
	require.Equal(t, strings.Replace(cudaDevel, "-devel-", "-runtime-", 1), cudaRuntime,
		"the plugin runs on the runtime image of the toolkit it was built with")
}

// The binary is built by the Makefile's own build target (so the flags, the ldflags version
// stamp and the output path cannot drift from it), with what its deps-build target needs.
func TestDockerfileBuildMatchesMakefile(t *testing.T) {
	d, m := loadDockerfile(t), loadMakefile(t)
	build := d.stage("build")

	require.Contains(t, m.recipes["build"], `$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dataplane`)
	require.Equal(t, "-X dataplane/dataplane.Version=$(VERSION)", m.vars["LDFLAGS"], "the version stamp make build sets")
	var makeRun string
	for _, r := range build.runs {
		if strings.Contains(r, "make build") {
			makeRun = r
		}
	}
	require.Contains(t, makeRun, `make build VERSION="${VERSION}"`, "the build stage runs make build with the version")

	// deps-build's header check names the Debian package that provides it.
	header := regexp.MustCompile(`need_file,(/usr/include/turbojpeg\.h),([a-z0-9.-]+)\)`)
	var pkg string
	for _, line := range m.recipes["deps-build"] {
		if h := header.FindStringSubmatch(line); h != nil {
			pkg = h[2]
		}
	}
	require.NotEmpty(t, pkg, "deps-build installs TurboJPEG's header")
	require.True(t, slices.ContainsFunc(build.runs, func(r string) bool { return aptInstalls(r, pkg) }),
		"the build stage installs %s, so make build's dependency check installs nothing", pkg)

	bin := m.vars["BIN"]
	require.Equal(t, "bin/dataplane", bin)
	for _, final := range []string{"cuda", "runtime"} {
		src, dst := copyFrom(d.stage(final), "build")
		require.Equal(t, path.Join(build.workdir, bin), src, "%s copies what make build wrote", final)
		require.Equal(t, "/opt/dataplane/dataplane", dst, final)
	}
}

// The plugin is built by the Makefile's cuda recipe (its CMake commands) and lands beside the
// binary, where the daemon looks first (cuda.SearchPath).
func TestDockerfileCUDAPlugin(t *testing.T) {
	d, m := loadDockerfile(t), loadMakefile(t)
	var cmake []string
	for _, line := range m.recipes["cuda"] {
		if strings.HasPrefix(line, "cmake ") {
			cmake = append(cmake, m.expand(line))
		}
	}
	require.Len(t, cmake, 2, "make cuda's configure and build")
	run := strings.Join(d.stage("cuda-build").runs, "\n")
	for _, c := range cmake {
		require.Contains(t, run, c)
	}
	require.True(t, slices.ContainsFunc(d.stage("cuda-build").runs, func(r string) bool { return aptInstalls(r, "cmake") }))

	src, dst := copyFrom(d.stage("cuda"), "cuda-build")
	require.Equal(t, cuda.PluginName, path.Base(src))
	require.Equal(t, path.Join("/opt/dataplane", cuda.PluginName), dst, "beside the binary")
	_, binary := copyFrom(d.stage("cuda"), "build")
	require.Equal(t, path.Dir(binary), path.Dir(dst))
}

// The two images a user runs: a non-root numeric USER (so Kubernetes can check runAsNonRoot),
// `dataplane serve` by default, the API and admin ports of the manifests' configuration
// exposed, the binary on PATH, the libraries and commands it needs at run time, no HEALTHCHECK.
func TestDockerfileRuntimeImages(t *testing.T) {
	d, b := loadDockerfile(t), loadBundle(t)
	cfg, err := b.daemonConfig()
	require.NoError(t, err)
	listen, admin := portOf(t, cfg["listen"]), portOf(t, cfg["admin-listen"])

	needs := map[string][]string{
		"runtime": {"libturbojpeg0", "ffmpeg", "ca-certificates"},
		"cuda":    {"libturbojpeg", "libjpeg-turbo8", "ffmpeg", "ca-certificates"},
	}
	for _, name := range []string{"cuda", "runtime"} {
		s := d.stage(name)
		uid, gid, ok := strings.Cut(s.user, ":")
		require.True(t, ok, "%s: USER uid:gid", name)
		for _, id := range []string{uid, gid} {
			n, err := strconv.Atoi(id)
			require.NoError(t, err, "%s: numeric USER", name)
			require.NotZero(t, n, "%s: not root", name)
		}
		require.NotNil(t, s.entrypoint, name)
		require.False(t, s.entrypoint.PrependShell, "%s: ENTRYPOINT in exec form", name)
		require.Equal(t, []string{"dataplane"}, s.entrypoint.CmdLine, name)
		require.NotNil(t, s.cmd, name)
		require.Equal(t, []string{"serve"}, s.cmd.CmdLine, name)
		require.ElementsMatch(t, []string{strconv.Itoa(listen), strconv.Itoa(admin)}, s.expose, name)
		require.False(t, s.health, "%s: no HEALTHCHECK (the Dockerfile's header says why)", name)
		require.True(t, strings.HasPrefix(s.env["PATH"], "/opt/dataplane:"), "%s: the binary's folder on PATH", name)
		for _, pkg := range needs[name] {
			require.True(t, slices.ContainsFunc(s.runs, func(r string) bool { return aptInstalls(r, pkg) }), "%s installs %s", name, pkg)
		}
	}
}

// .dockerignore keeps history and local outputs out of the context and nothing the build reads.
func TestDockerignore(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", ".dockerignore"))
	require.NoError(t, err)
	var patterns []string
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	for _, p := range []string{".git", "bin", "build"} {
		require.Contains(t, patterns, p)
	}
	entries, err := os.ReadDir(filepath.Join("..", ".."))
	require.NoError(t, err)
	for _, e := range entries {
		name := e.Name()
		if slices.Contains([]string{".git", "bin", "build", ".gpu"}, name) {
			continue
		}
		for _, p := range patterns {
			match, err := filepath.Match(p, name)
			require.NoError(t, err)
			require.False(t, match, "%q must stay in the build context (ignored by %q)", name, p)
		}
	}
}

// The checks above can fail: a Dockerfile that breaks a rule is refused by the parse.
func TestDockerfileParseRefuses(t *testing.T) {
	for name, src := range map[string]string{
		"FROM/AS casing":     "FROM debian:bookworm-slim as runtime\n",
		"stage name casing":  "FROM debian:bookworm-slim AS Runtime\n",
		"MAINTAINER":         "FROM debian:bookworm-slim AS a\nMAINTAINER someone\n",
		"empty continuation": "FROM debian:bookworm-slim AS a\nRUN true \\\n\n  && true\n",
		"unknown flag":       "FROM debian:bookworm-slim AS a\nCOPY --frm=b x y\n",
	} {
		_, err := parseDockerfile(src)
		require.Error(t, err, name)
	}
}

// aptInstalls reports whether a RUN script installs pkg with apt-get.
func aptInstalls(run, pkg string) bool {
	_, after, ok := strings.Cut(run, "apt-get install")
	if !ok {
		return false
	}
	line, _, _ := strings.Cut(after, "&&")
	return slices.Contains(strings.Fields(line), pkg)
}

// copyFrom is the source and destination of the stage's COPY --from=from.
func copyFrom(s stageInfo, from string) (string, string) {
	for _, c := range s.copies {
		if c.From == from && len(c.SourcePaths) == 1 {
			return c.SourcePaths[0], c.DestPath
		}
	}
	return "", ""
}

// portOf is the port of a HOST:PORT setting.
func portOf(t testing.TB, hostPort string) int {
	t.Helper()
	_, p, ok := strings.Cut(hostPort, ":")
	require.True(t, ok, "HOST:PORT %q", hostPort)
	n, err := strconv.Atoi(p)
	require.NoError(t, err, hostPort)
	return n
}
