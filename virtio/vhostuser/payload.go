package vhostuser

import (
	"encoding/binary"
)

// Payload codecs. Every DecodeX checks the exact length first, copies what
// it keeps, and returns the zero value together with any error (which wraps
// ErrInvalid). Decoders check structure only; the meaning of values (ring
// index in range, region sizes, enum values) is the session's business.
// Encoders do not validate: the receiving side does.

var le = binary.LittleEndian

// Payload sizes fixed by the spec (QEMU sends sizeof the C struct).
const (
	U64Size                 = 8
	VringStateSize          = 8
	VringAddrSize           = 40
	MemoryRegionSize        = 32
	MemTableHeaderSize      = 8 // u32 nregions, u32 padding
	MemRegionMsgSize        = 8 + MemoryRegionSize
	LogInfoSize             = 16
	ConfigHeaderSize        = 12 // offset, size, flags
	InflightInfoSize        = 24 // u64, u64, u16, u16, 4 bytes of C struct padding
	DeviceStateTransferSize = 8
	IOTLBSize               = 32 // struct vhost_iotlb_msg: 3 u64, 2 u8, 6 bytes padding
	VringAreaSize           = 24
	SharedObjectSize        = 16
)

func checkLen(req Request, what string, p []byte, want int) error {
	if len(p) != want {
		return invalidf(req, "%s payload is %d bytes, want %d", what, len(p), want)
	}
	return nil
}

// DecodeU64 decodes a single u64 payload.
func DecodeU64(p []byte) (uint64, error) {
	if err := checkLen(0, "u64", p, U64Size); err != nil {
		return 0, err
	}
	return le.Uint64(p), nil
}

// EncodeU64 encodes a single u64 payload.
func EncodeU64(v uint64) []byte {
	b := make([]byte, U64Size)
	le.PutUint64(b, v)
	return b
}

// VringState is the vring state description (SET_VRING_NUM, SET_VRING_BASE,
// GET_VRING_BASE, SET_VRING_ENABLE, SET_VRING_ENDIAN, VRING_KICK).
type VringState struct {
	Index, Num uint32
}

// DecodeVringState decodes a vring state description.
func DecodeVringState(p []byte) (VringState, error) {
	if err := checkLen(0, "vring state", p, VringStateSize); err != nil {
		return VringState{}, err
	}
	return VringState{Index: le.Uint32(p[0:]), Num: le.Uint32(p[4:])}, nil
}

// Encode encodes v.
func (v VringState) Encode() []byte {
	b := make([]byte, VringStateSize)
	le.PutUint32(b[0:], v.Index)
	le.PutUint32(b[4:], v.Num)
	return b
}

// VringAddrFLog is VHOST_VRING_F_LOG in VringAddr.Flags: log used-ring
// writes at VringAddr.Log.
const VringAddrFLog = 1

// VringAddr is the vring address description of SET_VRING_ADDR. Desc, Used
// and Avail are front-end virtual addresses; Log is a guest-physical
// address. Wire order: index, flags, desc, used, avail, log.
type VringAddr struct {
	Index, Flags           uint32
	Desc, Used, Avail, Log uint64
}

// DecodeVringAddr decodes a vring address description.
func DecodeVringAddr(p []byte) (VringAddr, error) {
	if err := checkLen(0, "vring address", p, VringAddrSize); err != nil {
		return VringAddr{}, err
	}
	return VringAddr{
		Index: le.Uint32(p[0:]),
		Flags: le.Uint32(p[4:]),
		Desc:  le.Uint64(p[8:]),
		Used:  le.Uint64(p[16:]),
		Avail: le.Uint64(p[24:]),
		Log:   le.Uint64(p[32:]),
	}, nil
}

// Encode encodes a.
func (a VringAddr) Encode() []byte {
	b := make([]byte, VringAddrSize)
	le.PutUint32(b[0:], a.Index)
	le.PutUint32(b[4:], a.Flags)
	le.PutUint64(b[8:], a.Desc)
	le.PutUint64(b[16:], a.Used)
	le.PutUint64(b[24:], a.Avail)
	le.PutUint64(b[32:], a.Log)
	return b
}

// MemoryRegion is one memory region: Size bytes of guest-physical memory
// at GuestAddr, mapped in the front-end at UserAddr, found at MmapOffset in
// the region's fd.
type MemoryRegion struct {
	GuestAddr, Size, UserAddr, MmapOffset uint64
}

func decodeRegion(p []byte) MemoryRegion {
	return MemoryRegion{
		GuestAddr:  le.Uint64(p[0:]),
		Size:       le.Uint64(p[8:]),
		UserAddr:   le.Uint64(p[16:]),
		MmapOffset: le.Uint64(p[24:]),
	}
}

func (r MemoryRegion) put(b []byte) {
	le.PutUint64(b[0:], r.GuestAddr)
	le.PutUint64(b[8:], r.Size)
	le.PutUint64(b[16:], r.UserAddr)
	le.PutUint64(b[24:], r.MmapOffset)
}

// MemTable is the memory regions description of SET_MEM_TABLE: u32
// nregions, u32 padding, then nregions regions.
type MemTable struct {
	Regions []MemoryRegion
}

// DecodeMemTable decodes a memory regions description: nregions <= MaxFds
// and the length exactly 8+32*nregions. Zero regions decode to a nil
// slice; Check additionally requires at least one for SET_MEM_TABLE. The
// padding is ignored.
func DecodeMemTable(p []byte) (MemTable, error) {
	if len(p) < MemTableHeaderSize {
		return MemTable{}, invalidf(0, "memory table payload is %d bytes, shorter than %d", len(p), MemTableHeaderSize)
	}
	n := le.Uint32(p[0:])
	if n > MaxFds {
		return MemTable{}, invalidf(0, "memory table has %d regions, limit %d", n, MaxFds)
	}
	// n <= 32, so the size cannot overflow.
	if want := MemTableHeaderSize + int(n)*MemoryRegionSize; len(p) != want {
		return MemTable{}, invalidf(0, "memory table of %d regions is %d bytes, want %d", n, len(p), want)
	}
	if n == 0 {
		return MemTable{}, nil
	}
	t := MemTable{Regions: make([]MemoryRegion, n)}
	for i := range t.Regions {
		off := MemTableHeaderSize + i*MemoryRegionSize
		t.Regions[i] = decodeRegion(p[off : off+MemoryRegionSize])
	}
	return t, nil
}

// Encode encodes t (zero padding).
func (t MemTable) Encode() []byte {
	b := make([]byte, MemTableHeaderSize+len(t.Regions)*MemoryRegionSize)
	le.PutUint32(b[0:], uint32(len(t.Regions)))
	for i, r := range t.Regions {
		off := MemTableHeaderSize + i*MemoryRegionSize
		r.put(b[off:])
	}
	return b
}

// MemRegionMsg is the single memory region description of ADD_MEM_REG and
// REM_MEM_REG: u64 padding, then one region.
type MemRegionMsg struct {
	Region MemoryRegion
}

// DecodeMemRegionMsg decodes a single memory region description. The
// padding is ignored.
func DecodeMemRegionMsg(p []byte) (MemRegionMsg, error) {
	if err := checkLen(0, "memory region", p, MemRegionMsgSize); err != nil {
		return MemRegionMsg{}, err
	}
	return MemRegionMsg{Region: decodeRegion(p[8:])}, nil
}

// Encode encodes m (zero padding).
func (m MemRegionMsg) Encode() []byte {
	b := make([]byte, MemRegionMsgSize)
	m.Region.put(b[8:])
	return b
}

// LogInfo is the log description of SET_LOG_BASE: the log is MmapSize
// bytes at MmapOffset in the fd.
type LogInfo struct {
	MmapSize, MmapOffset uint64
}

// DecodeLogInfo decodes a log description.
func DecodeLogInfo(p []byte) (LogInfo, error) {
	if err := checkLen(0, "log", p, LogInfoSize); err != nil {
		return LogInfo{}, err
	}
	return LogInfo{MmapSize: le.Uint64(p[0:]), MmapOffset: le.Uint64(p[8:])}, nil
}

// Encode encodes l.
func (l LogInfo) Encode() []byte {
	b := make([]byte, LogInfoSize)
	le.PutUint64(b[0:], l.MmapSize)
	le.PutUint64(b[8:], l.MmapOffset)
	return b
}

// ConfigMsg flags values.
const (
	// ConfigFlagWritable: a front-end write of writable fields.
	ConfigFlagWritable = 0
	// ConfigFlagMigration: a write during live migration (may touch
	// read-only fields).
	ConfigFlagMigration = 1
)

// ConfigMsg is the virtio device config space payload of GET_CONFIG and
// SET_CONFIG: u32 offset, u32 size, u32 flags, then size bytes. On the
// wire Size == len(Data) <= MaxConfigSize.
type ConfigMsg struct {
	Offset, Size, Flags uint32
	Data                []byte
}

// DecodeConfigMsg decodes a config space payload: Size <= MaxConfigSize
// and the length exactly 12+Size. Data is a copy.
func DecodeConfigMsg(p []byte) (ConfigMsg, error) {
	if len(p) < ConfigHeaderSize {
		return ConfigMsg{}, invalidf(0, "config payload is %d bytes, shorter than %d", len(p), ConfigHeaderSize)
	}
	c := ConfigMsg{Offset: le.Uint32(p[0:]), Size: le.Uint32(p[4:]), Flags: le.Uint32(p[8:])}
	if c.Size > MaxConfigSize {
		return ConfigMsg{}, invalidf(0, "config size %d exceeds %d", c.Size, MaxConfigSize)
	}
	if want := ConfigHeaderSize + int(c.Size); len(p) != want {
		return ConfigMsg{}, invalidf(0, "config payload of size %d is %d bytes, want %d", c.Size, len(p), want)
	}
	c.Data = make([]byte, c.Size)
	copy(c.Data, p[ConfigHeaderSize:])
	return c, nil
}

// End returns Offset+Size, and false if that overflows uint32.
func (c ConfigMsg) End() (uint32, bool) {
	end := c.Offset + c.Size
	return end, end >= c.Offset
}

// Encode encodes c with exactly c.Size data bytes: Data is copied and
// zero-padded or cut to Size (a GET_CONFIG request may leave Data nil).
func (c ConfigMsg) Encode() []byte {
	b := make([]byte, ConfigHeaderSize+int(c.Size))
	le.PutUint32(b[0:], c.Offset)
	le.PutUint32(b[4:], c.Size)
	le.PutUint32(b[8:], c.Flags)
	copy(b[ConfigHeaderSize:], c.Data)
	return b
}

// InflightInfo is the inflight description of GET/SET_INFLIGHT_FD. QEMU
// sends the C struct, 24 bytes with 4 bytes of trailing padding.
type InflightInfo struct {
	MmapSize, MmapOffset uint64
	NumQueues, QueueSize uint16
}

// DecodeInflightInfo decodes an inflight description. The padding is
// ignored.
func DecodeInflightInfo(p []byte) (InflightInfo, error) {
	if err := checkLen(0, "inflight", p, InflightInfoSize); err != nil {
		return InflightInfo{}, err
	}
	return InflightInfo{
		MmapSize:   le.Uint64(p[0:]),
		MmapOffset: le.Uint64(p[8:]),
		NumQueues:  le.Uint16(p[16:]),
		QueueSize:  le.Uint16(p[18:]),
	}, nil
}

// Encode encodes i (zero padding).
func (i InflightInfo) Encode() []byte {
	b := make([]byte, InflightInfoSize)
	le.PutUint64(b[0:], i.MmapSize)
	le.PutUint64(b[8:], i.MmapOffset)
	le.PutUint16(b[16:], i.NumQueues)
	le.PutUint16(b[18:], i.QueueSize)
	return b
}

// DeviceStateTransfer directions and phases.
const (
	TransferSave         = 0 // back-end to front-end (migration source)
	TransferLoad         = 1 // front-end to back-end (migration destination)
	TransferPhaseStopped = 0
)

// DeviceStateTransfer is the device state transfer parameters of
// SET_DEVICE_STATE_FD.
type DeviceStateTransfer struct {
	Direction, Phase uint32
}

// DecodeDeviceStateTransfer decodes device state transfer parameters.
func DecodeDeviceStateTransfer(p []byte) (DeviceStateTransfer, error) {
	if err := checkLen(0, "device state transfer", p, DeviceStateTransferSize); err != nil {
		return DeviceStateTransfer{}, err
	}
	return DeviceStateTransfer{Direction: le.Uint32(p[0:]), Phase: le.Uint32(p[4:])}, nil
}

// Encode encodes d.
func (d DeviceStateTransfer) Encode() []byte {
	b := make([]byte, DeviceStateTransferSize)
	le.PutUint32(b[0:], d.Direction)
	le.PutUint32(b[4:], d.Phase)
	return b
}

// IOTLB is struct vhost_iotlb_msg (IOTLB_MSG, BACKEND_IOTLB_MSG).
type IOTLB struct {
	IOVA, Size, UserAddr uint64
	Perm, Type           uint8
}

// DecodeIOTLB decodes an IOTLB message. The padding is ignored.
func DecodeIOTLB(p []byte) (IOTLB, error) {
	if err := checkLen(0, "iotlb", p, IOTLBSize); err != nil {
		return IOTLB{}, err
	}
	return IOTLB{
		IOVA:     le.Uint64(p[0:]),
		Size:     le.Uint64(p[8:]),
		UserAddr: le.Uint64(p[16:]),
		Perm:     p[24],
		Type:     p[25],
	}, nil
}

// Encode encodes t (zero padding).
func (t IOTLB) Encode() []byte {
	b := make([]byte, IOTLBSize)
	le.PutUint64(b[0:], t.IOVA)
	le.PutUint64(b[8:], t.Size)
	le.PutUint64(b[16:], t.UserAddr)
	b[24] = t.Perm
	b[25] = t.Type
	return b
}

// VringArea is the vring area description of
// BACKEND_VRING_HOST_NOTIFIER_MSG. U64 holds the ring index (bits 0-7) and
// the no-fd flag (bit 8), as DecodeVringFile reads them.
type VringArea struct {
	U64, Size, Offset uint64
}

// DecodeVringArea decodes a vring area description.
func DecodeVringArea(p []byte) (VringArea, error) {
	if err := checkLen(0, "vring area", p, VringAreaSize); err != nil {
		return VringArea{}, err
	}
	return VringArea{U64: le.Uint64(p[0:]), Size: le.Uint64(p[8:]), Offset: le.Uint64(p[16:])}, nil
}

// Encode encodes a.
func (a VringArea) Encode() []byte {
	b := make([]byte, VringAreaSize)
	le.PutUint64(b[0:], a.U64)
	le.PutUint64(b[8:], a.Size)
	le.PutUint64(b[16:], a.Offset)
	return b
}

// SharedObject is struct VhostUserShared: a 16-byte UUID whose first three
// components are big-endian (RFC 4122 byte order, as google/uuid.UUID).
type SharedObject struct {
	UUID [16]byte
}

// DecodeSharedObject decodes a VhostUserShared payload.
func DecodeSharedObject(p []byte) (SharedObject, error) {
	if err := checkLen(0, "shared object", p, SharedObjectSize); err != nil {
		return SharedObject{}, err
	}
	var s SharedObject
	copy(s.UUID[:], p)
	return s, nil
}

// Encode encodes s.
func (s SharedObject) Encode() []byte {
	b := make([]byte, SharedObjectSize)
	copy(b, s.UUID[:])
	return b
}

// Vring file u64 bits (SET_VRING_KICK/CALL/ERR; also the vring area U64).
const (
	VringFileIndexMask uint64 = 0xff
	VringFileNoFd      uint64 = 1 << 8
)

// DecodeVringFile decodes the u64 of SET_VRING_KICK/CALL/ERR: bits 0-7 are
// the ring index, bit 8 means no fd was sent (poll instead). Any other bit
// set is invalid (and yields zero results).
func DecodeVringFile(u uint64) (index uint8, noFd bool, err error) {
	if rest := u &^ (VringFileIndexMask | VringFileNoFd); rest != 0 {
		return 0, false, invalidf(0, "vring file value %#x has reserved bits %#x set", u, rest)
	}
	return uint8(u & VringFileIndexMask), u&VringFileNoFd != 0, nil
}

// EncodeVringFile encodes the u64 of SET_VRING_KICK/CALL/ERR.
func EncodeVringFile(index uint8, noFd bool) uint64 {
	u := uint64(index)
	if noFd {
		u |= VringFileNoFd
	}
	return u
}
