package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// loop is a loopback RC QP pair inside one device: a sends, b receives.
type loop struct {
	c          *verbs.Context
	pd         *verbs.PD
	cqa, cqb   *verbs.CQ
	qa, qb     *verbs.QP
	bufa, bufb *verbs.Buffer
	mra, mrb   *verbs.MR
	wc         []verbs.WC
}

const stBuf = 64 << 10

func (l *loop) close() {
	for _, mr := range []*verbs.MR{l.mra, l.mrb} {
		if mr != nil {
			mr.Dereg()
		}
	}
	for _, q := range []*verbs.QP{l.qa, l.qb} {
		if q != nil {
			q.Destroy()
		}
	}
	for _, cq := range []*verbs.CQ{l.cqa, l.cqb} {
		if cq != nil {
			cq.Destroy()
		}
	}
	for _, b := range []*verbs.Buffer{l.bufa, l.bufb} {
		if b != nil {
			b.Free()
		}
	}
	if l.pd != nil {
		l.pd.Dealloc()
	}
}

// wait polls cq for one completion.
func (l *loop) wait(cq *verbs.CQ) (verbs.WC, error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := cq.Poll(l.wc[:1])
		if err != nil {
			return verbs.WC{}, err
		}
		if n == 1 {
			if l.wc[0].Status != abi.WCSuccess {
				return l.wc[0], fmt.Errorf("work request %d: status %d (vendor error %d)", l.wc[0].WRID, l.wc[0].Status, l.wc[0].VendorErr)
			}
			return l.wc[0], nil
		}
		time.Sleep(10 * time.Microsecond)
	}
	return verbs.WC{}, fmt.Errorf("no completion in 10s")
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i) + byte(i>>8)*7
	}
}

// selftest exercises every verb on a loopback pair, printing one result
// per step.
func (e *env) selftest(c *verbs.Context) error {
	l := &loop{c: c, wc: make([]verbs.WC, 4)}
	defer l.close()
	if _, err := c.QueryGID(); err != nil {
		return fmt.Errorf("query gid: %w", err)
	}
	if _, err := c.QueryDevice(); err != nil {
		return fmt.Errorf("query device: %w", err)
	}
	if _, err := c.QueryPort(); err != nil {
		return fmt.Errorf("query port: %w", err)
	}
	steps := []struct {
		op  string
		run func() error
	}{
		{"setup", l.setup},
		{"query_qp", func() error {
			a, err := l.qa.Query()
			if err != nil {
				return err
			}
			if a.QPState != abi.QPSRTS || a.DestQPNum != l.qb.Num() {
				return fmt.Errorf("qp state %d dest %d, want RTS and %d", a.QPState, a.DestQPNum, l.qb.Num())
			}
			return nil
		}},
		{"write", func() error {
			fill(l.mra.Bytes()[:8192], 1)
			if err := l.post(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{l.mra.SGE(0, 8192)}, RemoteAddr: l.mrb.Addr + 100, RKey: l.mrb.RKey}); err != nil {
				return err
			}
			return same(l.mrb.Bytes()[100:8292], l.mra.Bytes()[:8192])
		}},
		{"read", func() error {
			fill(l.mrb.Bytes()[20000:24000], 9)
			if err := l.post(verbs.SendWR{WRID: 2, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{l.mra.SGE(30000, 4000)}, RemoteAddr: l.mrb.Addr + 20000, RKey: l.mrb.RKey}); err != nil {
				return err
			}
			return same(l.mra.Bytes()[30000:34000], l.mrb.Bytes()[20000:24000])
		}},
		{"send", func() error { return l.sendRecv(abi.WROpSend, 0, nil, 3000) }},
		{"send_with_imm", func() error { return l.sendRecv(abi.WROpSendWithImm, 0xfeedbeef, nil, 500) }},
		{"write_with_imm", func() error { return l.sendRecv(abi.WROpRDMAWriteWithImm, 0x1234, nil, 2048) }},
		{"inline", func() error { return l.sendRecv(abi.WROpSend, 0, []byte("inline data from vrdma-guest"), 0) }},
		{"cmp_swap", func() error {
			binary.LittleEndian.PutUint64(l.mrb.Bytes()[4096:], 41)
			if err := l.post(verbs.SendWR{WRID: 5, Opcode: abi.WROpAtomicCmpSwp, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{l.mra.SGE(40960, 8)}, RemoteAddr: l.mrb.Addr + 4096, RKey: l.mrb.RKey, CompareAdd: 41, Swap: 77}); err != nil {
				return err
			}
			old, now := binary.LittleEndian.Uint64(l.mra.Bytes()[40960:]), binary.LittleEndian.Uint64(l.mrb.Bytes()[4096:])
			if old != 41 || now != 77 {
				return fmt.Errorf("returned %d, memory %d; want 41, 77", old, now)
			}
			return nil
		}},
		{"fetch_add", func() error {
			if err := l.post(verbs.SendWR{WRID: 6, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{l.mra.SGE(40968, 8)}, RemoteAddr: l.mrb.Addr + 4096, RKey: l.mrb.RKey, CompareAdd: 5}); err != nil {
				return err
			}
			old, now := binary.LittleEndian.Uint64(l.mra.Bytes()[40968:]), binary.LittleEndian.Uint64(l.mrb.Bytes()[4096:])
			if old != 77 || now != 82 {
				return fmt.Errorf("returned %d, memory %d; want 77, 82", old, now)
			}
			return nil
		}},
		{"events", func() error {
			if err := l.cqb.ReqNotify(false); err != nil {
				return err
			}
			if err := l.qb.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{l.mrb.SGE(0, 64)}}); err != nil {
				return err
			}
			if err := l.qa.PostSend(verbs.SendWR{WRID: 9, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: []byte("event")}); err != nil {
				return err
			}
			cq, err := c.GetCQEvent(10 * time.Second)
			if err != nil {
				return fmt.Errorf("get cq event: %w", err)
			}
			if cq != l.cqb {
				return fmt.Errorf("event for cq %d, want %d", cq.Num(), l.cqb.Num())
			}
			if _, err := l.wait(l.cqa); err != nil {
				return err
			}
			_, err = l.wait(l.cqb)
			return err
		}},
		{"teardown", func() error {
			for _, mr := range []**verbs.MR{&l.mra, &l.mrb} {
				if err := (*mr).Dereg(); err != nil {
					return fmt.Errorf("dereg mr: %w", err)
				}
				*mr = nil
			}
			for _, q := range []**verbs.QP{&l.qa, &l.qb} {
				if err := (*q).Destroy(); err != nil {
					return fmt.Errorf("destroy qp: %w", err)
				}
				*q = nil
			}
			for _, cq := range []**verbs.CQ{&l.cqa, &l.cqb} {
				if err := (*cq).Destroy(); err != nil {
					return fmt.Errorf("destroy cq: %w", err)
				}
				*cq = nil
			}
			err := l.pd.Dealloc()
			l.pd = nil
			return err
		}},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.run(); err != nil {
			return fmt.Errorf("selftest %s: %w", s.op, err)
		}
		if err := e.result(map[string]any{"role": "selftest", "op": s.op, "verified": true,
			"us": float64(time.Since(t0).Microseconds())}); err != nil {
			return err
		}
	}
	return e.result(map[string]any{"role": "selftest", "op": "all", "verified": true})
}

// post posts wr on qa and waits for its completion.
func (l *loop) post(wr verbs.SendWR) error {
	if err := l.qa.PostSend(wr); err != nil {
		return err
	}
	_, err := l.wait(l.cqa)
	return err
}

// sendRecv sends n bytes (or inline data) with op from a to b and checks
// what b received (and the immediate).
func (l *loop) sendRecv(op int, imm uint32, inline []byte, n int) error {
	clear(l.mrb.Bytes()[8192:16384])
	if err := l.qb.PostRecv(verbs.RecvWR{WRID: 7, SGL: []abi.SGE{l.mrb.SGE(8192, 8192)}}); err != nil {
		return err
	}
	wr := verbs.SendWR{WRID: 8, Opcode: op, Flags: abi.WRFlagSignaled, Imm: imm, Inline: inline}
	want := inline
	dst := l.mrb.Bytes()[8192:]
	if inline == nil {
		fill(l.mra.Bytes()[50000:50000+n], byte(op)+3)
		wr.SGL = []abi.SGE{l.mra.SGE(50000, n)}
		want = l.mra.Bytes()[50000 : 50000+n]
	}
	if op == abi.WROpRDMAWriteWithImm {
		wr.RemoteAddr, wr.RKey = l.mrb.Addr+30000, l.mrb.RKey
		dst = l.mrb.Bytes()[30000:]
	}
	if err := l.post(wr); err != nil {
		return err
	}
	wc, err := l.wait(l.cqb)
	if err != nil {
		return err
	}
	if wc.WRID != 7 || int(wc.ByteLen) != len(want) {
		return fmt.Errorf("receive %d of %d bytes, want 7 and %d", wc.WRID, wc.ByteLen, len(want))
	}
	if (op == abi.WROpSendWithImm || op == abi.WROpRDMAWriteWithImm) && (wc.Imm != imm || wc.Flags&abi.WCFlagWithImm == 0) {
		return fmt.Errorf("immediate %#x (flags %#x), want %#x", wc.Imm, wc.Flags, imm)
	}
	return same(dst[:len(want)], want)
}

func same(got, want []byte) error {
	if !bytes.Equal(got, want) {
		return fmt.Errorf("data differs")
	}
	return nil
}
