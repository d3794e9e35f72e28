package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The out-of-band exchange of perftest (linux-rdma/perftest, the 4.5
// series Debian 12 ships; src/perftest_communication.c), played by a Go
// server so that a perftest client (ib_write_bw, ib_read_bw,
// ib_atomic_bw) runs against an RC QP of package rc. Over one TCP
// connection to port 18515 the client always writes a message first and
// the server answers with one of the same size:
//
//  1. the version string, 16 bytes (the server echoes the client's: the
//     client refuses versions below 5.70, check_version_compatibility);
//  2. from 5.32 on, the cycle buffer and cache line sizes, 4 bytes each,
//     big-endian (check_sys_data);
//  3. from 5.1 on, the MTU as a decimal ibv_mtu string, 2 bytes from 5.31
//     on (check_mtu; the server answers "3", IBV_MTU_1024);
//  4. three key messages (ctx_hand_shake: the keys, again once printed,
//     again after RTR), each the 108 bytes of
//     "%04x:%04x:%06x:%06x:%08x:%016llx:" (LID, out_reads, QPN, PSN, rkey,
//     VA) + 16 "%02x:" GID bytes + "%08x:" (SRQN) + NUL;
//  5. the test; the half-duplex server waits for the next key message,
//     which the client sends when done;
//  6. the bandwidth report: size (8), iterations (8 from 5.33 on, else
//     4), peak, average bandwidth and message rate (8 each)
//     (xchg_bw_reports);
//  7. ctx_close_connection: a last key message, then both sides write
//     "done" (5 bytes) and close.
const (
	perftestPort   = 18515
	perftestKeyLen = 108
)

// perftestKeys is one side's key message.
type perftestKeys struct {
	lid, outReads, qpn, psn, rkey uint32
	vaddr                         uint64
	gid                           [16]byte
	srqn                          uint32
}

func (k perftestKeys) marshal() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", k.lid, k.outReads, k.qpn, k.psn, k.rkey, k.vaddr)
	for _, g := range k.gid {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", k.srqn)
	out := make([]byte, perftestKeyLen)
	copy(out, b.String())
	return out
}

func parsePerftestKeys(m []byte) (perftestKeys, error) {
	s := string(m)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return perftestKeys{}, fmt.Errorf("perftest keys %q: %d fields, want 23", s, len(f))
	}
	var v [23]uint64
	for i, x := range f {
		n, err := strconv.ParseUint(x, 16, 64)
		if err != nil {
			return perftestKeys{}, fmt.Errorf("perftest keys %q: field %d: %w", s, i, err)
		}
		v[i] = n
	}
	k := perftestKeys{lid: uint32(v[0]), outReads: uint32(v[1]), qpn: uint32(v[2]), psn: uint32(v[3]), rkey: uint32(v[4]), vaddr: v[5], srqn: uint32(v[22])}
	for i := range k.gid {
		k.gid[i] = byte(v[6+i])
	}
	return k, nil
}

// perftestRun is what one served connection did.
type perftestRun struct {
	version string
	client  perftestKeys
	qp      *rc.QP
	mr      *rctest.MR
	host    *rctest.Host
	iters   uint64 // from the client's report
	recvBuf []byte // send_bw: the receives, size bytes each
	sent    []byte // write_lat: our WRITE buffer
}

// perftestServer serves one perftest client connection on conn with a
// fresh QP of ep: a memory region of mrSize bytes (filled with fill) is
// what the client writes, reads or works atomics on.
type perftestServer struct {
	ep     *udp.Endpoint
	local  netip.Addr
	qpn    uint32
	mrSize int
	fill   []byte
	// op is the perftest program: write_bw, read_bw and atomic_bw keep
	// the server passive; send_bw makes it post size-byte receives
	// (iters of them, kept in run.recvBuf) before the test; write_lat
	// makes it play perftest's ping-pong (run_iter_lat_write).
	op          string
	size, iters int
}

func (s *perftestServer) serve(conn net.Conn) (*perftestRun, error) {
	conn.SetDeadline(time.Now().Add(5 * time.Minute))
	xchg := func(n int, reply func(got []byte) []byte) ([]byte, error) {
		got := make([]byte, n)
		if _, err := io.ReadFull(conn, got); err != nil {
			return nil, fmt.Errorf("read %d bytes: %w", n, err)
		}
		out := reply(got)
		if len(out) != n {
			return nil, fmt.Errorf("reply of %d bytes to a %d-byte message", len(out), n)
		}
		if _, err := conn.Write(out); err != nil {
			return nil, fmt.Errorf("write %d bytes: %w", n, err)
		}
		return got, nil
	}
	echo := func(got []byte) []byte { return got }
	run := &perftestRun{host: rctest.NewHost()}
	v, err := xchg(16, echo)
	if err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}
	run.version = string(bytes.TrimRight(v, "\x00"))
	ver, err := strconv.ParseFloat(run.version, 64)
	if err != nil {
		return nil, fmt.Errorf("version %q: %w", run.version, err)
	}
	if ver >= 5.32 {
		for _, what := range []string{"cycle buffer", "cache line"} {
			if _, err := xchg(4, echo); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	if ver >= 5.1 {
		n := 4
		if ver >= 5.31 {
			n = 2
		}
		if _, err := xchg(n, func([]byte) []byte { b := make([]byte, n); b[0] = '3'; return b }); err != nil {
			return nil, fmt.Errorf("mtu: %w", err)
		}
	}
	// Our side: a QP and a memory region.
	run.mr = &rctest.MR{Buf: make([]byte, s.mrSize), Addr: 0x7e5500000000, RKey: 0x5a17 + s.qpn,
		Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
	copy(run.mr.Buf, s.fill)
	run.host.AddMR(run.mr)
	// The GID of an IPv4 address is its IPv4-mapped IPv6 form.
	mine := perftestKeys{outReads: 16, qpn: s.qpn, psn: rand.Uint32() & uint32(roce.PSNMask), rkey: run.mr.RKey, vaddr: run.mr.Addr,
		gid: s.local.As16()}
	keys := func(got []byte) []byte { return mine.marshal() }
	pre := 3
	if s.op == "write_lat" {
		pre = 4
	}
	for i := range pre {
		got, err := xchg(perftestKeyLen, keys)
		if err != nil {
			return nil, fmt.Errorf("key message %d: %w", i, err)
		}
		if i > 0 {
			continue
		}
		if run.client, err = parsePerftestKeys(got); err != nil {
			return nil, err
		}
		peer := netip.AddrFrom16(run.client.gid).Unmap()
		run.qp, err = s.ep.NewQP(rc.Config{QPN: s.qpn, DestQPN: run.client.qpn, SQPSN: roce.PSN(mine.psn), RQPSN: roce.PSN(run.client.psn),
			PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxDestRdAtomic: 128}, netip.AddrPortFrom(peer, 0), run.host)
		if err != nil {
			return nil, err
		}
	}
	switch s.op {
	case "write_lat":
		return run, s.pingPong(run)
	case "send_bw":
		run.recvBuf = make([]byte, s.size*s.iters)
		for i := range s.iters {
			run.host.PostRecv(rc.Recv{ID: uint64(i), Len: uint32(s.size), Buf: rctest.Buf(run.recvBuf[i*s.size : (i+1)*s.size])})
		}
		if _, err := xchg(perftestKeyLen, keys); err != nil {
			return run, fmt.Errorf("receives posted: %w", err)
		}
	default:
		// The test runs; the client's next key message says it is done.
		if _, err := xchg(perftestKeyLen, keys); err != nil {
			return run, fmt.Errorf("end of test: %w", err)
		}
		itersLen := 4
		if ver >= 5.33 {
			itersLen = 8
		}
		for i, n := range []int{8, itersLen, 8, 8, 8} {
			got, err := xchg(n, func([]byte) []byte { return make([]byte, n) })
			if err != nil {
				return run, fmt.Errorf("report field %d: %w", i, err)
			}
			if i == 1 {
				if n == 8 {
					run.iters = binary.BigEndian.Uint64(got)
				} else {
					run.iters = uint64(binary.BigEndian.Uint32(got))
				}
			}
		}
	}
	if _, err := xchg(perftestKeyLen, keys); err != nil {
		return run, fmt.Errorf("close: %w", err)
	}
	conn.Write([]byte("done\x00"))
	if s.op == "send_bw" {
		run.iters = uint64(s.iters)
	}
	return run, nil
}

// pingPong is the server's side of perftest's run_iter_lat_write: it
// writes size bytes whose last byte counts its WRITEs into the client's
// buffer (first, without waiting), then waits for the client's WRITE with
// the same count to land in Go memory, iters times.
func (s *perftestServer) pingPong(run *perftestRun) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run.sent = make([]byte, s.size)
	for i := range s.size - 1 {
		run.sent[i] = byte(i)
	}
	scnt, rcnt := 0, 0
	for scnt < s.iters || rcnt < s.iters {
		if rcnt < s.iters && scnt >= 1 {
			rcnt++
			for run.mr.Copy(s.size-1, 1)[0] != byte(rcnt) {
				if ctx.Err() != nil {
					return fmt.Errorf("write_lat: the client's WRITE %d never landed: %w", rcnt, ctx.Err())
				}
				time.Sleep(20 * time.Microsecond)
			}
		}
		if scnt < s.iters {
			scnt++
			run.sent[s.size-1] = byte(scnt)
			wr := rc.SendWR{ID: uint64(scnt), Opcode: rc.WRRDMAWrite, Length: uint32(s.size), RemoteAddr: run.client.vaddr,
				RKey: run.client.rkey, Local: rctest.Buf(run.sent)}
			if err := run.qp.Post(wr); err != nil {
				return fmt.Errorf("write_lat: post %d: %w", scnt, err)
			}
			cs, err := run.host.TakeSends(ctx, 1)
			if err != nil {
				return fmt.Errorf("write_lat: WRITE %d: %w", scnt, err)
			}
			if cs[0].Status != abi.WCSuccess {
				return fmt.Errorf("write_lat: WRITE %d completed with %v", scnt, cs[0].Status)
			}
		}
	}
	run.iters = uint64(s.iters)
	return nil
}
