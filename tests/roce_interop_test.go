package tests

import (
	"encoding/binary"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/pcapfile"
	"github.com/vrdma/vrdma/internal/roceinterop"
)

// interopJob is one perftest run of the guest against the Go server.
type interopJob struct {
	job   string // guest/perftest-jobs' OP:SIZE:ITERS
	op    string
	check func(t *testing.T, run *perftestRun, frames []rocePacket)
}

// TestRoCEInterop boots a Debian generic-kernel guest with rdma_rxe in its
// own network namespace (QEMU's tap there, bridged to a veth) and runs
// perftest's ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_bw and
// ib_write_lat as clients against an RC QP of backend/rdma/roce/rc over
// backend/rdma/roce/udp with plain Go memory in the other namespace,
// speaking perftest's own TCP exchange (for write_lat the Go side plays
// the server's half of the ping-pong with its requester). QEMU's
// filter-dump records the guest's link; every RoCE frame's ICRC is checked
// with the codec (with the IPv4 ID it carried), tshark must find nothing
// malformed, and the data is verified against the capture: every WRITE
// payload is what landed in Go memory at its address, every READ response
// payload is what Go memory held there, every SEND payload is what its
// receive holds, every FETCH_ADD ran once, every ping-pong WRITE carried
// its count.
func TestRoCEInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a TCG guest")
	}
	lab := newInteropLab(t)
	h, tshark := lab.h, lab.tshark
	var ep *udp.Endpoint
	var ln net.Listener
	if err := h.Do(func() error {
		var err error
		if ep, err = udp.Listen(udp.Config{Addr: interopGoIP, RecoverIPv4ID: true}); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(interopGoIP, perftestPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	defer ln.Close()

	pattern := make([]byte, 1<<20)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>8)
	}
	jobs := []interopJob{
		{"write_bw:65536:200", "write_bw", checkWrites},
		{"read_bw:65536:200", "read_bw", checkReads},
		{"atomic_bw:8:200", "atomic_bw", checkAtomics},
		{"send_bw:65536:200", "send_bw", checkSends},
		{"write_lat:64:200", "write_lat", checkLatWrites},
	}
	runs := make(chan *perftestRun, len(jobs))
	serveErr := make(chan error, 1)
	go func() {
		for i := range jobs {
			conn, err := ln.Accept()
			if err != nil {
				serveErr <- err
				return
			}
			op, size, iters := parseJob(jobs[i].job)
			s := &perftestServer{ep: ep, local: interopGoIP, qpn: 0x100 + uint32(i), mrSize: 2 << 20, fill: pattern,
				op: op, size: size, iters: iters}
			run, err := s.serve(conn)
			conn.Close()
			if err != nil {
				serveErr <- err
				return
			}
			runs <- run
		}
		serveErr <- nil
	}()

	dump := filepath.Join(t.TempDir(), "interop.pcap")
	var spec []string
	for _, j := range jobs {
		spec = append(spec, j.job)
	}
	start := time.Now()
	results, glog := lab.runGuest(t, "client", spec, dump)
	if err := <-serveErr; err != nil {
		t.Fatalf("perftest server: %v\n%s", err, glog)
	}
	close(runs)
	t.Logf("guest ran %d jobs in %v; endpoint %+v", len(results), time.Since(start), ep.Counters())
	for _, r := range results {
		t.Logf("guest result: %s", r.Raw)
	}
	if len(results) != len(jobs) {
		t.Fatalf("%d results for %d jobs\n%s", len(results), len(jobs), glog)
	}

	frames := readInteropCapture(t, dump)
	i := 0
	for run := range runs {
		j := jobs[i]
		i++
		var mine []rocePacket
		for _, f := range frames {
			if f.dst == interopGoIP && f.qpn == run.qp.QPN() || f.src == interopGoIP && f.qpn == run.client.QPN {
				mine = append(mine, f)
			}
		}
		if len(mine) == 0 {
			t.Fatalf("%s: no RoCE frames of QP %#x in the capture", j.op, run.qp.QPN())
		}
		c := run.qp.Counters()
		t.Logf("%s: version %s, %d frames, client QPN %#x, QP %+v", j.op, run.version, len(mine), run.client.QPN, c)
		if run.qp.Err() {
			t.Fatalf("%s: our QP is in the error state", j.op)
		}
		j.check(t, run, mine)
	}
	tsharkClean(t, tshark, dump, len(frames))
}

// readInteropCapture reads the filter-dump pcap: every RoCE frame must
// carry a correct ICRC.
func readInteropCapture(t *testing.T, path string) []rocePacket {
	t.Helper()
	_, pkts, err := pcapfile.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var frames []rocePacket
	for _, p := range pkts {
		r, ok := parseRoCE(p)
		if !ok {
			continue
		}
		if !r.icrcOK {
			t.Fatalf("frame %v %s→%s QPN %#x PSN %d: bad ICRC", roceOpNames[r.op], r.src, r.dst, r.qpn, r.psn)
		}
		frames = append(frames, r)
	}
	return frames
}

// bth returns the parsed packet of a frame (the UDP payload).
func framePacket(t *testing.T, f rocePacket) roce.Packet {
	t.Helper()
	b := f.pkt.Data
	off := 14 + 20
	if f.ipv6 {
		off = 14 + 40
	}
	ipLen := len(b)
	if !f.ipv6 {
		ipLen = 14 + int(binary.BigEndian.Uint16(b[16:]))
	}
	p, err := roce.Parse(b[off+8 : ipLen])
	if err != nil {
		t.Fatalf("frame %v PSN %d: %v", roceOpNames[f.op], f.psn, err)
	}
	return p
}

// tsharkClean runs tshark over the capture: nothing malformed, no expert
// error, and as many RoCE (InfiniBand) frames as the codec found.
func tsharkClean(t *testing.T, tshark, dump string, frames int) {
	t.Helper()
	if err := roceinterop.CheckTshark(tshark, dump, frames); err != nil {
		t.Fatal(err)
	}
	t.Logf("tshark: %d RoCE frames, none malformed", frames)
}
