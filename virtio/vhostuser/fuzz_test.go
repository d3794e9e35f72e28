package vhostuser

import (
	"errors"
	"io"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// wire returns the bytes of one message with a header for payload.
func wire(r Request, flags uint32, payload []byte) []byte {
	return append(Header{Request: uint32(r), Flags: FlagVersion | flags, Size: uint32(len(payload))}.Encode(), payload...)
}

// FuzzDecode feeds bytes through the byte-level half of ReadMessage
// (ParseMessage), then Check, CheckReply, CheckBackendRequest and every
// payload decoder. nfds is the number of fds the message pretends to carry
// (fake numbers: nothing is closed). Nothing may panic, every error must
// come with a zero result, and what decodes must re-encode to a value that
// decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(wire(GetFeatures, 0, nil), uint8(0))
	f.Add(wire(SetMemTable, FlagNeedReply, memTable(2)), uint8(2))
	f.Add(wire(SetVringAddr, 0, VringAddr{Index: 1, Desc: 0x1000, Used: 0x2000, Avail: 0x3000}.Encode()), uint8(0))
	f.Add(wire(SetVringKick, 0, EncodeU64(EncodeVringFile(1, false))), uint8(1))
	f.Add(wire(GetConfig, 0, ConfigMsg{Size: 16}.Encode()), uint8(0))
	f.Add(wire(AddMemReg, 0, MemRegionMsg{Region: region(1)}.Encode()), uint8(1))
	f.Add(wire(SetInflightFd, 0, InflightInfo{MmapSize: 4096, NumQueues: 2, QueueSize: 64}.Encode()), uint8(1))
	f.Add(wire(GetVringBase, FlagReply, VringState{0, 7}.Encode()), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, nfds uint8) {
		m, err := ParseMessage(data)
		if err != nil {
			if m != nil {
				t.Fatalf("ParseMessage: got message %+v with error %v", m.Header, err)
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("ParseMessage: got error %v, want ErrProtocol", err)
			}
			// The header alone must fail the same way or succeed.
			if len(data) >= HeaderSize {
				if h, herr := ParseHeader(data[:HeaderSize]); herr != nil && h != (Header{}) {
					t.Fatalf("ParseHeader: got %+v with error %v", h, herr)
				}
			}
			return
		}
		if int(m.Size) != len(m.Payload) || len(data) != HeaderSize+len(m.Payload) {
			t.Fatalf("got size %d, payload %d, input %d", m.Size, len(m.Payload), len(data))
		}
		m.Fds = fakeFds(int(nfds) % (MaxFds + 2))
		for _, err := range []error{Check(m), CheckReply(m.Req(), m), CheckBackendRequest(m), CheckBackendReply(BackendRequest(m.Request), m)} {
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("check: got error %v, want nil or ErrInvalid", err)
			}
		}
		for _, c := range codecs {
			v, err := c.decode(m.Payload)
			if err != nil {
				if !reflect.ValueOf(v).IsZero() {
					t.Fatalf("%s: got %+v with error %v, want zero value", c.name, v, err)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s: got error %v, want ErrInvalid", c.name, err)
				}
				continue
			}
			b := c.encode(v)
			if len(b) != len(m.Payload) {
				t.Fatalf("%s: re-encoded %d bytes, decoded from %d", c.name, len(b), len(m.Payload))
			}
			v2, err := c.decode(b)
			if err != nil || !reflect.DeepEqual(v, v2) {
				t.Fatalf("%s: round trip got %+v, %v; want %+v", c.name, v2, err, v)
			}
		}
		if len(m.Payload) == U64Size {
			u, _ := DecodeU64(m.Payload)
			index, noFd, err := DecodeVringFile(u)
			if err != nil && (index != 0 || noFd) {
				t.Fatalf("DecodeVringFile(%#x): got %d, %v with error", u, index, noFd)
			}
			if err == nil && EncodeVringFile(index, noFd) != u {
				t.Fatalf("DecodeVringFile(%#x) does not round-trip", u)
			}
		}
	})
}

// FuzzReadMessage sends bytes, split in two writes with nfds fds attached
// to one of them, over a real socketpair and reads messages until the
// stream ends. Every error must be io.EOF or ErrProtocol, and no received
// fd may stay open.
func FuzzReadMessage(f *testing.F) {
	f.Add(wire(SetMemTable, 0, memTable(2)), uint16(0), uint8(2), uint8(0))
	f.Add(append(wire(SetVringCall, 0, EncodeU64(0)), wire(GetFeatures, 0, nil)...), uint16(12), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, split uint16, nfds uint8, fdChunk uint8) {
		if len(data) > 16<<10 {
			return
		}
		c, peer := rawPair(t)
		n := int(nfds) % (MaxFds + 8)
		var dups []int
		if n > 0 {
			src := eventfds(t, 1)[0]
			dups = make([]int, n)
			for i := range dups {
				d, err := unix.FcntlInt(uintptr(src), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					t.Fatalf("dup: %v", err)
				}
				dups[i] = d
			}
			defer closeFds(dups)
		}
		s := int(split) % (len(data) + 1)
		chunks := [][]byte{data[:s], data[s:]}
		before := countFds(t)
		for i, ch := range chunks {
			if len(ch) == 0 {
				continue
			}
			var oob []byte
			if n > 0 && int(fdChunk)%2 == i {
				oob = unix.UnixRights(dups...)
			}
			if _, err := unix.SendmsgN(peer, ch, oob, nil, 0); err != nil {
				t.Fatalf("sendmsg: %v", err)
			}
		}
		unix.Shutdown(peer, unix.SHUT_WR)
		for range len(data) + 1 {
			m, err := c.ReadMessage()
			if err != nil {
				if m != nil {
					t.Fatalf("got message with error %v", err)
				}
				if err != io.EOF && !errors.Is(err, ErrProtocol) {
					t.Fatalf("got error %v, want io.EOF or ErrProtocol", err)
				}
				break
			}
			Check(m)
			m.CloseFds()
		}
		if after := countFds(t); after != before {
			t.Fatalf("open fds: got %d after, want %d", after, before)
		}
	})
}
