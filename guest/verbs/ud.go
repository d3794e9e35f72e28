package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// AHAttr describes an address handle, like ibv_ah_attr with a GRH: the
// destination GID and the local GID entry the datagrams are sent from. The
// port is always 1.
type AHAttr struct {
	DGID      [16]byte
	SGIDIndex uint32
}

// AH is an address handle: a destination for UD sends (SendWR.AH).
type AH struct {
	pd   *PD    // immutable
	num  uint32 // immutable
	attr AHAttr // immutable
}

// CreateAH creates an address handle in pd (CREATE_AH). A destination the
// device cannot reach over UD (another host's GID from a network GID: UD
// over RoCEv2 is not in this revision) is ErrUnsupported.
func (pd *PD) CreateAH(a AHAttr) (*AH, error) {
	req := abi.CreateAH{PDN: pd.num, PortNum: 1, DGID: a.DGID, SGIDIndex: a.SGIDIndex}
	resp, err := pd.ctx.command(abi.CmdCreateAH, abi.Marshal(&req), 8)
	if err != nil {
		return nil, err
	}
	return &AH{pd: pd, num: binary.LittleEndian.Uint32(resp), attr: a}, nil
}

// Num returns the AH's handle (what a send WQE names).
func (ah *AH) Num() uint32 { return ah.num }

// Attr returns the attributes the AH was created with.
func (ah *AH) Attr() AHAttr { return ah.attr }

// PD returns the PD the AH was created in.
func (ah *AH) PD() *PD { return ah.pd }

// Destroy destroys the AH (DESTROY_AH). Send WQEs already posted that name
// it complete with LOC_QP_OP_ERR when the device reaches them.
func (ah *AH) Destroy() error { return ah.pd.ctx.handleCommand(abi.CmdDestroyAH, ah.num) }

// ReadyUD moves a UD QP RESET → INIT → RTR → RTS with Q_Key qkey, as
// ibv_ud_pingpong does: port 1, P_Key index 0, the QP's random PSN as
// sq_psn. A UD QP receives in RTR and RTS, from any QP that sends it its
// Q_Key.
func (qp *QP) ReadyUD(qkey uint32) error {
	if qp.typ != abi.QPTypeUD {
		return argErr("qp type", "ReadyUD on a QP of type %d", qp.typ)
	}
	steps := []struct {
		name string
		attr abi.QPAttr
		mask int
	}{
		{"init", abi.QPAttr{QPState: abi.QPSInit, PKeyIndex: 0, PortNum: 1, QKey: qkey},
			abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey},
		{"rtr", abi.QPAttr{QPState: abi.QPSRTR}, abi.QPAttrState},
		{"rts", abi.QPAttr{QPState: abi.QPSRTS, SQPSN: qp.psn}, abi.QPAttrState | abi.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(s.attr, s.mask); err != nil {
			return fmt.Errorf("qp %d to %s: %w", qp.num, s.name, err)
		}
	}
	return nil
}

// GRH is what the 40 bytes of network header at the start of a UD receive
// buffer say (docs/spec.md, "Semantics (UD)"), like ibv_grh read through
// ibv_init_ah_from_wc: the sender's and receiver's GIDs. For IPv4-mapped
// GIDs the header is 20 zero bytes and an IPv4 header (IPv4 true), else an
// IPv6 header.
type GRH struct {
	SGID, DGID [16]byte
	IPv4       bool
	// HopLimit is the IPv6 hop limit or the IPv4 TTL.
	HopLimit uint8
}

// ParseGRH decodes the network header a UD receive completion with
// abi.WCFlagGRH put in front of the payload: b holds at least its first
// abi.GRHSize bytes. A header that is neither form is ErrProtocol.
func ParseGRH(b []byte) (GRH, error) {
	if len(b) < abi.GRHSize {
		return GRH{}, fmt.Errorf("%w: grh of %d bytes, want %d", ErrProtocol, len(b), abi.GRHSize)
	}
	b = b[:abi.GRHSize]
	var g GRH
	switch {
	case b[0]>>4 == 6:
		g.HopLimit = b[7]
		copy(g.SGID[:], b[8:24])
		copy(g.DGID[:], b[24:40])
		return g, nil
	case allZero(b[:20]) && b[20] == 0x45:
		ip := b[20:]
		g.IPv4, g.HopLimit = true, ip[8]
		g.SGID, g.DGID = v4Mapped(ip[12:16]), v4Mapped(ip[16:20])
		return g, nil
	}
	return GRH{}, fmt.Errorf("%w: grh is neither an IPv6 header nor 20 zero bytes and an IPv4 header: %x", ErrProtocol, b)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// v4Mapped returns ::ffff:a.b.c.d.
func v4Mapped(a []byte) [16]byte {
	var g [16]byte
	g[10], g[11] = 0xff, 0xff
	copy(g[12:], a)
	return g
}
