package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/stacklab"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// The end-to-end tests of the standard RDMA stack in the guest (issue 18):
// Debian's libibverbs, ibverbs-utils and perftest, unmodified, over the
// vrdma kernel driver and rdma-core provider, in TCG guests of the stack
// image, on one vrdmad. They run the user's way in: bin/vrdma-vmtest exec
// and exec-pair, and the commands in guest/vrdma-perftest.

// needStack returns the paths the stack tests need, skipping outside CI
// when something is missing and failing in CI.
func needStack(t *testing.T) (vmtest string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots TCG guests")
	}
	root := repoRoot(t)
	needBinary(t, "qemu-system-x86_64")
	needBinary(t, "vrdmad")
	vmtest = needBinary(t, "vrdma-vmtest")
	for _, f := range []string{"guest-stack/vmlinuz", "guest-stack/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(root, "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make guest-stack-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make guest-stack-image): %v", f, err)
		}
	}
	return vmtest
}

// vmtestRun runs bin/vrdma-vmtest with args and returns its combined
// output and exit status.
func vmtestRun(t *testing.T, vmtest string, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	args = append([]string{args[0], "--timeout", timeout.String()}, args[1:]...)
	out, err := exec.CommandContext(ctx, vmtest, args...).CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("vrdma-vmtest %v: %v\n%s", args, err, out)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// execPair runs exec-pair with the server's and the client's commands
// and ends the test unless both exited 0; it returns the output.
func execPair(t *testing.T, vmtest string, timeout time.Duration, server, client string) string {
	t.Helper()
	out, code := vmtestRun(t, vmtest, timeout, "exec-pair", "--server", server, "--client", client)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	return out
}

// wantAll reports each of wants that out lacks.
func wantAll(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

// suiteOK is what both sides of a vrdma-perftest or vrdma-middleware
// suite print when every job of theirs exited 0.
var suiteOK = []string{"client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok"}

// endPair checks the guests as checkGuestsClean does and, when anything
// failed, logs the whole output.
func endPair(t *testing.T, out string, guests int) {
	t.Helper()
	checkGuestsClean(t, out, guests)
	if t.Failed() {
		t.Log(out)
	}
}

// checkGuestsClean asserts what init reports after every command: no
// kernel warning in any guest's log, and the driver unloaded (rmmod vrdma
// succeeded: nothing leaked a reference).
func checkGuestsClean(t *testing.T, out string, guests int) {
	t.Helper()
	if n := strings.Count(out, guestvm.PrefixKernelWarning); n != 0 {
		t.Errorf("%d kernel warnings in the guests' logs:\n%s", n, grepLines(out, guestvm.PrefixKernelWarning))
	}
	if n := strings.Count(out, guestvm.PrefixRmmod+" ok"); n != guests {
		t.Errorf("rmmod vrdma succeeded in %d guests, want %d:\n%s", n, guests, grepLines(out, guestvm.PrefixRmmod))
	}
}

func grepLines(out, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// jobs parses vrdma-perftest's VRDMA-JOB lines of one role.
func jobs(t *testing.T, out, role string) []map[string]any {
	t.Helper()
	var js []map[string]any
	for _, l := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(l, role+"| VRDMA-JOB ")
		if !ok {
			continue
		}
		var j map[string]any
		if err := json.Unmarshal([]byte(rest), &j); err != nil {
			t.Fatalf("bad job line %q: %v", l, err)
		}
		js = append(js, j)
	}
	return js
}

// TestStackDevinfo: ibv_devices lists vrdma0, and ibv_devinfo -v shows the
// device with the limits vrdmad gives it, an active Ethernet (RoCE) port
// and a GID table filled from eth0's addresses.
func TestStackDevinfo(t *testing.T) {
	vmtest := needStack(t)
	out, code := vmtestRun(t, vmtest, 3*time.Minute, "exec", "--cmd",
		"ibv_devices && ibv_devinfo -v -d vrdma0 && ls -l /dev/infiniband")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, re := range []string{
		`(?m)^\s+vrdma0\s+525400fffe000001$`, // ibv_devices: name, node GUID
		`(?m)^hca_id:\s+vrdma0$`,
		`(?m)^\s+node_guid:\s+5254:00ff:fe00:0001$`,
		`(?m)^\s+vendor_id:\s+0x1af4$`,
		`(?m)^\s+vendor_part_id:\s+4202$`, // 0x106a
		`(?m)^\s+max_qp:\s+1024$`,
		`(?m)^\s+max_qp_wr:\s+4096$`,
		`(?m)^\s+max_cqe:\s+65536$`,
		`(?m)^\s+atomic_cap:\s+ATOMIC_HCA \(1\)$`,
		`(?m)^\s+state:\s+PORT_ACTIVE \(4\)$`,
		`(?m)^\s+link_layer:\s+Ethernet$`,
		`(?m)^\s+GID\[\s*0\]:\s+fe80:0000:0000:0000:5054:00ff:fe00:0001, RoCE v1$`,
		`(?m)^\s+GID\[\s*1\]:\s+fe80::5054:ff:fe00:1, RoCE v2$`,
		`(?m)^\s+GID\[\s*\d+\]:\s+::ffff:10\.11\.0\.1, RoCE v2$`,
		`uverbs0`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s", re)
		}
	}
	checkGuestsClean(t, out, 1)
	if t.Failed() {
		t.Log(out)
	}
}

// TestStackPerftest runs Debian's perftest between two guests: ib_write_bw,
// ib_read_bw, ib_send_bw, ib_atomic_bw, ib_write_lat and ib_send_lat with
// their default flags, with -s 65536 and with -q 4 (the bandwidth tests;
// perftest's latency tests run one QP, and atomics are 8 bytes). Every
// run must exit 0 on both sides and print its result table.
func TestStackPerftest(t *testing.T) {
	vmtest := needStack(t)
	out, code := vmtestRun(t, vmtest, 10*time.Minute, "exec-pair",
		"--server", "vrdma-perftest server perftest", "--client", "vrdma-perftest client perftest {server}")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	const want = 15 // write, read, send: default, -s 65536, -q 4; atomic: default, -q 4; write_lat, send_lat: default, -s 65536
	for _, role := range []string{"server", "client"} {
		js := jobs(t, out, role)
		if len(js) != want {
			t.Errorf("%s ran %d jobs, want %d", role, len(js), want)
		}
		for _, j := range js {
			if j["exit"] != float64(0) {
				t.Errorf("%s: %v %v exited %v", role, j["tool"], j["flags"], j["exit"])
			}
		}
		if !strings.Contains(out, role+"| VRDMA-SUITE ok") {
			t.Errorf("%s: no VRDMA-SUITE ok", role)
		}
	}
	for _, banner := range []string{"RDMA_Write BW Test", "RDMA_Read BW Test", "Send BW Test",
		"Atomic FETCH_AND_ADD BW Test", "RDMA_Write Latency Test", "Send Latency Test"} {
		if !strings.Contains(out, banner) {
			t.Errorf("no %q banner", banner)
		}
	}
	// Result rows: "client|  65536      5000    <peak>    <average>   <rate>".
	bw := regexp.MustCompile(`(?m)^client\|\s+65536\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s*$`)
	if n := len(bw.FindAllString(out, -1)); n < 8 {
		t.Errorf("%d 64 KiB bandwidth result rows, want at least 8", n)
	}
	checkGuestsClean(t, out, 2)
	if t.Failed() {
		t.Log(out)
	}
}

// TestStackPingpongConcurrentSyscalls: ibv_rc_pingpong passes with its
// buffer check, polling and with completion events, with ibv_post_send
// and with the ibv_wr_* API (-N), and so does ib_send_lat -e; two ib_write_bw processes share one device at once; and
// the fast path makes no system call per post or poll: ib_write_bw's
// system calls under strace -c do not grow from 1,000 to 20,000 posts.
func TestStackPingpongConcurrentSyscalls(t *testing.T) {
	vmtest := needStack(t)
	run := func(role string) string {
		host := ""
		if role == "client" {
			host = " {server}"
		}
		var cmds []string
		for _, s := range []string{"pingpong", "concurrent", "syscalls"} {
			cmds = append(cmds, fmt.Sprintf("vrdma-perftest %s %s%s", role, s, host))
		}
		return strings.Join(cmds, " && ")
	}
	out, code := vmtestRun(t, vmtest, 8*time.Minute, "exec-pair", "--server", run("server"), "--client", run("client"))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok"} {
		if n := strings.Count(out, want); n != 3 {
			t.Errorf("%q %d times, want 3 (one per suite)", want, n)
		}
	}
	// ibv_rc_pingpong prints its rate on both sides after checking data
	// (polling and -e, with ibv_post_send and with the ibv_wr_* API, -N).
	if n := len(regexp.MustCompile(`(?m)\| \d+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$`).FindAllString(out, -1)); n != 8 {
		t.Errorf("ibv_rc_pingpong result lines: %d, want 8", n)
	}
	for _, role := range []string{"server", "client"} {
		for _, flags := range []string{"-N", "-N -e"} {
			if !regexp.MustCompile(fmt.Sprintf(`"role":"%s","tool":"ibv_rc_pingpong","flags":"-g \d+ -c -n 500 %s","exit":0`, role, regexp.QuoteMeta(flags))).MatchString(out) {
				t.Errorf("%s: no passing ibv_rc_pingpong %s (the ibv_wr_* API)", role, flags)
			}
		}
	}
	var calls []int
	for _, m := range regexp.MustCompile(`client\| VRDMA-SYSCALLS (\{.*\})`).FindAllStringSubmatch(out, -1) {
		var s struct{ Iters, Calls, Exit int }
		if err := json.Unmarshal([]byte(m[1]), &s); err != nil || s.Exit != 0 || s.Calls <= 0 {
			t.Fatalf("bad syscall line %q (%v)", m[0], err)
		}
		calls = append(calls, s.Calls)
	}
	if len(calls) != 2 {
		t.Fatalf("%d syscall measurements, want 2:\n%s", len(calls), out)
	}
	t.Logf("ib_write_bw client system calls: %d at 1,000 posts, %d at 20,000", calls[0], calls[1])
	// 19,000 more posts and polls: a system call on the fast path would add
	// at least that many.
	if d := calls[1] - calls[0]; d > 200 {
		t.Errorf("system calls grew by %d for 19,000 more posts: the fast path enters the kernel", d)
	}
	checkGuestsClean(t, out, 2)
	if t.Failed() {
		t.Log(out)
	}
}

// stackLab starts vrdmad and the guests' configurations for a test that
// drives the guests itself.
func stackLab(t *testing.T, names ...string) *stacklab.Lab {
	t.Helper()
	root := repoRoot(t)
	q, err := filepath.Abs(filepath.Join(root, "bin", "qemu-system-x86_64"))
	if err != nil {
		t.Fatal(err)
	}
	lab, err := stacklab.New(context.Background(), stacklab.Config{Names: names,
		VRDMAD: filepath.Join(root, "bin", "vrdmad"), QEMU: q,
		Kernel: filepath.Join(root, "bin", "guest-stack", "vmlinuz"),
		Initrd: filepath.Join(root, "bin", "guest-stack", "initramfs.img")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("vrdmad: %v", err)
		}
	})
	return lab
}

// linesOf collects a guest's console lines for the test log.
type linesOf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *linesOf) add(role string, s guestvm.StackLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, "%s| %s\n", role, s.Text)
}

func (l *linesOf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStackGuestKilled kills the client guest (SIGKILL of its QEMU) in the
// middle of an ib_write_bw run. The server guest stays well: its driver
// logs no warning, a new loopback transfer on the same device works, and
// the driver unloads; vrdmad keeps serving (its devices answer, the killed
// guest's device is disconnected and holds nothing).
func TestStackGuestKilled(t *testing.T) {
	needStack(t)
	lab := stackLab(t, "server", "client")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cfg := guestvm.StackPairConfig{Server: lab.Configs[0], Client: lab.Configs[1], PeerGrace: 4 * time.Minute}
	// The server's run ends by timeout once its client is gone (a killed
	// peer sends no TCP reset); then a loopback run on the same device.
	cfg.Server.Command = "timeout 40 ib_write_bw -d vrdma0 -s 65536 -D 30; echo killed-run-exit=$?; " +
		"(ib_write_bw -d vrdma0 -s 4096 -n 500 -p 18600 >/tmp/lb.out 2>&1 &); sleep 1; " +
		"ib_write_bw -d vrdma0 -s 4096 -n 500 -p 18600 127.0.0.1"
	cfg.Client.Command = lab.Substitute("ib_write_bw -d vrdma0 -s 65536 -D 30 {server}")
	p, err := guestvm.StartStackPair(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var log linesOf
	killed := make(chan struct{})
	var once sync.Once
	res, err := p.Run(ctx, func(role string, l guestvm.StackLine) {
		log.add(role, l)
		// perftest prints its column header when the measurement starts.
		if role == guestvm.RoleClient && strings.Contains(l.Text, "#bytes") {
			once.Do(func() {
				go func() {
					time.Sleep(3 * time.Second)
					p.Client.Kill()
					close(killed)
				}()
			})
		}
	})
	select {
	case <-killed:
	default:
		t.Fatalf("the client never started measuring: %v\n%s", err, log.String())
	}
	out := log.String()
	if res.Server.ExitCode != 0 || !res.Server.Reported {
		t.Fatalf("server after its peer was killed: exit %d (reported %v): %v\n%s", res.Server.ExitCode, res.Server.Reported, err, out)
	}
	if !regexp.MustCompile(`(?m)^server\|\s+4096\s+500\s+`).MatchString(out) {
		t.Errorf("no loopback result row on the server:\n%s", out)
	}
	if len(res.Server.KernelWarnings) != 0 || res.Server.Rmmod != "ok" {
		t.Errorf("server guest: kernel warnings %q, rmmod %q", res.Server.KernelWarnings, res.Server.Rmmod)
	}
	devs, err := lab.Daemon.Devices()
	if err != nil {
		t.Fatalf("vrdmad after the kill: %v", err)
	}
	for _, d := range devs {
		if d.ID == "client" && (d.Connected || d.PinnedBytes != 0 || d.QPs != 0) {
			t.Errorf("the killed guest's device: %+v", d)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestStackHotUnplug removes the vrdma device (QMP device_del) while a
// process holds a context with a PD, MRs, CQs and a QP (an ib_write_bw
// server waiting for its client) and another watches async events. The
// watcher sees IBV_EVENT_DEVICE_FATAL, both processes end, the guest logs
// no kernel warning and the driver unloads; vrdmad is left serving.
func TestStackHotUnplug(t *testing.T) {
	needStack(t)
	lab := stackLab(t, "vm")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := lab.Configs[0]
	// The device goes away once both processes hold it (READY); the
	// watcher's wait is bounded (60 s) so a missing event fails the test
	// instead of hanging the guest.
	cfg.Command = "ib_write_bw -d vrdma0 -s 65536 >/tmp/bw.out 2>&1 & bw=$!; " +
		"ibv_asyncwatch -d vrdma0 >/tmp/aw.out 2>&1 & aw=$!; sleep 3; echo VRDMA-TEST-READY; " +
		"i=0; while kill -0 $aw 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; " +
		"kill $aw 2>/dev/null; wait $aw; echo asyncwatch-exit=$?; cat /tmp/aw.out; " +
		"kill $bw; wait $bw; echo perftest-exit=$?; cat /tmp/bw.out; " +
		"n=$(ls /sys/class/infiniband | wc -l); echo ib-devices=$n; test $n = 0"
	g, err := guestvm.BootStack(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var log linesOf
	unplugged := make(chan error, 1)
	res, err := g.RunCommand(ctx, func(l guestvm.StackLine) {
		log.add("vm", l)
		if strings.Contains(l.Text, "VRDMA-TEST-READY") {
			go func() { unplugged <- g.VM().DetachVhostUser(ctx, "vrdma0") }()
		}
	})
	out := log.String()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	select {
	case derr := <-unplugged:
		if derr != nil {
			t.Fatalf("device_del: %v\n%s", derr, out)
		}
	default:
		t.Fatalf("the device was never unplugged:\n%s", out)
	}
	if res.ExitCode != 0 {
		t.Errorf("command exit %d", res.ExitCode)
	}
	if !strings.Contains(out, "IBV_EVENT_DEVICE_FATAL") {
		t.Errorf("the async watcher saw no IBV_EVENT_DEVICE_FATAL")
	}
	if len(res.KernelWarnings) != 0 {
		t.Errorf("kernel warnings: %q", res.KernelWarnings)
	}
	if res.Rmmod != "ok" {
		t.Errorf("rmmod vrdma: %q", res.Rmmod)
	}
	devs, err := lab.Daemon.Devices()
	if err != nil {
		t.Fatalf("vrdmad after the unplug: %v", err)
	}
	for _, d := range devs {
		if d.Connected || d.PinnedBytes != 0 {
			t.Errorf("device after the unplug: %+v", d)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
