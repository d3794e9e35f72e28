package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// TestRoCETwoDaemons takes vrdma off the single host: two vrdmads in two
// network namespaces joined by a veth, each with --roce-bind on its end,
// serve one device each; vrdma-perf runs perftest's two-process mode
// between them (the server in one namespace, the client in the other,
// exchanging QPN, GID, rkey and buffer over TCP), sending from GID index
// 1, the host address's GID. Every operation completes with its data
// verified by both sides, so the RC QPs really ran over RoCEv2 on UDP
// 4791 between the namespaces. The devices' JSON lists the host address's
// GID at index 1, and a device added with its own roce_bind has that one
// instead.
func TestRoCETwoDaemons(t *testing.T) {
	vrdmad := needBinary(t, "vrdmad")
	perf := needBinary(t, "vrdma-perf")
	lab := netlab.NewT(t)
	addrA, addrB := netip.MustParseAddr("10.200.91.1"), netip.MustParseAddr("10.200.91.2")
	addr6A, addr6B := netip.MustParseAddr("fd00:7672:91::1"), netip.MustParseAddr("fd00:7672:91::2")
	nsA, nsB := vethHosts(t, lab, "ra", "rb", []netip.Prefix{netip.PrefixFrom(addrA, 24), netip.PrefixFrom(addr6A, 64)},
		[]netip.Prefix{netip.PrefixFrom(addrB, 24), netip.PrefixFrom(addr6B, 64)})
	metricsA := t.TempDir() + "/metrics.sock"
	start := func(ns *netlab.NS, addr, addr6 netip.Addr, extra ...string) *vrdmadproc.Proc {
		p, err := vrdmadproc.Start(context.Background(), vrdmadproc.Config{Binary: vrdmad, NetNS: ns.Name,
			Devices: []string{"d0"}, Args: append([]string{"--roce-bind", addr.String(), "--roce-bind", addr6.String()}, extra...),
			StateDir: vrdmadproc.NoState})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(); err != nil {
				t.Errorf("vrdmad in %s: %v\n%s", ns.Name, err, p.Log())
			}
		})
		return p
	}
	pa, pb := start(nsA, addrA, addr6A, "--metrics", "unix:"+metricsA), start(nsB, addrB, addr6B)

	// The host address's GID is entry 1 of the device's table.
	devs, err := pa.Devices()
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices of A: %v %+v", err, devs)
	}
	if g := devs[0].GIDs; len(g) != 3 || g[1].Index != 1 || g[1].GID != "::ffff:"+addrA.String() || g[2].Index != 2 || g[2].GID != addr6A.String() {
		t.Fatalf("device GIDs %+v, want entry 1 ::ffff:%s and 2 %s", g, addrA, addr6A)
	}

	// Hostile datagrams first: counted by reason and dropped, and the
	// daemon serves the runs below as if nothing had happened.
	if err := nsB.Do(func() error {
		c, err := nsB.ListenUDP(netip.AddrPortFrom(addrB, 0))
		if err != nil {
			return err
		}
		defer c.Close()
		for _, d := range hostileRoCE(t, c.LocalAddr().(*net.UDPAddr).AddrPort(), addrA) {
			if _, err := c.WriteToUDPAddrPort(d, netip.AddrPortFrom(addrA, 4791)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	ops := []struct {
		op   string
		size string
		gid  string     // the GID index both sides send from
		peer netip.Addr // the server's address, for the TCP exchange
	}{{"write", "64K", "1", addrB}, {"read", "64K", "1", addrB}, {"send", "8K", "1", addrB}, {"atomic", "8", "1", addrB},
		{"write", "64K", "2", addr6B}}
	for i, o := range ops {
		port := fmt.Sprint(18600 + i)
		args := []string{"--socket", "", "--op", o.op, "-s", o.size, "-n", "200", "-x", o.gid, "--verify", "--json", "-p", port}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		srvArgs := append([]string(nil), args...)
		srvArgs[1] = pb.Socket("d0")
		srv := nsB.Command(ctx, perf, srvArgs...)
		var srvOut, srvErr bytes.Buffer
		srv.Stdout, srv.Stderr = &srvOut, &srvErr
		if err := srv.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		cliArgs := append([]string(nil), args...)
		cliArgs[1] = pa.Socket("d0")
		cli := nsA.Command(ctx, perf, append(cliArgs, o.peer.String())...)
		out, cerr := cli.Output()
		serr := srv.Wait()
		cancel()
		if cerr != nil || serr != nil {
			var stderr string
			if ee, ok := cerr.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("%s: client %v: %s%s\nserver %v: %s%s\nvrdmad A:\n%s\nvrdmad B:\n%s", o.op, cerr, out, stderr,
				serr, srvOut.String(), srvErr.String(), pa.Log(), pb.Log())
		}
		var res struct {
			Verified bool    `json:"verified"`
			GBytes   float64 `json:"gbytes_per_s"`
		}
		line := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(line, '\n'); i >= 0 {
			line = line[i+1:]
		}
		if err := json.Unmarshal([]byte(line), &res); err != nil || !res.Verified {
			t.Fatalf("%s: client result %q (%v): not verified", o.op, out, err)
		}
		t.Logf("%s over RoCEv2 (GID index %s) between namespaces: %s", o.op, o.gid, line)
	}

	// The endpoint counted the hostile datagrams by reason, and the
	// runs' packets as delivered.
	m := scrapeUnix(t, metricsA)
	for _, want := range []string{
		`vrdma_roce_rx_dropped_total{address="10.200.91.1",reason="icrc"} 1`,
		`vrdma_roce_rx_dropped_total{address="10.200.91.1",reason="malformed"} 2`,
		`vrdma_roce_rx_dropped_total{address="10.200.91.1",reason="unknown_qp"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "vrdma_roce_"))
		}
	}
	if !strings.Contains(m, `vrdma_roce_rx_delivered_total{address="10.200.91.1"}`) || strings.Contains(m, `vrdma_roce_rx_delivered_total{address="10.200.91.1"} 0`) {
		t.Errorf("no delivered packets counted:\n%s", grepLines(m, "vrdma_roce_"))
	}

	// Per device: roce_bind names the device's own addresses.
	extra := netip.MustParseAddr("10.200.91.11")
	if err := nsA.AddAddr("va", netip.PrefixFrom(extra, 24)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := pa.AddDevice(ctx, controlapi.AddRequest{ID: "d1", Socket: pa.Dir() + "/d1.sock", RoCEBind: []string{extra.String()}})
	if err != nil {
		t.Fatalf("add a device with roce_bind: %v\n%s", err, pa.Log())
	}
	if g := info.GIDs; len(g) != 2 || g[1].GID != "::ffff:"+extra.String() || len(info.RoCEBind) != 1 || info.RoCEBind[0] != extra.String() {
		t.Fatalf("device with roce_bind: gids %+v, roce_bind %v", info.GIDs, info.RoCEBind)
	}
}

// hostileRoCE returns datagrams from src to dst's port 4791 that vrdmad
// must drop: a bad ICRC, a truncated BTH, a length that is no multiple of
// four, and a well-sealed packet to a QP number nobody has.
func hostileRoCE(t *testing.T, src netip.AddrPort, dst netip.Addr) [][]byte {
	t.Helper()
	ip := roce.IPHeader{Src: src.Addr(), Dst: dst, FlagsFragment: roce.IPv4DF}
	seal := func(p roce.Packet) []byte {
		b, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := roce.Seal(ip, src.Port(), 4791, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	unknown := roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PKey: 0xffff, DestQP: 0xfffffe, PSN: 1}, Payload: make([]byte, 16)}
	badICRC := seal(unknown)
	badICRC[len(badICRC)-1] ^= 0xff
	return [][]byte{badICRC, seal(unknown)[:8], append(seal(unknown), 0, 0), seal(unknown)}
}
