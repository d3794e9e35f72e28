package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/pcapfile"
	"github.com/vrdma/vrdma/internal/rxepair"
)

// Real RoCE v2 packets of Linux soft-RoCE (rdma_rxe), with their ICRCs, as
// test data for the RoCE v2 codec (backend/rdma/roce): TestRxeCapture boots
// an rxe pair (internal/rxepair, as make compare-rxe does), records the
// server's link with QEMU's filter-dump while perftest runs, and checks the
// capture. With -update-rxe-captures it also writes one pcap per perftest
// run (RoCE v2 packets only, bulk runs cut to their first messages) and a
// README into rxeCaptureDir.
//
//	go test ./tests -run 'TestRxeCapture$' -v -update-rxe-captures
var updateRxeCaptures = flag.Bool("update-rxe-captures", false,
	"TestRxeCapture: rewrite backend/rdma/roce/testdata/rxe from a fresh capture")

// rxeCaptureDir is where the captures live, under the repository.
const rxeCaptureDir = "backend/rdma/roce/testdata/rxe"

// rxeCaptureBudget bounds the committed captures' total size.
const rxeCaptureBudget = 320 << 10

// roceJob is one perftest run of a capture.
type roceJob struct {
	job  string // guest/perftest-jobs' OP:SIZE:ITERS
	want []byte // BTH opcodes the run must show
	// keep is how many messages of the run the committed file keeps
	// (0: every packet): bulk runs are cut after their keep-th message,
	// with every packet (acknowledgements included) in that PSN range.
	keep int
}

// roceCapture is one rxe pair's capture.
type roceCapture struct {
	name string
	gid  int // rxepair.GIDIPv4 or GIDIPv6
	ipv6 bool
	jobs []roceJob
}

// BTH opcodes of the RC transport (IBTA vol. 1, 9.2).
const (
	opSendFirst, opSendMiddle, opSendLast, opSendOnly                = 0x00, 0x01, 0x02, 0x04
	opWriteFirst, opWriteMiddle, opWriteLast, opWriteOnly            = 0x06, 0x07, 0x08, 0x0a
	opReadRequest, opReadRespFirst, opReadRespMiddle, opReadRespLast = 0x0c, 0x0d, 0x0e, 0x0f
	opAck, opAtomicAck, opCmpSwap, opFetchAdd                        = 0x11, 0x12, 0x13, 0x14
)

var roceOpNames = map[byte]string{
	0x00: "SEND_FIRST", 0x01: "SEND_MIDDLE", 0x02: "SEND_LAST", 0x03: "SEND_LAST_WITH_IMMEDIATE",
	0x04: "SEND_ONLY", 0x05: "SEND_ONLY_WITH_IMMEDIATE", 0x06: "RDMA_WRITE_FIRST", 0x07: "RDMA_WRITE_MIDDLE",
	0x08: "RDMA_WRITE_LAST", 0x09: "RDMA_WRITE_LAST_WITH_IMMEDIATE", 0x0a: "RDMA_WRITE_ONLY",
	0x0b: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x0c: "RDMA_READ_REQUEST", 0x0d: "RDMA_READ_RESPONSE_FIRST",
	0x0e: "RDMA_READ_RESPONSE_MIDDLE", 0x0f: "RDMA_READ_RESPONSE_LAST", 0x10: "RDMA_READ_RESPONSE_ONLY",
	0x11: "ACKNOWLEDGE", 0x12: "ATOMIC_ACKNOWLEDGE", 0x13: "COMPARE_SWAP", 0x14: "FETCH_ADD",
	0x16: "SEND_LAST_WITH_INVALIDATE", 0x17: "SEND_ONLY_WITH_INVALIDATE",
}

// roceMessageEnd reports whether opcode ends a message (the unit of keep).
func roceMessageEnd(op byte) bool {
	switch op {
	case 0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0a, 0x0b, 0x0f, 0x10, 0x16, 0x17:
		return true
	}
	return false
}

// rxeCaptures are the runs: every operation family over IPv4 (the 64 KiB
// runs segment into 64 packets at rxe's 1024-byte path MTU, 4 KiB ones into
// 4), and a WRITE and a SEND over IPv6 (eth0's link-local GID). atomic_bw
// is ib_atomic_bw's FETCH_AND_ADD, atomic_cs_bw its -A CMP_AND_SWAP
// (guest/perftest-jobs).
var rxeCaptures = []roceCapture{
	{name: "ipv4", gid: rxepair.GIDIPv4, jobs: []roceJob{
		{"write_bw:4096:20", []byte{opWriteFirst, opWriteMiddle, opWriteLast, opAck}, 5},
		{"write_bw:65536:5", []byte{opWriteFirst, opWriteMiddle, opWriteLast, opAck}, 1},
		{"read_bw:4096:20", []byte{opReadRequest, opReadRespFirst, opReadRespMiddle, opReadRespLast}, 5},
		{"read_bw:65536:5", []byte{opReadRequest, opReadRespFirst, opReadRespMiddle, opReadRespLast}, 1},
		{"send_bw:8192:20", []byte{opSendFirst, opSendMiddle, opSendLast, opAck}, 3},
		{"atomic_bw:8:20", []byte{opFetchAdd, opAtomicAck}, 0},
		{"atomic_cs_bw:8:20", []byte{opCmpSwap, opAtomicAck}, 0},
		{"write_lat:2:20", []byte{opWriteOnly}, 0},
		{"send_lat:2:20", []byte{opSendOnly}, 0},
	}},
	{name: "ipv6", gid: rxepair.GIDIPv6, ipv6: true, jobs: []roceJob{
		{"write_bw:4096:20", []byte{opWriteFirst, opWriteMiddle, opWriteLast, opAck}, 5},
		{"send_lat:2:20", []byte{opSendOnly}, 0},
	}},
}

// rocePacket is one RoCE v2 frame of a capture.
type rocePacket struct {
	pkt      pcapfile.Packet
	ipv6     bool
	src, dst netip.Addr
	op       byte
	qpn      uint32
	psn      uint32
	// icrcOK: the ICRC matches the one computed over the masked headers
	// and the payload.
	icrcOK bool
}

// parseRoCE decodes an Ethernet frame holding IPv4 or IPv6, UDP to port
// 4791 and a BTH; ok is false for any other frame.
func parseRoCE(p pcapfile.Packet) (rocePacket, bool) {
	b := p.Data
	if len(b) < 14 || p.Truncated() {
		return rocePacket{}, false
	}
	r := rocePacket{pkt: p}
	var ip []byte // from the IP header to the end of the IP datagram
	var ipHdr int
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		ip = b[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 17 {
			return rocePacket{}, false
		}
		ipHdr = int(ip[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if ipHdr != 20 || tot < ipHdr || tot > len(ip) {
			return rocePacket{}, false
		}
		ip = ip[:tot]
		r.src, r.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	case 0x86dd:
		ip = b[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 17 {
			return rocePacket{}, false
		}
		ipHdr = 40
		tot := 40 + int(binary.BigEndian.Uint16(ip[4:]))
		if tot > len(ip) {
			return rocePacket{}, false
		}
		ip = ip[:tot]
		r.ipv6 = true
		r.src, r.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	default:
		return rocePacket{}, false
	}
	udp := ip[ipHdr:]
	// UDP header, BTH (12), ICRC (4).
	if len(udp) < 8+12+4 || binary.BigEndian.Uint16(udp[2:]) != 4791 || int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
		return rocePacket{}, false
	}
	bth := udp[8:]
	r.op = bth[0]
	r.qpn = uint32(bth[5])<<16 | uint32(bth[6])<<8 | uint32(bth[7])
	r.psn = uint32(bth[9])<<16 | uint32(bth[10])<<8 | uint32(bth[11])
	hdr := roce.IPHeader{Src: r.src, Dst: r.dst}
	if !r.ipv6 {
		hdr.ID, hdr.FlagsFragment = binary.BigEndian.Uint16(ip[4:]), binary.BigEndian.Uint16(ip[6:])
	}
	r.icrcOK = roce.Verify(hdr, binary.BigEndian.Uint16(udp), roce.UDPPort, udp[8:]) == nil
	return r, true
}

// roceRun is the packets of one perftest run.
type roceRun []rocePacket

// splitRuns assigns a capture's RoCE packets to perftest runs, which come
// one after the other and each use a fresh QP on either side: a packet to
// an unseen (destination address, QPN) starts a run when the current run
// has both of its QPs already, else it names the current run's second QP.
func splitRuns(ps []rocePacket) []roceRun {
	var runs []roceRun
	owner := map[string]int{}
	cur := 0 // QPs the last run has
	for _, p := range ps {
		k := fmt.Sprintf("%s/%d", p.dst, p.qpn)
		i, ok := owner[k]
		if !ok {
			if len(runs) == 0 || cur == 2 {
				runs = append(runs, nil)
				cur = 0
			}
			i = len(runs) - 1
			owner[k] = i
			cur++
		}
		runs[i] = append(runs[i], p)
	}
	return runs
}

// trim keeps the first keep messages of a bulk run (one requester, so one
// PSN space): every packet whose PSN lies between the run's first PSN and
// the end of its keep-th message. keep 0 keeps everything.
func (r roceRun) trim(keep int) roceRun {
	if keep == 0 || len(r) == 0 {
		return r
	}
	p0 := r[0].psn
	off := func(psn uint32) uint32 { return (psn - p0) & 0xffffff }
	end, n := uint32(0), 0
	for _, p := range r {
		if roceMessageEnd(p.op) {
			n++
			if n == keep {
				end = off(p.psn)
				break
			}
		}
	}
	if n < keep {
		return r
	}
	var out roceRun
	for _, p := range r {
		if off(p.psn) <= end {
			out = append(out, p)
		}
	}
	return out
}

// histogram is the run's opcode counts, as "RDMA_WRITE_FIRST (0x06) ×5, ..."
// in opcode order.
func (r roceRun) histogram() string {
	n := map[byte]int{}
	for _, p := range r {
		n[p.op]++
	}
	ops := make([]int, 0, len(n))
	for op := range n {
		ops = append(ops, int(op))
	}
	sort.Ints(ops)
	var parts []string
	for _, op := range ops {
		name := roceOpNames[byte(op)]
		if name == "" {
			name = "OPCODE"
		}
		parts = append(parts, fmt.Sprintf("%s (0x%02x) ×%d", name, op, n[byte(op)]))
	}
	return strings.Join(parts, ", ")
}

// repeats counts the packets that repeat an earlier one's source, QP,
// opcode and PSN: rxe's retransmissions and the responder's answers to
// them.
func (r roceRun) repeats() int {
	seen := map[string]bool{}
	n := 0
	for _, p := range r {
		k := fmt.Sprintf("%s/%d/%d/%d", p.src, p.qpn, p.op, p.psn)
		if seen[k] {
			n++
		}
		seen[k] = true
	}
	return n
}

// readmeRow is the end of the run's README row: packets, repeats, opcodes.
func (r roceRun) readmeRow() string {
	return fmt.Sprintf("| %d | %d | %s |", len(r), r.repeats(), r.histogram())
}

func (r roceRun) has(op byte) bool {
	for _, p := range r {
		if p.op == op {
			return true
		}
	}
	return false
}

// captureFile is the committed file name of a capture's job.
func captureFile(c roceCapture, j roceJob) string {
	op, rest, _ := strings.Cut(j.job, ":")
	size, _, _ := strings.Cut(rest, ":")
	return fmt.Sprintf("%s-%s-%s.pcap", c.name, op, size)
}

// perftestCommand is the perftest command line guest/perftest-jobs runs
// for a job (the client's, without the server address).
func perftestCommand(j roceJob, gid int) string {
	f := strings.Split(j.job, ":")
	prog, extra := "ib_"+f[0], ""
	if f[0] == "atomic_cs_bw" {
		prog, extra = "ib_atomic_bw", " -A CMP_AND_SWAP"
	}
	if strings.HasSuffix(f[0], "_bw") {
		extra += " --report_gbits"
	}
	return fmt.Sprintf("%s -d rxe0 -i 1 -x %d -F -s %s -n %s%s", prog, gid, f[1], f[2], extra)
}

// rxePoolBin is the directory of the perftest programs scripts/rxe-image.sh
// unpacked (its package pool); debVersion finds the cached .debs from it.
func rxePoolBin() string {
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "vrdma", "rxe", "pool", "usr", "bin")
}

// TestRxeCapture boots two rxe pairs (IPv4, then IPv6 GID) with a
// filter-dump on the server's netdev, runs rxeCaptures' perftest jobs and
// checks the capture: every RoCE v2 packet whole and with a valid ICRC, of
// the capture's IP version, one run per job in order, each with its
// operation's opcodes. With -update-rxe-captures it rewrites
// rxeCaptureDir. Both guests of a pair must end with VRDMA-EXIT 0 (their
// /init drains the console before powering off). Skips outside CI when
// QEMU or the rxe image is missing; fails in CI. The image must be current
// (make rxe-image): it has ib_send_bw and ib_atomic_bw, and guest/rxe-init
// waits for eth0's IPv6 link-local address before perftest runs.
func TestRxeCapture(t *testing.T) {
	if testing.Short() {
		t.Skip("boots four TCG guests")
	}
	root := repoRoot(t)
	qemuBin := needBinary(t, "qemu-system-x86_64")
	for _, f := range []string{"rxe/vmlinux", "rxe/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(root, "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make rxe-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make rxe-image): %v", f, err)
		}
	}
	dir := t.TempDir()
	initrd := filepath.Join(root, "bin", "rxe", "initramfs.img")
	start := time.Now()
	type written struct {
		c   roceCapture
		j   roceJob
		run roceRun
	}
	var out []written
	kernel := ""
	for _, c := range rxeCaptures {
		dump := filepath.Join(dir, c.name+".pcap")
		jobs := make([]string, len(c.jobs))
		for i, j := range c.jobs {
			jobs[i] = j.job
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		t0 := time.Now()
		_, log, err := rxepair.Run(ctx, rxepair.Config{
			QEMU: qemuBin, Kernel: filepath.Join(root, "bin", "rxe", "vmlinux"), Initrd: initrd,
			Jobs: jobs, GID: c.gid,
			ServerQEMUArgs: []string{"-object", "filter-dump,id=dump0,netdev=" + rxepair.NetdevID + ",file=" + dump + ",maxlen=65536"},
		})
		cancel()
		if err != nil {
			t.Fatalf("%s: rxe pair: %v (a job the image lacks? make rxe-image)\n%s", c.name, err, log)
		}
		if m := regexp.MustCompile(`VRDMA-INIT (\S+)`).FindStringSubmatch(log); m != nil {
			kernel = m[1]
		}
		_, pkts, err := pcapfile.ReadFile(dump)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var roce []rocePacket
		for _, p := range pkts {
			r, ok := parseRoCE(p)
			if !ok {
				continue
			}
			if r.ipv6 != c.ipv6 {
				t.Errorf("%s: a RoCE v2 packet over IPv6=%v", c.name, r.ipv6)
			}
			if !r.icrcOK {
				t.Errorf("%s: packet at %v (opcode 0x%02x, %d bytes): bad ICRC", c.name, p.Time, r.op, len(p.Data))
			}
			roce = append(roce, r)
		}
		runs := splitRuns(roce)
		t.Logf("%s: %d frames, %d RoCE v2, %d runs in %v", c.name, len(pkts), len(roce), len(runs), time.Since(t0).Round(time.Second))
		if len(runs) != len(c.jobs) {
			t.Fatalf("%s: %d runs (by QP) in the capture, want %d (one per job %q)\n%s", c.name, len(runs), len(c.jobs), jobs, log)
		}
		for i, j := range c.jobs {
			t.Logf("%s %s: %d packets (%d repeats): %s", c.name, j.job, len(runs[i]), runs[i].repeats(), runs[i].histogram())
			for _, op := range j.want {
				if !runs[i].has(op) {
					t.Errorf("%s %s: no %s (0x%02x) packet", c.name, j.job, roceOpNames[op], op)
				}
			}
			out = append(out, written{c, j, runs[i].trim(j.keep)})
		}
	}
	t.Logf("captures took %v", time.Since(start).Round(time.Second))
	// What -update-rxe-captures writes: within the budget. Only then: a
	// trimmed run keeps the retransmissions of its first messages, as
	// many as the (shared, noisy) machine caused, so its size varies from
	// run to run, and nothing is written without the flag.
	if !*updateRxeCaptures || t.Failed() {
		return
	}
	total := 0
	for _, w := range out {
		total += 24
		for _, p := range w.run {
			total += 16 + len(p.pkt.Data)
		}
	}
	if total > rxeCaptureBudget {
		t.Fatalf("the trimmed captures take %d bytes, more than %d: lower keep, or run again on a quieter machine", total, rxeCaptureBudget)
	}
	dst := filepath.Join(root, rxeCaptureDir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	old, _ := filepath.Glob(filepath.Join(dst, "*.pcap"))
	for _, f := range old {
		os.Remove(f)
	}
	var rows []string
	for _, w := range out {
		ps := make([]pcapfile.Packet, len(w.run))
		for i, p := range w.run {
			ps[i] = p.pkt
		}
		name := captureFile(w.c, w.j)
		if err := pcapfile.WriteFile(filepath.Join(dst, name), 65536, false, ps); err != nil {
			t.Fatal(err)
		}
		kept := "every packet"
		if w.j.keep > 0 {
			kept = fmt.Sprintf("first %d message(s)", w.j.keep)
		}
		rows = append(rows, fmt.Sprintf("| `%s` | `%s` | %s %s", name, perftestCommand(w.j, w.c.gid), kept, w.run.readmeRow()))
	}
	qv, _ := exec.Command(qemuBin, "--version").Output()
	qver, _, _ := strings.Cut(string(qv), "\n")
	pver := debVersion("perftest_*.deb", "4.5")
	if v := debVersion("linux-image-"+kernel+"_*.deb", ""); v != "" {
		kernel += " (linux-image " + v + ")"
	}
	readme := fmt.Sprintf(rxeCaptureReadme, kernel, pver, qver, total, strings.Join(rows, "\n"))
	if err := os.WriteFile(filepath.Join(dst, "README.md"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d files (%d bytes) and README.md to %s", len(out), total, rxeCaptureDir)
}

// debVersion is the version in the name of the one .deb matching glob in
// scripts/rxe-image.sh's cache, else def.
func debVersion(glob, def string) string {
	debs, _ := filepath.Glob(filepath.Join(rxePoolBin(), "..", "..", "..", "debs", glob))
	if len(debs) != 1 {
		return def
	}
	f := strings.Split(strings.TrimSuffix(filepath.Base(debs[0]), ".deb"), "_")
	if len(f) != 3 {
		return def
	}
	return f[1]
}

// TestRxeCaptureFiles checks the committed captures without booting
// anything: every record a whole RoCE v2 frame with a valid ICRC, and the
// README's row for every file (its packet count and opcode histogram)
// true.
func TestRxeCaptureFiles(t *testing.T) {
	dir := filepath.Join(repoRoot(t), rxeCaptureDir)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatalf("%v (go test ./tests -run 'TestRxeCapture$' -update-rxe-captures writes it)", err)
	}
	total := 0
	for _, c := range rxeCaptures {
		for _, j := range c.jobs {
			name := captureFile(c, j)
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			total += int(fi.Size())
			_, pkts, err := pcapfile.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			var run roceRun
			for i, p := range pkts {
				r, ok := parseRoCE(p)
				switch {
				case !ok:
					t.Errorf("%s: record %d is not a whole RoCE v2 frame", name, i+1)
				case r.ipv6 != c.ipv6:
					t.Errorf("%s: record %d: IPv6=%v", name, i+1, r.ipv6)
				case !r.icrcOK:
					t.Errorf("%s: record %d: bad ICRC", name, i+1)
				}
				run = append(run, r)
			}
			for _, op := range j.want {
				if !run.has(op) {
					t.Errorf("%s: no %s (0x%02x) packet", name, roceOpNames[op], op)
				}
			}
			row := run.readmeRow()
			if !bytes.Contains(readme, []byte("| `"+name+"` |")) || !bytes.Contains(readme, []byte(row)) {
				t.Errorf("README.md has no row for %s ending %q", name, row)
			}
		}
	}
	if total > rxeCaptureBudget {
		t.Errorf("captures take %d bytes, more than %d", total, rxeCaptureBudget)
	}
}

// TestRoceICRCMask checks the test's ICRC check on a committed frame of
// each IP version: changing a variant field (TTL or hop limit, UDP
// checksum, BTH byte 4) keeps the ICRC valid, changing an invariant byte
// (the payload, the QPN) breaks it.
func TestRoceICRCMask(t *testing.T) {
	for _, name := range []string{"ipv4-write_bw-4096.pcap", "ipv6-write_bw-4096.pcap"} {
		_, pkts, err := pcapfile.ReadFile(filepath.Join(repoRoot(t), rxeCaptureDir, name))
		if err != nil || len(pkts) == 0 {
			t.Fatalf("%s: %d packets, %v", name, len(pkts), err)
		}
		p := pkts[0]
		if r, ok := parseRoCE(p); !ok || !r.icrcOK {
			t.Fatalf("%s: first frame: RoCE %v, ICRC ok %v", name, ok, r.icrcOK)
		}
		ipv6 := binary.BigEndian.Uint16(p.Data[12:]) == 0x86dd
		udp := 14 + 20
		ttl := 14 + 8
		if ipv6 {
			udp, ttl = 14+40, 14+7
		}
		for _, tc := range []struct {
			what string
			off  int
			ok   bool
		}{
			{"TTL/hop limit", ttl, true}, {"UDP checksum", udp + 6, true}, {"BTH resv8a", udp + 8 + 4, true},
			{"QPN", udp + 8 + 7, false}, {"last payload byte", len(p.Data) - 5, false},
		} {
			q := p
			q.Data = append([]byte(nil), p.Data...)
			q.Data[tc.off] ^= 0x5a
			r, ok := parseRoCE(q)
			if !ok || r.icrcOK != tc.ok {
				t.Errorf("%s: %s changed: RoCE %v, ICRC ok %v, want %v", name, tc.what, ok, r.icrcOK, tc.ok)
			}
		}
	}
}

// rxeCaptureReadme is the README of rxeCaptureDir: kernel, perftest and
// QEMU versions, the total size and the table rows.
const rxeCaptureReadme = "# RoCE v2 packets of Linux soft-RoCE (rdma_rxe)" + `

Real RoCE v2 traffic between two Linux rxe devices, with their ICRCs, for
testing the RoCE v2 codec of package roce against the real thing. Written
by

    go test ./tests -run 'TestRxeCapture$' -v -update-rxe-captures

(tests/rxe_capture_test.go), which boots, for each IP version, a pair of
TCG guests of the rxe image (make rxe-image: bin/rxe, Debian's generic
kernel with rdma_rxe over virtio-net, and perftest) joined by QEMU's
-netdev dgram (internal/rxepair, as make compare-rxe does), records the
server guest's netdev (both directions) with

    -object filter-dump,id=dump0,netdev=n0,file=PATH,maxlen=65536

while guest/perftest-jobs runs one perftest after the other, then splits
the capture into one file per perftest run (by the runs' fresh QPs).

- kernel: %s
- perftest: %s (Debian)
- QEMU: %s

The image's guest/rxe-init waits for eth0's IPv6 link-local address to be
usable (duplicate address detection off) before perftest starts: rxe shows
the link-local GID before the address exists, and until then the guest
answers no neighbour solicitation, so the peer's QP could not reach RTR.
Without -update-rxe-captures the test still boots, captures and checks
every run's opcodes and ICRCs, writing nothing here; TestRxeCaptureFiles
checks these files and this table.

Format: classic pcap, LINKTYPE_ETHERNET, microsecond timestamps, whole
frames (no snapshot cut, so every ICRC checks). Only RoCE v2 frames (UDP
to port 4791) are kept: ARP, IPv6 neighbour discovery and perftest's TCP
exchange of QP numbers are dropped. The ICRC is CRC-32 over 8 bytes of
0xff, the IP and UDP headers with their variant fields (IPv4 TOS, TTL,
checksum; IPv6 traffic class, flow label, hop limit; UDP checksum) set to
ones, the BTH with its reserved byte 4 set to ones, and the rest of the
datagram; it travels as the CRC's little-endian bytes.

Links: 10.77.0.1 (server, 52:54:00:77:00:01) and 10.77.0.2 (client,
52:54:00:77:00:02); the ipv6-* files use the link-local GIDs
fe80::5054:ff:fe77:1 and fe80::5054:ff:fe77:2 (perftest -x 0), the ipv4-*
ones ::ffff:10.77.0.x (-x 1). Path MTU 1024 (eth0's MTU 1500). perftest
exchanges QPs over TCP (no RDMA CM): QP numbers start at 17 on both sides.
The client is the requester of every bulk run; in the *_lat runs both
sides send. Bulk runs are cut after their first messages: every packet
whose PSN lies in the kept messages' range (their acknowledgements
included) is kept, so sequences have no holes. Repeats are packets with
the source, QP, opcode and PSN of an earlier one: rxe's retransmissions
(its timers run slow under TCG) and the answers to them. Total: %d bytes.

| File | perftest (both sides; the client adds the server's address) | Kept | Packets | Repeats | Opcodes |
|---|---|---|---|---|---|
%s
`
