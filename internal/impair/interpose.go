package impair

import (
	"fmt"
	"os"
	"strconv"

	"github.com/vrdma/vrdma/internal/netlab"
)

// tunQueueLen is the kernel's default queue of a TUN device (packets).
const tunQueueLen = 500

// Interpose puts a hop into every path of mp: it diverts each path's
// traffic in M to a pair of TUN devices (netlab.MultiPath.Divert, with the
// TUNs' MTU set to cfg.MTU) and starts a Hop over them, path i of the Hop
// being mp.Paths[i]. A cfg.QueueLen above the TUNs' default queue (500
// packets) becomes their queue too. Close the Hop before the Lab
// (t.Cleanup order does this when the Hop is made after the Lab): its TUNs
// keep M alive.
func Interpose(mp *netlab.MultiPath, cfg Config) (*Hop, error) {
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	var ports []Port
	var files []*os.File
	fail := func(err error) (*Hop, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	for _, p := range mp.Paths {
		a, b, err := mp.Divert(p.Index, mtu)
		if err != nil {
			return fail(fmt.Errorf("interpose path %d: %w", p.Index, err))
		}
		files = append(files, a, b)
		ports = append(ports, Port{FromA: a, FromB: b})
		// The TUN's own queue, in front of the reader, holds as many
		// packets as the lane does: a reader that the scheduler of a busy
		// machine keeps waiting does not make the kernel drop silently
		// what the lane would have queued (and counted).
		if q := cfg.QueueLen; q > tunQueueLen {
			for _, tun := range []string{fmt.Sprintf("hopa%d", p.Index), fmt.Sprintf("hopb%d", p.Index)} {
				if _, err := mp.M.IP("link", "set", "dev", tun, "txqueuelen", strconv.Itoa(q)); err != nil {
					return fail(fmt.Errorf("interpose path %d: %w", p.Index, err))
				}
			}
		}
	}
	h, err := New(cfg, ports)
	if err != nil {
		return fail(err)
	}
	return h, nil
}
