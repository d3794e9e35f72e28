package verbs

import (
	"encoding/binary"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// FuzzParseResponse feeds arbitrary device responses to the response
// checker: it must never panic, and an error means no result.
func FuzzParseResponse(f *testing.F) {
	ok := append(make([]byte, abi.RespHeaderSize), abi.Marshal(&abi.MRKeys{LKey: 1, RKey: 1})...)
	f.Add(uint16(abi.CmdRegMR), 8, ok)
	f.Fuzz(func(t *testing.T, op uint16, body int, resp []byte) {
		body = body & 0xffff
		got, err := parseResponse(abi.Opcode(op), resp, body)
		if err != nil {
			if got != nil {
				t.Fatalf("error %v with result %x", err, got)
			}
			return
		}
		if len(got) != body || binary.LittleEndian.Uint32(resp) != 0 {
			t.Fatalf("accepted %x as a %d-byte response", resp, body)
		}
	})
}

// FuzzPoll lets a hostile device write any ring contents and indices:
// Poll must never panic or return more entries than it may, and an error
// means nothing returned and ci untouched.
func FuzzPoll(f *testing.F) {
	seed := make([]byte, 4*abi.CQESize)
	copy(seed, abi.Marshal(&abi.CQE{WRID: 7, Opcode: abi.WCOpRecv, ByteLen: 3}))
	f.Add(uint32(1), uint32(0), uint8(4), seed)
	f.Fuzz(func(t *testing.T, pi, ci uint32, nwc uint8, ring []byte) {
		c, _ := openFake(t, 64<<10)
		cq, err := c.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		copy(cq.ring, ring)
		cq.ci = ci
		abi.StoreUint32(cq.rec, abi.CQRecordCI, ci)
		abi.StoreUint32(cq.rec, abi.CQRecordPI, pi)
		wc := make([]WC, int(nwc%8))
		n, err := cq.Poll(wc)
		if err != nil {
			if n != 0 || cq.ci != ci {
				t.Fatalf("error %v with %d entries, ci %d -> %d", err, n, ci, cq.ci)
			}
			return
		}
		if n > len(wc) || uint32(n) > pi-ci || cq.ci != ci+uint32(n) {
			t.Fatalf("pi %d ci %d: got %d entries, ci now %d", pi, ci, n, cq.ci)
		}
	})
}

// FuzzParseGRH feeds arbitrary receive-buffer heads to the GRH decoder: it
// must never panic, an error means a zero result, and an accepted IPv4 form
// yields IPv4-mapped GIDs.
func FuzzParseGRH(f *testing.F) {
	seed := make([]byte, abi.GRHSize)
	copy(seed[20:], []byte{0x45, 0, 0, 60, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ParseGRH(b)
		if err != nil {
			if g != (GRH{}) {
				t.Fatalf("error %v with result %+v", err, g)
			}
			return
		}
		if g.IPv4 && (g.SGID[10] != 0xff || g.SGID[11] != 0xff || g.DGID[10] != 0xff || g.DGID[11] != 0xff) {
			t.Fatalf("IPv4 header gave GIDs %x %x", g.SGID, g.DGID)
		}
	})
}
