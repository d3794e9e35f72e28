package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestCQArmRecord follows docs/spec.md's struct vrdma_cq_arm_record: the
// device fires once per new arm sequence, for a qualifying completion made
// visible after the arm, and acts on no arm word that was there at creation.
func TestCQArmRecord(t *testing.T) {
	g, d := newDevice(t)
	c := newCQ(t, g, d, 0x11, 64)
	c.ArmRecord = true
	rec := g.slice(t, c.Record, abi.CQArmRecordSize)
	arm := func(seq uint32, solicited bool) {
		v := seq << abi.CQArmSeqShift
		if solicited {
			v |= abi.CQArmSolicited
		}
		abi.StoreUint32(rec, abi.CQRecordArm, v)
	}
	consume := func() { abi.StoreUint32(rec, abi.CQRecordCI, abi.LoadUint32(rec, abi.CQRecordPI)) }
	ok := &abi.CQE{Status: abi.WCSuccess}
	bad := &abi.CQE{Status: abi.WCRemAccessErr}

	// An arm word left in the record before CREATE_CQ is not an arm.
	arm(7, false)
	c.InitArm(g.tbl)

	steps := []struct {
		name      string
		do        func()
		cqe       *abi.CQE
		solicited bool
		lazy      bool
		wantPush  bool // push reports fire
		wantPub   bool // the publish after it reports fire
	}{
		{name: "stale word from creation", cqe: ok},
		{name: "armed", do: func() { arm(8, false) }, cqe: ok, wantPush: true},
		{name: "fired once per sequence", cqe: ok},
		{name: "re-armed, same word again is no arm", do: func() { arm(8, false) }, cqe: ok},
		{name: "solicited-only skips plain success", do: func() { arm(9, true) }, cqe: ok},
		{name: "solicited-only fires on solicited", cqe: ok, solicited: true, wantPush: true},
		{name: "solicited-only fires on error", do: func() { arm(10, true) }, cqe: bad, wantPush: true},
		{name: "lazy push fires at publish", do: func() { arm(11, false) }, cqe: ok, lazy: true, wantPub: true},
		{name: "lazy push not armed", cqe: ok, lazy: true},
	}
	q := newQP(t, g, d, 0x21, c, c, qpOpts{})
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		var lazy *QP
		if s.lazy {
			lazy = q
		}
		fire, outcome := c.push(g.tbl, s.cqe, s.solicited, lazy)
		if outcome != pushOK {
			t.Fatalf("%s: push outcome %d", s.name, outcome)
		}
		pub := c.publish(g.tbl)
		if fire != s.wantPush || pub != s.wantPub {
			t.Errorf("%s: push fired %v, publish fired %v; want %v, %v", s.name, fire, pub, s.wantPush, s.wantPub)
		}
		if got := abi.LoadUint32(rec, abi.CQRecordPI); got != c.pi {
			t.Errorf("%s: record pi %d, want %d (published)", s.name, got, c.pi)
		}
		consume()
	}

	// A CQ created without the flag never reads the arm word.
	plain := newCQ(t, g, d, 0x12, 64)
	prec := g.slice(t, plain.Record, abi.CQArmRecordSize)
	abi.StoreUint32(prec, abi.CQRecordArm, 99<<abi.CQArmSeqShift)
	if fire, _ := plain.push(g.tbl, ok, true, nil); fire {
		t.Error("a CQ without ARM_RECORD fired on its record's arm word")
	}
}

// TestCQArmRecordEvent runs a WRITE between two nodes whose send CQ is armed
// through its record: the requester's pass publishes the CQE and posts one
// CQ_COMPLETION event.
func TestCQArmRecordEvent(t *testing.T) {
	p := newPair(t, pairOpts{})
	a := p.a
	a.scq.ArmRecord = true
	a.scq.InitArm(a.g.tbl)
	rec := a.g.slice(t, a.scq.Record, abi.CQArmRecordSize)
	abi.StoreUint32(rec, abi.CQRecordArm, 1<<abi.CQArmSeqShift)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
		RemoteAddr: mrIOVA, RKey: p.b.mr.Key}, []abi.SGE{a.sge(0, 64)}, nil)
	p.poll(t)
	if got := a.cqes(t, a.scq); len(got) != 1 || got[0].Status != abi.WCSuccess {
		t.Fatalf("send CQ: %+v", got)
	}
	evs := a.takeEvents()
	if len(evs) != 1 || evs[0].Type != abi.EventCQCompletion || evs[0].Handle != a.scq.Num {
		t.Fatalf("events %+v, want one CQ_COMPLETION for CQ %#x", evs, a.scq.Num)
	}
}
