package roceinterop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/pcapfile"
)

// Frame is one RoCEv2 frame of a capture.
type Frame struct {
	Src, Dst netip.Addr
	IPv6     bool
	// Packet is the parsed BTH and what follows (its ICRC was checked).
	Packet roce.Packet
}

// ErrICRC is a RoCE frame whose ICRC does not match.
var ErrICRC = errors.New("bad ICRC")

// ReadCapture reads a pcap of Ethernet frames (QEMU's filter-dump) and
// returns its RoCEv2 frames (UDP to port 4791) in order. Every one must
// carry a correct ICRC (computed with the IPv4 ID and flags it carried) and
// parse with the codec.
func ReadCapture(path string) ([]Frame, error) {
	_, pkts, err := pcapfile.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var frames []Frame
	for i, p := range pkts {
		f, ok, err := parseFrame(p)
		if err != nil {
			return frames, fmt.Errorf("capture %s: frame %d: %w", path, i+1, err)
		}
		if ok {
			frames = append(frames, f)
		}
	}
	return frames, nil
}

// parseFrame decodes an Ethernet frame holding IPv4 or IPv6, UDP to port
// 4791 and a RoCE packet; ok is false for any other frame.
func parseFrame(p pcapfile.Packet) (Frame, bool, error) {
	b := p.Data
	if len(b) < 14 {
		return Frame{}, false, nil
	}
	var f Frame
	var ip []byte // from the IP header to the end of the IP datagram
	var ipHdr int
	var hdr roce.IPHeader
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		ip = b[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 17 {
			return Frame{}, false, nil
		}
		ipHdr = int(ip[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if ipHdr != 20 || tot < ipHdr || tot > len(ip) {
			return Frame{}, false, nil
		}
		ip = ip[:tot]
		f.Src, f.Dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		hdr.ID, hdr.FlagsFragment = binary.BigEndian.Uint16(ip[4:]), binary.BigEndian.Uint16(ip[6:])
	case 0x86dd:
		ip = b[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 17 {
			return Frame{}, false, nil
		}
		ipHdr = 40
		tot := 40 + int(binary.BigEndian.Uint16(ip[4:]))
		if tot > len(ip) {
			return Frame{}, false, nil
		}
		ip = ip[:tot]
		f.IPv6 = true
		f.Src, f.Dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	default:
		return Frame{}, false, nil
	}
	udp := ip[ipHdr:]
	if len(udp) < 8 || binary.BigEndian.Uint16(udp[2:]) != roce.UDPPort {
		return Frame{}, false, nil
	}
	if p.Truncated() {
		return Frame{}, false, fmt.Errorf("RoCE frame truncated by the capture")
	}
	if int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
		return Frame{}, false, fmt.Errorf("UDP length %d, datagram %d", binary.BigEndian.Uint16(udp[4:]), len(udp))
	}
	hdr.Src, hdr.Dst = f.Src, f.Dst
	if err := roce.Verify(hdr, binary.BigEndian.Uint16(udp), roce.UDPPort, udp[8:]); err != nil {
		return Frame{}, false, fmt.Errorf("%s→%s: %w: %v", f.Src, f.Dst, ErrICRC, err)
	}
	pkt, err := roce.Parse(udp[8:])
	if err != nil {
		return Frame{}, false, fmt.Errorf("%s→%s: %w", f.Src, f.Dst, err)
	}
	f.Packet = pkt
	return f, true, nil
}

// CheckTshark runs tshark over the capture: nothing malformed, no expert
// error, and as many RoCE (InfiniBand) frames as ReadCapture found.
func CheckTshark(tshark, path string, frames int) error {
	// tshark's stdout only: it warns on stderr when run as root.
	out, err := exec.Command(tshark, "-r", path, "-Y", "_ws.malformed || _ws.expert.severity >= error").Output()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		return fmt.Errorf("tshark finds malformed frames (err %v):\n%s", err, out)
	}
	out, err = exec.Command(tshark, "-r", path, "-Y", "infiniband", "-T", "fields", "-e", "infiniband.bth.opcode").Output()
	if err != nil {
		return fmt.Errorf("tshark: %w", err)
	}
	if n := len(strings.Fields(string(out))); n != frames {
		return fmt.Errorf("tshark dissects %d RoCE frames, the codec %d", n, frames)
	}
	return nil
}

// Between returns the frames of one QP pair: to local's QP localQPN and to
// the peer's QP peerQPN from local.
func Between(frames []Frame, local netip.Addr, localQPN, peerQPN uint32) []Frame {
	var out []Frame
	for _, f := range frames {
		if f.Dst == local && f.Packet.BTH.DestQP == localQPN || f.Src == local && f.Packet.BTH.DestQP == peerQPN {
			out = append(out, f)
		}
	}
	return out
}
