package main

// The roce section (issue 16, part 5): vrdma's RC QPs carried between two
// network namespaces as RoCEv2 (backend/rdma/roce/rc over
// backend/rdma/roce/udp), each figure beside the same veth's raw UDP
// measured in the same run: one QP's 64 KiB WRITE goodput against a
// sendmmsg blast, 64 B WRITE latency against a UDP ping-pong. Further rows,
// each in a lab of its own: multipath spray under loss against single-path
// go-back-N (roce_spray.go, with the goodput-against-loss picture), and
// vrdma against Linux soft-RoCE beside rxe against rxe (roce_rxe.go). The
// lab is roce_lab.go, the verbs client roce_client.go, the raw UDP
// baselines roce_udp.go.

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/netlab"
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

// The veth's addresses, inside netlab.Range4, and its IPv6 ones, inside

// roceGSOSegs is the datagrams of one super-datagram of the UDP_SEGMENT
// blast: as many 1040-byte datagrams as 64 KiB of IP datagram holds (62,
// as the endpoint's GSO packs them), roceGSOBatch super-datagrams a
// sendmmsg.
const (
	roceGSOSegs  = 62
	roceGSOBatch = 8
)

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
	closed := false
	defer func() {
		if !closed {
			c.close()
		}
	}()
	c.wait = waitYield

	progress(w, "roce: 64 KiB WRITE goodput against a UDP blast")
	c.setSize(roceSize)
	c.wait = waitSleep
	if _, _, err := c.stream(roceWarmup); err != nil {
		return res, fmt.Errorf("64 KiB WRITE: %w", err)
	}
	var ops uint64
	a0, b0 := l.counters(0, false), l.counters(1, false)
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
		if g, err = u.blastGSO(s.rowTime); err != nil {
			return res, fmt.Errorf("udp blast, UDP_SEGMENT: %w", err)
		}
		res.blastsGSO = append(res.blastsGSO, g)
	}
	a1, b1 := l.counters(0, false), l.counters(1, false)
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
	res.goodput, res.blastMmsg, res.blastGSO = median(res.goodputs), median(res.blasts), median(res.blastsGSO)
	res.blast = max(res.blastMmsg, res.blastGSO)

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

	// A device serves one front-end: the IPv6 client needs A's and B's.
	c.close()
	closed = true
	progress(w, "roce: 64 KiB WRITE goodput over IPv6, GSO and GRO on and off, against UDP blasts")
	if res.v6, err = roceMeasure6(s, l); err != nil {
		return res, err
	}
	return res, nil
}

// roceMeasure6 measures the IPv6 goodput rows: a QP from GID index 2 (the
// veth's IPv6 addresses), the client napping as in the target IPv4 row,
// each repeat with the endpoints' GSO and GRO on, then off (Endpoint.
// SetOffload), then the two IPv6 blasts.
func roceMeasure6(s settings, l *roceLab) (roce6Result, error) {
	var r roce6Result
	u, err := openRawUDPOn(l, roceAddrs6)
	if err != nil {
		return r, fmt.Errorf("udp sockets (IPv6): %w", err)
	}
	defer u.close()
	// One round trip first: both sides' neighbour entries are then
	// resolved, and the QP's first burst does not wait in (or overflow)
	// a neighbour queue.
	if err := firstPing(u); err != nil {
		return r, fmt.Errorf("udp ping (IPv6): %w", err)
	}
	c, err := openRoceClient6(l, roceTxDepth, roceTxDepth*roceSize)
	if err != nil {
		return r, err
	}
	defer c.close()
	c.setSize(roceSize)
	c.wait = waitSleep
	if _, _, err := c.stream(roceWarmup); err != nil {
		return r, fmt.Errorf("64 KiB WRITE (IPv6): %w", err)
	}
	defer l.setOffload(true)
	var ops uint64
	var a, b udp.Counters // A's and B's counters over the runs with offload
	for range s.repeats {
		for _, on := range []bool{true, false} {
			if err := l.setOffload(on); err != nil {
				return r, fmt.Errorf("offload %v: %w", on, err)
			}
			a0, b0 := l.counters(0, true), l.counters(1, true)
			n, d, err := c.stream(s.rowTime)
			if err != nil {
				return r, fmt.Errorf("64 KiB WRITE (IPv6, offload %v): %w", on, err)
			}
			g := float64(n) * roceSize * 8 / d.Seconds() / 1e9
			if !on {
				r.offs = append(r.offs, g)
				continue
			}
			r.ons = append(r.ons, g)
			ops += n
			a1, b1 := l.counters(0, true), l.counters(1, true)
			a.TxDatagrams += a1.TxDatagrams - a0.TxDatagrams
			a.TxCalls += a1.TxCalls - a0.TxCalls
			a.TxGSO += a1.TxGSO - a0.TxGSO
			b.RxDatagrams += b1.RxDatagrams - b0.RxDatagrams
			b.RxGRO += b1.RxGRO - b0.RxGRO
		}
		g, err := u.blast(s.rowTime)
		if err != nil {
			return r, fmt.Errorf("udp blast (IPv6): %w", err)
		}
		r.blastsMmsg = append(r.blastsMmsg, g)
		if g, err = u.blastGSO(s.rowTime); err != nil {
			return r, fmt.Errorf("udp blast (IPv6, UDP_SEGMENT): %w", err)
		}
		r.blastsGSO = append(r.blastsGSO, g)
	}
	if ops == 0 || a.TxDatagrams < ops*roceSize/rocePayload {
		return r, fmt.Errorf("A's IPv6 endpoint sent %d datagrams for %d 64 KiB WRITEs: the QP did not use the network", a.TxDatagrams, ops)
	}
	r.txPerOp = float64(a.TxDatagrams) / float64(ops)
	r.txPerCall = float64(a.TxDatagrams) / float64(max(1, a.TxCalls))
	r.txPerGSO = float64(a.TxDatagrams) / float64(max(1, a.TxGSO))
	r.rxPerGRO = float64(b.RxDatagrams) / float64(max(1, b.RxGRO))
	r.on, r.off = median(r.ons), median(r.offs)
	r.blastMmsg, r.blastGSO = median(r.blastsMmsg), median(r.blastsGSO)
	r.blast = max(r.blastMmsg, r.blastGSO)
	return r, nil
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
	sec.notes = append(sec.notes, fmt.Sprintf("Path MTU %d. IPv4: per 64 KiB WRITE, A's endpoint sent %.2f datagrams (%d without "+
		"retransmission), %.1f per sendmmsg, and B's received %.1f %% of them. Goodput repeats (Gbit/s): vrdma %s, "+
		"busy-polling %s, sendmmsg blast %s, UDP_SEGMENT blast %s.", int(res.pmtu), res.txPerOp, roceSize/int(res.pmtu),
		res.txPerCall, 100*res.rxShare, fmtList(res.goodputs), fmtList(res.spinGoodputs), fmtList(res.blasts), fmtList(res.blastsGSO)))
	v6 := res.v6
	sec.notes = append(sec.notes, fmt.Sprintf("GSO and GRO (IPv6; an IPv4 endpoint never sends GSO, because segmentation "+
		"would number the segments' IPv4 IDs 0, 1, 2 … while each packet's ICRC is sealed over ID 0, docs/wire.md § 7): "+
		"with them A's endpoint sent %.2f datagrams per 64 KiB WRITE, %.1f per sendmmsg call and %.1f per super-datagram, "+
		"and B's received %.1f per GRO buffer. Goodput %s Gbit/s with them against %s without, %.2f× (switched off and on "+
		"with udp.Endpoint.SetOffload between the repeats of one run): the ratio to the better IPv6 blast went from %.2f× "+
		"to %.2f×. Repeats (Gbit/s): with %s, without %s, sendmmsg blast %s, UDP_SEGMENT blast %s.",
		v6.txPerOp, v6.txPerCall, v6.txPerGSO, v6.rxPerGRO, fmtNum(v6.on), fmtNum(v6.off), v6.on/v6.off,
		v6.off/v6.blast, v6.on/v6.blast, fmtList(v6.ons), fmtList(v6.offs), fmtList(v6.blastsMmsg), fmtList(v6.blastsGSO)))
	sec.notes = append(sec.notes, more...)
	sec.notes = append(sec.notes, verdict(sec.rows, roceMissOf(sec.rows)))
	return sec, loss, nil
}

// blastName names the better of a section's two blasts, with both figures.
func blastName(family string, mmsg, gso float64) string {
	better := "sendmmsg"
	if gso > mmsg {
		better = "UDP_SEGMENT"
	}
	return fmt.Sprintf("better %s UDP blast (%s; sendmmsg of 1040 B %s, UDP_SEGMENT+GRO %s Gbit/s), payload",
		family, better, fmtNum(mmsg), fmtNum(gso))
}

func roceRowsOf(r roceResult) []row {
	b4 := blastName("IPv4", r.blastMmsg, r.blastGSO)
	b6 := blastName("IPv6", r.v6.blastMmsg, r.v6.blastGSO)
	return []row{
		{name: "64 KiB WRITE goodput, one QP, tx-depth 128 (IPv4: no GSO)", figure: r.goodput, unit: "Gbit/s",
			baseName: b4, baseline: r.blast, baseUnit: "Gbit/s",
			target: fmt.Sprintf("≥ %.1f×", roceGoodputTarget), met: boolp(r.goodput >= roceGoodputTarget*r.blast)},
		{name: "the same, the client busy-polling its CQ", figure: r.spinGoodput, unit: "Gbit/s",
			baseName: b4, baseline: r.blast, baseUnit: "Gbit/s"},
		{name: "64 KiB WRITE goodput over IPv6, GSO and GRO", figure: r.v6.on, unit: "Gbit/s",
			baseName: b6, baseline: r.v6.blast, baseUnit: "Gbit/s",
			target: fmt.Sprintf("≥ %.1f×", roceGoodputTarget), met: boolp(r.v6.on >= roceGoodputTarget*r.v6.blast)},
		{name: "the same, GSO and GRO off", figure: r.v6.off, unit: "Gbit/s",
			baseName: b6, baseline: r.v6.blast, baseUnit: "Gbit/s"},
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
	"the better of two raw blasts over the same veth, both sockets with the endpoints' 4 MiB buffers, counting " +
	"1024 payload bytes per 1040-byte datagram that arrived: sendmmsg of 64 datagrams a call from A and recvmmsg " +
	"at B, and the kernel's best UDP, UDP_SEGMENT super-datagrams of 62 datagrams (8 a sendmmsg) from A received " +
	"with UDP_GRO at B. The same veth also has IPv6 addresses (fd00:7672:fa::1 and ::2, GID index 2 of each " +
	"device): the endpoints send runs of full-size packets as GSO super-datagrams and receive with GRO over IPv6 " +
	"only (IPv4 GSO would put IDs other than 0 on the wire), so the GSO rows are measured there, with the offload " +
	"on and, in the same repeats, off, against the IPv6 blasts. " +
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
// BenchmarkRoCEWriteLatency with -cpuprofile, -mutexprofile) while this
// section was developed on the 2-core machine.
const roceMiss = "Profiles (issue 26, IPv6 with GSO and GRO, both daemons in one process on two cores): about 40 % " +
	"of the CPU samples are sendmmsg and recvmmsg (the kernel's UDP and veth work, which the blast pays too, but " +
	"2-3× more per byte here: two super-datagrams per 64 KiB WRITE, FIRST with one MIDDLE and the other 62, " +
	"unconnected sends, a receiver that parks between batches), 12 % the two guest-memory copies (gather at the " +
	"requester, placement at the responder: the payload is copied once on each side), 12 % the two ICRC passes " +
	"(the pseudo header precomputed per peer), 7 % the engine's per-packet acquisition of the device's memory " +
	"table (a read lock and a reference count, cache lines both cores write). The blast's kernel work alone is " +
	"about 0.2 ns a byte; vrdma's user-space floor (two copies and two CRC passes of every byte, on top of the " +
	"kernel's two copies) is near 0.5 ns a byte, so on two cores the GSO blast stays out of reach at 0.7×: " +
	"what would close more of it is a table reference held per receive batch and per burst instead of per packet, " +
	"connected sockets per peer, and a CRC folded into the copy. A client that busy-polls its CQ takes a whole " +
	"core (CQ.Poll's mutex, and with runtime.Gosched the scheduler's run-queue lock) from the endpoint's " +
	"goroutines and the softirq work, which is why the busy-polling row is below the napping one. Latency: the " +
	"ping-pong has nothing runnable between its datagrams, while a WRITE's round trip has the busy-polling client " +
	"and the engine worker (which spins after work before it sleeps) on the two cores, so the endpoints' receive " +
	"goroutines, woken by the netpoller, wait for a processor: the p50 is two such wake-ups plus the doorbell, and " +
	"the p99 (milliseconds) is a preemption time slice. What would close it: an engine that does not spin while " +
	"its only QPs are network QPs waiting on the transport, and the client on a core of its own (vrdmad " +
	"--engine-cpus on a larger host)."
