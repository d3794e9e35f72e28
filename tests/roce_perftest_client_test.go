package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// perftestClient is the client side of perftest's exchange (see
// perftestServer for the messages; the client writes each one first) for
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
	server perftestKeys
	qp     *rc.QP
	host   *rctest.Host
	mr     *rctest.MR // our memory: the source, or the destination of READs and atomics
	comps  []rc.Completion
}

func (c *perftestClient) run(ctx context.Context, conn net.Conn) (*clientRun, error) {
	conn.SetDeadline(time.Now().Add(5 * time.Minute))
	xchg := func(out []byte) ([]byte, error) {
		if _, err := conn.Write(out); err != nil {
			return nil, fmt.Errorf("write %d bytes: %w", len(out), err)
		}
		in := make([]byte, len(out))
		if _, err := io.ReadFull(conn, in); err != nil {
			return nil, fmt.Errorf("read %d bytes: %w", len(in), err)
		}
		return in, nil
	}
	v := make([]byte, 16)
	copy(v, c.version)
	got, err := xchg(v)
	if err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}
	ver, err := strconv.ParseFloat(string(trimNUL(got)), 64)
	if err != nil {
		return nil, fmt.Errorf("server version %q: %w", got, err)
	}
	mine, _ := strconv.ParseFloat(c.version, 64)
	ver = min(ver, mine) // each side decides by the other's; both are alike here
	if ver >= 5.32 {
		for _, x := range []uint32{4096, 64} {
			if _, err := xchg(binary.BigEndian.AppendUint32(nil, x)); err != nil {
				return nil, fmt.Errorf("sys data: %w", err)
			}
		}
	}
	if ver >= 5.1 {
		if _, err := xchg([]byte{'3', 0}); err != nil {
			return nil, fmt.Errorf("mtu: %w", err)
		}
	}
	r := &clientRun{host: rctest.NewHost()}
	r.mr = &rctest.MR{Buf: make([]byte, c.size*c.iters+64), Addr: 0x7c1100000000, RKey: 0x3c00 + c.qpn,
		Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
	for i := range r.mr.Buf {
		r.mr.Buf[i] = byte(i*13 + 1)
	}
	r.mr.Buf[c.size-1] = 0 // write_lat's counter starts below 1
	r.host.AddMR(r.mr)
	myKeys := perftestKeys{outReads: 16, qpn: c.qpn, psn: rand.Uint32() & uint32(roce.PSNMask), rkey: r.mr.RKey, vaddr: r.mr.Addr, gid: c.local.As16()}
	pre := 3
	if c.op == "write_lat" {
		pre = 4
	}
	for i := range pre {
		got, err := xchg(myKeys.marshal())
		if err != nil {
			return nil, fmt.Errorf("key message %d: %w", i, err)
		}
		if i > 0 {
			continue
		}
		if r.server, err = parsePerftestKeys(got); err != nil {
			return nil, err
		}
		peer := netip.AddrFrom16(r.server.gid).Unmap()
		r.qp, err = c.ep.NewQP(rc.Config{QPN: c.qpn, DestQPN: r.server.qpn, SQPSN: roce.PSN(myKeys.psn), RQPSN: roce.PSN(r.server.psn),
			PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: int(max(1, min(r.server.outReads, 16))),
			Timeout: 100 * time.Millisecond}, netip.AddrPortFrom(peer, 0), r.host)
		if err != nil {
			return nil, err
		}
	}
	if c.op == "send_bw" {
		// The server posted its receives before it answers this one.
		if _, err := xchg(myKeys.marshal()); err != nil {
			return r, fmt.Errorf("receives posted: %w", err)
		}
	}
	if c.op == "write_lat" {
		return r, c.pingPong(ctx, r)
	}
	if err := c.load(ctx, r); err != nil {
		return r, err
	}
	if c.op != "send_bw" {
		if _, err := xchg(myKeys.marshal()); err != nil {
			return r, fmt.Errorf("end of test: %w", err)
		}
		itersLen := 4
		if ver >= 5.33 {
			itersLen = 8
		}
		for i, n := range []int{8, itersLen, 8, 8, 8} {
			out := make([]byte, n)
			switch i {
			case 0:
				binary.BigEndian.PutUint64(out, uint64(c.size))
			case 1:
				if n == 8 {
					binary.BigEndian.PutUint64(out, uint64(c.iters))
				} else {
					binary.BigEndian.PutUint32(out, uint32(c.iters))
				}
			}
			if _, err := xchg(out); err != nil {
				return r, fmt.Errorf("report field %d: %w", i, err)
			}
		}
	}
	if _, err := xchg(myKeys.marshal()); err != nil {
		return r, fmt.Errorf("close: %w", err)
	}
	conn.Write([]byte("done\x00"))
	return r, nil
}

func trimNUL(b []byte) []byte {
	for i, x := range b {
		if x == 0 {
			return b[:i]
		}
	}
	return b
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
			wr := rc.SendWR{ID: uint64(k), Length: uint32(c.size), RemoteAddr: r.server.vaddr, RKey: r.server.rkey,
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
		if err := r.qp.Post(rc.SendWR{ID: uint64(n), Opcode: rc.WRRDMAWrite, Length: uint32(c.size), RemoteAddr: r.server.vaddr,
			RKey: r.server.rkey, Local: rctest.Buf(src)}); err != nil {
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
