package main

// The roce section (issue 16, part 5): vrdma's RC QPs carried between two
// network namespaces as RoCEv2 (backend/rdma/roce/rc over
// backend/rdma/roce/udp), each figure beside the same veth's raw UDP
// measured in the same run: one QP's 64 KiB WRITE goodput against a
// sendmmsg blast, 64 B WRITE latency against a UDP ping-pong. Further rows,
// each in a lab of its own: multipath spray under loss against single-path
// go-back-N (roce_spray.go, with the goodput-against-loss picture), and
// vrdma against Linux soft-RoCE beside rxe against rxe (roce_rxe.go).

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	roceSize    = 64 << 10 // goodput message size
	roceTxDepth = 128      // perftest's default tx-depth of the bandwidth tests (DEF_TX_BW)
	roceLatSize = 64       // latency message size
	// roceDatagram is a full RoCEv2 packet at path MTU 1024 (BTH, 1024
	// bytes of payload, ICRC): what the blast sends, rocePayload of it
	// counted as goodput.
	roceDatagram = roce.BTHLen + rocePayload + roce.ICRCLen
	rocePayload  = 1024
	roceBatch    = 64      // datagrams per sendmmsg/recvmmsg, as udp.DefaultBatch
	roceSockBuf  = 4 << 20 // SO_SNDBUF/SO_RCVBUF of the baseline's sockets, as udp.DefaultBuffer
	roceLinkMTU  = 1500
	roceWarmup   = 100 * time.Millisecond // before each goodput repeat (cwnd's slow start, the blast's queues)
	// roceLabPrefix names the section's namespaces (netlab.Sweep removes
	// those of runs that died).
	roceLabPrefix = "vrdmabench"

	roceGoodputTarget = 0.7 // ≥ 0.7× the raw UDP blast
	roceLatTarget     = 2.0 // p50 ≤ 2× the UDP ping-pong's
)

// The veth's addresses, inside netlab.Range4.
var roceAddrs = [2]netip.Addr{netip.MustParseAddr("10.200.250.1"), netip.MustParseAddr("10.200.250.2")}

// roceRows measures further rows of the section in a lab of its own (it
// builds its namespaces, paths or rxe devices, and removes them) and
// returns only rows it measured, with their notes and, for the spray
// rows, the points of the goodput-against-loss picture.
type roceRows func(s settings, w io.Writer) (roceMore, error)

// roceMore is what a roceRows hook measured.
type roceMore struct {
	rows  []row
	notes []string
	loss  []lossPoint // the picture's points (spray rows only)
}

// The section's two further rows. A nil hook prints no row; the section
// notes that it was not measured.
var (
	// roceSprayRows: multipath spray (backend/rdma/roce/spray) at 1 %
	// loss on 1 of 4 paths, against single-path go-back-N on the lossy
	// path (roce_spray.go).
	roceSprayRows roceRows = sprayRows
	// roceRxeRows: vrdma↔rxe against rxe↔rxe on the same links
	// (roce_rxe.go).
	roceRxeRows roceRows = rxeRows
)

// roceLab is two namespaces joined by one veth (MTU 1500), each holding
// the RoCE endpoint of an in-process daemon with one device: A's device
// reaches B's only over the network, as two hosts' would.
type roceLab struct {
	lab   *netlab.Lab
	ns    [2]*netlab.NS
	nets  [2]*hostnet.Network
	rigs  [2]*rig
	socks [2]string
	pmtu  roce.MTU // the path MTU the endpoints derived from the link
}

func newRoceLab() (l *roceLab, err error) {
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	if _, err := netlab.Sweep(roceLabPrefix); err != nil {
		return nil, err
	}
	lab, err := netlab.New(netlab.Config{Prefix: roceLabPrefix})
	if err != nil {
		return nil, err
	}
	l = &roceLab{lab: lab}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	for i, label := range []string{"ra", "rb"} {
		if l.ns[i], err = lab.AddNS(label); err != nil {
			return nil, err
		}
	}
	links := [2]string{"va", "vb"}
	if err := lab.Veth(l.ns[0], links[0], l.ns[1], links[1]); err != nil {
		return nil, err
	}
	for i, ns := range l.ns {
		if err := ns.SetMTU(links[i], roceLinkMTU); err != nil {
			return nil, err
		}
		if err := ns.AddAddr(links[i], netip.PrefixFrom(roceAddrs[i], 24)); err != nil {
			return nil, err
		}
		if err := ns.SetUp(links[i], true); err != nil {
			return nil, err
		}
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.PanicLevel)
	for i, ns := range l.ns {
		n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
		if err != nil {
			return nil, err
		}
		l.nets[i] = n
		// The endpoint's socket, and the link MTU it reads, are those
		// of the namespace; its goroutines run anywhere.
		if err := ns.Do(func() error {
			if _, err := n.Listen(roceAddrs[i]); err != nil {
				return err
			}
			l.pmtu = udp.LinkPMTU(roceAddrs[i])
			return nil
		}); err != nil {
			return nil, fmt.Errorf("roce endpoint in %s: %w", ns.Label, err)
		}
		dir, err := os.MkdirTemp("", "vrdma-bench-roce-")
		if err != nil {
			return nil, err
		}
		l.rigs[i] = &rig{d: daemon.New(logrus.NewEntry(quiet), daemon.Config{Pool: enginePool, Pin: memmap.PinConfig{},
			RoCE: n, RoCEAddrs: []netip.Addr{roceAddrs[i]}}), dir: dir}
		if l.socks[i], err = l.rigs[i].device(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// close removes everything: the daemons, their endpoints (whose sockets
// would keep the namespaces alive), the namespaces. The front-ends must
// be closed first.
func (l *roceLab) close() {
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
	l.lab.Close()
}

// txDatagrams and rxDatagrams are endpoint i's counters.
func (l *roceLab) counters(i int) udp.Counters {
	var c udp.Counters
	for _, e := range l.nets[i].Endpoints() {
		x := e.Counters()
		c.TxDatagrams += x.TxDatagrams
		c.RxDatagrams += x.RxDatagrams
		c.TxErrors += x.TxErrors
		c.TxCalls += x.TxCalls
		c.RxCalls += x.RxCalls
	}
	return c
}

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

// openRoceClientOn connects a QP on the device of socks[0], from GID index
// 1 (addrs[0]), to one on the device of socks[1] (addrs[1]), asking for
// paths (MODIFY_QP's PATHS; 0: the device's default).
func openRoceClientOn(socks [2]string, addrs [2]netip.Addr, paths uint32, sq int, bufBytes int) (*roceClient, error) {
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
		if gids[i], err = s.c.QueryGIDAt(1); err != nil {
			c.close()
			return nil, fmt.Errorf("query gid 1: %w", err)
		}
		if want := udp.GID(addrs[i]); gids[i] != want {
			c.close()
			return nil, fmt.Errorf("gid 1 of device %d is %x, want the host address's %x", i, gids[i], want)
		}
	}
	acc := abi.AccessRemoteWrite | abi.AccessRemoteRead
	opts := verbs.ConnectOpts{SGIDIndex: 1, Paths: paths}
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

// roceMeasure runs the section's measurements in l, alternating each
// figure's repeats with its baseline's.
func roceMeasure(s settings, l *roceLab, w io.Writer) (roceResult, error) {
	res := roceResult{pmtu: l.pmtu}
	u, err := openRawUDP(l)
	if err != nil {
		return res, fmt.Errorf("udp sockets: %w", err)
	}
	defer u.close()
	c, err := openRoceClient(l, roceTxDepth, roceTxDepth*roceSize)
	if err != nil {
		return res, err
	}
	defer c.close()
	c.wait = waitYield

	progress(w, "roce: 64 KiB WRITE goodput against a UDP blast")
	c.setSize(roceSize)
	c.wait = waitSleep
	if _, _, err := c.stream(roceWarmup); err != nil {
		return res, fmt.Errorf("64 KiB WRITE: %w", err)
	}
	var ops uint64
	a0, b0 := l.counters(0), l.counters(1)
	for range s.repeats {
		for _, m := range []struct {
			wait clientWait
			dst  *[]float64
		}{{waitSleep, &res.goodputs}, {waitSpin, &res.spinGoodputs}} {
			c.wait = m.wait
			n, d, err := c.stream(s.rowTime)
			if err != nil {
				return res, fmt.Errorf("64 KiB WRITE (%v): %w", m.wait, err)
			}
			ops += n
			*m.dst = append(*m.dst, float64(n)*roceSize*8/d.Seconds()/1e9)
		}
		g, err := u.blast(s.rowTime)
		if err != nil {
			return res, fmt.Errorf("udp blast: %w", err)
		}
		res.blasts = append(res.blasts, g)
	}
	a1, b1 := l.counters(0), l.counters(1)
	if sent := a1.TxDatagrams - a0.TxDatagrams; ops > 0 && sent > 0 {
		res.txPerOp = float64(sent) / float64(ops)
		res.txPerCall = float64(sent) / float64(max(1, a1.TxCalls-a0.TxCalls))
		// B's endpoint receives only A's RoCE datagrams (the blast
		// goes to another port of its own).
		res.rxShare = float64(b1.RxDatagrams-b0.RxDatagrams) / float64(sent)
	}
	if res.txPerOp < roceSize/rocePayload {
		return res, fmt.Errorf("A's endpoint sent %.1f datagrams per 64 KiB WRITE, want ≥ %d: the QP did not use the network",
			res.txPerOp, roceSize/rocePayload)
	}
	res.spinGoodput = median(res.spinGoodputs)
	res.goodput, res.blast = median(res.goodputs), median(res.blasts)

	progress(w, "roce: 64 B WRITE latency against a UDP ping-pong")
	c.setSize(roceLatSize)
	c.wait = waitSpin // latency: the client busy-polls, as perftest's ib_write_lat
	var p50s, p99s, b50s, b99s []float64
	for range s.repeats {
		lat, err := c.latency(s.rowTime, 200000)
		if err != nil {
			return res, fmt.Errorf("64 B WRITE latency: %w", err)
		}
		slices.Sort(lat)
		p50s, p99s = append(p50s, us(percentile(lat, 50))), append(p99s, us(percentile(lat, 99)))
		pl, err := u.pingPong(s.rowTime, 200000)
		if err != nil {
			return res, fmt.Errorf("udp ping-pong: %w", err)
		}
		slices.Sort(pl)
		b50s, b99s = append(b50s, us(percentile(pl, 50))), append(b99s, us(percentile(pl, 99)))
	}
	res.p50, res.p99, res.pingP50, res.pingP99 = median(p50s), median(p99s), median(b50s), median(b99s)
	return res, nil
}

// roceSection measures the section, or says why it could not; loss is
// the goodput-against-loss picture's points (none if not measured).
func roceSection(s settings, w io.Writer) (sec section, loss []lossPoint, err error) {
	sec = section{title: "RoCEv2 between network namespaces", intro: roceIntro}
	l, err := newRoceLab()
	if errors.Is(err, netlab.ErrUnavailable) {
		sec.notes = append(sec.notes, "Not measured in this run: "+err.Error()+".")
		return sec, nil, nil
	}
	if err != nil {
		return sec, nil, fmt.Errorf("roce lab: %w", err)
	}
	res, err := roceMeasure(s, l, w)
	l.close()
	if err != nil {
		return sec, nil, fmt.Errorf("roce: %w", err)
	}
	sec.rows = roceRowsOf(res)
	var more []string
	for _, h := range []struct {
		name string
		rows roceRows
	}{{"multipath spray at 1 % loss on 1 of 4 paths against single-path go-back-N", roceSprayRows},
		{"vrdma↔rxe against rxe↔rxe", roceRxeRows}} {
		if h.rows == nil {
			more = append(more, "Not in this suite yet: "+h.name+".")
			continue
		}
		m, err := h.rows(s, w)
		if err != nil {
			return sec, nil, fmt.Errorf("roce, %s: %w", h.name, err)
		}
		sec.rows, more = append(sec.rows, m.rows...), append(more, m.notes...)
		loss = append(loss, m.loss...)
	}
	sec.notes = append(sec.notes, fmt.Sprintf("Path MTU %d. Per 64 KiB WRITE, A's endpoint sent %.2f datagrams (%d without "+
		"retransmission), %.1f per sendmmsg, and B's received %.1f %% of them. Goodput repeats (Gbit/s): vrdma %s, "+
		"busy-polling %s, blast %s.", int(res.pmtu), res.txPerOp, roceSize/int(res.pmtu), res.txPerCall, 100*res.rxShare,
		fmtList(res.goodputs), fmtList(res.spinGoodputs), fmtList(res.blasts)))
	sec.notes = append(sec.notes, more...)
	sec.notes = append(sec.notes, verdict(sec.rows, roceMissOf(sec.rows)))
	return sec, loss, nil
}

func roceRowsOf(r roceResult) []row {
	return []row{
		{name: "64 KiB WRITE goodput, one QP, tx-depth 128", figure: r.goodput, unit: "Gbit/s",
			baseName: "UDP blast (sendmmsg, 1040 B), payload", baseline: r.blast, baseUnit: "Gbit/s",
			target: fmt.Sprintf("≥ %.1f×", roceGoodputTarget), met: boolp(r.goodput >= roceGoodputTarget*r.blast)},
		{name: "the same, the client busy-polling its CQ", figure: r.spinGoodput, unit: "Gbit/s",
			baseName: "UDP blast (sendmmsg, 1040 B), payload", baseline: r.blast, baseUnit: "Gbit/s"},
		{name: "64 B WRITE latency p50", figure: r.p50, unit: "µs", baseName: "UDP ping-pong p50 (64 B)",
			baseline: r.pingP50, baseUnit: "µs", invRatio: true,
			target: fmt.Sprintf("≤ %.0f× (ratio ≥ %.1f×)", roceLatTarget, 1/roceLatTarget), met: boolp(r.p50 <= roceLatTarget*r.pingP50)},
		{name: "64 B WRITE latency p99", figure: r.p99, unit: "µs", baseName: "UDP ping-pong p99 (64 B)",
			baseline: r.pingP99, baseUnit: "µs", invRatio: true},
	}
}

func fmtList(xs []float64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += ", "
		}
		s += fmtNum(x)
	}
	return s
}

const roceIntro = "Two network namespaces joined by one veth (MTU 1500, so the endpoints lower the path MTU to " +
	"1024: a full packet is 1040 bytes of UDP payload, BTH + 1024 + ICRC), each holding the RoCEv2 endpoint " +
	"(backend/rdma/roce/udp, UDP 4791) of an in-process daemon with one device, the daemon started with that " +
	"namespace's address as `--roce-bind` (its socket opened inside the namespace). An RC QP on A's device is " +
	"connected from GID index 1 (::ffff:10.200.250.1) to a QP on B's, so every packet crosses the veth through " +
	"both kernels' UDP stacks (backend/rdma/roce/rc over udp), driven by a virtio-user client per device. " +
	"Goodput: 64 KiB WRITEs, 128 in flight (perftest's default tx-depth), payload bits per second; baseline: " +
	"a raw blast over the same veth, sendmmsg of 64 datagrams of 1040 bytes a call from A, recvmmsg at B, " +
	"both sockets with the endpoints' 4 MiB buffers, counting 1024 payload bytes per datagram that arrived. " +
	"Latency: 64 B WRITEs one at a time, post to the requester's completion (the responder's ACK); baseline: " +
	"a 64-byte UDP ping-pong between the same addresses, one datagram at a time, both sides blocking in Go's " +
	"netpoller as the endpoints' receive goroutines do. Each repeat of a figure is followed by one of its " +
	"baseline. CPUs: the machine's two cores are shared, in one process, by the client (in the target " +
	"goodput row it naps 50 µs when a poll of its CQ finds nothing, far below the time the 8 MiB in flight " +
	"take on the wire; the next row and the latency rows busy-poll, as perftest does), the engine pool serving both daemons' doorbells (the requester's WQE → rc.Conn.Post, " +
	"which sends the first 32 packets), each endpoint's receive, pump and timer goroutines (sealing, ICRC, " +
	"the responder's copy into guest memory, ACKs), and the kernel's veth and UDP softirq work for both " +
	"namespaces; the blast's sender and receiver share the same two cores with the softirq work. The rows " +
	"after the latency rows (multipath spray under loss, vrdma against soft-RoCE) are measured in labs of " +
	"their own, described under the table."

// roceMiss is printed under a missed target: what the profiles showed
// (`vrdma-bench --only roce --cpuprofile`, and BenchmarkRoCEWrite64K and
// BenchmarkRoCEWriteLatency with -cpuprofile) while this section was
// developed on the 2-core machine.
const roceMiss = "Profiles: in the goodput rows about a third of the CPU samples are sendmmsg (the kernel's veth " +
	"and UDP work, which the blast pays too; the endpoint sends 32 datagrams a call, rc's Burst, where the blast " +
	"sends 64), the rc requester's pump and the receive side's ICRC, placement copy and ACKs only a few per cent " +
	"each; a client that busy-polls its CQ takes a whole core (CQ.Poll's mutex, and with runtime.Gosched the " +
	"scheduler's run-queue lock) from the endpoint's goroutines and the softirq work, which is why the " +
	"busy-polling row is a third of the napping one. Latency: the ping-pong has nothing runnable between its " +
	"datagrams, while a WRITE's round trip has the busy-polling client and the engine worker (which spins after " +
	"work before it sleeps) on the two cores, so the endpoints' receive goroutines, woken by the netpoller, " +
	"wait for a processor: the p50 is two such wake-ups plus the doorbell, and the p99 (milliseconds) is a " +
	"preemption time slice. What would close it: an engine that does not spin while its only QPs are network " +
	"QPs waiting on the transport, and the client on a core of its own (vrdmad --engine-cpus on a larger host)."
