package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestInRange(t *testing.T) {
	for _, tc := range []struct {
		p    string
		want bool
	}{
		{"10.200.0.0/16", true},
		{"10.200.3.1/25", true},
		{"10.200.255.255/32", true},
		{"10.0.0.0/8", false},
		{"10.201.0.1/32", false},
		{"0.0.0.0/0", false},
		{"192.168.1.1/32", false},
		{"fd00:7672::/32", true},
		{"fd00:7672:3:a::1/64", true},
		{"fd00:7673::1/128", false},
		{"fd00::/16", false},
		{"::/0", false},
		{"::ffff:10.200.0.1/128", false},
	} {
		t.Run(tc.p, func(t *testing.T) {
			if got := InRange(netip.MustParsePrefix(tc.p)); got != tc.want {
				t.Errorf("InRange(%s) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestParsePid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"vrdmalab-123-4-a", 123, true},
		{"vrdmalab-123-", 123, true},
		{"vrdmalab-123", 0, false},
		{"vrdmalabx-123-4-a", 0, false},
		{"vrdmalab--4-a", 0, false},
		{"vrdmalab-0-4-a", 0, false},
		{"other-123-4-a", 0, false},
	} {
		pid, ok := parsePid("vrdmalab", tc.name)
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("parsePid(%q) = %d, %v, want %d, %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

func TestBadInputsRunNothing(t *testing.T) {
	// No root needed: the checks come before any command.
	n := &NS{lab: &Lab{ipPath: "/nonexistent/ip"}, Name: "x", Label: "x"}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"addr outside", n.AddAddr("p0", netip.MustParsePrefix("192.168.0.1/24")), ErrAddress},
		{"addr v6 outside", n.AddAddr("p0", netip.MustParsePrefix("fe80::1/64")), ErrAddress},
		{"default route", n.AddRoute(Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Dev: "p0"}), ErrAddress},
		{"gateway outside", n.AddRoute(Route{Dst: Range4, Via: netip.MustParseAddr("10.0.0.1")}), ErrAddress},
		{"long ifname", n.SetUp("abcdefghijklmnop", true), ErrName},
		{"ifname slash", n.SetUp("a/b", true), ErrName},
		{"sysctl outside net", n.Sysctl("kernel.panic", "1"), ErrName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Errorf("got %v, want %v", tc.err, tc.want)
			}
		})
	}
	if _, err := New(Config{Prefix: "bad-prefix"}); !errors.Is(err, ErrName) {
		t.Errorf("New with prefix bad-prefix: got %v, want %v", err, ErrName)
	}
}

// netnsList returns `ip netns list`'s names.
func netnsList(t *testing.T) []string {
	t.Helper()
	ip, err := IPPath()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ip, "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// rootLinks returns the link names of the test's own namespace.
func rootLinks(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	slices.Sort(names)
	return names
}

func TestLabCreatesAndRemovesEverything(t *testing.T) {
	Require(t)
	before := netnsList(t)
	linksBefore := rootLinks(t)
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mp, err := l.NewMultiPath(2)
	if err != nil {
		t.Fatal(err)
	}
	extra, err := l.AddNS("guest")
	if err != nil {
		t.Fatal(err)
	}
	if err := extra.AddBridge("br0"); err != nil {
		t.Fatal(err)
	}
	if err := extra.AddTap("tap0"); err != nil {
		t.Fatal(err)
	}
	if err := extra.SetMaster("tap0", "br0"); err != nil {
		t.Fatal(err)
	}
	if err := l.Veth(extra, "up0", mp.A, "guest0"); err != nil {
		t.Fatal(err)
	}
	tap, err := extra.OpenTap("tap0", true)
	if err != nil {
		t.Fatal(err)
	}
	tap.Close()

	during := netnsList(t)
	names := l.Namespaces()
	if len(names) != 4 {
		t.Fatalf("got %d namespaces %v, want 4", len(names), names)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, fmt.Sprintf("%s-%d-", DefaultPrefix, os.Getpid())) {
			t.Errorf("namespace %q lacks the prefix", n)
		}
		if !slices.Contains(during, n) {
			t.Errorf("namespace %q not in ip netns list %v", n, during)
		}
	}
	if got := rootLinks(t); !slices.Equal(got, linksBefore) {
		t.Errorf("links in the test's namespace: got %v, want %v", got, linksBefore)
	}

	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	after := netnsList(t)
	for _, n := range names {
		if slices.Contains(after, n) {
			t.Errorf("namespace %q still listed after Close", n)
		}
	}
	// Only this process's: other test binaries make their own meanwhile.
	mine := fmt.Sprintf("%s-%d-", DefaultPrefix, os.Getpid())
	for _, n := range after {
		if strings.HasPrefix(n, mine) && !slices.Contains(before, n) {
			t.Errorf("namespace %q appeared and stayed", n)
		}
	}
	if got := rootLinks(t); !slices.Equal(got, linksBefore) {
		t.Errorf("links after close: got %v, want %v", got, linksBefore)
	}
	if _, err := l.AddNS("late"); !errors.Is(err, ErrClosed) {
		t.Errorf("AddNS after Close: got %v, want %v", err, ErrClosed)
	}
}

func threadNetns(t testing.TB) string {
	s, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDoEntersAndLeavesNoThreadBehind(t *testing.T) {
	l := NewT(t)
	n, err := l.AddNS("do")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(nsPath(n.Name), &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	runtime.LockOSThread()
	home := threadNetns(t)
	runtime.UnlockOSThread()
	if home == want {
		t.Fatal("test runs inside the lab's namespace")
	}
	const rounds = 50
	for range rounds {
		var got string
		if err := n.Do(func() error { got = threadNetns(t); return nil }); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("inside Do: got %s, want %s", got, want)
		}
	}
	// Every thread left in the pool is still in the home namespace.
	var wg sync.WaitGroup
	errs := make(chan string, 4*rounds)
	for range 4 * rounds {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if got := threadNetns(t); got != home {
				errs <- got
			}
			time.Sleep(time.Millisecond) // keep many threads busy at once
		})
	}
	wg.Wait()
	close(errs)
	for got := range errs {
		t.Errorf("a pool thread is in %s, want %s", got, home)
	}
	if err := n.Do(func() error { return os.ErrInvalid }); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Do's error: got %v, want %v", err, os.ErrInvalid)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want boom", r)
			}
		}()
		n.Do(func() error { panic("boom") })
	}()
}

func TestCommandRunsInside(t *testing.T) {
	l := NewT(t)
	mp, err := l.NewMultiPath(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ip, _ := IPPath()
	out, err := mp.B.Command(ctx, ip, "-o", "addr", "show", "dev", mp.Paths[0].BLink).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), mp.Paths[0].B.String()+"/25") {
		t.Errorf("ip addr in B: got %q, want %s", out, mp.Paths[0].B)
	}
	// Close kills what is still running.
	cmd := mp.A.Command(context.Background(), "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("sleep exited cleanly, want killed")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sleep still running 20 s after Close")
	}
}

// exchange sends from src (in a) to dst (in b) until one datagram arrives
// (the first may wait for neighbour discovery) and returns the source
// address b saw.
func exchange(t *testing.T, a, b *NS, src, dst netip.Addr) netip.AddrPort {
	t.Helper()
	rx, err := b.ListenUDP(netip.AddrPortFrom(dst, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := a.ListenUDP(netip.AddrPortFrom(src, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	buf := make([]byte, 64)
	for range 50 {
		if _, err := tx.WriteToUDPAddrPort([]byte("hello"), to); err != nil {
			t.Fatalf("send %s -> %s: %v", src, to, err)
		}
		rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, from, err := rx.ReadFromUDPAddrPort(buf)
		if err == nil {
			if string(buf[:n]) != "hello" {
				t.Fatalf("got %q, want hello", buf[:n])
			}
			return from
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatal(err)
		}
	}
	t.Fatalf("nothing from %s reached %s in 10 s", src, to)
	return netip.AddrPort{}
}

func TestMultiPathCrossesEachPathWithAddresses(t *testing.T) {
	l := NewT(t)
	mp, err := l.NewMultiPath(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range mp.Paths {
		for _, fam := range []struct {
			name   string
			src, d netip.Addr
		}{{"v4", p.A, p.B}, {"v6", p.A6, p.B6}} {
			t.Run(fmt.Sprintf("path%d/%s", p.Index, fam.name), func(t *testing.T) {
				from := exchange(t, mp.A, mp.B, fam.src, fam.d)
				if from.Addr() != fam.src {
					t.Errorf("B saw source %s, want %s", from.Addr(), fam.src)
				}
				back := exchange(t, mp.B, mp.A, fam.d, fam.src)
				if back.Addr() != fam.d {
					t.Errorf("A saw source %s, want %s", back.Addr(), fam.d)
				}
			})
		}
	}
}

// rxPackets returns link's received-packet count in n.
func rxPackets(t *testing.T, n *NS, link string) uint64 {
	t.Helper()
	out, err := n.IP("-j", "-s", "link", "show", "dev", link)
	if err != nil {
		t.Fatal(err)
	}
	var v []struct {
		Stats64 struct {
			RX struct {
				Packets uint64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 {
		t.Fatalf("ip -j -s link show %s: %v: %s", link, err, out)
	}
	return v[0].Stats64.RX.Packets
}

func TestMultiPathPathIUsesLinkI(t *testing.T) {
	l := NewT(t)
	mp, err := l.NewMultiPath(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range mp.Paths {
		before := rxPackets(t, mp.M, p.MALink)
		exchange(t, mp.A, mp.B, p.A, p.B)
		if after := rxPackets(t, mp.M, p.MALink); after <= before {
			t.Errorf("path %d: %s received %d packets before and %d after, want more",
				p.Index, p.MALink, before, after)
		}
	}
}

func TestPathDownDropsUpRestores(t *testing.T) {
	l := NewT(t)
	mp, err := l.NewMultiPath(2)
	if err != nil {
		t.Fatal(err)
	}
	p := mp.Paths[1]
	exchange(t, mp.A, mp.B, p.A, p.B) // neighbours resolved, path works

	rx, err := mp.B.ListenUDP(netip.AddrPortFrom(p.B, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := mp.A.ListenUDP(netip.AddrPortFrom(p.A, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()

	if err := mp.SetPathUp(1, false); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		tx.WriteToUDPAddrPort([]byte("down"), to) // may fail: no carrier
	}
	buf := make([]byte, 64)
	rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, _, err := rx.ReadFromUDPAddrPort(buf); err == nil {
		t.Fatalf("received %q over a path that is down", buf[:n])
	}
	// The other path is unaffected.
	exchange(t, mp.A, mp.B, mp.Paths[0].A, mp.Paths[0].B)

	if err := mp.SetPathUp(1, true); err != nil {
		t.Fatal(err)
	}
	var downs int
	for range 50 {
		tx.WriteToUDPAddrPort([]byte("up"), to)
		rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			continue
		}
		if string(buf[:n]) == "down" {
			downs++
			continue
		}
		if downs != 0 {
			t.Errorf("%d of 20 packets sent while the path was down arrived after, want 0", downs)
		}
		return
	}
	t.Fatal("path did not come back in 10 s")
}

func TestSweepRemovesDeadPidsOnly(t *testing.T) {
	Require(t)
	ip, _ := IPPath()
	const prefix = "vrdmalabsweeptest"
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s-%d-1-a", prefix, dead.Process.Pid)
	live := fmt.Sprintf("%s-%d-1-a", prefix, os.Getpid())
	for _, n := range []string{stale, live} {
		if out, err := exec.Command(ip, "netns", "add", n).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", n, err, out)
		}
		t.Cleanup(func() { exec.Command(ip, "netns", "delete", n).Run() })
	}
	removed, err := Sweep(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{stale}) {
		t.Errorf("Sweep removed %v, want [%s]", removed, stale)
	}
	list := netnsList(t)
	if slices.Contains(list, stale) {
		t.Errorf("%s still listed", stale)
	}
	if !slices.Contains(list, live) {
		t.Errorf("%s (live pid) was removed", live)
	}
}

// TestVethHosts: two namespaces joined by a veth, each end up with its
// addresses, and a UDP datagram from one address reaches the other.
func TestVethHosts(t *testing.T) {
	l := NewT(t)
	a4, b4 := netip.MustParseAddr("10.200.97.1"), netip.MustParseAddr("10.200.97.2")
	extra := netip.MustParseAddr("10.200.97.11")
	a, b, err := l.VethHosts("ha", "hb", []netip.Prefix{netip.PrefixFrom(a4, 24), netip.PrefixFrom(extra, 32)},
		[]netip.Prefix{netip.PrefixFrom(b4, 24)})
	if err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[*NS][]string{a: {"va", a4.String(), extra.String(), "UP"}, b: {"vb", b4.String(), "UP"}} {
		out, err := ns.IP("addr", "show")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q lacks %s", ns.Label, out, w)
			}
		}
	}
	rx, err := b.ListenUDP(netip.AddrPortFrom(b4, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := a.ListenUDP(netip.AddrPortFrom(extra, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if _, err := tx.WriteToUDPAddrPort([]byte("hi"), rx.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 8)
	n, from, err := rx.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "hi" || from.Addr() != extra {
		t.Fatalf("got %q from %v, %v; want \"hi\" from %v", buf[:n], from, err, extra)
	}
}
