package guestvm

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

func validStack() StackConfig {
	return StackConfig{Name: "server", QEMU: "/q", Kernel: "/k", Initrd: "/i", Command: "ib_write_bw -d vrdma0",
		NIC: &qemu.NIC{ID: "net0", MAC: "52:54:00:00:00:01"}, IP: netip.MustParsePrefix("10.11.0.1/24"),
		Hosts: []Host{{"server", netip.MustParseAddr("10.11.0.1")}, {"client", netip.MustParseAddr("10.11.0.2")}}}
}

func TestStackValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*StackConfig)
		field string // "" = valid
	}{
		{"valid", func(*StackConfig) {}, ""},
		{"no nic, no ip", func(c *StackConfig) { c.NIC, c.IP = nil, netip.Prefix{} }, ""},
		{"default name", func(c *StackConfig) { c.Name = "" }, ""},
		{"quotes and newlines in the command", func(c *StackConfig) { c.Command = "echo \"a b\" 'c'\nexit 3" }, ""},
		{"no qemu", func(c *StackConfig) { c.QEMU = "" }, "QEMU"},
		{"no kernel", func(c *StackConfig) { c.Kernel = "" }, "Kernel"},
		{"no initrd", func(c *StackConfig) { c.Initrd = "" }, "Initrd"},
		{"bad name", func(c *StackConfig) { c.Name = "a_b" }, "Name"},
		{"name starts with dash", func(c *StackConfig) { c.Name = "-a" }, "Name"},
		{"no command", func(c *StackConfig) { c.Command = " \n" }, "Command"},
		{"nul in command", func(c *StackConfig) { c.Command = "a\x00b" }, "Command"},
		{"long command", func(c *StackConfig) { c.Command = strings.Repeat("x", 1600) }, "Command"},
		{"ipv6", func(c *StackConfig) { c.IP = netip.MustParsePrefix("fd00::1/64") }, "IP"},
		{"ip without nic", func(c *StackConfig) { c.NIC = nil }, "IP"},
		{"bad host", func(c *StackConfig) { c.Hosts[1].Name = "a b" }, "Hosts[1]"},
		{"host without address", func(c *StackConfig) { c.Hosts[0].IP = netip.Addr{} }, "Hosts[0]"},
		{"too many hosts", func(c *StackConfig) { c.Hosts = make([]Host, maxHosts+1) }, "Hosts"},
		{"short device wait", func(c *StackConfig) { c.DeviceWait = time.Millisecond }, "DeviceWait"},
		{"hugepages exceed ram", func(c *StackConfig) { c.MemoryMiB = 256; c.HugePages = 128 }, "HugePages"},
		{"append quote", func(c *StackConfig) { c.Append = `a="b"` }, "Append"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validStack()
			tt.edit(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want a *ConfigError", err)
			}
			if ce.Field != tt.field {
				t.Fatalf("got field %q, want %q (%v)", ce.Field, tt.field, err)
			}
		})
	}
}

func TestStackAppendLine(t *testing.T) {
	c := validStack()
	c.Command = "echo 'a b' \"$X\" | cat; exit 3"
	c.Gate, c.AnnounceListen = true, true
	c.DeviceWait = 1500 * time.Millisecond
	c.HugePages = 8
	c.Append = "loglevel=7"
	got := c.withDefaults().appendLine()
	b64 := base64.StdEncoding.EncodeToString([]byte(c.Command))
	want := "console=ttyS0 quiet panic=-1 no_timer_check vrdma.console=ttyS1 vrdma.hostname=server vrdma.ip=10.11.0.1/24 " +
		"vrdma.host=server:10.11.0.1 vrdma.host=client:10.11.0.2 vrdma.gate=1 vrdma.listen=1 vrdma.devwait=2 " +
		"vrdma.hugepages=8 vrdma.cmd=" + b64 + " loglevel=7"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// The command line has no quoting: the command travels as one word.
	if strings.ContainsAny(b64, " \"'") {
		t.Fatalf("base64 %q holds a space or quote", b64)
	}
	got = StackConfig{Name: "vm", Command: "true"}.withDefaults().appendLine()
	want = "console=ttyS0 quiet panic=-1 no_timer_check vrdma.console=ttyS1 vrdma.hostname=vm vrdma.cmd=dHJ1ZQ=="
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestSplitLine(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"hello", []string{"hello"}},
		{"VRDMA-CMD-EXIT 0", []string{"VRDMA-CMD-EXIT 0"}},
		{"partialVRDMA-CMD-EXIT 3", []string{"partial", "VRDMA-CMD-EXIT 3"}},
		{"a VRDMA-CMD-EXIT x", []string{"a VRDMA-CMD-EXIT x"}},
		{"a VRDMA-CMD-EXIT 0 and more", []string{"a VRDMA-CMD-EXIT 0 and more"}},
		{"aVRDMA-CMD-EXITS 0", []string{"aVRDMA-CMD-EXITS 0"}},
		{"VRDMA-CMD-EXIT 1VRDMA-CMD-EXIT 2", []string{"VRDMA-CMD-EXIT 1", "VRDMA-CMD-EXIT 2"}},
	}
	for _, tt := range tests {
		if got := splitLine(tt.in); strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("splitLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// stackConsole is a stack guest's console up to VRDMA-EXIT; cmd is the
// command's output.
func stackConsole(cmd string, code string) string {
	return "VRDMA-INIT 6.1.0-57-cloud-amd64\n" +
		"vrdma-init: modules loaded: virtio ib_core ib_uverbs vrdma\n" +
		"vrdma-init: vrdma0 gid 0 fe80:0000:0000:0000:5054:00ff:fe00:0001 RoCE v2 eth0\n" +
		"VRDMA-CMD-START 2.41\n" + cmd +
		"VRDMA-CMD-EXIT " + code + "\n" +
		"VRDMA-RMMOD ok\n" +
		"VRDMA-KERNEL-WARNING [   3.1] WARNING: CPU: 0 PID: 1 at x\n" +
		"VRDMA-EXIT " + code + "\n"
}

func TestRunCommand(t *testing.T) {
	tests := []struct {
		name      string
		console   string
		code      int
		reported  bool
		exited    bool
		gone      bool
		cmdLines  []string // the lines marked Command
		errors    int
		warnings  int
		rmmod     string
		startedOK bool
	}{
		{"success", stackConsole("out 1\nVRDMA-LISTEN 18515\nout 2\n", "0"), 0, true, true, false,
			[]string{"out 1", "out 2"}, 0, 1, "ok", true},
		{"exit code", stackConsole("VRDMA-EXIT 9\nVRDMA-ERROR from the command\n", "3"), 3, true, true, false,
			[]string{"VRDMA-EXIT 9", "VRDMA-ERROR from the command"}, 0, 1, "ok", true},
		{"no final newline", stackConsole("line\npartial", "0"), 0, true, true, false,
			[]string{"line", "partial"}, 0, 1, "ok", true},
		{"init fails", "VRDMA-INIT 6.1\nVRDMA-ERROR no vrdma.cmd\nVRDMA-EXIT 125\n", ExitHarness, false, true, false,
			nil, 1, 0, "", false},
		{"init error, command runs", "VRDMA-ERROR insmod vrdma: x\nVRDMA-CMD-START 1\nVRDMA-CMD-EXIT 0\nVRDMA-EXIT 0\n", 0, true, true, false,
			nil, 1, 0, "", true},
		{"guest dies in the command", "VRDMA-INIT 6.1\nVRDMA-CMD-START 1\nout\n", ExitHarness, false, false, true,
			[]string{"out"}, 0, 0, "", true},
		{"guest dies after the command", "VRDMA-CMD-START 1\nVRDMA-CMD-EXIT 4\n", 4, true, false, true,
			nil, 0, 0, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGuest(tt.console)
			var cmdLines []string
			var all []string
			res, err := g.RunCommand(context.Background(), func(l StackLine) {
				all = append(all, l.Text)
				if l.Command {
					cmdLines = append(cmdLines, l.Text)
				}
			})
			if tt.gone {
				var ge *GuestError
				if !errors.Is(err, ErrGuestGone) || !errors.As(err, &ge) {
					t.Fatalf("got %v, want ErrGuestGone", err)
				}
			} else if err != nil {
				t.Fatalf("got %v, want nil", err)
			}
			if res.ExitCode != tt.code || res.Reported != tt.reported || res.Exited != tt.exited || res.Started != tt.startedOK {
				t.Errorf("got code %d reported %v exited %v started %v, want %d %v %v %v",
					res.ExitCode, res.Reported, res.Exited, res.Started, tt.code, tt.reported, tt.exited, tt.startedOK)
			}
			if strings.Join(cmdLines, "|") != strings.Join(tt.cmdLines, "|") {
				t.Errorf("command lines: got %q, want %q", cmdLines, tt.cmdLines)
			}
			if len(res.Errors) != tt.errors || len(res.KernelWarnings) != tt.warnings || res.Rmmod != tt.rmmod {
				t.Errorf("got errors %q, warnings %q, rmmod %q; want %d, %d, %q", res.Errors, res.KernelWarnings, res.Rmmod, tt.errors, tt.warnings, tt.rmmod)
			}
			// Every line reaches out, up to VRDMA-EXIT.
			if want := strings.Count(tt.console, "\n") + strings.Count(tt.console, "partialVRDMA"); tt.exited && len(all) != want {
				t.Errorf("out saw %d lines, want %d: %q", len(all), want, all)
			}
		})
	}
}

func TestRunCommandContext(t *testing.T) {
	g := &Guest{name: "g", line: newLineLog(), done: make(chan struct{})}
	g.line.append("VRDMA-CMD-START 1")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res, err := g.RunCommand(ctx, nil)
	if !errors.Is(err, context.DeadlineExceeded) || res.ExitCode != ExitTimeout || !res.Started || res.Reported {
		t.Fatalf("got (%+v, %v), want the deadline and ExitTimeout", res, err)
	}
}

// pipeGuest is a fake guest whose console the test writes (w) and whose
// protocol line it reads (r: what the harness wrote to the guest).
func pipeGuest(t *testing.T, name string) (g *Guest, w io.WriteCloser, r *bufio.Reader) {
	t.Helper()
	cr, cw := io.Pipe()
	hostEnd, guestEnd := net.Pipe()
	g = &Guest{name: name, line: newLineLog(), done: make(chan struct{}), conn: hostEnd}
	go readLines(cr, g.line)
	t.Cleanup(func() {
		cw.Close()
		hostEnd.Close()
		guestEnd.Close()
	})
	return g, cw, bufio.NewReader(guestEnd)
}

func TestRelease(t *testing.T) {
	g, w, r := pipeGuest(t, "client")
	errc := make(chan error, 1)
	go func() { errc <- g.Release(context.Background()) }()
	// Nothing is written before VRDMA-WAIT.
	io.WriteString(w, "VRDMA-INIT 6.1\nvrdma-init: eth0 up\n")
	select {
	case err := <-errc:
		t.Fatalf("Release returned %v before VRDMA-WAIT", err)
	case <-time.After(50 * time.Millisecond):
	}
	io.WriteString(w, "VRDMA-WAIT\n")
	line, err := r.ReadString('\n')
	if err != nil || line != "VRDMA-GO\n" {
		t.Fatalf("guest read %q, %v; want VRDMA-GO", line, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// A console that closes before VRDMA-WAIT fails Release.
	g2, w2, _ := pipeGuest(t, "client2")
	w2.Close()
	if err := g2.Release(context.Background()); err == nil {
		t.Fatal("Release on a closed console succeeded")
	}
}

func TestGate(t *testing.T) {
	tests := []struct {
		name   string
		ready  time.Duration
		server string // the server's console
		want   string
	}{
		{"listen", time.Hour, "VRDMA-CMD-START 1\nsome output\nVRDMA-LISTEN 18515\n", "listen"},
		{"server command ended", time.Hour, "VRDMA-CMD-START 1\nVRDMA-CMD-EXIT 1\n", "server-ended"},
		{"server ended mid-line", time.Hour, "VRDMA-CMD-START 1\nerrVRDMA-CMD-EXIT 1\n", "server-ended"},
		{"init failed", time.Hour, "VRDMA-ERROR no vrdma.cmd\nVRDMA-EXIT 125\n", "server-ended"},
		{"ready timeout", 30 * time.Millisecond, "VRDMA-CMD-START 1\n", "ready-timeout"},
		{"immediately", -1, "VRDMA-CMD-START 1\n", "immediately"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, sw, _ := pipeGuest(t, "server")
			c, cw, cr := pipeGuest(t, "client")
			p := &StackPair{Server: s, Client: c, cfg: StackPairConfig{ReadyTimeout: tt.ready}}
			whyc := make(chan string, 1)
			go func() { whyc <- p.gate(context.Background()) }()
			io.WriteString(cw, "VRDMA-WAIT\n")
			io.WriteString(sw, tt.server)
			line, err := cr.ReadString('\n')
			if err != nil || line != "VRDMA-GO\n" {
				t.Fatalf("client read %q, %v; want VRDMA-GO", line, err)
			}
			if why := <-whyc; why != tt.want {
				t.Fatalf("released for %q, want %q", why, tt.want)
			}
		})
	}
	// The server's console closing releases the client too.
	s, sw, _ := pipeGuest(t, "server")
	c, cw, cr := pipeGuest(t, "client")
	p := &StackPair{Server: s, Client: c, cfg: StackPairConfig{ReadyTimeout: time.Hour}}
	go p.gate(context.Background())
	io.WriteString(cw, "VRDMA-WAIT\n")
	sw.Close()
	if line, err := cr.ReadString('\n'); err != nil || line != "VRDMA-GO\n" {
		t.Fatalf("client read %q, %v; want VRDMA-GO", line, err)
	}
	// A cancelled gate releases nobody.
	s2, _, _ := pipeGuest(t, "server")
	c2, _, _ := pipeGuest(t, "client")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if why := (&StackPair{Server: s2, Client: c2, cfg: StackPairConfig{ReadyTimeout: time.Hour}}).gate(ctx); why != "" {
		t.Fatalf("cancelled gate released for %q", why)
	}
}

func TestStackPairExitCode(t *testing.T) {
	ok := CommandResult{Reported: true, ExitCode: 0}
	fail := func(c int) CommandResult { return CommandResult{Reported: true, ExitCode: c} }
	gone := CommandResult{ExitCode: ExitHarness}
	timeout := CommandResult{ExitCode: ExitTimeout}
	tests := []struct {
		name string
		res  StackPairResult
		want int
	}{
		{"both ok", StackPairResult{Server: ok, Client: ok}, 0},
		{"server fails", StackPairResult{Server: fail(3), Client: ok}, 3},
		{"client fails", StackPairResult{Server: ok, Client: fail(4)}, 4},
		{"both fail: the client's", StackPairResult{Server: fail(3), Client: fail(4)}, 4},
		{"server gone", StackPairResult{Server: gone, Client: ok}, ExitHarness},
		{"client gone, server failed", StackPairResult{Server: fail(2), Client: gone}, ExitHarness},
		{"timeout", StackPairResult{Server: timeout, Client: timeout}, ExitTimeout},
		{"server stopped after the client failed", StackPairResult{Server: timeout, Client: fail(7), ServerStopped: true}, 7},
		{"client stopped after the server failed", StackPairResult{Server: fail(5), Client: gone, ClientStopped: true}, 5},
		{"stopped after the peer succeeded", StackPairResult{Server: timeout, Client: ok, ServerStopped: true}, ExitTimeout},
		{"failed with code 0 but unreported", StackPairResult{Server: CommandResult{}, Client: ok}, ExitHarness},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.res.ExitCode(); got != tt.want {
				t.Fatalf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestStartStackPairRejectsBadConfigWithoutQEMU(t *testing.T) {
	c := validStack()
	p, err := StartStackPair(context.Background(), StackPairConfig{Server: c, Client: c})
	if p != nil || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got (%v, %v), want both named server rejected", p, err)
	}
	bad := validStack()
	bad.Name, bad.Command = "client", ""
	if _, err := StartStackPair(context.Background(), StackPairConfig{Server: c, Client: bad}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "client") {
		t.Fatalf("got %v, want the client's config rejected", err)
	}
}
