package rc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// rebuilder is a sim host that gives a restored QP its buffers by ID, as
// the engine would from its rings.
type rebuilder struct {
	*host
	sends map[uint64]Buffer
	recvs map[uint64]Buffer
}

func (r *rebuilder) SendBuffer(w *WQEState) (Buffer, error) {
	if b := r.sends[w.ID]; b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("no send buffer %#x", w.ID)
}

func (r *rebuilder) RecvBuffer(v *RecvState) (Buffer, error) {
	if b := r.recvs[v.ID]; b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("no receive buffer %#x", v.ID)
}

// handOver freezes x, passes its state through JSON and restores it on a
// new port (what x had queued is lost, as with a process that exits).
func handOver(t *testing.T, x *side, rb *rebuilder) *ConnState {
	t.Helper()
	st, err := x.qp.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var got ConnState
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	p := &port{}
	q, err := Restore(&got, rb, p)
	if err != nil {
		t.Fatalf("restore %s: %v", b, err)
	}
	q.cfg.Clock = x.qp.cfg.Clock
	x.qp, x.port = q, p
	return &got
}

// TestRestoreMidStream runs traffic both ways (multi-packet SENDs,
// WRITEs, READs, atomics), sent two packets at a time, and at each of 40
// points (a packet delivered at a time) freezes both QPs, restores them from their states, and runs to
// the end: every completion succeeds in order, every byte arrives, each
// atomic runs once. Across the points, the states held work in flight, a
// SEND and a WRITE half placed, queued READ responses and remembered
// requests.
func TestRestoreMidStream(t *testing.T) {
	var sawWQE, sawRecv, sawWrite, sawResp, sawReplay bool
	for k := range 80 {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			s := newSim(t, Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, Burst: 2, SQPSN: 0xfffffa, RQPSN: 0x10}, simMem)
			ra := &rebuilder{host: s.a.host, sends: map[uint64]Buffer{}, recvs: map[uint64]Buffer{}}
			rb := &rebuilder{host: s.b.host, sends: map[uint64]Buffer{}, recvs: map[uint64]Buffer{}}
			post := func(x *side, r *rebuilder, wr SendWR) {
				r.sends[wr.ID] = wr.Local
				if err := x.qp.Post(wr); err != nil {
					t.Fatal(err)
				}
			}
			recv := func(x *side, r *rebuilder, id uint64, n int) buf {
				b := make(buf, n)
				r.recvs[id] = b
				x.host.recvs = append(x.host.recvs, Recv{ID: id, Len: uint32(n), Buf: b})
				return b
			}
			sendA, writeA, sendB := fill(5000, 1), fill(6000, 2), fill(4100, 3)
			copy(s.b.host.mr.b[20000:], fill(7000, 4))
			binary.LittleEndian.PutUint64(s.b.host.mr.b[40000:], 100)
			readA, atomA := make(buf, 7000), make(buf, 8)
			gotB := recv(s.b, rb, 1, 5000)
			gotA := recv(s.a, ra, 1, 4100)
			post(s.a, ra, SendWR{ID: 1, Opcode: WRSend, Length: 5000, Local: buf(sendA)})
			post(s.a, ra, SendWR{ID: 2, Opcode: WRRDMAWrite, Length: 6000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(writeA)})
			post(s.a, ra, SendWR{ID: 3, Opcode: WRRDMARead, Length: 7000, RemoteAddr: 0x10000 + 20000, RKey: simRKey, Local: readA})
			post(s.a, ra, SendWR{ID: 4, Opcode: WRAtomicFetchAdd, Length: 8, RemoteAddr: 0x10000 + 40000, RKey: simRKey, SwapAdd: 5, Local: atomA})
			post(s.b, rb, SendWR{ID: 1, Opcode: WRSendWithImm, Length: 4100, Imm: 77, Local: buf(sendB)})
			for i := range k {
				stepOne(s, i)
			}
			sa, sb := handOver(t, s.a, ra), handOver(t, s.b, rb)
			for _, st := range []*ConnState{sa, sb} {
				sawWQE = sawWQE || len(st.Requester.WQEs) > 0 && st.Requester.WQEs[0].Started
				sawRecv = sawRecv || st.Responder.Recv != nil
				sawWrite = sawWrite || st.Responder.Write != nil
				sawResp = sawResp || len(st.Responder.Responses) > 0
				sawReplay = sawReplay || len(st.Responder.Replay) > 0
			}
			s.run(func() bool { return len(s.a.host.sendDone) == 4 && len(s.b.host.sendDone) == 1 })
			wantStatus(t, s.a.host.sendDone, []uint64{1, 2, 3, 4}, abi.WCSuccess)
			wantStatus(t, s.b.host.sendDone, []uint64{1}, abi.WCSuccess)
			if len(s.b.host.recvDone) != 1 || len(s.a.host.recvDone) != 1 || s.a.host.recvDone[0].Imm != 77 {
				t.Fatalf("receives: %+v, %+v", s.b.host.recvDone, s.a.host.recvDone)
			}
			switch {
			case !bytes.Equal(gotB, sendA), !bytes.Equal(gotA, sendB):
				t.Fatal("SEND data differs")
			case !bytes.Equal(s.b.host.mr.b[:6000], writeA):
				t.Fatal("WRITE data differs")
			case !bytes.Equal(readA, s.b.host.mr.b[20000:27000]):
				t.Fatal("READ data differs")
			case binary.LittleEndian.Uint64(atomA) != 100 || binary.LittleEndian.Uint64(s.b.host.mr.b[40000:]) != 105 || s.b.host.mr.atomics != 1:
				t.Fatalf("atomic: returned %d, word %d after %d executions", binary.LittleEndian.Uint64(atomA),
					binary.LittleEndian.Uint64(s.b.host.mr.b[40000:]), s.b.host.mr.atomics)
			}
			if c := s.b.qp.Counters(); c.NAKsSent != 0 {
				t.Fatalf("b NAKed: %+v", c)
			}
			want := roce.PSN(0xfffffa).Add(5 + 6 + 7 + 1)
			if r := s.a.qp.Report(); roce.PSN(r.SQPSN) != want || roce.PSN(s.b.qp.Report().RQPSN) != want {
				t.Fatalf("a sends PSN %#x, b expects %#x, want %#x", r.SQPSN, s.b.qp.Report().RQPSN, want)
			}
		})
	}
	if !sawWQE || !sawRecv || !sawWrite || !sawResp || !sawReplay {
		t.Fatalf("states seen: work in flight %t, SEND half placed %t, WRITE half placed %t, READ responses queued %t, remembered requests %t",
			sawWQE, sawRecv, sawWrite, sawResp, sawReplay)
	}
}

// stepOne delivers one packet, from a on even i and b on odd i (from the
// other when the one has none), and lets the QPs send what it let out.
func stepOne(s *sim, i int) {
	sides := []*side{s.a, s.b}
	if i%2 == 1 {
		sides[0], sides[1] = s.b, s.a
	}
	for _, from := range sides {
		if len(from.port.out) == 0 {
			continue
		}
		pkt := from.port.out[0]
		from.port.out = from.port.out[1:]
		to := s.peer(from)
		s.deliver(to, pkt)
		to.qp.Flush()
		break
	}
	for _, x := range sides {
		if x.port.woken {
			x.port.woken = false
			x.qp.Pump()
		}
	}
}

// TestFreezeThaw: a frozen QP sends nothing, takes no packet and no work;
// thawed, it goes on.
func TestFreezeThaw(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RetryCnt: 7}, simMem)
	data := fill(3000, 9)
	st, err := s.a.qp.Freeze()
	if err != nil || st.QPN != 0x11 || !st.Started {
		t.Fatalf("freeze: %+v, %v", st, err)
	}
	if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRRDMAWrite, Length: 3000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(data)}); !errors.Is(err, ErrFrozen) {
		t.Fatalf("post on a frozen QP: %v", err)
	}
	s.a.qp.Thaw()
	if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRRDMAWrite, Length: 3000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(data)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.b.qp.Freeze(); err != nil {
		t.Fatal(err)
	}
	before := s.b.qp.Counters().DropState
	s.step() // b drops a's packets
	if s.b.qp.Counters().DropState == before || s.b.qp.Counters().RxRequests != 0 {
		t.Fatalf("frozen QP took packets: %+v", s.b.qp.Counters())
	}
	s.b.qp.Tick()
	s.b.qp.Pump()
	if len(s.b.port.out) != 0 {
		t.Fatal("frozen QP sent")
	}
	s.b.qp.Thaw()
	s.run(func() bool { return len(s.a.host.sendDone) == 1 })
	wantStatus(t, s.a.host.sendDone, []uint64{1}, abi.WCSuccess)
	if !bytes.Equal(s.b.host.mr.b[:3000], data) {
		t.Fatal("data differs")
	}
	s.a.qp.Close()
	if _, err := s.a.qp.Freeze(); !errors.Is(err, ErrState) {
		t.Fatalf("freeze of a closed QP: %v", err)
	}
}

// validState is a state with every part: work in flight (a READ half
// answered), a WRITE half placed, a queued READ response, remembered
// requests.
func validState() *ConnState {
	return &ConnState{
		QPN: 0x11, DestQPN: 0x22, PMTU: 1024, SQSize: 8, TimeoutNS: 20e6, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1,
		MaxRdAtomic: 4, MaxDestRdAtomic: 4, Window: 512, Burst: 32, Started: true,
		Requester: RequesterState{NextPSN: 0xfffffe, UnackedPSN: 0xfffffe, HighPSN: 0x5, WQEs: []WQEState{
			{ID: 1, Opcode: uint8(WRRDMARead), Length: 4000, RemoteAddr: 0x1000, RKey: 7, Started: true, PSN: 0xfffffc, Got: 2048,
				Local: &LocalState{SGEs: []SGEState{{LKey: 3, Addr: 0x100, Length: 1000}, {LKey: 3, Addr: 0x9000, Length: 3000}}}},
			{ID: 2, Opcode: uint8(WRSend), Length: 5000, Started: true, PSN: 0x0, Local: &LocalState{SGEs: []SGEState{{LKey: 3, Addr: 0, Length: 5000}}}},
			{ID: 3, Opcode: uint8(WRAtomicCmpSwp), Length: 8, RemoteAddr: 0x2000, RKey: 7, Compare: 1, SwapAdd: 2,
				Local: &LocalState{SGEs: []SGEState{{LKey: 3, Addr: 0, Length: 8}}}},
			{ID: 4, Opcode: uint8(WRSend), Length: 3, Local: &LocalState{Inline: []byte("abc")}},
		}},
		Responder: ResponderState{ExpectedPSN: 0x20, MSN: 9,
			Write:     &WriteState{RKey: 7, VA: 0x10000 + 2048, Left: 1000, Total: 3048},
			Responses: []ResponseState{{PSN: 0x10, MSN: 8, RKey: 7, VA: 0x10000, Left: 100}, {Atomic: true, PSN: 0x12, MSN: 9, Orig: 42}},
			Replay:    []ReplayState{{Read: true, PSN: 0x10, VA: 0x10000, RKey: 7, Length: 100}, {PSN: 0x12, Orig: 42}},
		},
	}
}

// anyHost resolves every key and range and rebuilds every buffer: what
// Restore refuses with it, Validate refused.
type anyHost struct{ host }

type anyRegion struct{}

func (anyRegion) WriteAt(uint64, []byte) error { return nil }
func (anyRegion) ReadAt(uint64, []byte) error  { return nil }
func (anyRegion) Atomic(uint64, AtomicOp, uint64, uint64) (uint64, error) {
	return 0, nil
}

func (h *anyHost) Resolve(uint32, uint64, uint32, Access) (Region, bool) { return anyRegion{}, true }
func (h *anyHost) SendBuffer(w *WQEState) (Buffer, error)                { return make(buf, w.Length), nil }
func (h *anyHost) RecvBuffer(r *RecvState) (Buffer, error)               { return make(buf, r.Length), nil }

// TestRestoreRoundTrip: a restored QP exports the state it was restored
// from (but the cursor, which goes back to the oldest unacknowledged PSN,
// and the local memory descriptions, which its buffers do not give).
func TestRestoreRoundTrip(t *testing.T) {
	st := validState()
	q, err := Restore(st, &anyHost{}, &port{})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, q)
	got, err := q.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(got), normalize(st)) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", normalize(got), normalize(st))
	}
}

func normalize(st *ConnState) *ConnState {
	c := *st
	c.Requester.NextPSN = 0
	c.Requester.WQEs = append([]WQEState(nil), st.Requester.WQEs...)
	for i := range c.Requester.WQEs {
		c.Requester.WQEs[i].Local = nil
	}
	return &c
}

// TestRestoreRefuses: states Restore refuses, with ErrConnState.
func TestRestoreRefuses(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*ConnState)
	}{
		{"QPN beyond 24 bits", func(s *ConnState) { s.QPN = 1 << 24 }},
		{"path MTU", func(s *ConnState) { s.PMTU = 1500 }},
		{"SQ size 0", func(s *ConnState) { s.SQSize = 0 }},
		{"SQ size too large", func(s *ConnState) { s.SQSize = MaxSQSize + 1 }},
		{"negative timeout", func(s *ConnState) { s.TimeoutNS = -1 }},
		{"timeout 0", func(s *ConnState) { s.TimeoutNS = 0 }},
		{"retry count", func(s *ConnState) { s.RetryCnt = 8 }},
		{"RNR timer", func(s *ConnState) { s.MinRNRTimer = 32 }},
		{"max_dest_rd_atomic", func(s *ConnState) { s.MaxDestRdAtomic = 1<<16 + 1 }},
		{"window", func(s *ConnState) { s.Window = MaxWindow + 1 }},
		{"burst 0", func(s *ConnState) { s.Burst = 0 }},
		{"next PSN beyond 24 bits", func(s *ConnState) { s.Requester.NextPSN = 1 << 24 }},
		{"PSNs out of order", func(s *ConnState) { s.Requester.NextPSN = 0x6 }},
		{"more WQEs than the SQ", func(s *ConnState) { s.SQSize = 3 }},
		{"WQEs on a QP not started", func(s *ConnState) { s.Started = false }},
		{"opcode", func(s *ConnState) { s.Requester.WQEs[3].Opcode = 7 }},
		{"length", func(s *ConnState) { s.Requester.WQEs[3].Length = abi.MaxMsgSize + 1 }},
		{"atomic length", func(s *ConnState) { s.Requester.WQEs[2].Length = 16 }},
		{"atomic alignment", func(s *ConnState) { s.Requester.WQEs[2].RemoteAddr = 0x2004 }},
		{"started after unstarted", func(s *ConnState) { s.Requester.WQEs[3].Started, s.Requester.WQEs[3].PSN = true, 0x6 }},
		{"PSN gap", func(s *ConnState) { s.Requester.WQEs[1].PSN = 0x1 }},
		{"PSN of unstarted", func(s *ConnState) { s.Requester.WQEs[2].PSN = 5 }},
		{"READ got not a PMTU multiple", func(s *ConnState) { s.Requester.WQEs[0].Got = 100 }},
		{"READ got all", func(s *ConnState) { s.Requester.WQEs[0].Got = 4000 }},
		{"got on a SEND", func(s *ConnState) { s.Requester.WQEs[1].Got = 1024 }},
		{"unacked before the oldest WQE", func(s *ConnState) { s.Requester.UnackedPSN, s.Requester.NextPSN = 0xfffffb, 0xfffffb }},
		{"high beyond the last WQE", func(s *ConnState) { s.Requester.HighPSN = 0x6 }},
		{"high at the last WQE's start", func(s *ConnState) { s.Requester.HighPSN = 0x0 }},
		{"unacked without work", func(s *ConnState) { s.Requester.WQEs = nil }},
		{"too many READs", func(s *ConnState) { s.MaxRdAtomic = 0 }},
		{"SGEs and inline", func(s *ConnState) { s.Requester.WQEs[3].Local.SGEs = []SGEState{{Length: 3}} }},
		{"SGE lengths", func(s *ConnState) { s.Requester.WQEs[1].Local.SGEs[0].Length = 4999 }},
		{"SGE wraps", func(s *ConnState) { s.Requester.WQEs[1].Local.SGEs[0].Addr = 1<<64 - 10 }},
		{"inline length", func(s *ConnState) { s.Requester.WQEs[3].Local.Inline = []byte("abcd") }},
		{"too many SGEs", func(s *ConnState) {
			s.Requester.WQEs[1].Local.SGEs = make([]SGEState, MaxStateSGEs+1)
			s.Requester.WQEs[1].Local.SGEs[0].Length = 5000
		}},
		{"expected PSN", func(s *ConnState) { s.Responder.ExpectedPSN = 1 << 24 }},
		{"MSN", func(s *ConnState) { s.Responder.MSN = 1 << 24 }},
		{"SEND and WRITE", func(s *ConnState) { s.Responder.Recv = &RecvState{ID: 1, Length: 4096, Offset: 1024} }},
		{"SEND offset", func(s *ConnState) {
			s.Responder.Write, s.Responder.Recv = nil, &RecvState{ID: 1, Length: 4096, Offset: 1000}
		}},
		{"SEND beyond its receive", func(s *ConnState) {
			s.Responder.Write, s.Responder.Recv = nil, &RecvState{ID: 1, Length: 1024, Offset: 2048}
		}},
		{"WRITE left", func(s *ConnState) { s.Responder.Write.Left = 3048 }},
		{"WRITE placed not a PMTU multiple", func(s *ConnState) { s.Responder.Write.Left = 1001 }},
		{"WRITE wraps", func(s *ConnState) { s.Responder.Write.VA = 1<<64 - 10 }},
		{"too many responses", func(s *ConnState) { s.MaxDestRdAtomic = 1 }},
		{"response after expected", func(s *ConnState) { s.Responder.Responses[1].PSN = 0x20 }},
		{"responses out of order", func(s *ConnState) { s.Responder.Responses[1].PSN = 0x10 }},
		{"atomic response with READ fields", func(s *ConnState) { s.Responder.Responses[1].Left = 1 }},
		{"READ response with orig", func(s *ConnState) { s.Responder.Responses[0].Orig = 1 }},
		{"READ response mid-way, empty", func(s *ConnState) { s.Responder.Responses[0].Left = 0 }},
		{"replay after expected", func(s *ConnState) { s.Responder.Replay[0].PSN = 0x30 }},
		{"replay atomic with READ fields", func(s *ConnState) { s.Responder.Replay[1].RKey = 7 }},
		{"replay READ length", func(s *ConnState) { s.Responder.Replay[0].Length = abi.MaxMsgSize + 1 }},
	}
	if _, err := Restore(validState(), &anyHost{}, &port{}); err != nil {
		t.Fatalf("the valid state: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := validState()
			tt.mod(st)
			q, err := Restore(st, &anyHost{}, &port{})
			if err == nil || q != nil {
				t.Fatalf("restored: %v", err)
			}
			if !errors.Is(err, ErrConnState) {
				t.Fatalf("error %v is not ErrConnState", err)
			}
		})
	}
	if _, err := Restore(nil, &anyHost{}, &port{}); !errors.Is(err, ErrConnState) {
		t.Fatalf("nil state: %v", err)
	}
	// Without a Rebuilder, work with data cannot be restored.
	if _, err := Restore(validState(), &host{}, &port{}); !errors.Is(err, ErrConnState) {
		t.Fatalf("host without Rebuilder: %v", err)
	}
}

// FuzzConnState: Restore never panics on a decoded state; what it
// accepts, it exports again unchanged (normalize), and the QP's
// invariants hold; what it refuses gives no QP.
func FuzzConnState(f *testing.F) {
	seed, _ := json.Marshal(validState())
	f.Add(seed)
	f.Add([]byte(`{"qpn":1,"pmtu":256,"sq_size":1,"timeout_ns":1,"max_rd_atomic":1,"max_dest_rd_atomic":1,"window":1,"burst":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var st ConnState
		if json.Unmarshal(data, &st) != nil {
			return
		}
		q, err := Restore(&st, &anyHost{}, &port{})
		if err != nil {
			if q != nil {
				t.Fatal("error with a QP")
			}
			return
		}
		checkInvariants(t, q)
		got, err := q.Freeze()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalize(got), normalize(&st)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", normalize(got), normalize(&st))
		}
	})
}
