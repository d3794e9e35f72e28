package rxepair

import (
	"context"
	"strings"
	"testing"
)

func TestDgramNIC(t *testing.T) {
	a := DgramNIC(4000, 4001, ServerMAC)
	if len(a) != 4 || a[0] != "-netdev" || a[2] != "-device" {
		t.Fatalf("%q", a)
	}
	for _, want := range []string{"dgram,id=" + NetdevID + ",", "local.port=4000", "remote.port=4001", "local.host=127.0.0.1"} {
		if !strings.Contains(a[1], want) {
			t.Errorf("-netdev %q lacks %q", a[1], want)
		}
	}
	if !strings.Contains(a[3], "netdev="+NetdevID) || !strings.HasSuffix(a[3], "mac="+ServerMAC) {
		t.Errorf("-device %q", a[3])
	}
}

func TestFreeUDPPorts(t *testing.T) {
	p1, p2, err := FreeUDPPorts()
	if err != nil || p1 == p2 || p1 <= 0 || p2 <= 0 {
		t.Fatalf("%d %d %v", p1, p2, err)
	}
}

func TestGuestConfig(t *testing.T) {
	c := Config{QEMU: "q", Kernel: "k", Initrd: "i", Jobs: []string{"write_bw:4096:5"}, GID: GIDIPv6}
	g := guestConfig(c, "rxe-client", "client", ClientIP, ServerIP, []string{"-x"})
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rxe.role=client", "rxe.ip=" + ClientIP, "rxe.peer=" + ServerIP, "rxe.runs=1", "rxe.gid=0"} {
		if !strings.Contains(g.Append, want) {
			t.Errorf("append %q lacks %q", g.Append, want)
		}
	}
	if g.Run != "perftest" || len(g.Args) != 1 || len(g.ExtraQEMUArgs) != 1 {
		t.Errorf("%+v", g)
	}
	c.Runs = 3
	if g := guestConfig(c, "rxe-server", "server", ServerIP, "", nil); strings.Contains(g.Append, "rxe.peer") || !strings.Contains(g.Append, "rxe.runs=3") {
		t.Errorf("server append %q", g.Append)
	}
}

func TestRunNoJobs(t *testing.T) {
	if _, _, err := Run(context.Background(), Config{}); err == nil {
		t.Error("no error without jobs")
	}
}
