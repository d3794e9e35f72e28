package packaging

// Tests of the systemd units (vrdmad.service, vrdmad.socket,
// vrdmad-device@.socket) as files: systemd-analyze verify and security,
// the directives vrdmad depends on, and vrdmad started the way the units
// start it. Helpers here are prefixed sd so they stay apart from the
// .deb tests' own.

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// maxExposure bounds `systemd-analyze security`'s overall exposure of
// vrdmad.service (0 best, 10 worst; 1.5 when this test was written). A
// change that loosens the unit past it must say why here.
const maxExposure = 2.0

// sdTool finds a tool, skipping the test without it except under
// CI=true.
func sdTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (CI=true): install it (Debian packages systemd, util-linux)", name)
		}
		t.Skipf("%s not found: %v", name, err)
	}
	return p
}

// sdOne returns the single value of a directive.
func sdOne(t *testing.T, u map[string]map[string][]string, sec, key string) string {
	t.Helper()
	v := u[sec][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: got %q, want one value", sec, key, v)
	}
	return v[0]
}

// TestUnitDirectives: what vrdmad and the contract rely on.
func TestUnitDirectives(t *testing.T) {
	svc := unitDirectives(t, "vrdmad.service")
	for _, c := range []struct{ key, want string }{
		{"Type", "notify"},
		{"NotifyAccess", "main"},
		{"User", "vrdma"},
		{"Group", "vrdma"},
		{"SupplementaryGroups", "kvm"},
		{"AmbientCapabilities", "CAP_IPC_LOCK"},
		{"CapabilityBoundingSet", "CAP_IPC_LOCK"},
		{"NoNewPrivileges", "yes"},
		{"ProtectSystem", "strict"},
		{"ProtectHome", "yes"},
		{"PrivateTmp", "yes"},
		{"ProtectKernelTunables", "yes"},
		{"ProtectKernelModules", "yes"},
		{"ProtectKernelLogs", "yes"},
		{"RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"},
		{"LimitNOFILE", "1048576"},
		{"LimitMEMLOCK", "infinity"},
		{"StateDirectory", "vrdma"},
		{"RuntimeDirectory", "vrdma"},
		{"RuntimeDirectoryPreserve", "yes"},
		{"MemoryDenyWriteExecute", "yes"},
	} {
		if got := sdOne(t, svc, "Service", c.key); got != c.want {
			t.Errorf("vrdmad.service %s: got %q, want %q", c.key, got, c.want)
		}
	}
	exec := strings.Fields(sdOne(t, svc, "Service", "ExecStart"))
	args := strings.Join(exec, " ")
	for _, want := range []string{"--state-dir /var/lib/vrdma", "--control /run/vrdma/control.sock"} {
		if !strings.Contains(args, want) {
			t.Errorf("ExecStart %q lacks %q", args, want)
		}
	}

	sock := unitDirectives(t, "vrdmad.socket")
	for _, c := range []struct{ key, want string }{
		{"ListenStream", "/run/vrdma/control.sock"},
		{"FileDescriptorName", "control"},
		{"SocketMode", "0660"},
		{"SocketGroup", "vrdma"}, // the control API: operators, not every QEMU
	} {
		if got := sdOne(t, sock, "Socket", c.key); got != c.want {
			t.Errorf("vrdmad.socket %s: got %q, want %q", c.key, got, c.want)
		}
	}
	dev := unitDirectives(t, "vrdmad-device@.socket")
	for _, c := range []struct{ key, want string }{
		{"ListenStream", "/run/vrdma/%i.sock"},
		{"FileDescriptorName", "%i"},
		{"Service", "vrdmad.service"},
		{"SocketMode", "0660"},
		{"SocketGroup", "kvm"},
	} {
		if got := sdOne(t, dev, "Socket", c.key); got != c.want {
			t.Errorf("vrdmad-device@.socket %s: got %q, want %q", c.key, got, c.want)
		}
	}
}

// sdBuildVrdmad builds vrdmad into a directory every user can read.
func sdBuildVrdmad(t *testing.T) string {
	t.Helper()
	goBin := sdTool(t, "go")
	dir, err := os.MkdirTemp("", "vrdmad-units-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "vrdmad")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/vrdma/vrdma/cmd/vrdmad")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// sdUnitCopies writes the units into a directory with ExecStart on bin,
// the device template as instance ID, and returns their paths.
func sdUnitCopies(t *testing.T, bin, id string) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for src, dst := range map[string]string{"vrdmad.service": "vrdmad.service", "vrdmad.socket": "vrdmad.socket", "vrdmad-device@.socket": "vrdmad-device@" + id + ".socket"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "ExecStart=/usr/bin/vrdmad ", "ExecStart="+bin+" ")
		p := filepath.Join(dir, dst)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestUnitsVerify: systemd-analyze verify finds nothing to say about the
// units, and security rates the service at most maxExposure.
func TestUnitsVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds vrdmad (make test runs it in its full pass)")
	}
	sa := sdTool(t, "systemd-analyze")
	bin := sdBuildVrdmad(t)
	units := sdUnitCopies(t, bin, "vm1")
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("systemd-analyze verify: error %v, output %q; want neither", err, out)
	}
	var svc string
	for _, u := range units {
		if strings.HasSuffix(u, "vrdmad.service") {
			svc = u
		}
	}
	out, err = exec.Command(sa, "security", "--offline=yes", svc).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for vrdmad\.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("systemd-analyze security: exposure %.1f", score)
	if score > maxExposure {
		t.Errorf("exposure %.1f, want at most %.1f:\n%s", score, maxExposure, out)
	}
}

// TestUnitsStartVrdmad starts vrdmad as the units would, under
// systemd-socket-activate: the sockets of vrdmad.socket and
// vrdmad-device@vm1.socket with their FileDescriptorName=s, ExecStart's
// arguments (paths moved to a test directory), an unprivileged user with
// CAP_IPC_LOCK as its only (ambient) capability and a 64 KiB
// RLIMIT_MEMLOCK. The device serves, and a 16 MiB memory registration
// pins (mlock beyond the limit: CAP_IPC_LOCK at work); without the
// capability the same registration fails, so the test measures what the
// unit grants.
func TestUnitsStartVrdmad(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds vrdmad (make test runs it in its full pass)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run vrdmad as another user with a capability")
	}
	activate := sdTool(t, "systemd-socket-activate")
	setpriv := sdTool(t, "setpriv")
	prlimit := sdTool(t, "prlimit")
	bin := sdBuildVrdmad(t)
	svc, sock, dev := unitDirectives(t, "vrdmad.service"), unitDirectives(t, "vrdmad.socket"), unitDirectives(t, "vrdmad-device@.socket")

	for _, withCap := range []bool{true, false} {
		name := "CAP_IPC_LOCK"
		if !withCap {
			name = "no capability"
		}
		t.Run(name, func(t *testing.T) {
			root, err := os.MkdirTemp("", "vrdma-unit-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(root)
			if err := os.Chmod(root, 0o777); err != nil {
				t.Fatal(err)
			}
			remap := strings.NewReplacer("/run/vrdma", filepath.Join(root, "run"), "/var/lib/vrdma", filepath.Join(root, "state"), "%i", "vm1")
			// As RuntimeDirectory= and StateDirectory= make them: the
			// service's user can write there.
			for _, d := range []string{"run", "state"} {
				if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(filepath.Join(root, d), 65534, 65534); err != nil {
					t.Fatal(err)
				}
			}
			control := remap.Replace(sdOne(t, sock, "Socket", "ListenStream"))
			vm1 := remap.Replace(sdOne(t, dev, "Socket", "ListenStream"))
			names := sdOne(t, sock, "Socket", "FileDescriptorName") + ":" + remap.Replace(sdOne(t, dev, "Socket", "FileDescriptorName"))

			notify := filepath.Join(root, "notify.sock")
			nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			os.Chmod(notify, 0o777)

			// ExecStart without $VRDMAD_ARGS; the sockets' group is the
			// unprivileged user's (kvm may not exist here).
			var args []string
			for _, a := range strings.Fields(sdOne(t, svc, "Service", "ExecStart"))[1:] {
				switch {
				case a == "$VRDMAD_ARGS":
				case a == ":kvm":
					args = append(args, ":nogroup")
				default:
					args = append(args, remap.Replace(a))
				}
			}
			caps := []string{"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"}
			if withCap {
				caps = []string{"--inh-caps=+ipc_lock", "--ambient-caps=+ipc_lock", "--bounding-set=-all,+ipc_lock"}
			}
			// As systemd does it: the sockets are made with privileges
			// (the activation tool, as root), then the service runs as
			// its user with the unit's capabilities; every exec keeps the
			// pid that LISTEN_PID names.
			cmdline := []string{"--memlock=65536:65536", "--", activate, "-l", control, "-l", vm1, "--fdname=" + names, "-E", "NOTIFY_SOCKET=" + notify,
				"--", setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"}
			cmdline = append(cmdline, caps...)
			cmdline = append(append(cmdline, "--", bin), args...)
			cmd := exec.Command(prlimit, cmdline...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			d := startDaemon(t, cmd)
			defer d.stop(t, 15*time.Second)

			// The tool execs vrdmad at the first connection.
			deadline := time.Now().Add(10 * time.Second)
			for {
				c, err := net.Dial("unix", control)
				if err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no listener on %s: %v\n%s", control, err, d.log())
				}
				time.Sleep(20 * time.Millisecond)
			}
			nc.SetReadDeadline(time.Now().Add(20 * time.Second))
			buf := make([]byte, 4096)
			for {
				n, err := nc.Read(buf)
				if err != nil {
					t.Fatalf("no READY=1: %v\n%s", err, d.log())
				}
				if strings.Contains(string(buf[:n]), "READY=1") {
					break
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, f, err := frontend.OpenRDMA(ctx, vm1, 64<<20)
			if err != nil {
				t.Fatalf("open vm1: %v\n%s", err, d.log())
			}
			defer f.Close()
			defer c.Close()
			pd, err := c.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			mr, err := c.AllocBuffer(16 << 20)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pd.RegMR(mr, 0, 16<<20, abi.AccessLocalWrite)
			switch {
			case withCap && err != nil:
				t.Errorf("REG_MR of 16 MiB with CAP_IPC_LOCK and a 64 KiB RLIMIT_MEMLOCK: %v\n%s", err, d.log())
			case !withCap && err == nil:
				t.Error("REG_MR of 16 MiB without CAP_IPC_LOCK and a 64 KiB RLIMIT_MEMLOCK succeeded: the test does not measure the capability")
			case !withCap:
				t.Logf("REG_MR without CAP_IPC_LOCK, as expected: %v", err)
			}
			if st, err := os.Stat(filepath.Join(root, "state")); err != nil || !st.IsDir() {
				t.Errorf("state directory: %v", err)
			}
		})
	}
}
