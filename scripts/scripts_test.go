// Package scripts holds the tests of the shell scripts beside it: the
// decisions of go-toolchain.sh (which go, when to install Debian's, when to
// fetch a toolchain) with fake go commands, the Makefile's use of it, and
// how qemu-build.sh gets its pinned QEMU source, with fake apt-get and curl.
// Nothing is installed or downloaded.
package scripts

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGoScript is a go command of version @VERSION@. It logs every run.
// `go version` prints the version; `go env GOROOT` prints its GOROOT, or,
// with GOTOOLCHAIN=goX.Y.Z naming another version and itself 1.21 or
// later, "downloads" that toolchain into $FAKE_CACHE (a fake go of that
// version) and prints its GOROOT, as the real go command does after
// switching; with FAKE_OFFLINE set that download fails. `go mod download`
// succeeds.
const fakeGoScript = `#!/bin/sh
v=@VERSION@
echo "$v GOTOOLCHAIN=${GOTOOLCHAIN:-} $*" >> "$FAKE_LOG"
case "$1" in
version) echo "go version go$v linux/amd64"; exit 0 ;;
mod) exit 0 ;;
env)
	[ "$2" = GOROOT ] || exit 2
	root=$(cd "$(dirname "$0")/.." && pwd)
	minor=$(echo "$v" | cut -d. -f2)
	case "${GOTOOLCHAIN:-}" in
	go[0-9]*)
		want=${GOTOOLCHAIN#go}
		if [ "$want" != "$v" ] && [ "$minor" -ge 21 ]; then
			if [ -n "${FAKE_OFFLINE:-}" ]; then
				echo "go: download go$want for linux/amd64: toolchain not available" >&2
				exit 1
			fi
			root=$FAKE_CACHE/golang.org/toolchain@v0.0.1-go$want.linux-amd64
			mkdir -p "$root/bin"
			sed "s/@VERSION""@/$want/" "$FAKE_TEMPLATE" > "$root/bin/go"
			chmod +x "$root/bin/go"
			echo "go: downloading go$want (linux/amd64)" >&2
		fi
		;;
	esac
	echo "$root"
	exit 0
	;;
esac
exit 2
`

// goEnv is a sandbox for go-toolchain.sh: fake go commands, a go.mod, a
// log of every fake run.
type goEnv struct {
	dir, template, log, cache string
}

func newGoEnv(t *testing.T) *goEnv {
	t.Helper()
	dir := t.TempDir()
	e := &goEnv{dir: dir, template: filepath.Join(dir, "fake-go.in"), log: filepath.Join(dir, "go.log"), cache: filepath.Join(dir, "modcache")}
	if err := os.WriteFile(e.template, []byte(fakeGoScript), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

// fakeGo installs a fake go of version v at dir/name/bin/go and returns
// its path.
func (e *goEnv) fakeGo(t *testing.T, name, v string) string {
	t.Helper()
	p := filepath.Join(e.dir, name, "bin", "go")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(fakeGoScript, "@VERSION@", v)), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *goEnv) gomod(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(e.dir, "go.mod")
	if err := os.WriteFile(p, []byte("module example.com/x\n\n"+text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *goEnv) runs(t *testing.T) string {
	b, _ := os.ReadFile(e.log)
	return string(b)
}

// fetched is where the fake download of version v puts its go.
func (e *goEnv) fetched(v string) string {
	return filepath.Join(e.cache, "golang.org", "toolchain@v0.0.1-go"+v+".linux-amd64", "bin", "go")
}

// env is the environment of a go-toolchain.sh run: no real go anywhere.
func (e *goEnv) env(gomod string, search []string, extra ...string) []string {
	return append([]string{
		"PATH=/usr/bin:/bin",
		"HOME=" + e.dir,
		"GO_TOOLCHAIN_GOMOD=" + gomod,
		"GO_TOOLCHAIN_SEARCH=" + strings.Join(search, " "),
		"GO_TOOLCHAIN_APT=0",
		"FAKE_LOG=" + e.log,
		"FAKE_CACHE=" + e.cache,
		"FAKE_TEMPLATE=" + e.template,
	}, extra...)
}

func runScript(t *testing.T, env []string, script string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{script}, args...)...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func TestGoToolchain(t *testing.T) {
	const mod = "go 1.26.8\n"
	tests := []struct {
		name   string
		gomod  string
		search func(e *goEnv, t *testing.T) []string
		args   []string
		extra  []string
		// apt, if set, is the fake apt-get install: it makes a go of
		// this version at dir/apt/bin/go (which is in the search list).
		apt string
		// want is the go printed (a path relative to the sandbox, or
		// "fetched:V"); "" means the script must fail.
		want string
		// wantErr is in the one-line message of a failure.
		wantErr string
		// wantFetch is the GOTOOLCHAIN a fake go was asked to switch to.
		wantFetch string
	}{
		{name: "new enough", gomod: mod, want: "a/bin/go",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.26.8")} }},
		{name: "newer", gomod: mod, want: "a/bin/go",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.27.1")} }},
		{name: "first new enough wins", gomod: mod, want: "b/bin/go",
			search: func(e *goEnv, t *testing.T) []string {
				return []string{filepath.Join(e.dir, "missing/bin/go"), e.fakeGo(t, "old", "1.19.8"), e.fakeGo(t, "b", "1.26.9"), e.fakeGo(t, "c", "1.27.0")}
			}},
		{name: "too old, fetches go.mod's toolchain", gomod: mod, want: "fetched:1.26.8", wantFetch: "go1.26.8",
			search: func(e *goEnv, t *testing.T) []string {
				return []string{e.fakeGo(t, "old", "1.19.8"), e.fakeGo(t, "bpo", "1.23.5")}
			}},
		{name: "the newest switcher fetches", gomod: mod, want: "fetched:1.26.8", wantFetch: "go1.26.8",
			search: func(e *goEnv, t *testing.T) []string {
				return []string{e.fakeGo(t, "a", "1.22.1"), e.fakeGo(t, "b", "1.24.3"), e.fakeGo(t, "c", "1.21.0")}
			}},
		{name: "toolchain line", gomod: "go 1.25.0\n\ntoolchain go1.26.8\n", want: "fetched:1.26.8", wantFetch: "go1.26.8",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.25.3")} }},
		{name: "go line without patch", gomod: "go 1.26\n", want: "fetched:1.26.0", wantFetch: "go1.26.0",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.23.5")} }},
		{name: "go line without patch, 1.26.0 there", gomod: "go 1.26\n", want: "a/bin/go",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.26.0")} }},
		{name: "offline", gomod: mod, extra: []string{"FAKE_OFFLINE=1"}, wantErr: "toolchain not available", wantFetch: "go1.26.8",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.23.5")} }},
		{name: "GOTOOLCHAIN=local", gomod: mod, extra: []string{"GOTOOLCHAIN=local"}, wantErr: "GOTOOLCHAIN=local",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.23.5")} }},
		{name: "--no-install", gomod: mod, args: []string{"--no-install"}, wantErr: "found go 1.23.5 at",
			search: func(e *goEnv, t *testing.T) []string { return []string{e.fakeGo(t, "a", "1.23.5")} }},
		{name: "no go, no apt", gomod: mod, wantErr: "found no Go",
			search: func(e *goEnv, t *testing.T) []string { return []string{filepath.Join(e.dir, "apt/bin/go")} }},
		{name: "only Go 1.19: backports golang, then fetch", gomod: mod, apt: "1.23.5", want: "fetched:1.26.8", wantFetch: "go1.26.8",
			search: func(e *goEnv, t *testing.T) []string {
				return []string{e.fakeGo(t, "old", "1.19.8"), filepath.Join(e.dir, "apt/bin/go")}
			}},
		{name: "no go: backports golang new enough", gomod: "go 1.23.0\n", apt: "1.23.5", want: "apt/bin/go",
			search: func(e *goEnv, t *testing.T) []string { return []string{filepath.Join(e.dir, "apt/bin/go")} }},
		{name: "not a go", gomod: mod, want: "b/bin/go",
			search: func(e *goEnv, t *testing.T) []string {
				bad := filepath.Join(e.dir, "bad", "go")
				os.MkdirAll(filepath.Dir(bad), 0o755)
				os.WriteFile(bad, []byte("#!/bin/sh\necho nonsense\n"), 0o755)
				return []string{bad, e.fakeGo(t, "b", "1.26.8")}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newGoEnv(t)
			search := tt.search(e, t)
			env := e.env(e.gomod(t, tt.gomod), search, tt.extra...)
			if tt.apt != "" {
				// The fake apt-get install: a Debian go appears.
				installer := filepath.Join(e.dir, "apt-install")
				script := "#!/bin/sh\necho apt-install >> " + e.log + "\nmkdir -p " + e.dir + "/apt/bin\n" +
					"sed 's/@VERSION@/" + tt.apt + "/' " + e.template + " > " + e.dir + "/apt/bin/go\nchmod +x " + e.dir + "/apt/bin/go\n"
				if err := os.WriteFile(installer, []byte(script), 0o755); err != nil {
					t.Fatal(err)
				}
				env = append(env, "GO_TOOLCHAIN_APT=1", "GO_TOOLCHAIN_APT_CMD="+installer)
			}
			stdout, stderr, err := runScript(t, env, "go-toolchain.sh", tt.args...)
			runs := e.runs(t)
			if tt.want == "" {
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 || stdout != "" {
					t.Fatalf("got %q, %v; want exit 1 and nothing on stdout\n%s", stdout, err, stderr)
				}
				lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
				last := lines[len(lines)-1]
				if !strings.Contains(last, tt.wantErr) || !strings.Contains(last, "need Go") || !strings.Contains(last, "install Go") {
					t.Errorf("last line %q: want what to install and %q", last, tt.wantErr)
				}
				if tt.wantFetch == "" && !strings.Contains(runs, "GOTOOLCHAIN=go") && len(lines) != 1 {
					t.Errorf("got %d lines on stderr, want one:\n%s", len(lines), stderr)
				}
			} else {
				if err != nil {
					t.Fatalf("%v\n%s", err, stderr)
				}
				want := filepath.Join(e.dir, tt.want)
				if v, ok := strings.CutPrefix(tt.want, "fetched:"); ok {
					want = e.fetched(v)
				}
				if strings.TrimSpace(stdout) != want || strings.Count(stdout, "\n") != 1 {
					t.Errorf("got stdout %q, want %q\nstderr: %s", stdout, want, stderr)
				}
			}
			if got := strings.Contains(runs, "GOTOOLCHAIN="+tt.wantFetch+" env GOROOT"); tt.wantFetch != "" && !got {
				t.Errorf("no fetch of %s; runs:\n%s", tt.wantFetch, runs)
			}
			if tt.wantFetch == "" && strings.Contains(runs, "GOTOOLCHAIN=go") {
				t.Errorf("fetched a toolchain it did not need; runs:\n%s", runs)
			}
			if got := strings.Contains(runs, "apt-install"); got != (tt.apt != "") {
				t.Errorf("apt install ran: %v, want %v; runs:\n%s", got, tt.apt != "", runs)
			}
			for _, line := range strings.Split(runs, "\n") {
				if strings.Contains(line, " version") && !strings.Contains(line, "GOTOOLCHAIN=local ") {
					t.Errorf("go version run without GOTOOLCHAIN=local (it could switch toolchains): %q", line)
				}
			}
		})
	}
}

// TestMakeDeps runs the Makefile's deps target with go-toolchain.sh
// finding only fake go commands: the go it prints is the one make uses
// (and first in PATH for the recipes), and with none make stops with the
// script's one line.
func TestMakeDeps(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	e := newGoEnv(t)
	gomod := filepath.Join(root, "go.mod")

	fetchOnly := []string{e.fakeGo(t, "bpo", "1.23.5")}
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "deps")
	cmd.Env = e.env(gomod, fetchOnly)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make deps: %v\n%s", err, out)
	}
	want := e.fetched(goModVersion(t, gomod))
	if !strings.Contains(string(out), want+" mod download") {
		t.Errorf("make deps did not run %s mod download:\n%s", want, out)
	}
	if runs := e.runs(t); !strings.Contains(runs, "mod download") {
		t.Errorf("the fetched go never ran mod download; runs:\n%s", runs)
	}

	none := []string{filepath.Join(e.dir, "nothing/bin/go")}
	cmd = exec.Command("make", "--no-print-directory", "-C", root, "deps")
	cmd.Env = e.env(gomod, none)
	out, err = cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make deps without any go succeeded:\n%s", out)
	}
	var mine []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "go-toolchain:") {
			mine = append(mine, l)
		}
	}
	if len(mine) != 1 || !strings.Contains(mine[0], "install Go") {
		t.Errorf("make deps without go: want one go-toolchain line saying what to install, got:\n%s", out)
	}
	if strings.Contains(string(out), "mod download") {
		t.Errorf("make deps ran mod download without a go:\n%s", out)
	}
}

func goModVersion(t *testing.T, gomod string) string {
	b, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no go line in go.mod")
	return ""
}

// qemuEnv is a sandbox for qemu-build.sh's source fetching: a cache
// directory, and fake apt-get and curl first in PATH.
type qemuEnv struct {
	dir, cache, log string
}

// fakeAptGet: update succeeds; source --print-uris lists $FAKE_SERVED as
// the backports orig tarball; source --download-only copies $FAKE_APT_FILE
// (if set) into the current directory under the served name.
const fakeAptGet = `#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
for a in "$@"; do
	case "$a" in
	update) exit 0 ;;
	--print-uris)
		echo "'http://deb.debian.org/debian/pool/main/q/qemu/$FAKE_SERVED' $FAKE_SERVED 39449628 SHA256:0000"
		exit 0 ;;
	--download-only)
		[ -n "${FAKE_APT_FILE:-}" ] && cp "$FAKE_APT_FILE" "./$FAKE_SERVED"
		exit 0 ;;
	esac
done
exit 0
`

// fakeCurl: for a URL containing $FAKE_CURL_OK_URL, writes $FAKE_CURL_FILE
// to the -o file; other URLs fail as a 404.
const fakeCurl = `#!/bin/sh
echo "curl $*" >> "$FAKE_LOG"
out="" url=""
while [ $# -gt 0 ]; do
	case "$1" in
	-o) out=$2; shift ;;
	--connect-timeout|--retry) shift ;;
	-*) ;;
	*) url=$1 ;;
	esac
	shift
done
case "$url" in
*"${FAKE_CURL_OK_URL:-none}"*) cp "$FAKE_CURL_FILE" "$out"; exit 0 ;;
esac
echo "curl: (22) The requested URL returned error: 404" >&2
exit 22
`

func newQEMUEnv(t *testing.T) *qemuEnv {
	t.Helper()
	if _, err := os.Stat("/etc/debian_version"); err != nil {
		t.Skip("qemu-build.sh derives its mirror from Debian's apt sources")
	}
	dir := t.TempDir()
	e := &qemuEnv{dir: dir, cache: filepath.Join(dir, "cache"), log: filepath.Join(dir, "calls.log")}
	bin := filepath.Join(dir, "bin")
	os.MkdirAll(bin, 0o755)
	for name, s := range map[string]string{"apt-get": fakeAptGet, "curl": fakeCurl} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// fetch runs qemu-build.sh's fetch_source (the script sourced, so nothing
// else of it runs) or, with check, its check mode.
func (e *qemuEnv) fetch(t *testing.T, check bool, extra ...string) (string, string, error) {
	t.Helper()
	body := `. ./qemu-build.sh && fetch_source`
	if check {
		body = `. ./qemu-build.sh && main check`
	}
	cmd := exec.Command("bash", "-c", body)
	cmd.Env = append([]string{
		"PATH=" + filepath.Join(e.dir, "bin") + ":/usr/bin:/bin",
		"HOME=" + e.dir, "VRDMA_CACHE=" + e.cache, "FAKE_LOG=" + e.log,
	}, extra...)
	var o, er bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &er
	err := cmd.Run()
	return o.String(), er.String(), err
}

func (e *qemuEnv) calls() string {
	b, _ := os.ReadFile(e.log)
	return string(b)
}

// pinned returns the real pinned tarball (a copy in the QEMU build cache)
// or skips.
func pinned(t *testing.T) string {
	t.Helper()
	home, _ := os.UserHomeDir()
	p := filepath.Join(home, ".cache", "vrdma", "qemu", "downloads", "qemu_10.0.2+ds.orig.tar.xz")
	if c := os.Getenv("VRDMA_CACHE"); c != "" {
		p = filepath.Join(c, "qemu", "downloads", "qemu_10.0.2+ds.orig.tar.xz")
	}
	f, err := os.Open(p)
	if err != nil {
		t.Skipf("no cached QEMU source to play the pinned file (make qemu fetches it): %v", err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	if got := hex.EncodeToString(h.Sum(nil)); got != pinnedSHA256(t) {
		t.Skipf("%s has sha256 %s, not the pin", p, got)
	}
	return p
}

func pinnedSHA256(t *testing.T) string {
	b, err := os.ReadFile("qemu-build.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "readonly QEMU_TARBALL_SHA256="); ok {
			return v
		}
	}
	t.Fatal("qemu-build.sh pins no QEMU_TARBALL_SHA256")
	return ""
}

func TestQEMUSourcePinned(t *testing.T) {
	if len(pinnedSHA256(t)) != 64 {
		t.Fatalf("QEMU_TARBALL_SHA256 %q is not a sha256", pinnedSHA256(t))
	}
	const name = "qemu_10.0.2+ds.orig.tar.xz"
	const moved = "qemu_10.2.0+ds.orig.tar.xz"

	t.Run("garbage in the cache, backports moved, nothing serves it", func(t *testing.T) {
		e := newQEMUEnv(t)
		dl := filepath.Join(e.cache, "qemu", "downloads")
		os.MkdirAll(dl, 0o755)
		os.WriteFile(filepath.Join(dl, name), []byte("not a tarball"), 0o644)
		stdout, stderr, err := e.fetch(t, false, "FAKE_SERVED="+moved)
		if err == nil || stdout != "" {
			t.Fatalf("got %q, %v, want a failure\n%s", stdout, err, stderr)
		}
		if _, err := os.Stat(filepath.Join(dl, name+".bad")); err != nil {
			t.Errorf("the bad cached tarball was not kept aside: %v", err)
		}
		if !strings.Contains(stderr, "bookworm-backports now serves "+moved+", not "+name) {
			t.Errorf("no note that backports moved on:\n%s", stderr)
		}
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		for _, w := range []string{"cannot get " + name, moved, "snapshot.debian.org", "put the file into"} {
			if !strings.Contains(last, w) {
				t.Errorf("last line %q lacks %q", last, w)
			}
		}
		calls := e.calls()
		if !strings.Contains(calls, "pool/main/q/qemu/qemu_10.0.2%2bds.orig.tar.xz") || !strings.Contains(calls, "snapshot.debian.org/file/") {
			t.Errorf("did not try the pool and snapshot.debian.org:\n%s", calls)
		}
		if strings.Contains(calls, "--download-only") {
			t.Errorf("apt-get source fetched the moved version:\n%s", calls)
		}
	})

	t.Run("wrong file from the pool is discarded", func(t *testing.T) {
		e := newQEMUEnv(t)
		junk := filepath.Join(e.dir, "junk")
		os.WriteFile(junk, []byte("junk"), 0o644)
		_, stderr, err := e.fetch(t, false, "FAKE_SERVED="+moved, "FAKE_CURL_OK_URL=pool/", "FAKE_CURL_FILE="+junk)
		if err == nil || !strings.Contains(stderr, "pool: "+name+" does not match the pinned sha256; discarded") {
			t.Errorf("got %v, want the pool's wrong file discarded:\n%s", err, stderr)
		}
		if _, err := os.Stat(filepath.Join(e.cache, "qemu", "downloads", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a file failing the checksum was left in the cache: %v", err)
		}
	})

	t.Run("cached and verified: offline", func(t *testing.T) {
		src := pinned(t)
		e := newQEMUEnv(t)
		dl := filepath.Join(e.cache, "qemu", "downloads")
		os.MkdirAll(dl, 0o755)
		if err := os.Symlink(src, filepath.Join(dl, name)); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, err := e.fetch(t, false, "FAKE_SERVED="+moved)
		if err != nil || strings.TrimSpace(stdout) != filepath.Join(dl, name) {
			t.Fatalf("got %q, %v, want the cached tarball\n%s", stdout, err, stderr)
		}
		if c := e.calls(); c != "" {
			t.Errorf("a verified cache still went to the network:\n%s", c)
		}
	})

	t.Run("backports moved, the pool still has it", func(t *testing.T) {
		src := pinned(t)
		e := newQEMUEnv(t)
		stdout, stderr, err := e.fetch(t, false, "FAKE_SERVED="+moved, "FAKE_CURL_OK_URL=pool/", "FAKE_CURL_FILE="+src)
		if err != nil || !strings.HasSuffix(strings.TrimSpace(stdout), name) {
			t.Fatalf("got %q, %v, want the tarball from the pool\n%s", stdout, err, stderr)
		}
		if !strings.Contains(stderr, "sha256 verified (pool)") {
			t.Errorf("not verified from the pool:\n%s", stderr)
		}
	})

	t.Run("backports serves it: apt-get source", func(t *testing.T) {
		src := pinned(t)
		e := newQEMUEnv(t)
		stdout, stderr, err := e.fetch(t, false, "FAKE_SERVED="+name, "FAKE_APT_FILE="+src)
		if err != nil || !strings.HasSuffix(strings.TrimSpace(stdout), name) || !strings.Contains(stderr, "sha256 verified (apt)") {
			t.Fatalf("got %q, %v, want the tarball through apt-get source\n%s", stdout, err, stderr)
		}
		if strings.Contains(e.calls(), "curl") {
			t.Errorf("curl ran though apt-get source had it:\n%s", e.calls())
		}
	})

	t.Run("check", func(t *testing.T) {
		e := newQEMUEnv(t)
		stdout, _, err := e.fetch(t, true, "FAKE_SERVED="+name)
		if err != nil || !strings.Contains(stdout, "serves the pinned "+name) {
			t.Errorf("check, not moved: got %q, %v", stdout, err)
		}
		stdout, _, err = e.fetch(t, true, "FAKE_SERVED="+moved)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stdout, "serves "+moved+", not the pinned "+name) {
			t.Errorf("check, moved: got %q, %v, want exit 1 naming both", stdout, err)
		}
	})
}
