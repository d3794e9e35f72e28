package main

import (
	"bufio"
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The guest's side of a back-end restart (docs/spec.md, "Reset and
// disconnect"): vrdmad dies and comes back while the driver runs, QEMU
// reconnects its chardev (reconnect-ms) and restarts the rings from the
// used indices in guest memory; the new vrdmad never handed those out, so
// it posts one DEVICE_FATAL on the event queue and knows none of the old
// handles. The driver resets the device (status 0), initialises it again,
// creates its objects again and carries on.

// restartQuiet is how long, after a recovery, the guest looks for a second
// DEVICE_FATAL (the spec says there is none for the same loss). The device
// posts DEVICE_FATAL when the event queue starts, which is before any of
// the recovery's commands are answered, so a short look is enough.
const restartQuiet = 300 * time.Millisecond

// restartPoll is one wait for an event while the guest idles; between two
// waits it checks its deadline.
const restartPoll = 500 * time.Millisecond

// restartStep is the key of restart's lines of round r.
func restartStep(r int, event string) guestresult.Step {
	return guestresult.Step{Role: guestresult.RoleRestart, Round: r, Event: event}
}

// statusReader is what a transport offers when it can show the virtio
// device status (guest/virtiopci does).
type statusReader interface{ DeviceStatus() (uint8, error) }

// restart opens the device, sets up a loopback pair and verifies traffic,
// reports "ready", then for each round waits (up to timeout) for
// DEVICE_FATAL, checks that an old handle is gone, resets and
// re-initialises the device, sets the pair up again and verifies traffic.
// With ack it waits for a VRDMA-NEXT line after each recovery.
func (e *env) restart(addr string, rounds int, timeout time.Duration, ack bool) error {
	var sc *bufio.Scanner
	if ack {
		sc = bufio.NewScanner(e.stdin)
		sc.Buffer(make([]byte, 4096), 1<<16)
	}
	c, closeDev, err := e.open(addr, e.log)
	if err != nil {
		return err
	}
	// Re-open the same device after each reset, not whichever comes first.
	if a, ok := c.Transport().(interface{ Addr() string }); ok && addr == "" {
		addr = a.Addr()
	}
	l, err := e.restartTraffic(c)
	if err != nil {
		closeDev()
		return fmt.Errorf("round 0: %w", err)
	}
	// Close the latest device whatever happens below.
	defer func() {
		l.close()
		closeDev()
	}()
	if err := e.result(guestresult.Restart{Step: restartStep(0, "ready"), Device: addr,
		QPs: []uint32{l.qa.Num(), l.qb.Num()}, Verified: true}); err != nil {
		return err
	}
	for r := 1; r <= rounds; r++ {
		start := time.Now()
		if err := waitDeviceFatal(c, start.Add(timeout)); err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		lost := time.Now()
		st := ""
		if sr, ok := c.Transport().(statusReader); ok {
			if s, err := sr.DeviceStatus(); err == nil {
				st = fmt.Sprintf("0x%02x", s)
			}
		}
		if err := e.result(guestresult.Restart{Step: restartStep(r, "device_fatal"), Status: st,
			WaitS: lost.Sub(start).Seconds()}); err != nil {
			return err
		}
		// "Every command naming an old handle answers NOT_FOUND."
		_, qerr := l.qa.Query()
		var ce *verbs.CommandError
		if !errors.As(qerr, &ce) || ce.Status != abi.StatusNotFound {
			return fmt.Errorf("round %d: QUERY_QP of old QP %d after DEVICE_FATAL: got %v, want NOT_FOUND", r, l.qa.Num(), qerr)
		}
		if err := e.result(guestresult.Restart{Step: restartStep(r, "not_found"),
			Command: ce.Op.String(), Answer: ce.Status.String()}); err != nil {
			return err
		}
		// The objects are gone on the device; only the guest's memory is
		// left to free. Closing the transport resets the device: status 0,
		// read back as 0, then the DMA memory goes.
		l.forget()
		l.close()
		closeDev()
		if err := e.result(guestresult.Restart{Step: restartStep(r, "reset")}); err != nil {
			return err
		}
		c, closeDev, err = e.open(addr, e.log)
		if err != nil {
			// Nothing left to close.
			closeDev, l = func() {}, &loop{}
			return fmt.Errorf("round %d: initialise again: %w", r, err)
		}
		nl, err := e.restartTraffic(c)
		if err != nil {
			l = &loop{}
			return fmt.Errorf("round %d: after the reset: %w", r, err)
		}
		l = nl
		// No second DEVICE_FATAL for the same loss.
		if ev, err := c.GetAsyncEvent(restartQuiet); err == nil {
			return fmt.Errorf("round %d: event %d (handle %d) after the recovery, want none", r, ev.Type, ev.Handle)
		} else if !errors.Is(err, verbs.ErrTimeout) {
			return fmt.Errorf("round %d: event queue after the recovery: %w", r, err)
		}
		if err := e.result(guestresult.Restart{Step: restartStep(r, "recovered"), Device: addr,
			RecoverS: time.Since(lost).Seconds(), QPs: []uint32{l.qa.Num(), l.qb.Num()}, Verified: true}); err != nil {
			return err
		}
		if ack {
			if err := waitLine(sc, lineNext); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
		}
	}
	return nil
}

// waitDeviceFatal polls the event queue until DEVICE_FATAL or deadline.
// Any other asynchronous event is an error: the loopback pair raises none.
func waitDeviceFatal(c *verbs.Context, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no DEVICE_FATAL event before the deadline (was vrdmad restarted? does QEMU reconnect?)")
		}
		ev, err := c.GetAsyncEvent(min(left, restartPoll))
		if errors.Is(err, verbs.ErrTimeout) {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting for DEVICE_FATAL: %w", err)
		}
		if ev.Type != abi.EventDeviceFatal {
			return fmt.Errorf("event %d (handle %d) while waiting for DEVICE_FATAL (%d)", ev.Type, ev.Handle, abi.EventDeviceFatal)
		}
		return nil
	}
}

// restartTraffic creates a loopback RC pair with two MRs on c and verifies
// an RDMA WRITE and a SEND through it. On error it releases what it made.
func (e *env) restartTraffic(c *verbs.Context) (*loop, error) {
	l := &loop{c: c, wc: make([]verbs.WC, 4)}
	err := l.setup()
	if err == nil {
		fill(l.mra.Bytes()[:8192], 11)
		err = l.post(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{l.mra.SGE(0, 8192)}, RemoteAddr: l.mrb.Addr + 64, RKey: l.mrb.RKey})
		if err == nil {
			err = same(l.mrb.Bytes()[64:64+8192], l.mra.Bytes()[:8192])
		}
		if err != nil {
			err = fmt.Errorf("rdma write: %w", err)
		}
	}
	if err == nil {
		if err = l.sendRecv(abi.WROpSend, 0, nil, 3000); err != nil {
			err = fmt.Errorf("send: %w", err)
		}
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// setup creates the loopback pair: a PD, a CQ and a QP per side, a 64 KiB
// MR per side, both QPs connected to each other (RTS).
func (l *loop) setup() error {
	c := l.c
	gid, err := c.QueryGID()
	if err != nil {
		return fmt.Errorf("query gid: %w", err)
	}
	if l.pd, err = c.AllocPD(); err != nil {
		return fmt.Errorf("alloc pd: %w", err)
	}
	for _, cq := range []**verbs.CQ{&l.cqa, &l.cqb} {
		if *cq, err = c.CreateCQ(16); err != nil {
			return fmt.Errorf("create cq: %w", err)
		}
	}
	cp := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	if l.qa, err = l.pd.CreateQP(verbs.QPInitAttr{SendCQ: l.cqa, RecvCQ: l.cqa, Cap: cp}); err != nil {
		return fmt.Errorf("create qp: %w", err)
	}
	if l.qb, err = l.pd.CreateQP(verbs.QPInitAttr{SendCQ: l.cqb, RecvCQ: l.cqb, Cap: cp}); err != nil {
		return fmt.Errorf("create qp: %w", err)
	}
	for _, p := range []struct {
		b  **verbs.Buffer
		mr **verbs.MR
	}{{&l.bufa, &l.mra}, {&l.bufb, &l.mrb}} {
		if *p.b, err = c.AllocBuffer(stBuf); err != nil {
			return fmt.Errorf("alloc buffer: %w", err)
		}
		if *p.mr, err = l.pd.RegMR(*p.b, 0, stBuf, abi.AccessAll); err != nil {
			return fmt.Errorf("reg mr: %w", err)
		}
	}
	acc := abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	if err := l.qa.ConnectRC(gid, l.qb.Num(), l.qb.PSN(), acc); err != nil {
		return fmt.Errorf("connect qp: %w", err)
	}
	if err := l.qb.ConnectRC(gid, l.qa.Num(), l.qa.PSN(), acc); err != nil {
		return fmt.Errorf("connect qp: %w", err)
	}
	return nil
}

// forget drops the device objects of l without destroying them (the device
// lost them already; destroying would only collect NOT_FOUND answers). The
// buffers stay, for close to free.
func (l *loop) forget() {
	l.mra, l.mrb, l.qa, l.qb, l.cqa, l.cqb, l.pd = nil, nil, nil, nil, nil, nil, nil
}
