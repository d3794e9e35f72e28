package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The Go RC peer of TestRoCEInterop: an RC QP of package rc with Go memory
// behind a perftest server's exchange (internal/pftexchange), so that a
// perftest client (ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_bw,
// ib_write_lat) runs against it.
const perftestPort = pftexchange.Port

// perftestRun is what one served connection did.
type perftestRun struct {
	version string
	client  pftexchange.Keys
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

	run  *perftestRun
	mine pftexchange.Keys
}

func (s *perftestServer) serve(conn net.Conn) (*perftestRun, error) {
	s.run = &perftestRun{host: rctest.NewHost()}
	run := s.run
	// Our side: a QP and a memory region.
	run.mr = &rctest.MR{Buf: make([]byte, s.mrSize), Addr: 0x7e5500000000, RKey: 0x5a17 + s.qpn,
		Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
	copy(run.mr.Buf, s.fill)
	run.host.AddMR(run.mr)
	// The GID of an IPv4 address is its IPv4-mapped IPv6 form.
	s.mine = pftexchange.Keys{OutReads: 16, QPN: s.qpn, PSN: rand.Uint32() & uint32(roce.PSNMask), RKey: run.mr.RKey,
		VAddr: run.mr.Addr, GID: s.local.As16()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := pftexchange.Serve(ctx, conn, pftexchange.Op(s.op), s.mine, s)
	run.version, run.client = res.Version, res.Peer
	if err != nil {
		return run, err
	}
	run.iters = res.Report.Iters
	if s.op == "send_bw" || s.op == "write_lat" {
		run.iters = uint64(s.iters)
	}
	return run, nil
}

// Connect creates the QP towards the client's keys.
func (s *perftestServer) Connect(client pftexchange.Keys) error {
	peer := netip.AddrFrom16(client.GID).Unmap()
	var err error
	s.run.qp, err = s.ep.NewQP(rc.Config{QPN: s.qpn, DestQPN: client.QPN, SQPSN: roce.PSN(s.mine.PSN), RQPSN: roce.PSN(client.PSN),
		PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxDestRdAtomic: 128}, netip.AddrPortFrom(peer, 0), s.run.host)
	s.run.client = client
	return err
}

// Test posts send_bw's receives or plays write_lat's ping-pong.
func (s *perftestServer) Test(ctx context.Context) error {
	run := s.run
	switch s.op {
	case "write_lat":
		return s.pingPong(run)
	case "send_bw":
		run.recvBuf = make([]byte, s.size*s.iters)
		for i := range s.iters {
			run.host.PostRecv(rc.Recv{ID: uint64(i), Len: uint32(s.size), Buf: rctest.Buf(run.recvBuf[i*s.size : (i+1)*s.size])})
		}
	}
	return nil
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
			wr := rc.SendWR{ID: uint64(scnt), Opcode: rc.WRRDMAWrite, Length: uint32(s.size), RemoteAddr: run.client.VAddr,
				RKey: run.client.RKey, Local: rctest.Buf(run.sent)}
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
	return nil
}
