package roceinterop

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// DefaultMemory is the guest memory of a Device's front-end.
const DefaultMemory = 192 << 20

// Connection parameters of our QPs, perftest's for RC over RoCE: a 1024-byte
// path MTU (what the exchange announces), seven retries, the RNR timer's
// 12 (0.64 ms), a 67 ms transport timeout (14).
const (
	pmtu        = 1024
	outReads    = 16
	minRNRTimer = 12
	qpTimeout   = 14
	retryCnt    = 7
	rnrRetry    = 7
	hopLimit    = 64
	// sqDepth bounds the requester's work requests in flight.
	sqDepth = 128
)

// pollTimeout bounds a wait for a completion or a ping-pong WRITE without
// progress.
const pollTimeout = 60 * time.Second

// Device is a vrdma device opened on a vrdmad socket as a virtio-user
// front-end, with the RoCE GID of its daemon's --roce-bind address.
type Device struct {
	Ctx      *verbs.Context     // immutable
	f        *frontend.Frontend // immutable
	Local    netip.Addr         // immutable: the bound address
	GID      [16]byte           // immutable: Local's IPv4-mapped GID
	GIDIndex int                // immutable: its index in the GID table
	attr     abi.DeviceAttr     // immutable

	// Seed varies the initial content of the memory of the device's runs
	// (Fill); zero is the content the interop tests know. Set it before
	// the first run.
	Seed byte
	// OnTest, when set, is called as a run's test starts (after the
	// exchange connected its QP; a client then posts its work requests).
	// Set it before the first run.
	OnTest func(*Run)
}

// ErrNoRoCEGID means the device's GID table has no entry for the address:
// its vrdmad was not started with --roce-bind for it.
var ErrNoRoCEGID = errors.New("no RoCE GID for the address (vrdmad --roce-bind)")

// OpenDevice opens the device served on socket with mem bytes of front-end
// memory (0: DefaultMemory) and finds local's GID in its table (QUERY_GID:
// entry 1 on a soft device with --roce-bind, where entry 0 is the port's
// link-local GID; wherever a device on a host NIC mirrors the NIC's).
func OpenDevice(ctx context.Context, socket string, local netip.Addr, mem uint64) (*Device, error) {
	if mem == 0 {
		mem = DefaultMemory
	}
	vctx, f, err := frontend.OpenRDMA(ctx, socket, mem)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", socket, err)
	}
	d := &Device{Ctx: vctx, f: f, Local: local, GID: local.As16(), GIDIndex: -1}
	fail := func(what string, err error) (*Device, error) {
		d.Close()
		return nil, fmt.Errorf("%s: %s: %w", socket, what, err)
	}
	if d.attr, err = vctx.QueryDevice(); err != nil {
		return fail("query device", err)
	}
	port, err := vctx.QueryPort()
	if err != nil {
		return fail("query port", err)
	}
	for i := 0; i < int(port.GIDTblLen); i++ {
		g, err := vctx.QueryGIDAt(uint32(i))
		if err != nil {
			return fail(fmt.Sprintf("query gid %d", i), err)
		}
		if g == d.GID {
			d.GIDIndex = i
			break
		}
	}
	if d.GIDIndex < 0 {
		return fail(local.String(), ErrNoRoCEGID)
	}
	return d, nil
}

// Close closes the verbs context and the front-end.
func (d *Device) Close() {
	if d.Ctx != nil {
		d.Ctx.Close()
	}
	if d.f != nil {
		d.f.Close()
	}
}

// Run is one job on the vrdma side.
type Run struct {
	Job Job
	// Role is our side's perftest role: "server" (the rxe guest is the
	// client and requester, but for write_lat) or "client".
	Role string
	// Version is the peer's perftest version.
	Version string
	// Mine and Peer are the two key messages.
	Mine, Peer pftexchange.Keys
	// Elapsed is the client's test: first post to last completion.
	Elapsed time.Duration
	// Local lists what was verified in our memory and completions.
	Local []string

	dev   *Device
	pd    *verbs.PD
	cq    *verbs.CQ
	qp    *verbs.QP
	buf   *verbs.Buffer
	mr    *verbs.MR
	init  []byte     // the MR's initial content
	comps []verbs.WC // the requester's completions (client), the receives (send_bw server)
	sent  []byte     // write_lat: our WRITE's payload
	latN  int        // write_lat: ping-pong WRITEs done each way
	wc    []verbs.WC // poll scratch
	// What CheckCapture reads: our address, our MR's memory (at
	// Mine.VAddr).
	local netip.Addr
	mem   []byte
}

// latOff is where a write_lat side keeps the payload it writes.
const latOff = 1 << 20

// Fill is the initial content of a run's memory at offset i on a device
// whose Seed is seed.
func Fill(seed byte, i int) byte { return byte(i*7+i>>8) ^ seed }

// newRun creates the job's objects on dev.
func newRun(dev *Device, job Job, role string) (*Run, error) {
	r := &Run{Job: job, Role: role, dev: dev, wc: make([]verbs.WC, 64)}
	n := int(max(job.Bytes()+64, 4<<20))
	if job.Op == pftexchange.WriteLat {
		n = max(n, latOff+job.Size)
	}
	recvs := 16
	if (job.Op == pftexchange.SendBW || job.Op == pftexchange.WriteImmBW) && role == "server" {
		recvs = job.Iters
	}
	if uint32(max(recvs, sqDepth)) > dev.attr.MaxQPWR {
		return nil, fmt.Errorf("%s: %d work requests, the device allows %d", job, max(recvs, sqDepth), dev.attr.MaxQPWR)
	}
	var err error
	fail := func(what string, err error) (*Run, error) {
		r.Close()
		return nil, fmt.Errorf("%s: %s: %w", job, what, err)
	}
	if r.pd, err = dev.Ctx.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if r.cq, err = dev.Ctx.CreateCQ(sqDepth + recvs + 8); err != nil {
		return fail("create cq", err)
	}
	if r.qp, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxRecvWR: recvs, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail("create qp", err)
	}
	if r.buf, err = dev.Ctx.AllocBuffer(n); err != nil {
		return fail("alloc buffer", err)
	}
	if r.mr, err = r.pd.RegMR(r.buf, 0, n, abi.AccessAll); err != nil {
		return fail("reg mr", err)
	}
	mem := r.mr.Bytes()
	r.mem, r.local = mem, dev.Local
	for i := range mem {
		mem[i] = Fill(dev.Seed, i)
	}
	if job.Op == pftexchange.WriteLat {
		mem[job.Size-1] = 0 // the ping-pong's count starts below 1
	}
	r.init = bytes.Clone(mem)
	r.Mine = pftexchange.Keys{OutReads: min(outReads, max(dev.attr.MaxQPRdAtom, 1)), QPN: r.qp.Num(),
		PSN: rand.Uint32() & (1<<24 - 1), RKey: r.mr.RKey, VAddr: r.mr.Addr, GID: dev.GID}
	return r, nil
}

// Close destroys the job's objects.
func (r *Run) Close() {
	if r.qp != nil {
		r.qp.Destroy()
	}
	if r.mr != nil {
		r.mr.Dereg()
	}
	if r.buf != nil {
		r.buf.Free()
	}
	if r.cq != nil {
		r.cq.Destroy()
	}
	if r.pd != nil {
		r.pd.Dealloc()
	}
}

// QPN is our QP's number.
func (r *Run) QPN() uint32 { return r.qp.Num() }

// Memory is the run's registered memory (at Mine.VAddr): what the peer
// wrote, what our READs and atomics brought. Valid until Close.
func (r *Run) Memory() []byte { return r.mem }

// Gbits is the client's measured rate (zero for a server).
func (r *Run) Gbits() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Job.Bytes()) * 8 / r.Elapsed.Seconds() / 1e9
}

// Connect moves our QP RESET → INIT → RTR → RTS towards the peer's keys,
// over the network: sgid_index names our RoCE GID, dgid the peer's.
func (r *Run) Connect(peer pftexchange.Keys) error {
	r.Peer = peer
	rd := uint32(min(outReads, max(r.dev.attr.MaxQPRdAtom, 1)))
	steps := []struct {
		name string
		attr abi.QPAttr
		mask int
	}{
		{"init", abi.QPAttr{QPState: abi.QPSInit, PKeyIndex: 0, PortNum: 1,
			QPAccessFlags: abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic},
			abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags},
		{"rtr", abi.QPAttr{QPState: abi.QPSRTR, PathMTU: abi.MTU1024, DestQPNum: peer.QPN, RQPSN: peer.PSN,
			MaxDestRdAtomic: rd, MinRNRTimer: minRNRTimer, DGID: peer.GID, SGIDIndex: uint32(r.dev.GIDIndex), HopLimit: hopLimit},
			abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer},
		{"rts", abi.QPAttr{QPState: abi.QPSRTS, SQPSN: r.Mine.PSN, Timeout: qpTimeout, RetryCnt: retryCnt, RNRRetry: rnrRetry,
			MaxRdAtomic: min(rd, max(peer.OutReads, 1))},
			abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := r.qp.Modify(s.attr, s.mask); err != nil {
			return fmt.Errorf("qp %#x to %s: %w", r.qp.Num(), s.name, err)
		}
	}
	return nil
}

// Test runs our side of the test (pftexchange.Peer).
func (r *Run) Test(ctx context.Context) error {
	if r.dev.OnTest != nil {
		r.dev.OnTest(r)
	}
	switch {
	case r.Job.Op == pftexchange.WriteLat:
		return r.pingPong(ctx)
	case r.Role == "server" && (r.Job.Op == pftexchange.SendBW || r.Job.Op == pftexchange.WriteImmBW):
		return r.postRecvs()
	case r.Role == "client":
		return r.load(ctx)
	}
	return nil
}

// Serve plays perftest's server for one client connection of the rxe
// guest with a fresh QP of dev, then checks what it can locally: the QP is
// not in the error state; send_bw's receives all completed with the
// message's length; read_bw and atomic_bw left the memory they did not
// target as it was. The Run is returned on failure too (nil only when its
// objects could not be made); close it after its capture check.
func Serve(ctx context.Context, dev *Device, conn net.Conn, job Job) (*Run, error) {
	r, err := newRun(dev, job, "server")
	if err != nil {
		return nil, err
	}
	res, err := pftexchange.Serve(ctx, conn, job.Op, r.Mine, r)
	r.Version, r.Peer = res.Version, res.Peer
	if err != nil {
		return r, fmt.Errorf("%s: perftest exchange: %w", job, err)
	}
	if job.Op != pftexchange.SendBW && job.Op != pftexchange.WriteImmBW && job.Op != pftexchange.WriteLat && res.Report.Iters != uint64(job.Iters) {
		return r, fmt.Errorf("%s: the client reports %d iterations", job, res.Report.Iters)
	}
	return r, r.checkLocal(ctx)
}

// Client plays perftest's client against the rxe guest's server on conn
// with a fresh QP of dev: the requester of write_bw, read_bw, send_bw and
// atomic_bw, one side of write_lat. See Serve for the Run.
func Client(ctx context.Context, dev *Device, conn net.Conn, job Job) (*Run, error) {
	r, err := newRun(dev, job, "client")
	if err != nil {
		return nil, err
	}
	res, err := pftexchange.Run(ctx, conn, job.Op, "", r.Mine, r,
		pftexchange.Report{Size: uint64(job.Size), Iters: uint64(job.Iters)})
	r.Version, r.Peer = res.Version, res.Peer
	if err != nil {
		return r, fmt.Errorf("%s: perftest exchange: %w", job, err)
	}
	return r, r.checkLocal(ctx)
}

// postRecvs posts send_bw's receives, message i at offset i×size.
func (r *Run) postRecvs() error {
	for i := range r.Job.Iters {
		wr := verbs.RecvWR{WRID: uint64(i), SGL: []abi.SGE{r.mr.SGE(i*r.Job.Size, r.Job.Size)}}
		if err := r.qp.PostRecv(wr); err != nil {
			return fmt.Errorf("post receive %d: %w", i, err)
		}
	}
	return nil
}

// poll waits for n completions and appends them to r.comps; any failed
// one is an error.
func (r *Run) poll(ctx context.Context, n int, what string) error {
	return r.pollUpTo(ctx, n, n, what)
}

// pollUpTo waits for at least n completions, takes up to most, and
// appends them to r.comps; any failed one is an error.
func (r *Run) pollUpTo(ctx context.Context, n, most int, what string) error {
	last := time.Now()
	for got := 0; got < n; {
		k, err := r.cq.Poll(r.wc[:min(len(r.wc), most-got)])
		if err != nil {
			return fmt.Errorf("%s: poll: %w", what, err)
		}
		for _, wc := range r.wc[:k] {
			if wc.Status != abi.WCSuccess {
				return fmt.Errorf("%s: WR %d completed with %v (vendor error %#x)", what, wc.WRID, wc.Status, wc.VendorErr)
			}
		}
		r.comps = append(r.comps, r.wc[:k]...)
		got += k
		if k > 0 {
			last = time.Now()
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %d of %d completions: %w", what, got, n, ctx.Err())
		}
		if time.Since(last) > pollTimeout {
			return fmt.Errorf("%s: %d of %d completions, none for %v", what, got, n, pollTimeout)
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// load posts the client's iters work requests, at most sqDepth in flight,
// and collects their completions. WRITEs and SENDs go from message i's
// slot (offset i×size); READs land there; FETCH_ADDs add 1 to the server's
// first word and store the original value at offset 8i.
func (r *Run) load(ctx context.Context) error {
	j := r.Job
	start := time.Now()
	posted := 0
	for len(r.comps) < j.Iters {
		for posted < j.Iters && posted-len(r.comps) < sqDepth {
			wr := verbs.SendWR{WRID: uint64(posted), Flags: abi.WRFlagSignaled, RemoteAddr: r.Peer.VAddr, RKey: r.Peer.RKey,
				SGL: []abi.SGE{r.mr.SGE(posted*j.Size, j.Size)}}
			switch j.Op {
			case pftexchange.WriteBW:
				wr.Opcode = abi.WROpRDMAWrite
			case pftexchange.ReadBW:
				wr.Opcode = abi.WROpRDMARead
			case pftexchange.SendBW:
				wr.Opcode = abi.WROpSend
			case pftexchange.WriteImmBW:
				wr.Opcode, wr.Imm = abi.WROpRDMAWriteWithImm, uint32(posted)
			case pftexchange.AtomicBW:
				wr.Opcode, wr.CompareAdd, wr.SGL = abi.WROpAtomicFetchAdd, 1, []abi.SGE{r.mr.SGE(8*posted, 8)}
			}
			if err := r.qp.PostSend(wr); err != nil {
				if errors.Is(err, verbs.ErrQueueFull) {
					break
				}
				return fmt.Errorf("%s: post %d: %w", j, posted, err)
			}
			posted++
		}
		if err := r.pollUpTo(ctx, 1, posted-len(r.comps), string(j.Op)); err != nil {
			return err
		}
	}
	r.Elapsed = time.Since(start)
	return nil
}

// waitByte waits until our memory's byte at off holds v.
func (r *Run) waitByte(ctx context.Context, off int, v byte, what string) error {
	start := time.Now()
	mem := r.mr.Bytes()
	for mem[off] != v {
		if ctx.Err() != nil || time.Since(start) > pollTimeout {
			return fmt.Errorf("%s never landed (byte %d is %d, want %d): %v", what, off, mem[off], v, ctx.Err())
		}
		time.Sleep(10 * time.Microsecond)
	}
	return nil
}

// pingPong is our side of perftest's run_iter_lat_write: each side WRITEs
// size bytes whose last byte counts its WRITEs into the other's buffer;
// the server writes first, the client answers each of its WRITEs.
func (r *Run) pingPong(ctx context.Context) error {
	j := r.Job
	mem := r.mr.Bytes()
	r.sent = mem[latOff : latOff+j.Size]
	for i := range j.Size - 1 {
		r.sent[i] = byte(i)
	}
	start := time.Now()
	for n := 1; n <= j.Iters; n++ {
		if r.Role == "client" {
			if err := r.waitByte(ctx, j.Size-1, byte(n), fmt.Sprintf("write_lat: the server's WRITE %d", n)); err != nil {
				return err
			}
		}
		r.sent[j.Size-1] = byte(n)
		wr := verbs.SendWR{WRID: uint64(n), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: r.Peer.VAddr,
			RKey: r.Peer.RKey, SGL: []abi.SGE{r.mr.SGE(latOff, j.Size)}}
		if err := r.qp.PostSend(wr); err != nil {
			return fmt.Errorf("write_lat: post %d: %w", n, err)
		}
		if err := r.poll(ctx, 1, fmt.Sprintf("write_lat: WRITE %d", n)); err != nil {
			return err
		}
		if r.Role == "server" {
			if err := r.waitByte(ctx, j.Size-1, byte(n), fmt.Sprintf("write_lat: the client's WRITE %d", n)); err != nil {
				return err
			}
		}
		r.latN = n
	}
	r.Elapsed = time.Since(start)
	return nil
}

// checkLocal checks what our side can see without the capture.
func (r *Run) checkLocal(ctx context.Context) error {
	j := r.Job
	mem := r.mr.Bytes()
	if a, err := r.qp.Query(); err != nil {
		return fmt.Errorf("%s: query qp: %w", j, err)
	} else if a.QPState != abi.QPSRTS {
		return fmt.Errorf("%s: our QP is in state %d, not RTS", j, a.QPState)
	}
	note := func(format string, args ...any) { r.Local = append(r.Local, fmt.Sprintf(format, args...)) }
	switch {
	case j.Op == pftexchange.WriteLat:
		if r.latN != j.Iters {
			return fmt.Errorf("%s: %d ping-pong rounds of %d", j, r.latN, j.Iters)
		}
		note("%d WRITEs each way, every count landed in our memory", j.Iters)
	case r.Role == "server" && j.Op == pftexchange.SendBW:
		wctx, cancel := context.WithTimeout(ctx, pollTimeout)
		defer cancel()
		if err := r.poll(wctx, j.Iters, "send_bw receives"); err != nil {
			return fmt.Errorf("%s: %w", j, err)
		}
		for i, wc := range r.comps {
			if wc.WRID != uint64(i) || wc.Opcode != abi.WCOpRecv || wc.ByteLen != uint32(j.Size) {
				return fmt.Errorf("%s: receive completion %d: %+v", j, i, wc)
			}
		}
		note("%d receives completed in order with %d bytes each", j.Iters, j.Size)
	case r.Role == "server" && j.Op == pftexchange.WriteImmBW:
		wctx, cancel := context.WithTimeout(ctx, pollTimeout)
		defer cancel()
		if err := r.poll(wctx, j.Iters, "write_imm_bw receives"); err != nil {
			return fmt.Errorf("%s: %w", j, err)
		}
		for i, wc := range r.comps {
			if wc.WRID != uint64(i) || wc.Opcode != abi.WCOpRecvRDMAWithImm || wc.Flags&abi.WCFlagWithImm == 0 ||
				wc.Imm != uint32(i) || wc.ByteLen != uint32(j.Size) {
				return fmt.Errorf("%s: receive completion %d: %+v", j, i, wc)
			}
		}
		note("%d WRITEs with immediate completed receives in order, immediates 0..%d, %d bytes each", j.Iters, j.Iters-1, j.Size)
	case r.Role == "server" && j.Op == pftexchange.ReadBW:
		if !bytes.Equal(mem, r.init) {
			return fmt.Errorf("%s: READs changed our memory", j)
		}
		note("our memory unchanged by %d READs", j.Iters)
	case r.Role == "server" && j.Op == pftexchange.AtomicBW:
		// The capture says which words; the rest must be as they were.
	case r.Role == "server": // write_bw: the capture says what landed
	case j.Op == pftexchange.ReadBW:
		if len(r.comps) != j.Iters {
			return fmt.Errorf("%s: %d completions", j, len(r.comps))
		}
		first := mem[:j.Size]
		for i := 1; i < j.Iters; i++ {
			if !bytes.Equal(mem[i*j.Size:(i+1)*j.Size], first) {
				return fmt.Errorf("%s: READ %d brought other bytes than READ 0 (the server's buffer does not change)", j, i)
			}
		}
		note("%d READs of %d bytes landed, all alike", j.Iters, j.Size)
	case j.Op == pftexchange.AtomicBW:
		first := binary.LittleEndian.Uint64(mem)
		for k := range j.Iters {
			if got := binary.LittleEndian.Uint64(mem[8*k:]); got != first+uint64(k) {
				return fmt.Errorf("%s: FETCH_ADD %d returned %d, want %d", j, k, got, first+uint64(k))
			}
		}
		note("%d FETCH_ADDs returned consecutive values from %d", j.Iters, first)
	default: // write_bw, send_bw clients: every completion succeeded
		if len(r.comps) != j.Iters {
			return fmt.Errorf("%s: %d completions", j, len(r.comps))
		}
		for i, wc := range r.comps {
			if wc.WRID != uint64(i) {
				return fmt.Errorf("%s: completion %d is WR %d", j, i, wc.WRID)
			}
		}
		note("%d work requests completed in order", j.Iters)
	}
	return nil
}
