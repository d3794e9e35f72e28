package main

// The roce section's spray rows (issue 16, part 5): a vrdma QP sprayed
// over four parallel paths (backend/rdma/roce/spray, chosen by
// backend/rdma/roce/hostnet for a QP that asks for PATHS 4), one path
// losing packets in the user-space impairment hop, against a plain RC QP
// (go-back-N) on that lossy path, both between two in-process daemons
// whose endpoints are in namespaces A and B of a netlab.MultiPath.

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/impair"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/memmap"
)

const (
	sprayPaths  = 4    // the sprayed QP's paths
	sprayLossy  = 0    // the path that loses packets, and the single-path QP's (GID index 1)
	sprayLoss   = 0.01 // the row's loss on sprayLossy, each direction
	sprayTarget = 3.0  // issue 16: spray ≥ 3× single-path go-back-N
	// sprayTxDepth WRITEs posted (2 MiB): more than either transport
	// keeps in flight (rc's Window, spray's per-path windows), so each
	// runs at its own limit and the queue drains quickly even at 5 %.
	sprayTxDepth = 32
	sprayHopSeed = 16 // the hop's random choices start from a fixed seed
	// sprayHopQueue is each direction's packet buffers in the hop: more
	// than the 2 MiB posted, so the hop drops only by its Rule.
	sprayHopQueue = 4096
)

// sprayLab is hosts A and B joined by sprayPaths paths through M, where an
// impair.Hop forwards every path's packets; A and B each hold an
// in-process daemon whose RoCE endpoints are its namespace's path
// addresses (GID index 1 + i: path i), with two devices: a device has one
// front-end, so each of the two QPs gets one of its own.
type sprayLab struct {
	lab   *netlab.Lab
	mp    *netlab.MultiPath
	hop   *impair.Hop
	nets  [2]*hostnet.Network
	rigs  [2]*rig
	socks [2][2]string // socks[q][host]: QP q's devices in A and B
	pmtu  roce.MTU
}

func newSprayLab() (l *sprayLab, err error) {
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	lab, err := netlab.New(netlab.Config{Prefix: roceLabPrefix})
	if err != nil {
		return nil, err
	}
	l = &sprayLab{lab: lab}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	if l.mp, err = lab.NewMultiPath(sprayPaths); err != nil {
		return nil, err
	}
	if l.hop, err = impair.Interpose(l.mp, impair.Config{Seed: sprayHopSeed, QueueLen: sprayHopQueue}); err != nil {
		return nil, err
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.PanicLevel)
	for i, ns := range []*netlab.NS{l.mp.A, l.mp.B} {
		addrs := l.addrs(i)
		// One path unless a QP asks (MODIFY_QP's PATHS), as vrdmad
		// without --roce-paths.
		n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
		if err != nil {
			return nil, err
		}
		l.nets[i] = n
		if err := ns.Do(func() error {
			for _, a := range addrs {
				if _, err := n.Listen(a); err != nil {
					return err
				}
			}
			l.pmtu = udp.LinkPMTU(addrs[0])
			return nil
		}); err != nil {
			return nil, fmt.Errorf("roce endpoints in %s: %w", ns.Label, err)
		}
		dir, err := os.MkdirTemp("", "vrdma-bench-spray-")
		if err != nil {
			return nil, err
		}
		l.rigs[i] = &rig{d: daemon.New(logrus.NewEntry(quiet), daemon.Config{Pool: enginePool, Pin: memmap.PinConfig{},
			RoCE: n, RoCEAddrs: addrs}), dir: dir}
		for q := range l.socks {
			if l.socks[q][i], err = l.rigs[i].device(); err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// addrs returns host i's (0: A, 1: B) IPv4 addresses, path by path.
func (l *sprayLab) addrs(i int) []netip.Addr {
	var as []netip.Addr
	for _, p := range l.mp.Paths {
		as = append(as, [2]netip.Addr{p.A, p.B}[i])
	}
	return as
}

// close removes everything: daemons, endpoints, the hop (its TUNs keep M
// alive), the namespaces. The front-ends must be closed first.
func (l *sprayLab) close() {
	for _, r := range l.rigs {
		if r != nil {
			r.close()
		}
	}
	for _, n := range l.nets {
		if n != nil {
			n.Close()
		}
	}
	if l.hop != nil {
		l.hop.Close()
	}
	l.lab.Close()
}

// client connects QP q (0 or 1) of A's devices from GID index 1 (path
// sprayLossy's address) to B's address on the same path, asking for paths
// paths.
func (l *sprayLab) client(q int, paths uint32) (*roceClient, error) {
	p := l.mp.Paths[sprayLossy]
	return openRoceClientOn(l.socks[q], [2]netip.Addr{p.A, p.B}, paths, sprayTxDepth, sprayTxDepth*roceSize)
}

// txByPath returns the datagrams A's endpoint of each path has sent.
func (l *sprayLab) txByPath() []uint64 {
	var tx []uint64
	for _, e := range l.nets[0].Endpoints() { // ordered by address: path order
		tx = append(tx, e.Counters().TxDatagrams)
	}
	return tx
}

// lossPoint is one loss rate of the picture: goodput (Gbit/s) of the
// sprayed QP and of the single-path one, loss on sprayLossy.
type lossPoint struct {
	loss         float64 // probability, each direction
	spray, plain float64
}

// sprayResult is what the spray rows measured.
type sprayResult struct {
	spray, plain   float64   // medians at sprayLoss, Gbit/s
	sprays, plains []float64 // their repeats
	share          []float64 // the spray QP's datagrams by path, fractions
	sprayTx        float64   // datagrams A sent per 64 KiB WRITE, sprayed
	plainTx        float64   // and single-path
	hop            impair.Counters
	points         []lossPoint
	pmtu           roce.MTU
}

// sprayLossRates are the picture's loss rates on the lossy path.
func sprayLossRates(quick bool) []float64 {
	if quick {
		return []float64{0, 0.01, 0.05}
	}
	return []float64{0, 0.001, 0.005, 0.01, 0.02, 0.05}
}

// sprayMeasure runs the picture's points in l, the row's among them:
// at each loss rate a warm-up, then s.repeats repeats of the sprayed QP
// each followed by one of the single-path QP (medians).
func sprayMeasure(s settings, l *sprayLab, w io.Writer) (sprayResult, error) {
	res := sprayResult{pmtu: l.pmtu}
	sc, err := l.client(0, sprayPaths)
	if err != nil {
		return res, fmt.Errorf("sprayed qp: %w", err)
	}
	defer sc.close()
	pc, err := l.client(1, 1)
	if err != nil {
		return res, fmt.Errorf("single-path qp: %w", err)
	}
	defer pc.close()
	for _, c := range []*roceClient{sc, pc} {
		c.setSize(roceSize)
		c.wait = waitSleep
	}
	// one streams c for d and returns its goodput, the operations and
	// the datagrams A's endpoints sent by path.
	one := func(c *roceClient, d time.Duration) (float64, uint64, []uint64, error) {
		t0 := l.txByPath()
		n, took, err := c.stream(d)
		if err != nil {
			return 0, 0, nil, err
		}
		t1 := l.txByPath()
		for i := range t1 {
			t1[i] -= t0[i]
		}
		return float64(n) * roceSize * 8 / took.Seconds() / 1e9, n, t1, nil
	}
	progress(w, "roce: 64 KiB WRITE, %d paths against 1, loss on path %d: %d rates", sprayPaths, sprayLossy,
		len(sprayLossRates(s.quick)))
	for _, p := range sprayLossRates(s.quick) {
		if err := l.hop.SetRule(sprayLossy, impair.Rule{Loss: p}); err != nil {
			return res, err
		}
		// Warm-up at the new rate: the first time the spray QP's
		// negotiation (HELLO), then the paths' windows and scores, and
		// the single-path QP's, under that loss.
		for _, c := range []*roceClient{sc, pc} {
			if _, _, _, err := one(c, roceWarmup); err != nil {
				return res, fmt.Errorf("warm-up at %s %% loss: %w", lossLabel(p), err)
			}
		}
		h0 := l.hop.Counters(sprayLossy)
		byPath := make([]uint64, sprayPaths)
		var sprays, plains []float64
		var sOps, pOps, pTx uint64
		for range s.repeats {
			g, n, tx, err := one(sc, s.rowTime)
			if err != nil {
				return res, fmt.Errorf("sprayed 64 KiB WRITE at %s %% loss: %w", lossLabel(p), err)
			}
			sprays, sOps = append(sprays, g), sOps+n
			for i := range tx {
				byPath[i] += tx[i]
			}
			g, n, tx, err = one(pc, s.rowTime)
			if err != nil {
				return res, fmt.Errorf("single-path 64 KiB WRITE at %s %% loss: %w", lossLabel(p), err)
			}
			plains, pOps = append(plains, g), pOps+n
			for i, x := range tx {
				// The idle sprayed QP may probe a path now and then.
				if i != sprayLossy && x > tx[sprayLossy]/100 {
					return res, fmt.Errorf("the single-path QP sent %d datagrams on path %d: it did not stay on path %d",
						x, i, sprayLossy)
				}
				pTx += x
			}
		}
		var total uint64
		for _, x := range byPath {
			total += x
		}
		for _, x := range byPath {
			if x == 0 {
				return res, fmt.Errorf("at %s %% loss the sprayed QP sent nothing on one of its paths (by path: %v): "+
					"it did not spray", lossLabel(p), byPath)
			}
		}
		pt := lossPoint{loss: p, spray: median(sprays), plain: median(plains)}
		res.points = append(res.points, pt)
		if p != sprayLoss {
			continue
		}
		h1 := l.hop.Counters(sprayLossy)
		res.hop = impair.Counters{Received: h1.Received - h0.Received, DroppedLoss: h1.DroppedLoss - h0.DroppedLoss,
			QueueFull: h1.QueueFull - h0.QueueFull}
		for _, x := range byPath {
			res.share = append(res.share, float64(x)/float64(total))
		}
		res.sprayTx = float64(total) / float64(max(1, sOps))
		res.plainTx = float64(pTx) / float64(max(1, pOps))
		res.spray, res.plain, res.sprays, res.plains = pt.spray, pt.plain, sprays, plains
	}
	if res.sprays == nil {
		return res, fmt.Errorf("the loss rates %v lack the row's %v", sprayLossRates(s.quick), sprayLoss)
	}
	return res, l.hop.SetRule(sprayLossy, impair.Rule{})
}

// sprayRows is the section's roceSprayRows: it builds the multipath lab,
// measures, and removes the lab.
func sprayRows(s settings, w io.Writer) (roceMore, error) {
	l, err := newSprayLab()
	if err != nil {
		return roceMore{}, fmt.Errorf("multipath lab: %w", err)
	}
	res, err := sprayMeasure(s, l, w)
	l.close()
	if err != nil {
		return roceMore{}, err
	}
	return roceMore{rows: sprayRowsOf(res), notes: sprayNotes(res), loss: res.points}, nil
}

func sprayRowsOf(r sprayResult) []row {
	return []row{{name: fmt.Sprintf("64 KiB WRITE goodput, one QP sprayed over %d paths, %.0f %% loss on one",
		sprayPaths, 100*sprayLoss), figure: r.spray, unit: "Gbit/s",
		baseName: "a QP on the lossy path alone (plain RC, go-back-N)", baseline: r.plain, baseUnit: "Gbit/s",
		target: fmt.Sprintf("≥ %.0f×", sprayTarget), met: boolp(r.spray >= sprayTarget*r.plain)}}
}

// sprayMiss is printed under a missed spray target.
const sprayMiss = "Spray: the sprayed QP's share of the lossy path and the datagrams it sent per WRITE are in the note " +
	"above; BenchmarkSprayLoss (backend/rdma/roce/spray) measures the transport alone between the same kind of paths, " +
	"without the engine, for profiling."

// roceMissOf is what verdict prints under the section's missed targets:
// the veth rows' profiles when one of them missed, the spray row's
// pointers when it did.
func roceMissOf(rows []row) string {
	var miss []string
	for _, r := range rows {
		if r.met == nil || *r.met {
			continue
		}
		m := roceMiss
		if strings.Contains(r.name, "sprayed") {
			m = sprayMiss
		}
		if !slices.Contains(miss, m) {
			miss = append(miss, m)
		}
	}
	return strings.Join(miss, " ")
}

// lossPNG is the goodput-against-loss picture's file, beside the
// bandwidth chart.
const lossPNG = "benchmarks-roce-loss.png"

func sprayNotes(r sprayResult) []string {
	share := ""
	for i, x := range r.share {
		if i > 0 {
			share += ", "
		}
		share += fmt.Sprintf("%.0f %%", 100*x)
	}
	pts := ""
	for i, p := range r.points {
		if i > 0 {
			pts += "; "
		}
		pts += fmt.Sprintf("%s %%: %s against %s", lossLabel(p.loss), fmtNum(p.spray), fmtNum(p.plain))
	}
	clean := ""
	if len(r.points) > 0 && r.points[0].loss == 0 && r.points[0].plain > 0 {
		x := r.points[0].spray / r.points[0].plain
		clean = fmt.Sprintf(" Without loss the sprayed QP reaches %.2f× the single-path one.", x)
		if x < 1.1 {
			clean += " Every path's packets cross the one user-space hop and both kernels on the same two cores, so " +
				"here four paths carry about as much as one: what spraying gains under loss is recovery (selective " +
				"retransmission, per path; traffic moved off the lossy path), not bandwidth."
		}
	}
	return []string{
		fmt.Sprintf("Multipath (the spray row): hosts A and B, each a namespace with an in-process daemon of two devices "+
			"(one per QP below: a device has one front-end), "+
			"joined by %d parallel paths (internal/netlab's MultiPath: per path a veth pair from A and from B into a "+
			"middle namespace M, MTU 1500, each path its own address pair in 10.200.<path>.0/24) on which M forwards "+
			"every packet through internal/impair's user-space hop (TUN devices, a reader and a scheduler goroutine "+
			"per direction of each path, %d buffers each so that it drops only by its rule). The hop drops %.0f %% of "+
			"path %d's packets each way (random, from a fixed seed), the other paths lose nothing. "+
			"Each daemon's RoCE endpoints are its host's %d path addresses (as vrdmad --roce-bind once per path, "+
			"the network's default one path). Two QPs, each on a device of A's, each connected from GID index 1 (path %d's "+
			"address, 10.200.%d.1) to a QP on a device of B's at B's address of that path (10.200.%d.129): one asks for PATHS "+
			"%d at RTR (backend/rdma/roce/hostnet then gives it backend/rdma/roce/spray, which negotiates with "+
			"the peer and sprays over every address pair, scoring each path), the other for 1 (plain RoCEv2 RC, "+
			"backend/rdma/roce/rc: go-back-N). The single-path QP is on the lossy path because that is the fair "+
			"baseline: a plain RC QP cannot leave its path, and an ECMP fabric hashes a flow onto one path "+
			"whatever its loss, so plain RC on a clean path would measure the luck of the hash, not loss "+
			"recovery; each QP starts on the same address pair. Both stream 64 KiB WRITEs, %d posted at a time "+
			"(2 MiB, more than either transport keeps in flight), the client napping as in the first row, one QP "+
			"at a time, each after %v of warm-up at the new loss rate, each repeat of the sprayed QP followed by "+
			"one of the single-path QP. The whole data path is in each figure: the engine, "+
			"hostnet, the transport, the endpoints' sockets, both kernels and the hop, on the machine's two cores.",
			sprayPaths, sprayHopQueue, 100*sprayLoss, sprayLossy, sprayPaths, sprayLossy, sprayLossy, sprayLossy,
			sprayPaths, sprayTxDepth, roceWarmup),
		fmt.Sprintf("At %.0f %% loss: goodput repeats (Gbit/s) sprayed %s, single-path %s. A's endpoints sent %.1f "+
			"datagrams per sprayed 64 KiB WRITE and %.1f per single-path one (%d without retransmission); the "+
			"sprayed QP's datagrams by path: %s. The hop received %d packets on path %d (both QPs, both "+
			"directions), dropped %d by the loss rule and %d for want of a buffer.",
			100*sprayLoss, fmtList(r.sprays), fmtList(r.plains), r.sprayTx, r.plainTx, roceSize/int(r.pmtu), share,
			r.hop.Received, sprayLossy, r.hop.DroppedLoss, r.hop.QueueFull),
		fmt.Sprintf("Goodput against the loss rate of path %d, each point measured as the row is (the %.0f %% point is the "+
			"row itself), sprayed over %d paths against single-path, medians in Gbit/s: %s.%s", sprayLossy,
			100*sprayLoss, sprayPaths, pts, clean),
		fmt.Sprintf("![64 KiB WRITE goodput against the loss rate of one path, %d paths and 1](%s)", sprayPaths, lossPNG),
	}
}

// lossLabel prints a loss probability as a percentage: 0.005 → "0.5".
func lossLabel(p float64) string { return strconv.FormatFloat(100*p, 'g', 3, 64) }
