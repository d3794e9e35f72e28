package main

import (
	"bytes"
	"fmt"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/stacklab"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

func TestParseExec(t *testing.T) {
	o := options{qemuBin: "/q", vrdmad: "/d", kernel: "/bin/guest/vmlinuz", initrd: "/bin/guest/initramfs.img",
		memory: 512, timeout: 5 * time.Minute}
	tests := []struct {
		name      string
		scenario  string
		args      []string
		kernelSet bool
		ok        bool
		check     func(t *testing.T, f execFlags)
	}{
		{"exec defaults", "exec", []string{"--cmd", "ibv_devices"}, false, true, func(t *testing.T, f execFlags) {
			if f.cmd != "ibv_devices" || f.kernel != "/b/guest-stack/vmlinuz" || f.initrd != "/b/guest-stack/initramfs.img" ||
				f.memory != 512 || f.smp != 1 || f.timeout != 5*time.Minute || f.qemuBin != "/q" || f.vrdmad != "/d" || f.quiet || f.verbose {
				t.Errorf("got %+v", f)
			}
		}},
		{"global kernel kept", "exec", []string{"--cmd", "x"}, true, true, func(t *testing.T, f execFlags) {
			if f.kernel != "/bin/guest/vmlinuz" {
				t.Errorf("got kernel %q, want the global flag's", f.kernel)
			}
		}},
		{"exec flags", "exec", []string{"--cmd", "x", "--timeout", "1m", "--memory", "1024", "--smp", "2", "-v", "-q",
			"--kernel", "/k", "--initrd", "/i", "--append", "loglevel=7"}, false, true, func(t *testing.T, f execFlags) {
			if f.timeout != time.Minute || f.memory != 1024 || f.smp != 2 || !f.verbose || !f.quiet ||
				f.kernel != "/k" || f.initrd != "/i" || f.append != "loglevel=7" {
				t.Errorf("got %+v", f)
			}
		}},
		{"pair", "exec-pair", []string{"--server", "ib_write_bw", "--client", "ib_write_bw {server}", "--ready-timeout", "-1s", "--grace", "5s"},
			false, true, func(t *testing.T, f execFlags) {
				if f.server != "ib_write_bw" || f.client != "ib_write_bw {server}" || f.readyTimeout != -time.Second || f.grace != 5*time.Second {
					t.Errorf("got %+v", f)
				}
			}},
		{"pair defaults", "exec-pair", []string{"--server", "a", "--client", "b"}, false, true, func(t *testing.T, f execFlags) {
			if f.readyTimeout != guestvm.DefaultReadyTimeout || f.grace != guestvm.DefaultPeerGrace {
				t.Errorf("got %+v", f)
			}
		}},
		{"no cmd", "exec", nil, false, false, nil},
		{"blank cmd", "exec", []string{"--cmd", "  "}, false, false, nil},
		{"unquoted command", "exec", []string{"--cmd", "ibv_rc_pingpong", "server"}, false, false, nil},
		{"exec has no --server", "exec", []string{"--server", "x"}, false, false, nil},
		{"pair needs both", "exec-pair", []string{"--server", "x"}, false, false, nil},
		{"pair has no --cmd", "exec-pair", []string{"--cmd", "x", "--server", "a", "--client", "b"}, false, false, nil},
		{"small memory", "exec", []string{"--cmd", "x", "--memory", "16"}, false, false, nil},
		{"bad smp", "exec", []string{"--cmd", "x", "--smp", "0"}, false, false, nil},
		{"bad timeout", "exec", []string{"--cmd", "x", "--timeout", "0s"}, false, false, nil},
		{"bad grace", "exec-pair", []string{"--server", "a", "--client", "b", "--grace", "0s"}, false, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseExec(tt.scenario, tt.args, o, tt.kernelSet, "/b", io.Discard)
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok=%v", err, tt.ok)
			}
			if err != nil && err != errUsage {
				t.Fatalf("got %v, want errUsage", err)
			}
			if tt.check != nil {
				tt.check(t, f)
			}
		})
	}
}

func TestExecGuests(t *testing.T) {
	one := execGuests(false)
	if len(one) != 1 || one[0].Name != "vm" || one[0].MAC != "52:54:00:00:00:01" || one[0].IP.String() != "10.11.0.1/24" {
		t.Fatalf("got %+v", one)
	}
	two := execGuests(true)
	want := []struct{ name, mac, ip, guid string }{
		{"server", "52:54:00:00:00:01", "10.11.0.1/24", "525400fffe000001"},
		{"client", "52:54:00:00:00:02", "10.11.0.2/24", "525400fffe000002"},
	}
	if len(two) != 2 {
		t.Fatalf("got %+v", two)
	}
	for i, w := range want {
		g := two[i]
		hw, err := net.ParseMAC(g.MAC)
		var guid string
		if err == nil {
			var g64 uint64
			g64, err = abi.GUIDOfMAC(hw)
			guid = fmt.Sprintf("%016x", g64)
		}
		if g.Name != w.name || g.MAC != w.mac || g.IP.String() != w.ip || err != nil || guid != w.guid {
			t.Errorf("guest %d: got %+v (guid %s, %v), want %+v", i, g, guid, err, w)
		}
	}
}

func TestSubstitute(t *testing.T) {
	gs := execGuests(true)
	tests := []struct{ in, want string }{
		{"ib_write_bw -d vrdma0 {server}", "ib_write_bw -d vrdma0 10.11.0.1"},
		{"ping -c1 {server} && ping -c1 {client}; echo {server}", "ping -c1 10.11.0.1 && ping -c1 10.11.0.2; echo 10.11.0.1"},
		{"no placeholders {serv} {SERVER}", "no placeholders {serv} {SERVER}"},
	}
	for _, tt := range tests {
		if got := stacklab.Substitute(tt.in, gs); got != tt.want {
			t.Errorf("substitute(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLinePrinter(t *testing.T) {
	lines := []guestvm.StackLine{
		{Text: "VRDMA-INIT 6.1", Kind: guestvm.KindInit},
		{Text: "vrdma-init: eth0 up"},
		{Text: "VRDMA-ERROR insmod vrdma: x", Kind: guestvm.KindError},
		{Text: "VRDMA-CMD-START 2.1", Kind: guestvm.KindCmdStart},
		{Text: " #bytes  BW", Command: true},
		{Text: "VRDMA-LISTEN 18515", Kind: guestvm.KindListen},
		{Text: "VRDMA-CMD-EXIT 0", Kind: guestvm.KindCmdExit},
		{Text: "VRDMA-RMMOD ok", Kind: guestvm.KindRmmod},
		{Text: "VRDMA-RMMOD failed: busy", Kind: guestvm.KindRmmod},
		{Text: "VRDMA-KERNEL-WARNING WARNING: at x", Kind: guestvm.KindKernelWarning},
		{Text: "VRDMA-EXIT 0", Kind: guestvm.KindExit},
	}
	t.Run("all, prefixed", func(t *testing.T) {
		var out, errb bytes.Buffer
		p := &linePrinter{out: &out, err: &errb}
		for _, l := range lines {
			p.print("server", l)
		}
		want := ""
		for _, l := range lines {
			want += "server| " + l.Text + "\n"
		}
		if out.String() != want || errb.Len() != 0 {
			t.Fatalf("got stdout %q stderr %q, want every line prefixed on stdout", out.String(), errb.String())
		}
	})
	t.Run("all, no prefix", func(t *testing.T) {
		var out bytes.Buffer
		p := &linePrinter{out: &out, err: io.Discard}
		p.print("", lines[4])
		if out.String() != " #bytes  BW\n" {
			t.Fatalf("got %q", out.String())
		}
	})
	t.Run("quiet", func(t *testing.T) {
		var out, errb bytes.Buffer
		p := &linePrinter{out: &out, err: &errb, quiet: true}
		for _, l := range lines {
			p.print("client", l)
		}
		if out.String() != "client|  #bytes  BW\n" {
			t.Errorf("stdout %q, want the command's output only", out.String())
		}
		want := "client| VRDMA-ERROR insmod vrdma: x\nclient| VRDMA-RMMOD failed: busy\nclient| VRDMA-KERNEL-WARNING WARNING: at x\n"
		if errb.String() != want {
			t.Errorf("stderr %q, want %q", errb.String(), want)
		}
	})
	t.Run("whole lines from many goroutines", func(t *testing.T) {
		var out bytes.Buffer
		p := &linePrinter{out: &out, err: io.Discard}
		var wg sync.WaitGroup
		for _, role := range []string{"server", "client"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					p.print(role, guestvm.StackLine{Text: strings.Repeat("x", 100), Command: true})
				}
			}()
		}
		wg.Wait()
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if l != "server| "+strings.Repeat("x", 100) && l != "client| "+strings.Repeat("x", 100) {
				t.Fatalf("torn line %q", l)
			}
		}
	})
}

func TestRunExecUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"exec without --cmd", []string{"exec"}, 2, "--cmd is required"},
		{"pair without --client", []string{"exec-pair", "--server", "x"}, 2, "--client are required"},
		{"command too long", []string{"exec", "--cmd", strings.Repeat("echo x; ", 200)}, 2, "shorten the command"},
		{"bad append", []string{"exec", "--cmd", "true", "--append", `a="b c"`}, 2, "Append"},
		{"missing binaries", []string{"--qemu", missing, "--vrdmad", missing, "exec", "--cmd", "true"}, guestvm.ExitHarness, "vrdmad"},
		{"missing image", []string{"--qemu", missing, "exec", "--vrdmad", "/bin/true", "--qemu", "/bin/true", "--kernel", missing, "--cmd", "true"},
			guestvm.ExitHarness, "make guest-stack-image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tt.args, &out, &errb); code != tt.code {
				t.Fatalf("got exit %d, want %d (stderr %q)", code, tt.code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.msg) {
				t.Fatalf("got stderr %q, want it to hold %q", errb.String(), tt.msg)
			}
		})
	}
	// --help: the usage and the flags on standard output, exit 0.
	var out, errb bytes.Buffer
	if code := run([]string{"exec", "--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "Exit status") ||
		!strings.Contains(out.String(), "  --cmd COMMAND\n") || errb.Len() != 0 {
		t.Errorf("exec --help: exit %d, stdout %q, stderr %q; want 0 and the usage with --cmd on stdout", code, out.String(), errb.String())
	}
}
