package packaging

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// need skips the test when tool is missing, except under CI=true, where
// every tool the packaging needs must be installed.
func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (CI=true): install it", tool)
		}
		t.Skipf("%s not found: %v", tool, err)
	}
	return p
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// unitDirectives returns the unit's Key=Value lines by section.
func unitDirectives(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string][]string{}
	sec := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			sec = line[1 : len(line)-1]
			out[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s: bad line %q", path, line)
			}
			out[sec][k] = append(out[sec][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sysusers returns the users and groups packaging/deb/sysusers.conf
// creates, and the group memberships ("user group").
func sysusers(t *testing.T) (users, groups, members []string) {
	t.Helper()
	b, err := os.ReadFile("deb/sysusers.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "u":
			users = append(users, f[1])
			groups = append(groups, f[1]) // u creates the user's group
		case "g":
			groups = append(groups, f[1])
		case "m":
			members = append(members, f[1]+" "+f[2])
			groups = append(groups, f[2])
		default:
			t.Fatalf("sysusers.conf: line %q: this test knows u, g and m", line)
		}
	}
	return users, groups, members
}

// TestUnit checks that the units fit the package: ExecStart runs the
// packaged vrdmad, EnvironmentFile is the conffile, every unit they name
// is packaged, and every user and group they name is root or created by
// the package's sysusers.conf (the maintainer scripts apply it).
// packaging/systemd_test.go checks the units' directives themselves.
func TestUnit(t *testing.T) {
	units := []string{"vrdmad.service", "vrdmad.socket", "vrdmad-device@.socket"}
	users, groups, members := sysusers(t)
	users, groups = append(users, "root"), append(groups, "root")
	svc := unitDirectives(t, "vrdmad.service")
	t.Run("ExecStart", func(t *testing.T) {
		if got := svc["Service"]["ExecStart"]; len(got) != 1 || !strings.HasPrefix(got[0], "/usr/bin/vrdmad ") {
			t.Errorf("ExecStart %q: want /usr/bin/vrdmad (the packaged daemon)", got)
		}
		if got := svc["Service"]["EnvironmentFile"]; !slices.Equal(got, []string{"-/etc/default/vrdmad"}) {
			t.Errorf("EnvironmentFile %q: want -/etc/default/vrdmad (the conffile)", got)
		}
		if got := svc["Install"]["WantedBy"]; !slices.Equal(got, []string{"multi-user.target"}) {
			t.Errorf("[Install] WantedBy %q: want multi-user.target (the postinst enables the service)", got)
		}
	})
	for _, name := range units {
		u := unitDirectives(t, name)
		t.Run(name, func(t *testing.T) {
			for _, sec := range []string{"Unit", "Install"} {
				for _, key := range []string{"Requires", "Wants", "Also", "BindsTo"} {
					for _, v := range u[sec][key] {
						for _, dep := range strings.Fields(v) {
							if strings.HasPrefix(dep, "vrdmad") && !slices.Contains(units, dep) {
								t.Errorf("%s=%s: not a packaged unit", key, dep)
							}
						}
					}
				}
			}
			check := func(key string, known []string, what string) {
				for _, sec := range []string{"Service", "Socket"} {
					for _, v := range u[sec][key] {
						for _, name := range strings.Fields(v) {
							if !slices.Contains(known, name) {
								t.Errorf("%s=%s: a %s sysusers.conf does not create", key, name, what)
							}
						}
					}
				}
			}
			check("User", users, "user")
			check("SocketUser", users, "user")
			check("Group", groups, "group")
			check("SocketGroup", groups, "group")
			check("SupplementaryGroups", groups, "group")
			if name == "vrdmad.service" {
				user := strings.Join(u["Service"]["User"], "")
				for _, g := range strings.Fields(strings.Join(u["Service"]["SupplementaryGroups"], " ")) {
					if user != "" && !slices.Contains(members, user+" "+g) {
						t.Errorf("SupplementaryGroups=%s: sysusers.conf does not make %s a member (m %s %s)", g, user, user, g)
					}
				}
			}
		})
	}
}

func TestEnvironmentFile(t *testing.T) {
	b, err := os.ReadFile("vrdmad.default")
	if err != nil {
		t.Fatal(err)
	}
	var set []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		set = append(set, line)
	}
	if len(set) != 1 || set[0] != `VRDMAD_ARGS=""` {
		t.Errorf("got assignments %q, want only VRDMAD_ARGS=\"\"", set)
	}
}

// TestMaintainerScripts checks the maintainer scripts' syntax with sh -n
// (and shellcheck where installed: POSIX sh, as dpkg runs them).
func TestMaintainerScripts(t *testing.T) {
	for _, s := range []string{"deb/postinst", "deb/prerm", "deb/postrm"} {
		t.Run(s, func(t *testing.T) {
			fi, err := os.Stat(s)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm()&0o111 == 0 {
				t.Errorf("mode %v: want it executable", fi.Mode())
			}
			if out, err := exec.Command("sh", "-n", s).CombinedOutput(); err != nil {
				t.Errorf("sh -n: %v\n%s", err, out)
			}
			if sc, err := exec.LookPath("shellcheck"); err == nil {
				if out, err := exec.Command(sc, "-s", "sh", s).CombinedOutput(); err != nil {
					t.Errorf("shellcheck: %v\n%s", err, out)
				}
			}
		})
	}
}

// TestCopyright checks that packaging/deb/copyright has a Files:
// paragraph for every Go module linked into the packaged programs, and
// none for a module they do not link (go list -deps).
func TestCopyright(t *testing.T) {
	goBin := need(t, "go")
	out := run(t, nil, goBin, "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}}{{end}}{{end}}",
		"../cmd/vrdmad", "../cmd/vrdmactl", "../cmd/vrdma-perf")
	var mods []string
	for _, m := range strings.Fields(out) {
		if !slices.Contains(mods, m) {
			mods = append(mods, m)
		}
	}
	b, err := os.ReadFile("deb/copyright")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "Files: "); ok && p != "*" && p != "go/*" {
			patterns = append(patterns, strings.TrimSuffix(p, "/*"))
		}
	}
	covers := func(p, m string) bool { return m == p || strings.HasPrefix(m, p+"/") }
	for _, m := range mods {
		if !slices.ContainsFunc(patterns, func(p string) bool { return covers(p, m) }) {
			t.Errorf("module %s is linked into the programs but has no Files: paragraph in deb/copyright", m)
		}
	}
	for _, p := range patterns {
		if !slices.ContainsFunc(mods, func(m string) bool { return covers(p, m) }) {
			t.Errorf("deb/copyright has Files: %s/* but no packaged program links it", p)
		}
	}
	for _, want := range []string{"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n", "\nFiles: *\n", "\nFiles: go/*\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("deb/copyright lacks %q", want)
		}
	}
}

const (
	testVersion    = "1.2.3+test"
	testDebVersion = testVersion + "-1" // Debian revision 1
)

// TestDeb builds the .deb with scripts/deb.sh and checks it: contents,
// owners and modes, control fields, conffiles, md5sums, manual pages, the
// maintainer scripts against a scratch root, lintian, the packaged units
// under systemd-analyze verify, and the packaged vrdmad serving metrics
// that promtool accepts.
func TestDeb(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds two packages (make test runs it in its full pass)")
	}
	need(t, "dpkg-deb")
	need(t, "go")
	for _, tc := range []struct {
		name     string
		compress string
	}{
		{"xz", ""}, // the default
		{"gzip", "gzip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			// DEB_QEMU=0: vrdma alone; qemu_deb_test.go builds both.
			run(t, []string{"OUTDIR=" + out, "VERSION=" + testVersion, "DEB_COMPRESS=" + tc.compress, "DEB_QEMU=0"}, "bash", "../scripts/deb.sh")
			deb := filepath.Join(out, "vrdma_"+testDebVersion+"_amd64.deb")
			if _, err := os.Stat(deb); err != nil {
				t.Fatalf("no .deb: %v", err)
			}
			checkDeb(t, deb)
		})
	}
}

// debEntries lists deb's files and directories (directories end in "/")
// with their modes, as dpkg-deb -c shows them, and checks that root owns
// each and that every directory is drwxr-xr-x.
func debEntries(t *testing.T, deb string) map[string]string {
	t.Helper()
	// drwxr-xr-x root/root 0 2026-01-01 00:00 ./usr/bin/
	entries := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(run(t, nil, "dpkg-deb", "-c", deb)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb -c line %q", line)
		}
		if f[1] != "root/root" {
			t.Errorf("%s: got owner %s, want root/root", f[5], f[1])
		}
		path := strings.TrimPrefix(f[5], ".")
		entries[path] = f[0]
		if strings.HasSuffix(path, "/") && f[0] != "drwxr-xr-x" {
			t.Errorf("%s: got mode %s, want drwxr-xr-x", path, f[0])
		}
	}
	return entries
}

func checkDeb(t *testing.T, deb string) {
	t.Run("contents", func(t *testing.T) {
		entries := debEntries(t, deb)
		for path, mode := range map[string]string{
			"/usr/bin/vrdmad":                                 "-rwxr-xr-x",
			"/usr/bin/vrdmactl":                               "-rwxr-xr-x",
			"/usr/bin/vrdma-perf":                             "-rwxr-xr-x",
			"/lib/systemd/system/vrdmad.service":              "-rw-r--r--",
			"/lib/systemd/system/vrdmad.socket":               "-rw-r--r--",
			"/lib/systemd/system/vrdmad-device@.socket":       "-rw-r--r--",
			"/usr/lib/sysusers.d/vrdma.conf":                  "-rw-r--r--",
			"/etc/default/vrdmad":                             "-rw-r--r--",
			"/usr/share/bash-completion/completions/vrdmactl": "-rw-r--r--",
			"/usr/share/zsh/vendor-completions/_vrdmactl":     "-rw-r--r--",
			"/usr/share/doc/vrdma/copyright":                  "-rw-r--r--",
			"/usr/share/doc/vrdma/changelog.Debian.gz":        "-rw-r--r--",
			"/usr/share/doc/vrdma/README.md":                  "-rw-r--r--",
			"/usr/share/doc/vrdma/docs/spec.md":               "-rw-r--r--",
			"/usr/share/man/man8/vrdmad.8.gz":                 "-rw-r--r--",
			"/usr/share/man/man8/vrdmactl.8.gz":               "-rw-r--r--",
			"/usr/share/man/man1/vrdma-perf.1.gz":             "-rw-r--r--",
			"/usr/share/lintian/overrides/vrdma":              "-rw-r--r--",
		} {
			if got, ok := entries[path]; !ok {
				t.Errorf("%s: missing", path)
			} else if got != mode {
				t.Errorf("%s: got mode %s, want %s", path, got, mode)
			}
		}
		// docs/ as a tree beside README.md, images and the libvirt domain
		// included: README.md's links point into it.
		docs, _ := filepath.Glob("../docs/*")
		for _, d := range docs {
			p := "/usr/share/doc/vrdma/docs/" + filepath.Base(d)
			if _, ok := entries[p]; !ok {
				t.Errorf("%s: missing (docs/%s)", p, filepath.Base(d))
			}
		}
		if _, ok := entries["/var/lib/vrdma/"]; ok {
			t.Error("/var/lib/vrdma/ is in the package: systemd creates it (StateDirectory=)")
		}
	})
	t.Run("control", func(t *testing.T) {
		for field, want := range map[string]string{
			"Package":      "vrdma",
			"Version":      testDebVersion,
			"Architecture": "amd64",
			"Section":      "admin",
			"Priority":     "optional",
			"Depends":      "libc6 (>= 2.34), systemd | systemd-standalone-sysusers | systemd-sysusers",
			"Recommends":   "vrdma-qemu, libibverbs1, ibverbs-providers", // not Debian's QEMU: it has no device for vrdma
		} {
			if got := strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, field)); got != want {
				t.Errorf("%s: got %q, want %q", field, got, want)
			}
		}
		for _, field := range []string{"Maintainer", "Description", "Installed-Size"} {
			if got := strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, field)); got == "" {
				t.Errorf("%s: empty", field)
			}
		}
		if got := run(t, nil, "dpkg-deb", "-I", deb, "conffiles"); got != "/etc/default/vrdmad\n" {
			t.Errorf("conffiles: got %q, want /etc/default/vrdmad", got)
		}
	})

	root := t.TempDir()
	run(t, nil, "dpkg-deb", "-x", deb, root)
	ctrl := t.TempDir()
	run(t, nil, "dpkg-deb", "-e", deb, ctrl)

	t.Run("md5sums", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(ctrl, "md5sums"))
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			_, p, ok := strings.Cut(line, "  ")
			if !ok {
				t.Fatalf("md5sums line %q", line)
			}
			listed[p] = true
		}
		cmd := exec.Command("md5sum", "--check", "--quiet", filepath.Join(ctrl, "md5sums"))
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("md5sum --check: %v\n%s", err, out)
		}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if !listed[rel] && !strings.HasPrefix(rel, "etc/") {
				t.Errorf("%s: not in md5sums", rel)
			}
			return nil
		})
	})
	t.Run("changelog", func(t *testing.T) {
		page := gunzip(t, filepath.Join(root, "usr/share/doc/vrdma/changelog.Debian.gz"))
		if want := "vrdma (" + testDebVersion + ") unstable; urgency=medium\n"; !strings.HasPrefix(page, want) {
			t.Errorf("changelog starts %.80q, want %q", page, want)
		}
	})
	t.Run("man pages", func(t *testing.T) {
		// The pages of packaging/man (man_test.go checks them), stamped
		// with the build's date and version on the .TH line and nothing
		// else changed.
		for _, m := range manPages {
			sec := m.file[strings.LastIndexByte(m.file, '.')+1:]
			installed := filepath.Join(root, "usr/share/man/man"+sec, m.file+".gz")
			page := gunzip(t, installed)
			src, err := os.ReadFile(filepath.Join("man", m.file))
			if err != nil {
				t.Fatal(err)
			}
			thRe := regexp.MustCompile(`(?m)^\.TH .*$`)
			th := thRe.FindString(page)
			f := strings.Fields(th)
			if len(f) < 5 || !regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`).MatchString(f[3]) ||
				!strings.HasPrefix(th, strings.Join(f[:4], " ")+` "vrdma `+testVersion+`" `) {
				t.Errorf("%s: .TH line %q, want .TH NAME %s DATE \"vrdma %s\" MANUAL", installed, th, sec, testVersion)
			}
			if thRe.ReplaceAllString(page, "") != thRe.ReplaceAllString(string(src), "") {
				t.Errorf("%s: differs from packaging/man/%s beyond the .TH line", installed, m.file)
			}
			// What lintian's manpage-has-errors-from-man runs.
			if man, err := exec.LookPath("man"); err == nil {
				cmd := exec.Command(man, "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", installed)
				cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANWIDTH=80")
				var stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = io.Discard, &stderr
				if err := cmd.Run(); err != nil || stderr.Len() != 0 {
					t.Errorf("%s: man --warnings: %v\n%s", installed, err, stderr.String())
				}
			}
		}
	})
	t.Run("doc links", func(t *testing.T) {
		// The package's own file list: a link into the source tree that
		// is not installed fails here, where TestDocLinks would pass.
		files := map[string]bool{}
		docRoot := filepath.Join(root, "usr/share/doc/vrdma")
		filepath.WalkDir(docRoot, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(docRoot, p)
				files[filepath.ToSlash(rel)] = true
			}
			return err
		})
		checkDocLinks(t, docRoot, files)
	})
	t.Run("lintian", func(t *testing.T) {
		lintian := need(t, "lintian")
		// No error, and no warning that packaging/deb/lintian-overrides
		// does not give a reason for.
		cmd := exec.Command(lintian, "--fail-on", "error,warning", "--no-tag-display-limit", deb)
		out, err := cmd.CombinedOutput()
		var bad []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "E: ") || strings.HasPrefix(line, "W: ") {
				bad = append(bad, line)
			}
		}
		if err != nil || len(bad) > 0 {
			t.Errorf("lintian: %v\n%s", err, out)
		}
	})
	t.Run("bash completion", func(t *testing.T) {
		bash := need(t, "bash")
		p := filepath.Join(root, "usr/share/bash-completion/completions/vrdmactl")
		out := run(t, nil, bash, "--norc", "-c", `source "$1" && complete -p vrdmactl`, "bash", p)
		if out != "complete -F _vrdmactl vrdmactl\n" {
			t.Errorf("complete -p vrdmactl: got %q", out)
		}
	})
	t.Run("zsh completion", func(t *testing.T) {
		p := filepath.Join(root, "usr/share/zsh/vendor-completions/_vrdmactl")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// compinit autoloads a file of $fpath by this first line.
		if !strings.HasPrefix(string(b), "#compdef vrdmactl\n") {
			t.Errorf("_vrdmactl starts %.40q, want #compdef vrdmactl", b)
		}
		zsh := need(t, "zsh")
		// Loaded as zsh loads it: autoloaded from $fpath, run as the
		// completion function with compadd standing in for zsh's.
		out := run(t, nil, zsh, "-f", "-c", `compadd() { shift; print -r -- "$*"; }
fpath=("$1" $fpath); autoload -Uz _vrdmactl; words=(vrdmactl device ''); CURRENT=3; _vrdmactl`, "zsh", filepath.Dir(p))
		for _, want := range []string{"add", "set", "rm", "ls", "show"} {
			if !slices.Contains(strings.Fields(out), want) {
				t.Errorf("vrdmactl device <TAB>: got %q, want the device commands (%s among them)", out, want)
			}
		}
	})
	t.Run("dpkg install, remove, purge", func(t *testing.T) { checkScripts(t, deb) })

	vrdmad := filepath.Join(root, "usr/bin/vrdmad")
	t.Run("version", func(t *testing.T) {
		// The package's version, and the checkout's revision (deb.sh links
		// both in).
		want := "vrdmad " + testVersion
		if rev, err := exec.Command("git", "-C", "..", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
			want += " (revision " + strings.TrimSpace(string(rev))
		}
		if got := strings.TrimSpace(run(t, nil, vrdmad, "--version")); !strings.HasPrefix(got, want) {
			t.Errorf("vrdmad --version: got %q, want %q", got, want+"…")
		}
	})
	t.Run("systemd-analyze verify", func(t *testing.T) {
		sa := need(t, "systemd-analyze")
		// The units as installed, with ExecStart pointing at the extracted
		// binary (verify checks that it exists and is executable) and the
		// device socket template as an instance.
		dir := t.TempDir()
		var units []string
		for src, dst := range map[string]string{"vrdmad.service": "vrdmad.service", "vrdmad.socket": "vrdmad.socket",
			"vrdmad-device@.socket": "vrdmad-device@vm1.socket"} {
			b, err := os.ReadFile(filepath.Join(root, "lib/systemd/system", src))
			if err != nil {
				t.Fatal(err)
			}
			unit := strings.ReplaceAll(string(b), "ExecStart=/usr/bin/vrdmad ", "ExecStart="+vrdmad+" ")
			if src == "vrdmad.service" && unit == string(b) {
				t.Fatal("no ExecStart=/usr/bin/vrdmad in the unit")
			}
			p := filepath.Join(dir, dst)
			if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
				t.Fatal(err)
			}
			units = append(units, p)
		}
		cmd := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...)
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("systemd-analyze verify: got error %v, output %q; want neither", err, out)
		}
	})
	t.Run("metrics", func(t *testing.T) { checkMetrics(t, vrdmad) })
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(b)
}

// checkScripts installs, upgrades, removes and purges the package with
// dpkg in a scratch root (dpkg --root with --force-script-chrootless: the
// maintainer scripts run on the host with DPKG_ROOT set, as for a
// bootstrap, so nothing on the host changes and systemd is left alone).
// The postinst must create the vrdma user and group and put vrdma into the
// kvm group already there (as Debian's systemd makes it); remove must keep
// the state directory and the conffile, purge must remove both.
func checkScripts(t *testing.T, deb string) {
	dpkg := need(t, "dpkg")
	need(t, "systemd-sysusers")
	if os.Geteuid() != 0 {
		t.Skip("dpkg --root needs root")
	}
	r := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, content := range map[string]string{
		"var/lib/dpkg/status": "", "var/lib/dpkg/available": "",
		"etc/passwd": "root:x:0:0:root:/root:/bin/bash\n",
		"etc/group":  "root:x:0:\nkvm:x:104:\n",
	} {
		if err := os.WriteFile(filepath.Join(r, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dpkgRun := func(args ...string) {
		t.Helper()
		// --force-depends: the scratch root has no systemd package.
		run(t, nil, dpkg, append([]string{"--root=" + r, "--force-script-chrootless", "--force-depends", "--log=/dev/null"}, args...)...)
	}
	dpkgRun("--install", deb)
	dpkgRun("--install", deb) // an upgrade (postinst configure OLD-VERSION): idempotent
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	group, _ := os.ReadFile(filepath.Join(r, "etc/group"))
	if !regexp.MustCompile(`(?m)^vrdma:x:[0-9]+:[0-9]+:[^:]*:/var/lib/vrdma:/usr/sbin/nologin$`).Match(passwd) {
		t.Errorf("/etc/passwd lacks the vrdma system user (home /var/lib/vrdma, shell nologin):\n%s", passwd)
	}
	if !regexp.MustCompile(`(?m)^vrdma:x:[0-9]+:$`).Match(group) {
		t.Errorf("/etc/group lacks the group vrdma:\n%s", group)
	}
	if !regexp.MustCompile(`(?m)^kvm:x:104:vrdma$`).Match(group) {
		t.Errorf("/etc/group: want vrdma in the existing kvm group (104):\n%s", group)
	}
	state := filepath.Join(r, "var/lib/vrdma")
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "devices.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	dpkgRun("--remove", "vrdma")
	for _, keep := range []string{"var/lib/vrdma/devices.json", "etc/default/vrdmad"} {
		if _, err := os.Stat(filepath.Join(r, keep)); err != nil {
			t.Errorf("after remove: /%s: %v, want it kept until purge", keep, err)
		}
	}
	if _, err := os.Stat(filepath.Join(r, "usr/bin/vrdmad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after remove: /usr/bin/vrdmad: got %v, want it gone", err)
	}
	dpkgRun("--purge", "vrdma")
	for _, gone := range []string{"var/lib/vrdma", "etc/default/vrdmad"} {
		if _, err := os.Stat(filepath.Join(r, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after purge: /%s: got %v, want it gone", gone, err)
		}
	}
}

// checkMetrics runs the packaged vrdmad with a device and --metrics on a
// unix socket, scrapes it, runs promtool check metrics on the scrape, and
// checks that a second vrdmad on the same metrics address fails with a
// clear error.
func checkMetrics(t *testing.T, vrdmad string) {
	dir, err := os.MkdirTemp("", "vrdma-pkg") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	msock := filepath.Join(dir, "metrics.sock")
	cmd := exec.Command(vrdmad, "--control", filepath.Join(dir, "control.sock"), "--state-dir", filepath.Join(dir, "state"),
		"--socket", "vm1="+filepath.Join(dir, "vm1.sock"), "--metrics", "unix:"+msock)
	d := startDaemon(t, cmd)
	defer d.stop(t, 10*time.Second)

	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", msock)
		},
	}}
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get("http://vrdmad/metrics")
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
			err = errors.Join(rerr, errors.New(resp.Status))
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape: %v\n%s", err, d.log())
		}
		select {
		case <-d.exited:
			t.Fatalf("vrdmad exited: %v\n%s", d.err, d.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, want := range []string{
		"vrdma_devices 1\n",
		"vrdma_global_pinned_bytes 0\n",
		`vrdma_pinned_bytes{device="vm1"} 0` + "\n",
		`vrdma_vhost_user_connected{device="vm1"} 0` + "\n",
		`vrdma_operations_total{device="vm1",opcode="rdma_write"} 0` + "\n",
		`vrdma_resource_limit{device="vm1",type="qp"} 1024` + "\n",
		"# TYPE vrdma_vhost_user_sessions_total counter\n",
		`version="` + testVersion + `"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^vrdma_build_info\{[^}]*goversion="go[0-9.]+"[^}]*\} 1$`).MatchString(body) {
		t.Errorf("scrape lacks vrdma_build_info{goversion=…} 1")
	}
	t.Run("promtool", func(t *testing.T) {
		promtool := need(t, "promtool")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("promtool check metrics: got error %v, output:\n%s\nwant neither", err, out)
		}
	})

	second := exec.Command(vrdmad, "--control", filepath.Join(dir, "control2.sock"), "--state-dir", filepath.Join(dir, "state2"),
		"--metrics", "unix:"+msock)
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("second vrdmad on the same --metrics: got %v, want it to exit non-zero\n%s", err, out)
	}
	if !strings.Contains(string(out), "--metrics") || !strings.Contains(string(out), "in use") {
		t.Errorf("second vrdmad: got %q, want an error naming --metrics and saying the address is in use", out)
	}
}

// daemonRun is a vrdmad a packaging test started, with its output.
type daemonRun struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer  // protected by mu
	exited chan struct{} // closed once the process has been waited for
	err    error         // how it exited; valid once exited is closed
}

func (d *daemonRun) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.Write(p)
}

// log is the daemon's output so far.
func (d *daemonRun) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// startDaemon starts cmd with its stdout and stderr in the run's log.
func startDaemon(t *testing.T, cmd *exec.Cmd) *daemonRun {
	t.Helper()
	d := &daemonRun{cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d, d
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = cmd.Wait(); close(d.exited) }()
	return d
}

// stop ends the daemon with SIGTERM and fails the test unless it exits
// with status 0 within grace (then it is killed).
func (d *daemonRun) stop(t *testing.T, grace time.Duration) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.err != nil {
			t.Errorf("vrdmad after SIGTERM: %v\n%s", d.err, d.log())
		}
	case <-time.After(grace):
		d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("vrdmad did not exit on SIGTERM\n%s", d.log())
	}
}
