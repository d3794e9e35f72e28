package main

// The roce section's client: a QP of the lab's A device streaming WRITEs
// to one of B's, or timing them one at a time.

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// roceClient is a QP on A's device connected, from GID index 1 (A's host
// address), to a QP on B's device: the requester's side streams WRITEs.
type roceClient struct {
	a, b  *side
	sq    int
	size  uint64
	slots int
	wrs   []verbs.SendWR
	sges  []abi.SGE
	wc    []verbs.WC
	// wait is what the client does when a poll found nothing.
	wait clientWait
}

// clientWait is what a client does after a poll of its CQ found nothing.
type clientWait int

const (
	waitSpin   clientWait = iota // poll again at once (perftest's default)
	waitYield                    // runtime.Gosched, then poll again (BenchmarkRoCEWrite64K compares)
	waitEvents                   // arm the CQ (REQ_NOTIFY_CQ) and sleep until its event (perftest -e)
	waitSleep                    // sleep for roceNap, then poll again
)

// roceNap is a waitSleep client's nap: far below the time the 8 MiB in
// flight take to cross the veth, so the client never leaves it idle.
const roceNap = 50 * time.Microsecond

func (w clientWait) String() string {
	return [...]string{"spin", "yield", "events", "sleep"}[w]
}

func openRoceClient(l *roceLab, sq int, bufBytes int) (*roceClient, error) {
	return openRoceClientOn(l.socks, roceAddrs, 0, sq, bufBytes)
}

// openRoceClient6 is openRoceClient over the veth's IPv6 addresses (GID
// index 2).
func openRoceClient6(l *roceLab, sq int, bufBytes int) (*roceClient, error) {
	return openRoceClientGID(l.socks, roceAddrs6, 2, 0, sq, bufBytes)
}

// openRoceClientOn connects a QP on the device of socks[0], from GID index
// 1 (addrs[0]), to one on the device of socks[1] (addrs[1]), asking for
// paths (MODIFY_QP's PATHS; 0: the device's default).
func openRoceClientOn(socks [2]string, addrs [2]netip.Addr, paths uint32, sq int, bufBytes int) (*roceClient, error) {
	return openRoceClientGID(socks, addrs, 1, paths, sq, bufBytes)
}

// openRoceClientGID is openRoceClientOn from GID index gid, which must be
// addrs[i]'s on each device.
func openRoceClientGID(socks [2]string, addrs [2]netip.Addr, gid uint32, paths uint32, sq int, bufBytes int) (*roceClient, error) {
	c := &roceClient{sq: sq, wrs: make([]verbs.SendWR, sq), sges: make([]abi.SGE, sq), wc: make([]verbs.WC, 2*sq)}
	for i := range c.wrs {
		c.wrs[i].SGL = c.sges[i : i+1 : i+1]
	}
	var err error
	if c.a, err = openSideDepth(socks[0], bufBytes, sq); err != nil {
		return nil, err
	}
	if c.b, err = openSideDepth(socks[1], bufBytes, sq); err != nil {
		c.a.close()
		return nil, err
	}
	var gids [2][16]byte
	for i, s := range []*side{c.a, c.b} {
		if gids[i], err = s.c.QueryGIDAt(gid); err != nil {
			c.close()
			return nil, fmt.Errorf("query gid %d: %w", gid, err)
		}
		if want := udp.GID(addrs[i]); gids[i] != want {
			c.close()
			return nil, fmt.Errorf("gid %d of device %d is %x, want the host address's %x", gid, i, gids[i], want)
		}
	}
	acc := abi.AccessRemoteWrite | abi.AccessRemoteRead
	opts := verbs.ConnectOpts{SGIDIndex: gid, Paths: paths}
	if err := c.a.qp.ConnectRCOpts(gids[1], c.b.qp.Num(), c.b.qp.PSN(), acc, opts); err != nil {
		c.close()
		return nil, fmt.Errorf("connect a: %w", err)
	}
	if err := c.b.qp.ConnectRCOpts(gids[0], c.a.qp.Num(), c.a.qp.PSN(), acc, opts); err != nil {
		c.close()
		return nil, fmt.Errorf("connect b: %w", err)
	}
	return c, nil
}

func (c *roceClient) close() {
	c.a.close()
	c.b.close()
}

func (c *roceClient) setSize(size uint64) {
	c.size = size
	c.slots = int(max(1, min(uint64(c.sq), uint64(len(c.a.mr.Bytes()))/size)))
}

// stream keeps c.sq WRITEs of c.size in flight for d and returns the
// operations completed and the time taken.
func (c *roceClient) stream(d time.Duration) (uint64, time.Duration, error) {
	var posted, done uint64
	start := time.Now()
	end := start.Add(d)
	last := start
	posting := true
	for spins := 0; ; spins++ {
		if spins&15 == 0 && posting {
			posting = time.Now().Before(end)
		}
		if !posting && done == posted {
			break
		}
		if free := c.sq - int(posted-done); posting && free > 0 {
			for j := range free {
				c.fill(j, posted+uint64(j))
			}
			err := c.a.qp.PostSend(c.wrs[:free]...)
			if err != nil && !errors.Is(err, verbs.ErrQueueFull) {
				return 0, 0, fmt.Errorf("post: %w", err)
			}
			if err == nil {
				posted += uint64(free)
			}
		}
		n, err := c.poll()
		if err != nil {
			return 0, 0, err
		}
		if n == 0 {
			if spins&1023 == 0 && time.Since(last) > stall {
				return 0, 0, fmt.Errorf("no completion for %v (posted %d, done %d)", stall, posted, done)
			}
			if n, err = c.idle(); err != nil {
				return 0, 0, err
			}
		}
		done += uint64(n)
		if n > 0 {
			last = time.Now()
		}
	}
	return done, time.Since(start), nil
}

// latency measures c.size WRITEs one at a time for d (at most maxSamples):
// post to the requester's completion, which the responder's ACK brings.
func (c *roceClient) latency(d time.Duration, maxSamples int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, maxSamples)
	end := time.Now().Add(d)
	for i := uint64(0); len(lat) < maxSamples && (len(lat) < 100 || time.Now().Before(end)); i++ {
		c.fill(0, i)
		t0 := time.Now()
		if err := c.a.qp.PostSend(c.wrs[:1]...); err != nil {
			return nil, fmt.Errorf("post: %w", err)
		}
		for spins := 0; ; spins++ {
			n, err := c.poll()
			if err == nil && n == 0 {
				n, err = c.idle()
			}
			if err != nil {
				return nil, err
			}
			if n > 0 {
				break
			}
			if spins&1023 == 1023 && time.Since(t0) > stall {
				return nil, fmt.Errorf("no completion for %v", stall)
			}
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

func (c *roceClient) fill(j int, i uint64) {
	off := (i % uint64(c.slots)) * c.size
	wr := &c.wrs[j]
	wr.WRID, wr.Opcode, wr.Flags = i, abi.WROpRDMAWrite, abi.WRFlagSignaled
	c.sges[j] = abi.SGE{Addr: c.a.mr.Addr + off, Length: uint32(c.size), LKey: c.a.mr.LKey}
	wr.RemoteAddr, wr.RKey = c.b.mr.Addr+off, c.b.mr.RKey
}

func (c *roceClient) poll() (int, error) {
	n, err := c.a.cq.Poll(c.wc)
	if err != nil {
		return 0, err
	}
	for k := range c.wc[:n] {
		if err := wcCheck(&c.wc[k]); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// idle waits as c.wait says after a poll found nothing; it returns the
// completions a poll after arming the CQ found.
func (c *roceClient) idle() (int, error) {
	switch c.wait {
	case waitYield:
		runtime.Gosched()
	case waitSleep:
		time.Sleep(roceNap)
	case waitEvents:
		if err := c.a.cq.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("req notify: %w", err)
		}
		// What completed before the CQ was armed raises no event.
		if n, err := c.poll(); n > 0 || err != nil {
			return n, err
		}
		if _, err := c.a.c.GetCQEvent(stall); err != nil {
			return 0, fmt.Errorf("cq event: %w", err)
		}
	}
	return 0, nil
}
