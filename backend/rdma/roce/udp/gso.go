package udp

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// Offload limits (see the package documentation, § Segmentation offload).
const (
	// maxGSOSegs bounds the datagrams of one super-datagram: the
	// kernel's UDP_MAX_SEGMENTS, 64 since UDP_SEGMENT exists (later
	// kernels allow more).
	maxGSOSegs = 64
	// maxGSOBytes bounds its UDP payload: an IP datagram is at most
	// 65535 bytes, and the IPv6 header (40) and the UDP header (8) are
	// the most they add (IPv4: 28).
	maxGSOBytes = 0xffff - 40 - 8
	// groBufSize is a receive buffer with UDP_GRO: the largest UDP
	// payload there is, so that a coalesced buffer is never truncated.
	groBufSize = 1 << 16
	// rxCtlSpace holds the UDP_GRO control message (an int), the only
	// one the socket asks for, with room to spare.
	rxCtlSpace = 64
	// gsoCtlSpace holds a UDP_SEGMENT control message (a u16).
	gsoCtlSpace = 24
	// minPacket is the shortest RoCEv2 packet: a BTH and the ICRC.
	minPacket = roce.BTHLen + roce.ICRCLen
)

// run is one message of a flush: n packets of the send batch from first
// on, to one destination; with n > 1 a GSO super-datagram whose datagrams
// are all seg bytes but the last, which may be shorter.
type run struct {
	first, n, seg int
}

// planRuns groups the queued packets (their lengths and destinations)
// into messages, appended to out (whose capacity must be len(lens)).
// Without gso every packet is a message of its own. With it, a message
// takes the longest run of packets to one destination that GSO can carry
// as one super-datagram: every packet seg bytes (the first's length)
// except the last, which may be shorter and ends the run; at most
// maxGSOSegs packets and maxGSOBytes in all. Each segment is then exactly
// the datagram the packet would have been. O(len(lens)); it does not
// allocate.
func planRuns(lens []int, dsts []netip.AddrPort, gso bool, out []run) []run {
	for i := 0; i < len(lens); {
		r := run{first: i, n: 1, seg: lens[i]}
		total := lens[i]
		if gso {
			for j := i + 1; j < len(lens) && r.n < maxGSOSegs; j++ {
				if dsts[j] != dsts[i] || lens[j] > r.seg || lens[j] <= 0 || total+lens[j] > maxGSOBytes {
					break
				}
				r.n++
				total += lens[j]
				if lens[j] < r.seg {
					break // a short segment is the last
				}
			}
		}
		out = append(out, r)
		i += r.n
	}
	return out
}

// groSegments says how a received buffer of n bytes whose UDP_GRO control
// message said seg divides into the datagrams the kernel coalesced: count
// datagrams of size bytes, the last n-(count-1)*size. A seg that no
// coalescing has (≤ 0, or not below n: the kernel reports gso_size only
// for a buffer of two datagrams or more) leaves the buffer whole, one
// datagram. count is at most n (n/seg rounded up).
func groSegments(n, seg int) (count, size int) {
	if seg <= 0 || seg >= n {
		return 1, n
	}
	return (n + seg - 1) / seg, seg
}

// probeOffload turns UDP_GRO on for the socket and, for IPv6, checks that
// UDP_SEGMENT is known, logging what the kernel refuses: gso and gro
// report what the endpoint may use. IPv4 never uses GSO: segmentation
// numbers the IPv4 IDs of the segments 0, 1, 2 … (inet_gso_segment), and
// the ICRC is sealed over ID 0 (docs/wire.md § 7).
func probeOffload(raw syscall.RawConn, v6 bool, log *logrus.Entry) (gso, gro bool) {
	var gsoErr, groErr error
	raw.Control(func(fd uintptr) {
		groErr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1)
		if v6 {
			// 0: no socket-wide segment size, each message says its own.
			gsoErr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, 0)
		}
	})
	if groErr != nil {
		log.WithError(groErr).Warn("udp: UDP_GRO unavailable: receiving a datagram at a time")
	}
	if v6 && gsoErr != nil {
		log.WithError(gsoErr).Warn("udp: UDP_SEGMENT unavailable: sending a datagram at a time")
	}
	return v6 && gsoErr == nil, groErr == nil
}

// gsoRefused reports whether errno, from a super-datagram, says the socket
// cannot send GSO at all (rather than that this datagram failed): an old
// kernel (ENOPROTOOPT, EOPNOTSUPP), a route whose device cannot offload
// the checksum or that goes through xfrm (EIO), a segment count or socket
// option it does not take (EINVAL).
func gsoRefused(errno unix.Errno) bool {
	switch errno {
	case unix.EIO, unix.EINVAL, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// Offload reports whether the endpoint sends GSO super-datagrams and
// receives GRO buffers.
func (e *Endpoint) Offload() (gso, gro bool) { return e.gso.Load(), e.gro.Load() }

// ErrOffload: SetOffload asked for what the socket cannot do.
var ErrOffload = errors.New("udp: offload unavailable")

// SetOffload turns GSO and GRO off, or back on where Listen found them
// available (a benchmark compares the two): it fails with ErrOffload when
// asked for GSO on an IPv4 endpoint, for either when Config.NoOffload was
// set, or for what the kernel refused. Datagrams in flight are not
// affected.
func (e *Endpoint) SetOffload(gso, gro bool) error {
	if gso && (e.cfg.NoOffload || !e.cfg.Addr.Is6()) {
		return fmt.Errorf("%w: GSO on %v", ErrOffload, e.cfg.Addr)
	}
	if gro && !e.groCapable {
		return fmt.Errorf("%w: GRO on %v", ErrOffload, e.cfg.Addr)
	}
	if e.groCapable {
		var serr error
		v := 0
		if gro {
			v = 1
		}
		if err := e.raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, v)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("%w: UDP_GRO: %w", ErrOffload, serr)
		}
	}
	e.gro.Store(gro)
	if gso {
		var serr error
		if err := e.raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, 0)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("%w: UDP_SEGMENT: %w", ErrOffload, serr)
		}
	}
	e.gso.Store(gso)
	return nil
}
