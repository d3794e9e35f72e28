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
	"strings"
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

func TestUnit(t *testing.T) {
	u := unitDirectives(t, "vrdmad.service")
	tests := []struct {
		section, key, want string
	}{
		{"Service", "Type", "exec"},
		{"Service", "ExecStart", "/usr/bin/vrdmad --control /run/vrdma/control.sock $VRDMAD_ARGS"},
		{"Service", "EnvironmentFile", "-/etc/default/vrdmad"},
		{"Service", "RuntimeDirectory", "vrdma"},
		{"Service", "StateDirectory", "vrdma"},
		{"Service", "Restart", "on-failure"},
		{"Service", "LimitMEMLOCK", "infinity"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "ProtectSystem", "full"},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got := u[tt.section][tt.key]
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("[%s] %s: got %q, want %q", tt.section, tt.key, got, tt.want)
			}
		})
	}
	t.Run("capabilities", func(t *testing.T) {
		caps := strings.Fields(strings.Join(u["Service"]["CapabilityBoundingSet"], " "))
		if len(caps) > 0 && !contains(caps, "CAP_IPC_LOCK") {
			t.Errorf("CapabilityBoundingSet %v lacks CAP_IPC_LOCK (mlock beyond RLIMIT_MEMLOCK)", caps)
		}
	})
	t.Run("address families", func(t *testing.T) {
		fams := strings.Fields(strings.Join(u["Service"]["RestrictAddressFamilies"], " "))
		if len(fams) > 0 && !contains(fams, "AF_UNIX") {
			t.Errorf("RestrictAddressFamilies %v lacks AF_UNIX (vhost-user and control sockets)", fams)
		}
	})
	t.Run("syscall filter keeps mlock", func(t *testing.T) {
		filter := u["Service"]["SystemCallFilter"]
		if len(filter) == 0 {
			return
		}
		if len(filter) != 1 || filter[0] != "@system-service" {
			t.Fatalf("SystemCallFilter %q: this test knows only @system-service", filter)
		}
		sa := need(t, "systemd-analyze")
		out := run(t, nil, sa, "syscall-filter", "@system-service")
		for _, want := range []string{"@memlock", "@ipc", "@network-io", "@file-system"} {
			if !strings.Contains(out, want) {
				t.Errorf("@system-service lacks %s here", want)
			}
		}
	})
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
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

const testVersion = "1.2.3+test"

// TestDeb builds the .deb with scripts/deb.sh and checks it: contents,
// control fields, conffiles, manual pages, the packaged unit under
// systemd-analyze verify, and the packaged vrdmad serving metrics.
func TestDeb(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds two packages (make test runs it in its full pass)")
	}
	if testing.Short() {
		t.Skip("builds the binaries and a .deb")
	}
	need(t, "dpkg-deb")
	need(t, "go")
	for _, tc := range []struct {
		name     string
		help2man string
		compress string
	}{
		{"help2man", "", ""}, // help2man when installed, else the fallback; xz
		{"roff", "none", "gzip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			run(t, []string{"OUTDIR=" + out, "VERSION=" + testVersion, "HELP2MAN=" + tc.help2man, "DEB_COMPRESS=" + tc.compress}, "bash", "../scripts/deb.sh")
			deb := filepath.Join(out, "vrdma_"+testVersion+"_amd64.deb")
			if _, err := os.Stat(deb); err != nil {
				t.Fatalf("no .deb: %v", err)
			}
			checkDeb(t, deb)
		})
	}
}

func checkDeb(t *testing.T, deb string) {
	t.Run("contents", func(t *testing.T) {
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
			entries[strings.TrimPrefix(f[5], ".")] = f[0]
		}
		for path, mode := range map[string]string{
			"/usr/bin/vrdmad":                     "-rwxr-xr-x",
			"/usr/bin/vrdmactl":                   "-rwxr-xr-x",
			"/usr/bin/vrdma-perf":                 "-rwxr-xr-x",
			"/lib/systemd/system/vrdmad.service":  "-rw-r--r--",
			"/etc/default/vrdmad":                 "-rw-r--r--",
			"/usr/share/doc/vrdma/README.md":      "-rw-r--r--",
			"/usr/share/man/man8/vrdmad.8.gz":     "-rw-r--r--",
			"/usr/share/man/man8/vrdmactl.8.gz":   "-rw-r--r--",
			"/usr/share/man/man1/vrdma-perf.1.gz": "-rw-r--r--",
			"/usr/share/doc/vrdma/spec.md":        "-rw-r--r--",
		} {
			if got, ok := entries[path]; !ok {
				t.Errorf("%s: missing", path)
			} else if got != mode {
				t.Errorf("%s: got mode %s, want %s", path, got, mode)
			}
		}
		docs, _ := filepath.Glob("../docs/*.md")
		for _, d := range docs {
			p := "/usr/share/doc/vrdma/" + filepath.Base(d)
			if _, ok := entries[p]; !ok {
				t.Errorf("%s: missing (docs/%s)", p, filepath.Base(d))
			}
		}
	})
	t.Run("control", func(t *testing.T) {
		for field, want := range map[string]string{
			"Package":      "vrdma",
			"Version":      testVersion,
			"Architecture": "amd64",
			"Section":      "admin",
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

	t.Run("man pages", func(t *testing.T) {
		for _, m := range []struct{ path, name, want string }{
			{"usr/share/man/man8/vrdmad.8.gz", "VRDMAD", "metrics"},
			{"usr/share/man/man8/vrdmactl.8.gz", "VRDMACTL", "device"},
			{"usr/share/man/man1/vrdma-perf.1.gz", "VRDMA-PERF", "iters"},
		} {
			f, err := os.Open(filepath.Join(root, m.path))
			if err != nil {
				t.Fatal(err)
			}
			zr, err := gzip.NewReader(f)
			if err != nil {
				f.Close()
				t.Fatalf("%s: %v", m.path, err)
			}
			b, err := io.ReadAll(zr)
			f.Close()
			if err != nil {
				t.Fatalf("%s: %v", m.path, err)
			}
			page := string(b)
			if !strings.Contains(page, "\n.TH "+m.name+" ") && !strings.HasPrefix(page, ".TH "+m.name+" ") &&
				!strings.Contains(page, "\n.TH "+m.name+` "`) {
				t.Errorf("%s: no .TH %s header:\n%.300s", m.path, m.name, page)
			}
			for _, s := range []string{".SH NAME", m.want} {
				if !strings.Contains(page, s) {
					t.Errorf("%s: lacks %q", m.path, s)
				}
			}
		}
	})

	vrdmad := filepath.Join(root, "usr/bin/vrdmad")
	t.Run("version", func(t *testing.T) {
		if got := strings.TrimSpace(run(t, nil, vrdmad, "--version")); got != "vrdmad "+testVersion {
			t.Errorf("vrdmad --version: got %q, want %q", got, "vrdmad "+testVersion)
		}
	})
	t.Run("systemd-analyze verify", func(t *testing.T) {
		sa := need(t, "systemd-analyze")
		// The unit as installed, with ExecStart pointing at the extracted
		// binary (verify checks that it exists and is executable).
		b, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/vrdmad.service"))
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.ReplaceAll(string(b), "ExecStart=/usr/bin/vrdmad ", "ExecStart="+vrdmad+" ")
		if unit == string(b) {
			t.Fatal("no ExecStart=/usr/bin/vrdmad in the unit")
		}
		p := filepath.Join(t.TempDir(), "vrdmad.service")
		if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sa, "verify", "--man=no", p)
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("systemd-analyze verify: got error %v, output %q; want neither", err, out)
		}
	})
	t.Run("metrics", func(t *testing.T) { checkMetrics(t, vrdmad) })
}

// checkMetrics runs the packaged vrdmad with a device and --metrics on a
// unix socket, scrapes it, and checks that a second vrdmad on the same
// metrics address fails with a clear error.
func checkMetrics(t *testing.T, vrdmad string) {
	dir, err := os.MkdirTemp("", "vrdma-pkg") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	msock := filepath.Join(dir, "metrics.sock")
	cmd := exec.Command(vrdmad, "--control", filepath.Join(dir, "control.sock"),
		"--socket", "vm1="+filepath.Join(dir, "vm1.sock"), "--metrics", "unix:"+msock)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("vrdmad after SIGTERM: %v\n%s", err, log.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("vrdmad did not exit on SIGTERM\n%s", log.String())
		}
	}()

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
			t.Fatalf("scrape: %v\n%s", err, log.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("vrdmad exited: %v\n%s", err, log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, want := range []string{
		"vrdma_devices 1\n",
		"vrdma_pinned_bytes_total 0\n",
		`vrdma_pinned_bytes{device="vm1"} 0` + "\n",
		`vrdma_vhost_user_connected{device="vm1"} 0` + "\n",
		`vrdma_operations_total{device="vm1",opcode="rdma_write"} 0` + "\n",
		"# TYPE vrdma_vhost_user_sessions_total counter\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}

	second := exec.Command(vrdmad, "--control", filepath.Join(dir, "control2.sock"), "--metrics", "unix:"+msock)
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("second vrdmad on the same --metrics: got %v, want it to exit non-zero\n%s", err, out)
	}
	if !strings.Contains(string(out), "--metrics") || !strings.Contains(string(out), "in use") {
		t.Errorf("second vrdmad: got %q, want an error naming --metrics and saying the address is in use", out)
	}
}
