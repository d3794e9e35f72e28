package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/impair"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// TestRoCESprayDaemons: two vrdmads on hosts A and B joined by four
// parallel paths (netlab.MultiPath, each path its own address pair,
// through the user-space impairment hop in M), each vrdmad bound to its
// four addresses. vrdma-perf --paths 4 sprays one QP over them: with 1%
// loss on one path, then with another path taken down in the middle of a
// run, every operation completes with every byte verified by both sides,
// and the endpoints of all four addresses carried traffic.
func TestRoCESprayDaemons(t *testing.T) {
	vrdmad := needBinary(t, "vrdmad")
	perf := needBinary(t, "vrdma-perf")
	lab := netlab.NewT(t)
	mp, err := lab.NewMultiPath(4)
	if err != nil {
		t.Fatal(err)
	}
	hop, err := impair.Interpose(mp, impair.Config{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hop.Close() })
	if err := hop.SetRule(0, impair.Rule{Loss: 0.01}); err != nil {
		t.Fatal(err)
	}
	metricsA := t.TempDir() + "/metrics.sock"
	start := func(ns *netlab.NS, b bool, extra ...string) *vrdmadproc.Proc {
		var args []string
		for _, p := range mp.Paths {
			a := p.A
			if b {
				a = p.B
			}
			args = append(args, "--roce-bind", a.String())
		}
		p, err := vrdmadproc.Start(context.Background(), vrdmadproc.Config{Binary: vrdmad, NetNS: ns.Name,
			Devices: []string{"d0"}, Args: append(args, extra...), StateDir: vrdmadproc.NoState})
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
	pa, pb := start(mp.A, false, "--metrics", "unix:"+metricsA), start(mp.B, true)

	run := func(i int, op, size, iters string, during func()) {
		t.Helper()
		port := fmt.Sprint(18700 + i)
		args := []string{"--op", op, "-s", size, "-n", iters, "-x", "1", "--paths", "4", "--verify", "--json", "-p", port}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		srv := mp.B.Command(ctx, perf, append([]string{"--socket", pb.Socket("d0")}, args...)...)
		var srvOut, srvErr bytes.Buffer
		srv.Stdout, srv.Stderr = &srvOut, &srvErr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		cli := mp.A.Command(ctx, perf, append(append([]string{"--socket", pa.Socket("d0")}, args...), mp.Paths[0].B.String())...)
		var cliOut, cliErr bytes.Buffer
		cli.Stdout, cli.Stderr = &cliOut, &cliErr
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		if during != nil {
			during()
		}
		cerr, serr := cli.Wait(), srv.Wait()
		if cerr != nil || serr != nil {
			t.Fatalf("%s: client %v: %s%s\nserver %v: %s%s\nvrdmad A:\n%s\nvrdmad B:\n%s", op, cerr, cliOut.String(), cliErr.String(),
				serr, srvOut.String(), srvErr.String(), pa.Log(), pb.Log())
		}
		line := strings.TrimSpace(cliOut.String())
		if k := strings.LastIndexByte(line, '\n'); k >= 0 {
			line = line[k+1:]
		}
		var res struct {
			Verified bool `json:"verified"`
		}
		if err := json.Unmarshal([]byte(line), &res); err != nil || !res.Verified {
			t.Fatalf("%s: client result %q (%v): not verified", op, cliOut.String(), err)
		}
		t.Logf("%s sprayed over 4 paths, 1%% loss on path 0: %s", op, line)
	}
	run(0, "write", "64K", "300", nil)
	run(1, "read", "64K", "200", nil)
	run(2, "send", "16K", "300", nil)
	// Path 1 goes down in the middle of a run and comes back after it.
	run(3, "write", "64K", "1500", func() {
		time.Sleep(300 * time.Millisecond)
		if err := hop.SetRule(1, impair.Rule{Down: true}); err != nil {
			t.Error(err)
		}
	})
	if err := hop.SetRule(1, impair.Rule{}); err != nil {
		t.Fatal(err)
	}
	if c := hop.Counters(0); c.DroppedLoss == 0 {
		t.Errorf("the hop dropped nothing on path 0: %+v", c)
	}

	// Every address of A sent packets: the QP used all four paths.
	m := scrapeUnix(t, metricsA)
	for _, p := range mp.Paths {
		re := regexp.MustCompile(`vrdma_roce_tx_datagrams_total\{address="` + regexp.QuoteMeta(p.A.String()) + `"\} (\d+)`)
		sm := re.FindStringSubmatch(m)
		if sm == nil {
			t.Fatalf("no tx counter for %s:\n%s", p.A, grepLines(m, "vrdma_roce_tx"))
		}
		if n, _ := strconv.Atoi(sm[1]); n == 0 {
			t.Errorf("path %d (%s) carried nothing:\n%s", p.Index, p.A, grepLines(m, "vrdma_roce_tx"))
		}
	}
}
