package roce

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Test addresses: documentation ranges (RFC 5737, RFC 3849); nothing is sent.
var (
	testIPv4 = IPHeader{
		Src:           netip.MustParseAddr("192.0.2.1"),
		Dst:           netip.MustParseAddr("192.0.2.2"),
		ID:            0,
		FlagsFragment: IPv4DF,
	}
	testIPv6 = IPHeader{
		Src: netip.MustParseAddr("2001:db8::1"),
		Dst: netip.MustParseAddr("2001:db8::2"),
	}
)

const testSrcPort = 0xc0de

// frame returns an Ethernet frame carrying udpPayload in UDP to UDPPort over
// ip, with real (unmasked) values in the fields the ICRC masks: TOS/traffic
// class, TTL/hop limit, flow label, IPv4 header checksum and UDP checksum.
func frame(ip IPHeader, srcPort uint16, udpPayload []byte) []byte {
	udpLen := udpHeaderLen + len(udpPayload)
	var b []byte
	b = append(b, 0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1) // dst, src MAC
	if ip.Is4() {
		b = append(b, 0x08, 0x00)
		h := make([]byte, ipv4HeaderLen)
		h[0] = 0x45
		h[1] = 0x02 // DSCP 0, ECN ECT(0)
		binary.BigEndian.PutUint16(h[2:], uint16(ipv4HeaderLen+udpLen))
		binary.BigEndian.PutUint16(h[4:], ip.ID)
		binary.BigEndian.PutUint16(h[6:], ip.FlagsFragment)
		h[8] = 64
		h[9] = ipProtoUDP
		s, d := ip.Src.Unmap().As4(), ip.Dst.Unmap().As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		var sum uint32
		for i := 0; i < len(h); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
		b = append(b, h...)
	} else {
		b = append(b, 0x86, 0xdd)
		h := make([]byte, ipv6HeaderLen)
		binary.BigEndian.PutUint32(h, 6<<28|0x02<<20|0x12345) // TC ECT(0), a flow label
		binary.BigEndian.PutUint16(h[4:], uint16(udpLen))
		h[6] = ipProtoUDP
		h[7] = 64
		s, d := ip.Src.As16(), ip.Dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		b = append(b, h...)
	}
	u := make([]byte, udpHeaderLen)
	binary.BigEndian.PutUint16(u[0:], srcPort)
	binary.BigEndian.PutUint16(u[2:], UDPPort)
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen))
	if !ip.Is4() {
		// IPv6 requires a UDP checksum (over IPv4 0 means none).
		s, d := ip.Src.As16(), ip.Dst.As16()
		var ph []byte
		ph = append(ph, s[:]...)
		ph = append(ph, d[:]...)
		ph = binary.BigEndian.AppendUint32(ph, uint32(udpLen))
		ph = binary.BigEndian.AppendUint32(ph, ipProtoUDP)
		ph = append(append(ph, u...), udpPayload...)
		if len(ph)%2 != 0 {
			ph = append(ph, 0)
		}
		var sum uint32
		for i := 0; i < len(ph); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(ph[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		c := ^uint16(sum)
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(u[6:], c)
	}
	b = append(b, u...)
	return append(b, udpPayload...)
}

// writePcap writes frames to a classic pcap file (Ethernet link type).
func writePcap(t *testing.T, path string, frames [][]byte) {
	t.Helper()
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, 0xa1b2c3d4) // magic, microseconds
	b = binary.LittleEndian.AppendUint16(b, 2)
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = binary.LittleEndian.AppendUint32(b, 0) // thiszone
	b = binary.LittleEndian.AppendUint32(b, 0) // sigfigs
	b = binary.LittleEndian.AppendUint32(b, 65535)
	b = binary.LittleEndian.AppendUint32(b, 1) // LINKTYPE_ETHERNET
	for i, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(1700000000+i))
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// needTshark returns the path of tshark, skipping the test without it, but
// failing it under CI (which installs it: the Makefile's TEST_APT).
func needTshark(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		// make test's -race pass is -short; the external tools run once,
		// in the full pass.
		t.Skip("short mode: runs tshark")
	}
	p, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: tshark is missing (make test-tools installs it): %v", err)
		}
		t.Skipf("tshark not installed: %v", err)
	}
	return p
}

// wirePackets returns the packets of the dissection tests: each RC opcode
// once, with distinct QPNs and PSNs (the last ones across the wrap).
func wirePackets() []Packet {
	var ps []Packet
	for _, op := range testOpcodes {
		sizes := payloadSizes(op)
		p := samplePacket(op, sizes[len(sizes)/2])
		p.BTH.DestQP = 0x100 + uint32(op)
		p.BTH.PSN = PSNMask.Add(uint32(op) * 1000)
		if op == OpAcknowledge {
			p.AETH.Syndrome = NAKSyndrome(NAKRemoteAccessError)
		}
		ps = append(ps, p)
	}
	return ps
}

// wireCapture seals ps for ip and writes them to a pcap file in dir; it
// returns the path and the UDP payloads.
func wireCapture(t *testing.T, dir string, ps []Packet, ips ...IPHeader) (string, [][]byte) {
	t.Helper()
	var frames, payloads [][]byte
	for _, ip := range ips {
		for i := range ps {
			b := encode(t, ps[i])
			if err := Seal(ip, testSrcPort+uint16(i), UDPPort, b); err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, b)
			frames = append(frames, frame(ip, testSrcPort+uint16(i), b))
		}
	}
	path := filepath.Join(dir, "roce.pcap")
	writePcap(t, path, frames)
	return path, payloads
}

// TestTsharkDissection has Wireshark's InfiniBand dissector read one
// packet of every RC opcode over IPv4 and IPv6: nothing may be malformed or
// draw an expert warning, and the fields must be the encoded ones.
// Wireshark 4.0 shows the ICRC field (as a big-endian number) but does not
// check it; TestScapyICRC does.
func TestTsharkDissection(t *testing.T) {
	tshark := needTshark(t)
	ps := wirePackets()
	path, payloads := wireCapture(t, t.TempDir(), ps, testIPv4, testIPv6)
	// RPC-over-RDMA's heuristic would claim some SEND payloads and call
	// them malformed.
	base := []string{"-r", path, "--disable-protocol", "rpcordma"}

	verbose, err := exec.Command(tshark, append(base, "-V")...).CombinedOutput()
	if err != nil {
		t.Fatalf("tshark -V: %v\n%s", err, verbose)
	}
	if bytes.Contains(verbose, []byte("Malformed")) || bytes.Contains(verbose, []byte("Expert Info")) {
		t.Fatalf("tshark found a problem:\n%s", verbose)
	}
	if got := bytes.Count(verbose, []byte("Base Transport Header")); got != len(payloads) {
		t.Fatalf("got %d BTHs dissected, want %d:\n%s", got, len(payloads), verbose)
	}

	fields := []string{"infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
		"infiniband.bth.padcnt", "infiniband.invariant.crc", "infiniband.reth.va",
		"infiniband.aeth.syndrome", "infiniband.aeth.msn", "infiniband.atomiceth.swapdt",
		"infiniband.atomicacketh.origremdt", "infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.ieth",
		"_ws.col.Info"}
	args := append(base, "-T", "fields", "-E", "separator=|")
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark -T fields: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(payloads) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(payloads), out)
	}
	for i, line := range lines {
		p := ps[i%len(ps)]
		b := payloads[i]
		op := p.BTH.Opcode
		ext := op.Ext()
		want := []string{
			fmt.Sprint(uint8(op)),
			fmt.Sprintf("0x%06x", p.BTH.DestQP),
			fmt.Sprint(uint32(p.BTH.PSN)),
			fmt.Sprint(padLen(len(p.Payload))),
			fmt.Sprintf("0x%08x", binary.BigEndian.Uint32(b[len(b)-4:])),
			// Wireshark shows the AtomicETH's VA in the RETH's field.
			ifExt(ext, ExtRETH, fmt.Sprintf("0x%016x", p.RETH.VA)) + ifExt(ext, ExtAtomicETH, fmt.Sprintf("0x%016x", p.AtomicETH.VA)),
			ifExt(ext, ExtAETH, fmt.Sprint(uint8(p.AETH.Syndrome))),
			ifExt(ext, ExtAETH, fmt.Sprint(p.AETH.MSN)),
			ifExt(ext, ExtAtomicETH, fmt.Sprint(p.AtomicETH.SwapAdd)),
			ifExt(ext, ExtAtomicAckETH, fmt.Sprint(p.AtomicAckETH.OrigData)),
			ifExt(ext, ExtDETH, fmt.Sprintf("0x%016x", p.DETH.QKey)),
			ifExt(ext, ExtDETH, fmt.Sprintf("0x%08x", p.DETH.SrcQP)),
			// Wireshark 4.0 names both the IETH subtree and its R_Key
			// infiniband.ieth: the 4 bytes twice.
			ifExt(ext, ExtIETH, fmt.Sprintf("%08x,%08x", p.IETH, p.IETH)),
		}
		got := strings.Split(line, "|")
		if len(got) != len(fields) {
			t.Fatalf("frame %d: got %q", i+1, line)
		}
		for j := range want {
			if !strings.EqualFold(got[j], want[j]) {
				t.Errorf("frame %d (%v): %s: got %q, want %q", i+1, op, fields[j], got[j], want[j])
			}
		}
		info := strings.TrimSpace(got[len(got)-1])
		wantInfo := fmt.Sprintf("RC %s QP=0x%06x", wiresharkName(op), p.BTH.DestQP)
		if op.IsUD() {
			wantInfo = fmt.Sprintf("UD %s QP=0x%06x", wiresharkName(op), p.BTH.DestQP)
		}
		if op == OpAcknowledge {
			wantInfo += " [Remote Access Error]" // the NAK code of wirePackets
		}
		if info != wantInfo {
			t.Errorf("frame %d (%v): got Info %q, want %q", i+1, op, info, wantInfo)
		}
	}
}

// wiresharkNames are the opcode names of Wireshark's InfiniBand dissector.
var wiresharkNames = [...]string{
	"Send First", "Send Middle", "Send Last", "Send Last Immediate", "Send Only",
	"Send Only Immediate", "RDMA Write First", "RDMA Write Middle", "RDMA Write Last",
	"RDMA Write Last Immediate", "RDMA Write Only", "RDMA Write Only Immediate",
	"RDMA Read Request", "RDMA Read Response First", "RDMA Read Response Middle",
	"RDMA Read Response Last", "RDMA Read Response Only", "Acknowledge",
	"Atomic Acknowledge", "Compare Swap", "Fetch Add", "Resync",
	"Send Last Invalidate", "Send Only Invalidate",
}

// wiresharkName is op's name in Wireshark's dissector: the RC names by
// opcode, a UD opcode's name as the RC opcode of the same low five bits.
func wiresharkName(op Opcode) string { return wiresharkNames[op&0x1f] }

func ifExt(have, want Ext, s string) string {
	if have&want == 0 {
		return ""
	}
	return s
}

// scapyScript recomputes the ICRC of every packet of a pcap file with
// Scapy's RoCE layer (scapy.contrib.roce, an independent implementation
// from the RoCEv2 annex) and prints the carried and the recomputed ICRC
// bytes, one packet a line.
const scapyScript = `
import logging, sys
logging.getLogger("scapy").setLevel(logging.ERROR)
from scapy.all import rdpcap, raw, load_contrib
load_contrib("roce")
from scapy.contrib.roce import BTH
for p in rdpcap(sys.argv[1]):
    b = raw(p)
    p[BTH].icrc = None
    print(b[-4:].hex(), raw(p)[-4:].hex())
`

// needScapy returns a Python interpreter that can import Scapy's RoCE
// layer (Debian's python3-scapy), skipping the test without one, but
// failing it under CI.
func needScapy(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("short mode: runs Scapy")
	}
	var errs []string
	// Debian's interpreter first: python3-scapy installs there, and a
	// python3 earlier in PATH (pyenv, a virtualenv) may not see it.
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		out, err := exec.Command(py, "-c", "import scapy.contrib.roce").CombinedOutput()
		if err == nil {
			return py
		}
		errs = append(errs, fmt.Sprintf("%s: %v %s", py, err, bytes.TrimSpace(out)))
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: Scapy is missing (make test-tools installs python3-scapy): %s", strings.Join(errs, "; "))
	}
	t.Skipf("Scapy not installed (apt-get install python3-scapy): %s", strings.Join(errs, "; "))
	return ""
}

// TestScapyICRC checks the ICRC of every RC opcode at several payload
// lengths against Scapy's. Debian's Scapy (2.5) computes it for IPv4 only;
// IPv6 is covered by TestICRCReference.
func TestScapyICRC(t *testing.T) {
	py := needScapy(t)
	var ps []Packet
	for _, op := range testOpcodes {
		for _, n := range payloadSizes(op) {
			ps = append(ps, samplePacket(op, n))
		}
	}
	ip := testIPv4
	ip.ID = 0x4d2 // not 0, to cover the ID
	path, payloads := wireCapture(t, t.TempDir(), ps, ip)
	out, err := exec.Command(py, "-c", scapyScript, path).CombinedOutput()
	if err != nil {
		t.Fatalf("scapy: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(payloads) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(payloads), out)
	}
	for i, line := range lines {
		b := payloads[i]
		want := hex.EncodeToString(b[len(b)-4:])
		if line != want+" "+want {
			t.Errorf("%v with %d bytes: carried, Scapy's: %q; want %s twice", ps[i].BTH.Opcode, len(ps[i].Payload), line, want)
		}
	}
}
