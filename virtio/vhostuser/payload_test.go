package vhostuser

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// codec is one payload type's decoder and encoder, type-erased for tables.
type codec struct {
	name   string
	decode func([]byte) (any, error)
	encode func(any) []byte
}

var codecs = []codec{
	{"u64", func(p []byte) (any, error) { return DecodeU64(p) }, func(v any) []byte { return EncodeU64(v.(uint64)) }},
	{"VringState", func(p []byte) (any, error) { return DecodeVringState(p) }, func(v any) []byte { return v.(VringState).Encode() }},
	{"VringAddr", func(p []byte) (any, error) { return DecodeVringAddr(p) }, func(v any) []byte { return v.(VringAddr).Encode() }},
	{"MemTable", func(p []byte) (any, error) { return DecodeMemTable(p) }, func(v any) []byte { return v.(MemTable).Encode() }},
	{"MemRegionMsg", func(p []byte) (any, error) { return DecodeMemRegionMsg(p) }, func(v any) []byte { return v.(MemRegionMsg).Encode() }},
	{"LogInfo", func(p []byte) (any, error) { return DecodeLogInfo(p) }, func(v any) []byte { return v.(LogInfo).Encode() }},
	{"ConfigMsg", func(p []byte) (any, error) { return DecodeConfigMsg(p) }, func(v any) []byte { return v.(ConfigMsg).Encode() }},
	{"InflightInfo", func(p []byte) (any, error) { return DecodeInflightInfo(p) }, func(v any) []byte { return v.(InflightInfo).Encode() }},
	{"DeviceStateTransfer", func(p []byte) (any, error) { return DecodeDeviceStateTransfer(p) }, func(v any) []byte { return v.(DeviceStateTransfer).Encode() }},
	{"IOTLB", func(p []byte) (any, error) { return DecodeIOTLB(p) }, func(v any) []byte { return v.(IOTLB).Encode() }},
	{"VringArea", func(p []byte) (any, error) { return DecodeVringArea(p) }, func(v any) []byte { return v.(VringArea).Encode() }},
	{"SharedObject", func(p []byte) (any, error) { return DecodeSharedObject(p) }, func(v any) []byte { return v.(SharedObject).Encode() }},
}

func codecByName(t *testing.T, name string) codec {
	t.Helper()
	for _, c := range codecs {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no codec %q", name)
	return codec{}
}

func region(i uint64) MemoryRegion {
	return MemoryRegion{GuestAddr: i << 30, Size: 1 << 30, UserAddr: 0x7f0000000000 + i<<30, MmapOffset: i * 4096}
}

func TestCodecRoundTrip(t *testing.T) {
	tests := []struct {
		codec string
		value any
		size  int
	}{
		{"u64", uint64(0x0123456789abcdef), 8},
		{"VringState", VringState{Index: 3, Num: 256}, 8},
		{"VringAddr", VringAddr{Index: 1, Flags: VringAddrFLog, Desc: 0x1000, Used: 0x2000, Avail: 0x3000, Log: 0x4000}, 40},
		{"MemTable", MemTable{Regions: []MemoryRegion{region(0)}}, 40},
		{"MemTable", MemTable{Regions: []MemoryRegion{region(0), region(1), region(2)}}, 8 + 3*32},
		{"MemTable", MemTable{Regions: func() []MemoryRegion {
			r := make([]MemoryRegion, MaxFds)
			for i := range r {
				r[i] = region(uint64(i))
			}
			return r
		}()}, 8 + MaxFds*32},
		{"MemRegionMsg", MemRegionMsg{Region: region(5)}, 40},
		{"LogInfo", LogInfo{MmapSize: 1 << 20, MmapOffset: 4096}, 16},
		{"ConfigMsg", ConfigMsg{Offset: 4, Size: 3, Flags: ConfigFlagMigration, Data: []byte{1, 2, 3}}, 15},
		{"ConfigMsg", ConfigMsg{Size: MaxConfigSize, Data: bytes.Repeat([]byte{0xaa}, MaxConfigSize)}, 12 + MaxConfigSize},
		{"ConfigMsg", ConfigMsg{Data: []byte{}}, 12},
		{"InflightInfo", InflightInfo{MmapSize: 8192, MmapOffset: 0, NumQueues: 4, QueueSize: 128}, 24},
		{"DeviceStateTransfer", DeviceStateTransfer{Direction: TransferLoad, Phase: TransferPhaseStopped}, 8},
		{"IOTLB", IOTLB{IOVA: 0x1000, Size: 0x2000, UserAddr: 0x3000, Perm: 3, Type: 2}, 32},
		{"VringArea", VringArea{U64: EncodeVringFile(2, false), Size: 4096, Offset: 8192}, 24},
		{"SharedObject", SharedObject{UUID: [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}, 16},
	}
	for _, tt := range tests {
		t.Run(tt.codec, func(t *testing.T) {
			c := codecByName(t, tt.codec)
			b := c.encode(tt.value)
			if len(b) != tt.size {
				t.Fatalf("encoded size: got %d, want %d", len(b), tt.size)
			}
			got, err := c.decode(b)
			if err != nil {
				t.Fatalf("decode: got error %v, want nil", err)
			}
			if !reflect.DeepEqual(got, tt.value) {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.value)
			}
			// Wrong lengths fail with a zero value.
			for _, n := range []int{0, len(b) - 1, len(b) + 1} {
				if n < 0 || n == len(b) {
					continue
				}
				p := make([]byte, n)
				copy(p, b)
				v, err := c.decode(p)
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("decode %d bytes: got error %v, want ErrInvalid", n, err)
				}
				if !reflect.ValueOf(v).IsZero() {
					t.Errorf("decode %d bytes: got %+v with error, want zero value", n, v)
				}
			}
		})
	}
}

func TestCodecWireLayout(t *testing.T) {
	// Field order on the wire, checked byte by byte for the structs QEMU
	// sends most.
	a := VringAddr{Index: 1, Flags: 2, Desc: 3, Used: 4, Avail: 5, Log: 6}.Encode()
	want := []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(a, want) {
		t.Errorf("VringAddr: got % x, want % x", a, want)
	}
	m := MemRegionMsg{Region: MemoryRegion{GuestAddr: 1, Size: 2, UserAddr: 3, MmapOffset: 4}}.Encode()
	if m[8] != 1 || m[16] != 2 || m[24] != 3 || m[32] != 4 {
		t.Errorf("MemRegionMsg: got % x, want padding then guest, size, user, offset", m)
	}
	i := InflightInfo{MmapSize: 1, MmapOffset: 2, NumQueues: 3, QueueSize: 4}.Encode()
	if i[0] != 1 || i[8] != 2 || i[16] != 3 || i[18] != 4 {
		t.Errorf("InflightInfo: got % x", i)
	}
	h := Header{Request: uint32(SetMemTable), Flags: FlagVersion | FlagNeedReply, Size: 40}.Encode()
	if want := []byte{5, 0, 0, 0, 9, 0, 0, 0, 40, 0, 0, 0}; !bytes.Equal(h, want) {
		t.Errorf("Header: got % x, want % x", h, want)
	}
}

func TestDecodeMemTableErrors(t *testing.T) {
	over := make([]byte, 8+33*32)
	over[0] = 33
	tests := []struct {
		name string
		p    []byte
	}{
		{"short", []byte{1, 0, 0}},
		{"too many regions", over},
		{"count larger than payload", append([]byte{2, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 32)...)},
		{"count smaller than payload", append([]byte{1, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 64)...)},
		{"huge count", append([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, make([]byte, 32)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeMemTable(tt.p)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got error %v, want ErrInvalid", err)
			}
			if got.Regions != nil {
				t.Fatalf("got %+v with error, want zero", got)
			}
		})
	}
}

func TestDecodeConfigMsgErrors(t *testing.T) {
	big := ConfigMsg{Size: MaxConfigSize + 1}.Encode()
	mismatch := ConfigMsg{Size: 4}.Encode()[:14]
	for name, p := range map[string][]byte{"too big": big, "short data": mismatch, "short header": {0, 0}} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeConfigMsg(p)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got error %v, want ErrInvalid", err)
			}
			if got.Data != nil || got.Size != 0 {
				t.Fatalf("got %+v with error, want zero", got)
			}
		})
	}
}

func TestConfigMsgEncodePadsToSize(t *testing.T) {
	b := ConfigMsg{Size: 8}.Encode()
	if got, want := len(b), 20; got != want {
		t.Fatalf("got %d bytes, want %d", got, want)
	}
	c, err := DecodeConfigMsg(b)
	if err != nil || len(c.Data) != 8 {
		t.Fatalf("got %+v, %v; want 8 zero data bytes", c, err)
	}
	if end, ok := (ConfigMsg{Offset: 0xffffffff, Size: 2}).End(); ok {
		t.Errorf("End: got %d, true; want overflow", end)
	}
	if end, ok := (ConfigMsg{Offset: 8, Size: 4}).End(); !ok || end != 12 {
		t.Errorf("End: got %d, %v; want 12, true", end, ok)
	}
}

func TestDecodedDataIsCopy(t *testing.T) {
	p := ConfigMsg{Size: 2, Data: []byte{7, 8}}.Encode()
	c, err := DecodeConfigMsg(p)
	if err != nil {
		t.Fatal(err)
	}
	p[12] = 0
	if c.Data[0] != 7 {
		t.Fatalf("got Data[0]=%d after the payload changed, want 7 (a copy)", c.Data[0])
	}
}

func TestVringFile(t *testing.T) {
	tests := []struct {
		u       uint64
		index   uint8
		noFd    bool
		wantErr bool
	}{
		{0, 0, false, false},
		{5, 5, false, false},
		{0xff, 0xff, false, false},
		{0x100, 0, true, false},
		{0x1ff, 0xff, true, false},
		{0x200, 0, false, true},
		{1 << 63, 0, false, true},
		{0x301, 0, false, true},
	}
	for _, tt := range tests {
		index, noFd, err := DecodeVringFile(tt.u)
		if tt.wantErr {
			if !errors.Is(err, ErrInvalid) || index != 0 || noFd {
				t.Errorf("DecodeVringFile(%#x): got %d, %v, %v; want 0, false, ErrInvalid", tt.u, index, noFd, err)
			}
			continue
		}
		if err != nil || index != tt.index || noFd != tt.noFd {
			t.Errorf("DecodeVringFile(%#x): got %d, %v, %v; want %d, %v, nil", tt.u, index, noFd, err, tt.index, tt.noFd)
		}
		if got := EncodeVringFile(tt.index, tt.noFd); got != tt.u {
			t.Errorf("EncodeVringFile(%d, %v): got %#x, want %#x", tt.index, tt.noFd, got, tt.u)
		}
	}
}

func TestRequestString(t *testing.T) {
	tests := []struct {
		s    interface{ String() string }
		want string
	}{
		{SetMemTable, "SET_MEM_TABLE"},
		{GetFeatures, "GET_FEATURES"},
		{CheckDeviceState, "CHECK_DEVICE_STATE"},
		{SetBackendReqFd, "SET_BACKEND_REQ_FD"},
		{Request(0), "Request(0)"},
		{Request(44), "Request(44)"},
		{Request(0xffffffff), "Request(4294967295)"},
		{BackendConfigChangeMsg, "BACKEND_CONFIG_CHANGE_MSG"},
		{BackendRequest(99), "BackendRequest(99)"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
	for r := GetFeatures; r <= maxRequest; r++ {
		if requestNames[r] == "" {
			t.Errorf("request %d has no name", uint32(r))
		}
	}
}

func TestMessageError(t *testing.T) {
	err := invalidf(SetVringNum, "bad %s", "thing")
	var me *MessageError
	if !errors.As(err, &me) || me.Request != SetVringNum || me.Reason != "bad thing" {
		t.Fatalf("got %#v, want MessageError for SET_VRING_NUM", err)
	}
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrProtocol) {
		t.Fatalf("got Is(ErrInvalid)=%v Is(ErrProtocol)=%v, want true, false", errors.Is(err, ErrInvalid), errors.Is(err, ErrProtocol))
	}
	if got, want := err.Error(), "vhostuser: SET_VRING_NUM: bad thing"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	perr := protocolf(0, errors.New("boom"), "read header")
	if !errors.Is(perr, ErrProtocol) || perr.Error() != "vhostuser: message: read header: boom" {
		t.Errorf("got %q (Is ErrProtocol %v)", perr, errors.Is(perr, ErrProtocol))
	}
}
