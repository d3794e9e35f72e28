package main

// The roce section's baselines: the same veth's raw UDP, a sendmmsg blast
// of RoCE-sized datagrams and a 64-byte ping-pong.

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

func openRawUDP(l *roceLab) (*rawUDP, error) {
	rx, err := l.ns[1].ListenUDP(netip.AddrPortFrom(roceAddrs[1], 0))
	if err != nil {
		return nil, err
	}
	tx, err := l.ns[0].ListenUDP(netip.AddrPortFrom(roceAddrs[0], 0))
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
			if c == tx {
				serr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
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
func (u *rawUDP) blast(d time.Duration) (float64, error) {
	var got atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { // the receiver
		defer wg.Done()
		raw, err := u.rx.SyscallConn()
		if err != nil {
			errs[0] = err
			return
		}
		b := newMmsgBatch(roceBatch, 2048)
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
				got.Add(uint64(n))
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
		b := newMmsgBatch(roceBatch, roceDatagram)
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
	buf := make([]byte, 2048)
	for {
		if _, _, err := u.rx.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
	}
	u.rx.SetReadDeadline(time.Time{})
	return float64(n1-n0) * rocePayload * 8 / t1.Sub(t0).Seconds() / 1e9, nil
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

// roceResult is what the section measured: medians over the repeats.
type roceResult struct {
	goodput, blast   float64 // Gbit/s of payload
	p50, p99         float64 // µs, 64 B WRITE
	pingP50, pingP99 float64 // µs, UDP ping-pong
	txPerOp, rxShare float64 // datagrams A sent per 64 KiB WRITE; share of A's datagrams B received
	pmtu             roce.MTU
	goodputs, blasts []float64
	spinGoodput      float64   // Gbit/s, the client busy-polling
	spinGoodputs     []float64 // its repeats
	txPerCall        float64   // datagrams per sendmmsg of A's endpoint
}
