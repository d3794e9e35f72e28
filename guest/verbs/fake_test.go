package verbs

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fakeBase is the guest-physical address of the fake's DMA memory.
const fakeBase = 0x10_0000

// fakeTransport is a Transport that records commands and answers them from
// a table of handles, with DMA memory in a Go slice.
type fakeTransport struct {
	mu       sync.Mutex
	conf     abi.Config
	cmds     [][]byte // every request, header included
	status   map[abi.Opcode]abi.Status
	next     uint32
	mem      []byte
	brk      uint64
	live     map[abi.GPA]int
	notifies []int
	polling  bool
	events   []abi.Event
	closed   bool
	// srqAttr, when set, answers QUERY_SRQ; else the SRQ asked for with
	// max_wr 0 (a hostile answer the tests set on purpose otherwise).
	srqAttr *abi.SRQAttr
}

func newFake(memSize int) *fakeTransport {
	return &fakeTransport{
		conf: abi.Config{ABIVersion: abi.ABIVersion, NumDoorbellQueues: 2, MaxQP: 64, MaxQPWR: 4096, MaxSGE: 8,
			MaxCQ: 64, MaxCQE: 65536, MaxMR: 64, MaxPD: 8, MaxAH: 8, MaxMRSize: 1 << 40, MaxInlineData: 256,
			ActiveMTU: abi.MTU4096, PortState: abi.PortActive, MaxQPRdAtom: 16, MaxSRQ: 8},
		status: map[abi.Opcode]abi.Status{},
		next:   0x100,
		mem:    make([]byte, memSize),
		live:   map[abi.GPA]int{},
	}
}

func (f *fakeTransport) attr() abi.DeviceAttr {
	c := f.conf
	return abi.DeviceAttr{FWVer: 1, MaxMRSize: c.MaxMRSize, PageSizeCap: 0x7ffff000, VendorID: 0x1af4, VendorPartID: 0x106a,
		HWVer: 1, MaxQP: c.MaxQP, MaxQPWR: c.MaxQPWR, MaxSGE: c.MaxSGE, MaxCQ: c.MaxCQ, MaxCQE: c.MaxCQE,
		MaxMR: c.MaxMR, MaxPD: c.MaxPD, MaxQPRdAtom: c.MaxQPRdAtom, MaxQPInitRdAtom: c.MaxQPRdAtom,
		AtomicCap: abi.AtomicHCA, MaxAH: c.MaxAH, PhysPortCnt: 1, MaxInlineData: c.MaxInlineData, MaxSRQ: c.MaxSRQ}
}

func (f *fakeTransport) ReadConfig(off, n int) ([]byte, error) {
	raw := abi.Marshal(&f.conf)
	if off < 0 || n < 0 || off+n > len(raw) {
		return nil, fmt.Errorf("fake: config [%d, +%d)", off, n)
	}
	return raw[off : off+n], nil
}

func (f *fakeTransport) Command(req []byte, respLen int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmds = append(f.cmds, append([]byte(nil), req...))
	op := abi.Opcode(binary.LittleEndian.Uint16(req))
	resp := make([]byte, abi.RespHeaderSize, respLen)
	if st, ok := f.status[op]; ok && st != abi.StatusOK {
		binary.LittleEndian.PutUint32(resp, uint32(st))
		return resp, nil
	}
	f.next++
	h := f.next
	var body []byte
	switch op {
	case abi.CmdQueryDevice:
		a := f.attr()
		body = abi.Marshal(&a)
	case abi.CmdQueryPort:
		body = abi.Marshal(&abi.PortAttr{State: abi.PortActive, MaxMTU: abi.MTU4096, ActiveMTU: abi.MTU4096, GIDTblLen: 1, MaxMsgSz: abi.MaxMsgSize, LinkLayer: abi.LinkLayerEthernet})
	case abi.CmdQueryGID:
		body = abi.Marshal(&abi.GID{Raw: f.conf.PortGID})
	case abi.CmdCreatePD, abi.CmdCreateCQ, abi.CmdCreateQP, abi.CmdCreateAH, abi.CmdCreateSRQ:
		body = abi.Marshal(&abi.Handle{Handle: h})
	case abi.CmdRegMR:
		body = abi.Marshal(&abi.MRKeys{LKey: h, RKey: h})
	case abi.CmdQuerySRQ:
		a := abi.SRQAttr{SRQN: binary.LittleEndian.Uint32(req[8:])}
		if f.srqAttr != nil {
			a = *f.srqAttr
		}
		body = abi.Marshal(&a)
	case abi.CmdQueryQP:
		body = abi.Marshal(&abi.QPAttr{QPN: binary.LittleEndian.Uint32(req[8:]), QPState: abi.QPSRTS, PathMTU: abi.MTU4096})
	}
	return append(resp, body...), nil
}

func (f *fakeTransport) AllocDMA(size, align uint64) (DMABuf, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := (f.brk + align - 1) &^ (align - 1)
	if start+size > uint64(len(f.mem)) {
		return DMABuf{}, fmt.Errorf("fake: out of memory")
	}
	f.brk = start + size
	b := DMABuf{Addr: abi.GPA(fakeBase + start), Buf: f.mem[start : start+size : start+size]}
	f.live[b.Addr] = len(b.Buf)
	return b, nil
}

func (f *fakeTransport) FreeDMA(b DMABuf) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, b.Addr)
}

// at returns the fake memory at a guest-physical address.
func (f *fakeTransport) at(gpa uint64, n int) []byte {
	off := gpa - fakeBase
	return f.mem[off : off+uint64(n)]
}

func (f *fakeTransport) Notify(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notifies = append(f.notifies, i)
	return nil
}

func (f *fakeTransport) Polling(i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polling
}

func (f *fakeTransport) WaitEvent(timeout time.Duration) (abi.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.events) == 0 {
		return abi.Event{}, ErrTimeout
	}
	ev := f.events[0]
	f.events = f.events[1:]
	return ev, nil
}

func (f *fakeTransport) Close() error {
	f.closed = true
	return nil
}

// last returns the last command's opcode and body.
func (f *fakeTransport) last() (abi.Opcode, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cmds[len(f.cmds)-1]
	return abi.Opcode(binary.LittleEndian.Uint16(c)), c[abi.CmdHeaderSize:]
}
