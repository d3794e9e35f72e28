package vhostuser

import (
	"errors"
	"fmt"
	"testing"
)

// fakeFds returns n distinct fd numbers for Check tests. Check only counts
// fds, and these messages are never closed.
func fakeFds(n int) []int {
	fds := make([]int, n)
	for i := range fds {
		fds[i] = 1000 + i
	}
	return fds
}

func req(r Request, payload []byte, nfds int) *Message {
	return &Message{
		Header:  Header{Request: uint32(r), Flags: FlagVersion, Size: uint32(len(payload))},
		Payload: payload,
		Fds:     fakeFds(nfds),
	}
}

func reply(r Request, payload []byte, nfds int) *Message {
	m := req(r, payload, nfds)
	m.Flags |= FlagReply
	return m
}

func memTable(n int) []byte {
	t := MemTable{Regions: make([]MemoryRegion, n)}
	for i := range t.Regions {
		t.Regions[i] = region(uint64(i))
	}
	return t.Encode()
}

// goodRequests has one valid message per known request.
var goodRequests = []struct {
	r       Request
	payload []byte
	fds     int
	// fixed is false when the size is not fixed by the spec, so the
	// short/long variants are not errors.
	fixed bool
}{
	{GetFeatures, nil, 0, true},
	{SetFeatures, EncodeU64(1 << 32), 0, true},
	{SetOwner, nil, 0, true},
	{ResetOwner, nil, 0, true},
	{SetMemTable, memTable(2), 2, true},
	{SetLogBase, LogInfo{MmapSize: 4096}.Encode(), 1, true},
	{SetLogFd, nil, 1, true},
	{SetVringNum, VringState{0, 256}.Encode(), 0, true},
	{SetVringAddr, VringAddr{Index: 1}.Encode(), 0, true},
	{SetVringBase, VringState{1, 0}.Encode(), 0, true},
	{GetVringBase, VringState{1, 0}.Encode(), 0, true},
	{SetVringKick, EncodeU64(EncodeVringFile(1, false)), 1, true},
	{SetVringCall, EncodeU64(EncodeVringFile(2, false)), 1, true},
	{SetVringErr, EncodeU64(EncodeVringFile(3, false)), 1, true},
	{GetProtocolFeatures, nil, 0, true},
	{SetProtocolFeatures, EncodeU64(ProtocolMQ | ProtocolConfig), 0, true},
	{GetQueueNum, nil, 0, true},
	{SetVringEnable, VringState{0, 1}.Encode(), 0, true},
	{SendRarp, EncodeU64(0x0000525400123456), 0, true},
	{NetSetMTU, EncodeU64(1500), 0, true},
	{SetBackendReqFd, nil, 1, true},
	{IOTLBMsg, IOTLB{IOVA: 1, Size: 2, Type: 2}.Encode(), 0, true},
	{SetVringEndian, VringState{0, 0}.Encode(), 0, true},
	{GetConfig, ConfigMsg{Size: 64}.Encode(), 0, true},
	{SetConfig, ConfigMsg{Offset: 4, Size: 4, Data: []byte{1, 2, 3, 4}}.Encode(), 0, true},
	{CreateCryptoSession, make([]byte, 100), 0, false},
	{CloseCryptoSession, EncodeU64(7), 0, true},
	{PostcopyAdvise, nil, 0, true},
	{PostcopyListen, nil, 0, true},
	{PostcopyEnd, nil, 0, true},
	{GetInflightFd, InflightInfo{NumQueues: 2, QueueSize: 64}.Encode(), 0, true},
	{SetInflightFd, InflightInfo{MmapSize: 4096, NumQueues: 2, QueueSize: 64}.Encode(), 1, true},
	{GPUSetSocket, nil, 1, true},
	{ResetDevice, nil, 0, true},
	{VringKick, VringState{2, 0}.Encode(), 0, true},
	{GetMaxMemSlots, nil, 0, true},
	{AddMemReg, MemRegionMsg{Region: region(1)}.Encode(), 1, true},
	{RemMemReg, MemRegionMsg{Region: region(1)}.Encode(), 0, true},
	{SetStatus, EncodeU64(0xf), 0, true},
	{GetStatus, nil, 0, true},
	{GetSharedObject, SharedObject{}.Encode(), 0, true},
	{SetDeviceStateFd, DeviceStateTransfer{Direction: TransferSave}.Encode(), 1, true},
	{CheckDeviceState, nil, 0, true},
}

func TestGoodRequestsCoverEveryRequest(t *testing.T) {
	seen := map[Request]bool{}
	for _, g := range goodRequests {
		seen[g.r] = true
	}
	for r := GetFeatures; r <= maxRequest; r++ {
		if !seen[r] {
			t.Errorf("no Check test for %v", r)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, g := range goodRequests {
		t.Run(g.r.String(), func(t *testing.T) {
			cases := []struct {
				name    string
				m       *Message
				wantErr bool
			}{
				{"good", req(g.r, g.payload, g.fds), false},
				{"one fd more", req(g.r, g.payload, g.fds+1), true},
				{"need reply", func() *Message { m := req(g.r, g.payload, g.fds); m.Flags |= FlagNeedReply; return m }(), false},
				{"reply flag", func() *Message { m := req(g.r, g.payload, g.fds); m.Flags |= FlagReply; return m }(), true},
				{"size field mismatch", func() *Message { m := req(g.r, g.payload, g.fds); m.Size++; return m }(), true},
				{"bad version", func() *Message { m := req(g.r, g.payload, g.fds); m.Flags = 2; return m }(), true},
			}
			if g.fds > 0 {
				cases = append(cases, struct {
					name    string
					m       *Message
					wantErr bool
				}{"one fd less", req(g.r, g.payload, g.fds-1), true})
			}
			if len(g.payload) > 0 {
				cases = append(cases, struct {
					name    string
					m       *Message
					wantErr bool
				}{"short payload", req(g.r, g.payload[:len(g.payload)-1], g.fds), g.fixed})
			}
			cases = append(cases, struct {
				name    string
				m       *Message
				wantErr bool
			}{"long payload", req(g.r, append(append([]byte{}, g.payload...), 0), g.fds), g.fixed})
			for _, c := range cases {
				err := Check(c.m)
				if c.wantErr {
					var me *MessageError
					if !errors.Is(err, ErrInvalid) || !errors.As(err, &me) {
						t.Errorf("%s: got error %v, want *MessageError wrapping ErrInvalid", c.name, err)
					} else if me.Request != g.r {
						t.Errorf("%s: got error for request %v, want %v", c.name, me.Request, g.r)
					}
				} else if err != nil {
					t.Errorf("%s: got error %v, want nil", c.name, err)
				}
			}
		})
	}
}

func TestCheckSpecialCases(t *testing.T) {
	noFd := func(r Request, i uint8) *Message {
		return req(r, EncodeU64(EncodeVringFile(i, true)), 0)
	}
	tests := []struct {
		name    string
		m       *Message
		wantErr bool
	}{
		{"nil", nil, true},
		{"unknown request 0", req(0, nil, 0), true},
		{"unknown request 44", req(44, nil, 0), true},
		{"unknown request max", req(Request(0xffffffff), nil, 0), true},
		{"mem table 1 region", req(SetMemTable, memTable(1), 1), false},
		{"mem table MaxFds regions", req(SetMemTable, memTable(MaxFds), MaxFds), false},
		{"mem table 0 regions", req(SetMemTable, memTable(0), 0), true},
		{"mem table 33 regions", req(SetMemTable, func() []byte {
			b := make([]byte, 8+33*32)
			b[0] = 33
			return b
		}(), 33), true},
		{"mem table count says 3, payload has 2", req(SetMemTable, func() []byte {
			b := memTable(2)
			b[0] = 3
			return b
		}(), 2), true},
		{"mem table fds fewer than regions", req(SetMemTable, memTable(3), 2), true},
		{"mem table fds more than regions", req(SetMemTable, memTable(3), 4), true},
		{"kick no-fd flag, no fd", noFd(SetVringKick, 0), false},
		{"call no-fd flag, no fd", noFd(SetVringCall, 1), false},
		{"err no-fd flag, no fd", noFd(SetVringErr, 2), false},
		{"kick no-fd flag with fd", req(SetVringKick, EncodeU64(EncodeVringFile(0, true)), 1), true},
		{"call fd missing", req(SetVringCall, EncodeU64(EncodeVringFile(0, false)), 0), true},
		{"kick reserved bit", req(SetVringKick, EncodeU64(1<<9), 1), true},
		{"kick high bits", req(SetVringKick, EncodeU64(1<<40|1), 1), true},
		{"rem mem reg with an fd", req(RemMemReg, MemRegionMsg{}.Encode(), 1), true},
		{"add mem reg without fd", req(AddMemReg, MemRegionMsg{}.Encode(), 0), true},
		{"get config too big", req(GetConfig, ConfigMsg{Size: MaxConfigSize + 1}.Encode(), 0), true},
		{"get config max", req(GetConfig, ConfigMsg{Size: MaxConfigSize}.Encode(), 0), false},
		{"set config size field disagrees", req(SetConfig, func() []byte {
			b := ConfigMsg{Size: 4}.Encode()
			b[4] = 8
			return b
		}(), 0), true},
		{"payload over MaxPayloadSize", req(CreateCryptoSession, make([]byte, MaxPayloadSize+1), 0), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.m)
			if tt.wantErr && !errors.Is(err, ErrInvalid) {
				t.Fatalf("got error %v, want ErrInvalid", err)
			}
			if !tt.wantErr && err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
		})
	}
}

func TestCheckReply(t *testing.T) {
	tests := []struct {
		name    string
		req     Request
		m       *Message
		wantErr bool
	}{
		{"features", GetFeatures, reply(GetFeatures, EncodeU64(1<<30), 0), false},
		{"features short", GetFeatures, reply(GetFeatures, EncodeU64(1)[:4], 0), true},
		{"features with fd", GetFeatures, reply(GetFeatures, EncodeU64(1), 1), true},
		{"features without reply flag", GetFeatures, req(GetFeatures, EncodeU64(1), 0), true},
		{"features answered as protocol features", GetFeatures, reply(GetProtocolFeatures, EncodeU64(1), 0), true},
		{"protocol features", GetProtocolFeatures, reply(GetProtocolFeatures, EncodeU64(ProtocolMQ), 0), false},
		{"queue num", GetQueueNum, reply(GetQueueNum, EncodeU64(4), 0), false},
		{"max mem slots", GetMaxMemSlots, reply(GetMaxMemSlots, EncodeU64(32), 0), false},
		{"status", GetStatus, reply(GetStatus, EncodeU64(0xf), 0), false},
		{"vring base", GetVringBase, reply(GetVringBase, VringState{1, 17}.Encode(), 0), false},
		{"vring base u32", GetVringBase, reply(GetVringBase, make([]byte, 4), 0), true},
		{"config", GetConfig, reply(GetConfig, ConfigMsg{Size: 16}.Encode(), 0), false},
		{"config failure", GetConfig, reply(GetConfig, nil, 0), false},
		{"config broken", GetConfig, reply(GetConfig, make([]byte, 5), 0), true},
		{"inflight", GetInflightFd, reply(GetInflightFd, InflightInfo{MmapSize: 4096}.Encode(), 1), false},
		{"inflight without fd", GetInflightFd, reply(GetInflightFd, InflightInfo{MmapSize: 4096}.Encode(), 0), true},
		{"inflight failure", GetInflightFd, reply(GetInflightFd, InflightInfo{}.Encode(), 0), false},
		{"device state own fd", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(0), 1), false},
		{"device state no fd", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(VringFileNoFd), 0), false},
		{"device state error no fd", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(VringFileNoFd|1), 0), false},
		{"device state error with fd", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(1), 1), true},
		{"device state missing fd", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(0), 0), true},
		{"device state reserved bits", SetDeviceStateFd, reply(SetDeviceStateFd, EncodeU64(1<<20|VringFileNoFd), 0), true},
		{"check device state", CheckDeviceState, reply(CheckDeviceState, EncodeU64(0), 0), false},
		{"log base empty", SetLogBase, reply(SetLogBase, nil, 0), false},
		{"log base u64", SetLogBase, reply(SetLogBase, EncodeU64(0), 0), false},
		{"log base odd", SetLogBase, reply(SetLogBase, make([]byte, 4), 0), true},
		{"mem table ack", SetMemTable, reply(SetMemTable, EncodeU64(0), 0), false},
		{"mem table postcopy", SetMemTable, reply(SetMemTable, memTable(2), 0), false},
		{"mem table bad", SetMemTable, reply(SetMemTable, make([]byte, 12), 0), true},
		{"add mem reg ack", AddMemReg, reply(AddMemReg, EncodeU64(0), 0), false},
		{"add mem reg postcopy", AddMemReg, reply(AddMemReg, MemRegionMsg{}.Encode(), 0), false},
		{"rem mem reg odd", RemMemReg, reply(RemMemReg, make([]byte, 16), 0), true},
		{"postcopy advise", PostcopyAdvise, reply(PostcopyAdvise, nil, 1), false},
		{"postcopy advise without fd", PostcopyAdvise, reply(PostcopyAdvise, nil, 0), true},
		{"shared object", GetSharedObject, reply(GetSharedObject, nil, 1), false},
		{"shared object two fds", GetSharedObject, reply(GetSharedObject, nil, 2), true},
		{"reply ack", SetVringNum, reply(SetVringNum, EncodeU64(0), 0), false},
		{"reply ack empty", SetVringNum, reply(SetVringNum, nil, 0), true},
		{"reply ack with fd", SetVringKick, reply(SetVringKick, EncodeU64(0), 1), true},
		{"unknown", Request(77), reply(Request(77), EncodeU64(0), 0), true},
		{"nil", GetFeatures, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckReply(tt.req, tt.m)
			if tt.wantErr && !errors.Is(err, ErrInvalid) {
				t.Fatalf("got error %v, want ErrInvalid", err)
			}
			if !tt.wantErr && err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
		})
	}
}

func TestCheckBackend(t *testing.T) {
	breq := func(r BackendRequest, p []byte, nfds int) *Message { return req(Request(r), p, nfds) }
	brep := func(r BackendRequest, p []byte, nfds int) *Message { return reply(Request(r), p, nfds) }
	tests := []struct {
		name    string
		check   func() error
		wantErr bool
	}{
		{"config change", func() error { return CheckBackendRequest(breq(BackendConfigChangeMsg, nil, 0)) }, false},
		{"config change with payload", func() error { return CheckBackendRequest(breq(BackendConfigChangeMsg, EncodeU64(0), 0)) }, true},
		{"config change with fd", func() error { return CheckBackendRequest(breq(BackendConfigChangeMsg, nil, 1)) }, true},
		{"iotlb", func() error { return CheckBackendRequest(breq(BackendIOTLBMsg, IOTLB{}.Encode(), 0)) }, false},
		{"host notifier", func() error {
			return CheckBackendRequest(breq(BackendVringHostNotifierMsg, VringArea{U64: 1, Size: 4096}.Encode(), 1))
		}, false},
		{"host notifier removal", func() error {
			return CheckBackendRequest(breq(BackendVringHostNotifierMsg, VringArea{U64: EncodeVringFile(1, true)}.Encode(), 0))
		}, false},
		{"host notifier missing fd", func() error {
			return CheckBackendRequest(breq(BackendVringHostNotifierMsg, VringArea{U64: 1}.Encode(), 0))
		}, true},
		{"host notifier reserved bits", func() error {
			return CheckBackendRequest(breq(BackendVringHostNotifierMsg, VringArea{U64: 1 << 12}.Encode(), 1))
		}, true},
		{"vring call", func() error { return CheckBackendRequest(breq(BackendVringCall, VringState{}.Encode(), 0)) }, false},
		{"shared object add", func() error { return CheckBackendRequest(breq(BackendSharedObjectAdd, SharedObject{}.Encode(), 0)) }, false},
		{"reply flag on request", func() error { return CheckBackendRequest(brep(BackendConfigChangeMsg, nil, 0)) }, true},
		{"unknown", func() error { return CheckBackendRequest(breq(9, nil, 0)) }, true},
		{"nil", func() error { return CheckBackendRequest(nil) }, true},
		{"ack", func() error {
			return CheckBackendReply(BackendConfigChangeMsg, brep(BackendConfigChangeMsg, EncodeU64(0), 0))
		}, false},
		{"ack without flag", func() error {
			return CheckBackendReply(BackendConfigChangeMsg, breq(BackendConfigChangeMsg, EncodeU64(0), 0))
		}, true},
		{"ack wrong request", func() error { return CheckBackendReply(BackendConfigChangeMsg, brep(BackendIOTLBMsg, EncodeU64(0), 0)) }, true},
		{"lookup with fd", func() error {
			return CheckBackendReply(BackendSharedObjectLookup, brep(BackendSharedObjectLookup, EncodeU64(0), 1))
		}, false},
		{"lookup failure with fd", func() error {
			return CheckBackendReply(BackendSharedObjectLookup, brep(BackendSharedObjectLookup, EncodeU64(1), 1))
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check()
			if tt.wantErr {
				var me *MessageError
				if !errors.Is(err, ErrInvalid) || !errors.As(err, &me) || !me.Backend {
					t.Fatalf("got error %v, want back-end *MessageError wrapping ErrInvalid", err)
				}
			} else if err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
		})
	}
}

func TestAlwaysReplies(t *testing.T) {
	for _, r := range []Request{GetFeatures, GetProtocolFeatures, GetVringBase, GetConfig, GetQueueNum, GetMaxMemSlots, GetStatus, GetInflightFd} {
		if !r.AlwaysReplies() {
			t.Errorf("%v: got AlwaysReplies false, want true", r)
		}
	}
	for _, r := range []Request{SetFeatures, SetMemTable, SetVringKick, SetVringNum, SetOwner} {
		if r.AlwaysReplies() {
			t.Errorf("%v: got AlwaysReplies true, want false", r)
		}
	}
}

func ExampleCheck() {
	m := &Message{
		Header:  Header{Request: uint32(SetVringNum), Flags: FlagVersion, Size: 4},
		Payload: []byte{0, 0, 0, 0},
	}
	fmt.Println(Check(m))
	// Output: vhostuser: SET_VRING_NUM: payload is 4 bytes, want 8
}
