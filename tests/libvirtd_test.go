package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// The libvirt this test runs: a session libvirtd of its own (private
// HOME and runtime directory, nothing of the host's libvirt touched),
// run as nobody when the test runs as root, as libvirt's QEMU runs as an
// unprivileged user. Debian packages: libvirt-daemon,
// libvirt-daemon-driver-qemu, libvirt-clients.
type libvirtdEnv struct {
	dir   string // work directory, owned by the libvirt user, mode 0755
	virsh string // a virsh that runs as the libvirt user in the private environment
	uri   string
	owner string // the libvirt user, for vrdmad --socket-owner ("" when not root)
}

const libvirtdBinary = "/usr/sbin/libvirtd"

// needLibvirtd skips without libvirtd and its QEMU driver, except in CI
// (make test installs them), where it fails.
func needLibvirtd(t *testing.T) {
	t.Helper()
	missing := ""
	if _, err := os.Stat(libvirtdBinary); err != nil {
		missing = "libvirt-daemon (" + libvirtdBinary + ")"
	} else if m, _ := filepath.Glob("/usr/lib/*/libvirt/connection-driver/libvirt_driver_qemu.so"); len(m) == 0 {
		missing = "libvirt-daemon-driver-qemu"
	} else if _, err := exec.LookPath("virsh"); err != nil {
		missing = "libvirt-clients (virsh)"
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: %s is not installed (make test-tools installs it)", missing)
	}
	t.Skipf("%s is not installed", missing)
}

// TestLibvirtdReaperHelper runs libvirtd for startLibvirtd as a child
// subreaper: libvirt daemonizes QEMU, so when a domain ends its QEMU is
// reaped here, not left to a PID 1 that may not reap (as in containers).
// SIGTERM goes on to libvirtd; the helper exits once every descendant is
// gone. In a test run it skips.
func TestLibvirtdReaperHelper(t *testing.T) {
	if os.Getenv("VRDMA_LIBVIRTD_REAPER") != "1" {
		t.Skip("helper process for startLibvirtd")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "reaper:", err)
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "reaper:", err)
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); err == unix.ECHILD {
			os.Exit(0)
		}
	}
}

// startLibvirtd starts the session libvirtd and returns how to reach it;
// it is stopped, and its directory removed, at cleanup.
func startLibvirtd(t *testing.T) *libvirtdEnv {
	t.Helper()
	needLibvirtd(t)
	// A short path: libvirt puts unix sockets below it.
	dir, err := os.MkdirTemp("", "vrdma-lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"home/.config/libvirt", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// QEMU's output to files, not through virtlogd (another daemon).
	if err := os.WriteFile(filepath.Join(dir, "home/.config/libvirt/qemu.conf"), []byte("stdio_handler = \"file\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lv := &libvirtdEnv{dir: dir, virsh: filepath.Join(dir, "bin", "virsh"), uri: "qemu:///session"}
	if err := os.MkdirAll(filepath.Dir(lv.virsh), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir + "/home",
		"XDG_RUNTIME_DIR=" + dir + "/run", "LC_ALL=C"}
	var prefix []string
	if os.Geteuid() == 0 {
		lv.owner = "nobody"
		prefix = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
		if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 65534, 65534)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var quoted []string
	for _, a := range append(append(prefix, env...), "virsh") {
		quoted = append(quoted, "'"+a+"'")
	}
	script := "#!/bin/sh\nexec " + strings.Join(quoted, " ") + " \"$@\"\n"
	if err := os.WriteFile(lv.virsh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// vrdmactl finds this virsh first (the script resets PATH for the
	// real one).
	t.Setenv("PATH", filepath.Dir(lv.virsh)+string(os.PathListSeparator)+os.Getenv("PATH"))

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "libvirtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	args := append([]string{"-test.run=^TestLibvirtdReaperHelper$", "--"}, prefix...)
	args = append(append(args, env...), libvirtdBinary)
	reaper := exec.Command(exe, args...)
	reaper.Env = append(os.Environ(), "VRDMA_LIBVIRTD_REAPER=1")
	reaper.Stdout, reaper.Stderr = log, log
	reaper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := reaper.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- reaper.Wait() }()
	t.Cleanup(func() {
		reaper.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			syscall.Kill(-reaper.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("libvirtd did not stop within 20 s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "libvirtd.log"))
			t.Logf("libvirtd log:\n%s", b)
		}
	})
	sock := filepath.Join(dir, "run", "libvirt", "libvirt-sock")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-done:
			b, _ := os.ReadFile(filepath.Join(dir, "libvirtd.log"))
			t.Fatalf("libvirtd exited: %v: %s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd: no %s after 30 s", sock)
		}
	}
	return lv
}

// reachable returns path if the libvirt user can read it, else a copy in
// the work directory (a checkout under /root is not open to nobody).
func (lv *libvirtdEnv) reachable(t *testing.T, path string) string {
	t.Helper()
	if lv.owner == "" || exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "test", "-r", path).Run() == nil {
		return path
	}
	dst := filepath.Join(lv.dir, filepath.Base(path))
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// run runs virsh on the session.
func (lv *libvirtdEnv) run(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, lv.virsh, append([]string{"-c", lv.uri}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("virsh %s: %v: %s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// monitor is what vrdmactl --libvirt uses, on this session.
func (lv *libvirtdEnv) monitor(t *testing.T, ctx context.Context, domain string) *qemu.LibvirtMonitor {
	t.Helper()
	mon, err := qemu.DialLibvirt(ctx, domain, qemu.LibvirtOptions{URI: lv.uri, Virsh: lv.virsh})
	if err != nil {
		t.Fatal(err)
	}
	return mon
}

// define defines and starts a domain from xml; it is destroyed and
// undefined at cleanup.
func (lv *libvirtdEnv) start(t *testing.T, ctx context.Context, name, xml string) {
	t.Helper()
	p := filepath.Join(lv.dir, name+".xml")
	if err := os.WriteFile(p, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	lv.run(t, ctx, "define", p)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		exec.CommandContext(c, lv.virsh, "-c", lv.uri, "destroy", name).Run()
		exec.CommandContext(c, lv.virsh, "-c", lv.uri, "undefine", name).Run()
	})
	lv.run(t, ctx, "start", name)
}

// edit replaces old by new in s, exactly once: the test follows the
// documented XML, and a change there that it does not know fails here.
func edit(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("docs/libvirt-domain.xml: %q occurs %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}

// cut removes the text from the line holding start through the line
// holding end.
func cut(t *testing.T, s, start, end string) string {
	t.Helper()
	i := strings.Index(s, start)
	j := strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/libvirt-domain.xml: no %q ... %q", start, end)
	}
	i = strings.LastIndex(s[:i], "\n")
	j += len(end)
	return s[:i] + s[j:]
}

// TestLibvirtd runs docs/libvirt-domain.xml under a real libvirtd, with
// only what this machine needs changed (TCG instead of KVM, the patched
// QEMU from bin/, sockets in a temporary directory, no disk or network):
// the device from boot answers through vrdmad, and vrdmactl's hot-plug
// path (virsh qemu-monitor-command, the real virsh) attaches a device to
// the spare port the XML keeps; then a guest under libvirt sees a device
// hot-plugged and lets go of it on detach.
func TestLibvirtd(t *testing.T) {
	env := needGuestImage(t)
	ctl := needBinary(t, "vrdmactl")
	lv := startLibvirtd(t)
	var args []string
	if lv.owner != "" {
		args = append(args, "--socket-owner", lv.owner)
	}
	d := startVrdmad(t, t.TempDir(), args...)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	vrdmactl := func(args ...string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, ctl, append([]string{"--control", d.control}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("vrdmactl %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "libvirt-domain.xml"))
	if err != nil {
		t.Fatal(err)
	}
	x := string(doc)
	x = edit(t, x, "<domain type='kvm'", "<domain type='qemu'") // no KVM here
	x = edit(t, x, "<emulator>"+qemu.InstalledBinary+"</emulator>", "<emulator>"+lv.reachable(t, env.qemu)+"</emulator>")
	x = strings.ReplaceAll(x, "/run/vrdma/", lv.dir+"/")
	x = cut(t, x, "<disk type='file'", "</disk>")
	x = cut(t, x, "<interface type='network'>", "</interface>")
	x = edit(t, x, "<console type='pty'/>", "")
	help, _ := exec.Command(ctl, "vm", "attach", "--help").CombinedOutput()
	viaCtl := bytes.Contains(help, []byte("-libvirt"))

	t.Run("documented domain", func(t *testing.T) {
		dx := edit(t, x, "<name>vm1</name>", "<name>vrdma-doc</name>")
		dx = edit(t, dx, "<memory unit='GiB'>2</memory>", "<memory unit='MiB'>256</memory>")
		dx = edit(t, dx, "<serial type='pty'/>", "<serial type='file'><source path='"+lv.dir+"/doc-serial.log'/><target port='0'/></serial>")
		vrdmactl("device", "add", "vm1", "--socket", lv.dir+"/vm1.sock")
		lv.start(t, ctx, "vrdma-doc", dx)
		mon := lv.monitor(t, ctx, "vrdma-doc")
		// The boot-time device, behind the XML's own port.
		waitLibvirtPCI(t, ctx, mon, "vm1")
		if info := deviceInfo(t, d, "vm1"); !info.Connected {
			t.Errorf("vm1 not connected to the domain's QEMU: %+v", info)
		}
		// Hot-plug through libvirt: the spare port the XML keeps.
		vrdmactl("device", "add", "vm2", "--socket", lv.dir+"/vm2.sock")
		dev := qemu.VhostUserDevice{ID: "vm2", Socket: lv.dir + "/vm2.sock", VirtioID: abi.DeviceID,
			NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
		bus, err := qemu.AttachVhostUserQMP(ctx, mon, dev, "", qemu.HotplugOptions{Version: *mon.Version})
		if err != nil || bus != "vrdma-rp0" {
			t.Fatalf("AttachVhostUserQMP through libvirt: got %q, %v, want vrdma-rp0", bus, err)
		}
		waitLibvirtPCI(t, ctx, mon, "vm2")
		if info := deviceInfo(t, d, "vm2"); !info.Connected {
			t.Errorf("vm2 not connected after the hot-plug: %+v", info)
		}
		lv.run(t, ctx, "destroy", "vrdma-doc")
	})

	t.Run("hot-plug into a guest", func(t *testing.T) {
		hx := edit(t, x, "<name>vm1</name>", "<name>vrdma-hp</name>")
		hx = edit(t, hx, "<memory unit='GiB'>2</memory>", "<memory unit='MiB'>512</memory>")
		// No device from boot: the guest's hotplug program takes the
		// first vrdma device it finds.
		hx = cut(t, hx, "<qemu:arg value='-chardev'/>", `"bus":"vm1-port"}'/>`)
		hx = edit(t, hx, "<boot dev='hd'/>", fmt.Sprintf("<kernel>%s</kernel><initrd>%s</initrd><cmdline>console=ttyS0 quiet panic=-1 no_timer_check vrdma.console=ttyS1 vrdma.hugepages=%d vrdma.run=hotplug vrdma.args=--rounds,2</cmdline>",
			lv.reachable(t, env.kernel), lv.reachable(t, env.initrd), guestvm.DefaultHugePages))
		results := lv.dir + "/hp-ttyS1.log"
		hx = edit(t, hx, "<serial type='pty'/>", "<serial type='file'><source path='"+lv.dir+"/hp-ttyS0.log'/><target port='0'/></serial>"+
			"<serial type='file'><source path='"+results+"'/><target port='1'/></serial>")
		if strings.Count(hx, "<qemu:arg") != 4 {
			t.Fatalf("hot-plug domain: want the two spare ports only:\n%s", hx)
		}
		lv.start(t, ctx, "vrdma-hp", hx)
		next := serialEvents(t, ctx, results)
		next("waiting", 1)
		sock := lv.dir + "/hp0.sock"
		start := time.Now()
		vrdmactl("device", "add", "hp0", "--socket", sock)
		// vrdmactl --libvirt when it has it, else the calls it makes.
		mon := lv.monitor(t, ctx, "vrdma-hp")
		if viaCtl {
			vrdmactl("vm", "attach", "--libvirt", "vrdma-hp", "--connect", lv.uri, "--device", "hp0")
		} else {
			dev := qemu.VhostUserDevice{ID: "hp0", Socket: sock, VirtioID: abi.DeviceID,
				NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
			if _, err := qemu.AttachVhostUserQMP(ctx, mon, dev, "", qemu.HotplugOptions{Version: *mon.Version}); err != nil {
				t.Fatal(err)
			}
		}
		attached := time.Since(start)
		next("usable", 1)
		next("attached", 1)
		start = time.Now()
		if viaCtl {
			vrdmactl("vm", "detach", "--libvirt", "vrdma-hp", "--connect", lv.uri, "--device", "hp0")
		} else if err := qemu.DetachVhostUserQMP(ctx, mon, "hp0", nil); err != nil {
			t.Fatal(err)
		}
		detached := time.Since(start)
		vrdmactl("device", "rm", "hp0")
		next("detached", 1)
		t.Logf("libvirtd hot-plug (vrdmactl: %v): add+attach %.3f s, detach %.3f s", viaCtl, attached.Seconds(), detached.Seconds())
		// Round 2 would wait for another device: the guest is alive
		// until here (after its last round it would power off, and the
		// chardev-remove of a detach could find the domain gone).
		next("waiting", 2)
		lv.run(t, ctx, "destroy", "vrdma-hp")
	})
}

// waitLibvirtPCI waits until query-pci (through libvirt) shows the vrdma
// device with qdev id id.
func waitLibvirtPCI(t *testing.T, ctx context.Context, mon *qemu.LibvirtMonitor, id string) {
	t.Helper()
	var pci []qemu.PCIDevice
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if pci, err = qemu.QueryPCIQMP(ctx, mon); err != nil {
			t.Fatal(err)
		}
		for _, p := range pci {
			if p.ID == id {
				if p.VendorID != 0x1af4 || p.DeviceID != 0x1040+abi.DeviceID {
					t.Fatalf("%s is %04x:%04x, want 1af4:%04x", id, p.VendorID, p.DeviceID, 0x1040+abi.DeviceID)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PCI device %s after 30 s: %+v", id, pci)
		}
	}
}

// serialEvents follows the guest's result console, a file libvirt writes,
// and returns a function that waits for the next hotplug result, which
// must be want of round.
func serialEvents(t *testing.T, ctx context.Context, path string) func(want string, round int) {
	seen := 0
	return func(want string, round int) {
		t.Helper()
		for {
			b, _ := os.ReadFile(path)
			lines := strings.Split(string(b), "\n")
			for ; seen < len(lines)-1; seen++ {
				kind, payload := guestvm.Classify(strings.TrimRight(lines[seen], "\r"))
				if kind == guestvm.KindError {
					t.Fatalf("guest: VRDMA-ERROR %s", payload)
				}
				if kind != guestvm.KindResult {
					continue
				}
				ok, err := guestresult.DecodeStep(payload, guestresult.RoleHotplug, want, round, nil)
				if err != nil {
					t.Fatalf("guest: %v", err)
				}
				if !ok {
					continue
				}
				seen++
				return
			}
			select {
			case <-ctx.Done():
				b, _ := os.ReadFile(path)
				t.Fatalf("no %s from the guest: %v; console:\n%s", want, ctx.Err(), b)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}
