package netlab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on a fresh OS thread that has entered the namespace, and
// returns fn's error. Whatever fn creates with a system call on that
// thread (sockets, TUN descriptors) belongs to the namespace and keeps
// working from any goroutine afterwards; goroutines fn starts run on other
// threads, outside it. A panic in fn is re-raised in the caller.
//
// The thread never runs anything else: the goroutine locks itself to it,
// calls setns(2), and returns still locked, so the runtime terminates the
// thread instead of returning it to the pool in the wrong namespace
// (runtime.LockOSThread: "If the calling goroutine exits without unlocking
// the thread, the thread will be terminated"). Unlocking, even after
// setns back, would be wrong if that second setns failed.
func (n *NS) Do(fn func() error) error {
	fd, err := unix.Open(nsPath(n.Name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", n.Label, err)
	}
	defer unix.Close(fd)
	type result struct {
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: see above.
		var r result
		defer func() {
			r.panic = recover()
			done <- r
		}()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			r.err = fmt.Errorf("setns %s: %w", n.Label, err)
			return
		}
		r.err = fn()
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

// Command returns a command that runs name with args inside the namespace
// (through `ip netns exec`, which also mounts the namespace's /sys). It is
// killed when ctx is done or the Lab is closed, whichever comes first; the
// caller still Waits for it.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cctx, cancel := context.WithCancel(ctx)
	// Cancel when the Lab closes; both contexts end by then, so nothing
	// outlives the Lab.
	context.AfterFunc(n.lab.ctx, cancel)
	return exec.CommandContext(cctx, n.lab.ipPath,
		append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// OpenTUN creates a TUN device name in the namespace (IFF_TUN|IFF_NO_PI: a
// Read returns one IP packet, a Write injects one) and returns its
// descriptor, non-blocking and registered with Go's poller, so Close
// unblocks a Read. The device is not persistent: it disappears when the
// file is closed. It is created down; see SetUp.
func (n *NS) OpenTUN(name string) (*os.File, error) {
	return n.openTun(name, unix.IFF_TUN|unix.IFF_NO_PI)
}

// OpenTap attaches to the tap device name made by AddTap (or creates a
// non-persistent one) and returns its descriptor, for a QEMU that runs
// outside the namespace (-netdev tap,fd=N with the file in
// exec.Cmd.ExtraFiles). vnetHdr asks for IFF_VNET_HDR, as QEMU's
// virtio-net offloads want.
func (n *NS) OpenTap(name string, vnetHdr bool) (*os.File, error) {
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if vnetHdr {
		flags |= unix.IFF_VNET_HDR
	}
	return n.openTun(name, flags)
}

func (n *NS) openTun(name string, flags uint16) (*os.File, error) {
	if err := checkIfName(name); err != nil {
		return nil, err
	}
	fd := -1
	err := n.Do(func() error {
		// TUNSETIFF creates (or finds) the device in the namespace of
		// the calling thread.
		f, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(f)
			return err
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(f, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(f)
			return fmt.Errorf("TUNSETIFF %s: %w", name, err)
		}
		fd = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tun %s/%s: %w", n.Label, name, err)
	}
	// O_NONBLOCK makes os.NewFile register the descriptor with the poller.
	return os.NewFile(uintptr(fd), "tun:"+n.Label+"/"+name), nil
}

// ListenUDP opens a UDP socket in the namespace bound to laddr, which must
// lie in Range4 or Range6 (port 0 picks one).
func (n *NS) ListenUDP(laddr netip.AddrPort) (*net.UDPConn, error) {
	if err := checkAddr(laddr.Addr()); err != nil {
		return nil, err
	}
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(laddr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("udp %s/%s: %w", n.Label, laddr, err)
	}
	return c, nil
}
