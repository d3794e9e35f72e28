package main

// The roce section's baselines: the same veth's raw UDP, two blasts of
// RoCE-sized datagrams (sendmmsg of one datagram a message, and UDP_SEGMENT
// super-datagrams received with UDP_GRO: the kernel's best UDP) and a
// 64-byte ping-pong.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// rawUDP is a pair of UDP sockets on the veth's addresses (other ports
// than the endpoints'), A's connected to B's.
type rawUDP struct {
	tx, rx *net.UDPConn
}

func openRawUDP(l *roceLab) (*rawUDP, error) { return openRawUDPOn(l, roceAddrs) }

// openRawUDPOn is openRawUDP on addrs (A's and B's, of one family).
func openRawUDPOn(l *roceLab, addrs [2]netip.Addr) (*rawUDP, error) {
	rx, err := l.ns[1].ListenUDP(netip.AddrPortFrom(addrs[1], 0))
	if err != nil {
		return nil, err
	}
	tx, err := l.ns[0].ListenUDP(netip.AddrPortFrom(addrs[0], 0))
	if err != nil {
		rx.Close()
		return nil, err
	}
	u := &rawUDP{tx: tx, rx: rx}
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	var serr error
	for _, c := range []*net.UDPConn{tx, rx} {
		raw, err := c.SyscallConn()
		if err != nil {
			u.close()
			return nil, err
		}
		// The endpoint's socket buffers (best effort, as the endpoint:
		// the *FORCE options need CAP_NET_ADMIN).
		if err := raw.Control(func(fd uintptr) {
			for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], roceSockBuf) != nil {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], roceSockBuf)
				}
			}
			if c == tx && dst.Addr().Is4() {
				serr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
			} else if c == tx {
				serr = unix.Connect(int(fd), &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()})
			}
		}); err != nil {
			u.close()
			return nil, err
		}
	}
	if serr != nil {
		u.close()
		return nil, fmt.Errorf("connect: %w", serr)
	}
	return u, nil
}

func (u *rawUDP) close() {
	u.tx.Close()
	u.rx.Close()
}

// blast sends roceDatagram-byte datagrams from A to B with sendmmsg
// (roceBatch a call, waiting when the socket buffer is full) while B
// receives them with recvmmsg, for roceWarmup and then d, and returns
// the payload (rocePayload bytes a datagram) that arrived during d, in
// Gbit/s.
func (u *rawUDP) blast(d time.Duration) (float64, error) { return u.blastWith(d, false) }

// blastGSO is blast with UDP segmentation offload on both sides: A sends
// super-datagrams of roceGSOSegs datagrams (UDP_SEGMENT = roceDatagram,
// roceGSOBatch a sendmmsg), B receives with UDP_GRO into 64 KiB buffers;
// the same datagrams on the veth, the fewest trips through the kernel.
func (u *rawUDP) blastGSO(d time.Duration) (float64, error) { return u.blastWith(d, true) }

// setGSO sets UDP_SEGMENT on A's socket and UDP_GRO on B's.
func (u *rawUDP) setGSO(on bool) error {
	seg, gro := 0, 0
	if on {
		seg, gro = roceDatagram, 1
	}
	var serr error
	for _, o := range []struct {
		c        *net.UDPConn
		opt, val int
	}{{u.tx, unix.UDP_SEGMENT, seg}, {u.rx, unix.UDP_GRO, gro}} {
		raw, err := o.c.SyscallConn()
		if err != nil {
			return err
		}
		if err := raw.Control(func(fd uintptr) {
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, o.opt, o.val)
			}
		}); err != nil {
			return err
		}
	}
	return serr
}

func (u *rawUDP) blastWith(d time.Duration, gso bool) (float64, error) {
	var got atomic.Uint64 // bytes: datagrams × roceDatagram
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, 2)
	rxBatch, rxSize, txBatch, txSize := roceBatch, 2048, roceBatch, roceDatagram
	if gso {
		if err := u.setGSO(true); err != nil {
			return 0, fmt.Errorf("UDP_SEGMENT, UDP_GRO: %w", err)
		}
		defer u.setGSO(false)
		rxBatch, rxSize, txBatch, txSize = roceGSOBatch, 1<<16, roceGSOBatch, roceGSOSegs*roceDatagram
	}
	wg.Add(2)
	go func() { // the receiver
		defer wg.Done()
		raw, err := u.rx.SyscallConn()
		if err != nil {
			errs[0] = err
			return
		}
		b := newMmsgBatch(rxBatch, rxSize)
		for !stop.Load() {
			var n int
			var errno unix.Errno
			if err := raw.Read(func(fd uintptr) bool {
				n, errno = mmsgCall(unix.SYS_RECVMMSG, fd, b.hdrs)
				return errno != unix.EAGAIN
			}); err != nil {
				return // deadline: stopped
			}
			if errno != 0 && errno != unix.EINTR {
				errs[0] = fmt.Errorf("recvmmsg: %w", errno)
				return
			}
			if errno == 0 {
				var bytes uint64
				for k := range n {
					bytes += uint64(b.hdrs[k].Len)
				}
				got.Add(bytes)
			}
		}
	}()
	go func() { // the sender
		defer wg.Done()
		raw, err := u.tx.SyscallConn()
		if err != nil {
			errs[1] = err
			return
		}
		b := newMmsgBatch(txBatch, txSize)
		for !stop.Load() {
			var errno unix.Errno
			if err := raw.Write(func(fd uintptr) bool {
				_, errno = mmsgCall(unix.SYS_SENDMMSG, fd, b.hdrs)
				return errno != unix.EAGAIN
			}); err != nil {
				errs[1] = err
				return
			}
			if errno != 0 && errno != unix.EINTR && errno != unix.ECONNREFUSED {
				errs[1] = fmt.Errorf("sendmmsg: %w", errno)
				return
			}
		}
	}()
	time.Sleep(roceWarmup)
	n0, t0 := got.Load(), time.Now()
	time.Sleep(d)
	n1, t1 := got.Load(), time.Now()
	stop.Store(true)
	u.rx.SetReadDeadline(time.Now()) // unblock the receiver
	wg.Wait()
	u.rx.SetReadDeadline(time.Time{})
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	// Drain what is still queued, so the next repeat starts empty.
	u.rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	buf := make([]byte, 1<<16)
	for {
		if _, _, err := u.rx.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
	}
	u.rx.SetReadDeadline(time.Time{})
	return float64(n1-n0) / roceDatagram * rocePayload * 8 / t1.Sub(t0).Seconds() / 1e9, nil
}

// pingPong sends roceLatSize-byte datagrams from A to B, which echoes each
// back, one at a time, for d (at most maxSamples): the round trips. Both
// sides block in Go's netpoller, as the endpoints' receive goroutines do.
func (u *rawUDP) pingPong(d time.Duration, maxSamples int) ([]time.Duration, error) {
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := u.rx.ReadFromUDPAddrPort(buf)
			if err != nil {
				echoed <- nil // closed or stopped by the deadline
				return
			}
			if _, err := u.rx.WriteToUDPAddrPort(buf[:n], from); err != nil {
				echoed <- err
				return
			}
		}
	}()
	msg, buf := make([]byte, roceLatSize), make([]byte, 2048)
	lat := make([]time.Duration, 0, maxSamples)
	end := time.Now().Add(d)
	var err error
	for len(lat) < maxSamples && (len(lat) < 100 || time.Now().Before(end)) {
		t0 := time.Now()
		if _, err = u.tx.Write(msg); err != nil {
			break
		}
		u.tx.SetReadDeadline(t0.Add(time.Second))
		if _, _, err = u.tx.ReadFromUDPAddrPort(buf); err != nil {
			err = fmt.Errorf("no echo: %w", err)
			break
		}
		lat = append(lat, time.Since(t0))
	}
	u.tx.SetReadDeadline(time.Time{})
	u.rx.SetReadDeadline(time.Now())
	if e := <-echoed; err == nil {
		err = e
	}
	u.rx.SetReadDeadline(time.Time{})
	return lat, err
}

// firstPing makes one round trip on u, the first over its addresses,
// trying a few times: the first neighbour solicitation on a new veth is
// sometimes lost (IPv6), and the next leaves a second later.
func firstPing(u *rawUDP) (err error) {
	for range 5 {
		if _, err = u.pingPong(0, 1); err == nil {
			return nil
		}
	}
	return err
}

// roceResult is what the section measured: medians over the repeats.
type roceResult struct {
	goodput, blast   float64 // Gbit/s of payload; blast: the better of blastMmsg and blastGSO
	blastMmsg        float64 // the sendmmsg blast
	blastGSO         float64 // the UDP_SEGMENT blast
	blastsGSO        []float64
	v6               roce6Result
	p50, p99         float64 // µs, 64 B WRITE
	pingP50, pingP99 float64 // µs, UDP ping-pong
	txPerOp, rxShare float64 // datagrams A sent per 64 KiB WRITE; share of A's datagrams B received
	pmtu             roce.MTU
	goodputs, blasts []float64
	spinGoodput      float64   // Gbit/s, the client busy-polling
	spinGoodputs     []float64 // its repeats
	txPerCall        float64   // datagrams per sendmmsg of A's endpoint
}

// roce6Result is the IPv6 rows: the endpoints with GSO and GRO (on) and
// without (off), against the same veth's IPv6 blasts.
type roce6Result struct {
	on, off, blast, blastMmsg, blastGSO float64 // Gbit/s of payload, medians; blast: the better blast
	ons, offs, blastsMmsg, blastsGSO    []float64
	txPerOp, txPerCall, txPerGSO        float64 // A's datagrams per 64 KiB WRITE, per sendmmsg, per super-datagram (on)
	rxPerGRO                            float64 // B's datagrams per GRO buffer (on)
}
