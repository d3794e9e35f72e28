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

// perftestClient is the client side of perftest's exchange
// (internal/pftexchange) for
// a perftest server in the rxe guest: its RC QP of package rc is the
// requester of write_bw, read_bw, send_bw and atomic_bw, and one side of
// write_lat's ping-pong.
type perftestClient struct {
	ep          *udp.Endpoint
	local       netip.Addr
	qpn         uint32
	op          string
	size, iters int
	version     string // what the client announces (the rxe image's perftest says 6.06)
}

// clientRun is what a client run did.
type clientRun struct {
	c      *perftestClient
	mine   pftexchange.Keys
	server pftexchange.Keys
	qp     *rc.QP
	host   *rctest.Host
	mr     *rctest.MR // our memory: the source, or the destination of READs and atomics
	comps  []rc.Completion
}

func (c *perftestClient) run(ctx context.Context, conn net.Conn) (*clientRun, error) {
	r := &clientRun{host: rctest.NewHost(), c: c}
	r.mr = &rctest.MR{Buf: make([]byte, c.size*c.iters+64), Addr: 0x7c1100000000, RKey: 0x3c00 + c.qpn,
		Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
	for i := range r.mr.Buf {
		r.mr.Buf[i] = byte(i*13 + 1)
	}
	r.mr.Buf[c.size-1] = 0 // write_lat's counter starts below 1
	r.host.AddMR(r.mr)
	r.mine = pftexchange.Keys{OutReads: 16, QPN: c.qpn, PSN: rand.Uint32() & uint32(roce.PSNMask), RKey: r.mr.RKey, VAddr: r.mr.Addr, GID: c.local.As16()}
	res, err := pftexchange.Run(ctx, conn, pftexchange.Op(c.op), c.version, r.mine, r,
		pftexchange.Report{Size: uint64(c.size), Iters: uint64(c.iters)})
	r.server = res.Peer
	return r, err
}

// Connect creates the QP towards the server's keys.
func (r *clientRun) Connect(server pftexchange.Keys) error {
	c := r.c
	peer := netip.AddrFrom16(server.GID).Unmap()
	var err error
	r.qp, err = c.ep.NewQP(rc.Config{QPN: c.qpn, DestQPN: server.QPN, SQPSN: roce.PSN(r.mine.PSN), RQPSN: roce.PSN(server.PSN),
		PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: int(max(1, min(server.OutReads, 16))),
		Timeout: 100 * time.Millisecond}, netip.AddrPortFrom(peer, 0), r.host)
	r.server = server
	return err
}

// Test runs the client's load, or its half of write_lat's ping-pong.
func (r *clientRun) Test(ctx context.Context) error {
	if r.c.op == "write_lat" {
		return r.c.pingPong(ctx, r)
	}
	return r.c.load(ctx, r)
}

// load posts the bandwidth test's iters work requests, at most 128 at a
// time, and collects their completions, which must all succeed. WRITEs and
// SENDs go from our MR (message i from offset i*size); READs land there
// (message i at offset i*size); FETCH_ADDs add 1 to the server's first
// word and store the original value at offset 8*i.
func (c *perftestClient) load(ctx context.Context, r *clientRun) error {
	for i := 0; i < c.iters; {
		n := min(128, c.iters-i)
		for j := range n {
			k := i + j
			wr := rc.SendWR{ID: uint64(k), Length: uint32(c.size), RemoteAddr: r.server.VAddr, RKey: r.server.RKey,
				Local: rctest.Buf(r.mr.Buf[k*c.size : (k+1)*c.size])}
			switch c.op {
			case "write_bw":
				wr.Opcode = rc.WRRDMAWrite
			case "read_bw":
				wr.Opcode = rc.WRRDMARead
			case "send_bw":
				wr.Opcode = rc.WRSend
			case "atomic_bw":
				wr.Opcode, wr.SwapAdd, wr.Local = rc.WRAtomicFetchAdd, 1, rctest.Buf(r.mr.Buf[8*k:8*k+8])
			}
			if err := r.qp.Post(wr); err != nil {
				return fmt.Errorf("%s: post %d: %w", c.op, k, err)
			}
		}
		cs, err := r.host.TakeSends(ctx, n)
		if err != nil {
			return fmt.Errorf("%s: %w (QP %+v)", c.op, err, r.qp.Counters())
		}
		for _, x := range cs {
			if x.Status != abi.WCSuccess {
				return fmt.Errorf("%s: WR %d completed with %v (QP %+v)", c.op, x.ID, x.Status, r.qp.Counters())
			}
		}
		r.comps = append(r.comps, cs...)
		i += n
	}
	return nil
}

// pingPong is the client's side of run_iter_lat_write: wait for the
// server's WRITE with count n to land in our MR (at our vaddr, its last
// byte at size-1), answer with our WRITE carrying n, iters times.
func (c *perftestClient) pingPong(ctx context.Context, r *clientRun) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	src := make([]byte, c.size)
	for n := 1; n <= c.iters; n++ {
		for r.mr.Copy(c.size-1, 1)[0] != byte(n) {
			if ctx.Err() != nil {
				return fmt.Errorf("write_lat: the server's WRITE %d never landed: %w", n, ctx.Err())
			}
			time.Sleep(20 * time.Microsecond)
		}
		src[c.size-1] = byte(n)
		if err := r.qp.Post(rc.SendWR{ID: uint64(n), Opcode: rc.WRRDMAWrite, Length: uint32(c.size), RemoteAddr: r.server.VAddr,
			RKey: r.server.RKey, Local: rctest.Buf(src)}); err != nil {
			return err
		}
		cs, err := r.host.TakeSends(ctx, 1)
		if err != nil {
			return err
		}
		if cs[0].Status != abi.WCSuccess {
			return fmt.Errorf("write_lat: WRITE %d completed with %v", n, cs[0].Status)
		}
		r.comps = append(r.comps, cs[0])
	}
	return nil
}
