package impair

import (
	"fmt"
	"os"

	"github.com/vrdma/vrdma/internal/netlab"
)

// Interpose puts a hop into every path of mp: it diverts each path's
// traffic in M to a pair of TUN devices (netlab.MultiPath.Divert, with the
// TUNs' MTU set to cfg.MTU) and starts a Hop over them, path i of the Hop
// being mp.Paths[i]. Close the Hop before the Lab (t.Cleanup order does
// this when the Hop is made after the Lab): its TUNs keep M alive.
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
	}
	h, err := New(cfg, ports)
	if err != nil {
		return fail(err)
	}
	return h, nil
}
