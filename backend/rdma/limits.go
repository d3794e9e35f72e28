package rdma

// Limits are a device's resource limits, reported in config space and
// QUERY_DEVICE and enforced by the control path.
type Limits struct {
	MaxQP     uint32
	MaxQPWR   uint32
	MaxSGE    uint32
	MaxCQ     uint32
	MaxCQE    uint32
	MaxMR     uint32
	MaxPD     uint32
	MaxAH     uint32
	MaxMRSize uint64
	// MaxMRExtents bounds the guest-physically contiguous runs all of a
	// device's MRs are kept as together (an RNIC's translation table):
	// host memory a driver can make the device hold with page lists that
	// never repeat a neighbour. Not in config space.
	MaxMRExtents  uint32
	MaxInlineData uint32
	MaxQPRdAtom   uint32
	// MaxSRQ bounds the device's shared receive queues (config space
	// max_srq). A device on a host NIC has none (CREATE_SRQ is
	// UNSUPPORTED there): its config space says 0 whatever this is.
	MaxSRQ uint32
}

// DefaultLimits are the limits of a device created without explicit ones.
func DefaultLimits() Limits {
	return Limits{
		MaxQP: 1024, MaxQPWR: 4096, MaxSGE: 16, MaxCQ: 1024, MaxCQE: 65536,
		MaxMR: 4096, MaxPD: 256, MaxAH: 1024, MaxMRSize: 1 << 32, MaxMRExtents: 1 << 20,
		MaxInlineData: 256, MaxQPRdAtom: 16, MaxSRQ: 1024,
	}
}

// WithDefaults returns l with every zero field taken from base.
func (l Limits) WithDefaults(base Limits) Limits {
	pick := func(v, b uint32) uint32 {
		if v == 0 {
			return b
		}
		return v
	}
	l.MaxQP, l.MaxQPWR, l.MaxSGE = pick(l.MaxQP, base.MaxQP), pick(l.MaxQPWR, base.MaxQPWR), pick(l.MaxSGE, base.MaxSGE)
	l.MaxCQ, l.MaxCQE, l.MaxMR = pick(l.MaxCQ, base.MaxCQ), pick(l.MaxCQE, base.MaxCQE), pick(l.MaxMR, base.MaxMR)
	l.MaxPD, l.MaxAH = pick(l.MaxPD, base.MaxPD), pick(l.MaxAH, base.MaxAH)
	l.MaxInlineData, l.MaxQPRdAtom = pick(l.MaxInlineData, base.MaxInlineData), pick(l.MaxQPRdAtom, base.MaxQPRdAtom)
	l.MaxMRExtents = pick(l.MaxMRExtents, base.MaxMRExtents)
	l.MaxSRQ = pick(l.MaxSRQ, base.MaxSRQ)
	if l.MaxMRSize == 0 {
		l.MaxMRSize = base.MaxMRSize
	}
	return l
}
