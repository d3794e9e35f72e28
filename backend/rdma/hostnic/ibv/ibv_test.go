//go:build cgo && linux

package ibv

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func TestLoad(t *testing.T) {
	if err := Load(); err != nil {
		t.Fatalf("Load: %v (this host has libibverbs1)", err)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		lib  string
		want []string
	}{
		{"libibverbs-vrdma-missing.so.1", []string{"libibverbs-vrdma-missing.so.1", "cannot open shared object file", "libibverbs1", "ibverbs-providers"}},
		// A library without the symbols: the resolved table must stay as it was.
		{"libc.so.6", []string{"symbol ibv_get_device_list", "libibverbs1"}},
	} {
		t.Run(tc.lib, func(t *testing.T) {
			err := load(tc.lib)
			if err == nil {
				t.Fatalf("load(%q) = nil, want an error", tc.lib)
			}
			if !errors.Is(err, ErrLoad) {
				t.Errorf("errors.Is(%v, ErrLoad) = false", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := Devices(); err != nil {
		t.Fatalf("Devices after failed loads: %v", err)
	}
}

func TestDevices(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	t.Logf("devices: %+v", devs)
}

func TestOpenMissing(t *testing.T) {
	ctx, err := Open("vrdma-no-such-device")
	if err == nil {
		ctx.Close()
		t.Fatal("Open of a missing device succeeded")
	}
	t.Logf("Open: %v", err)
	if !errors.Is(err, ErrNoDevice) {
		t.Errorf("errors.Is(%v, ErrNoDevice) = false", err)
	}
	devs, _ := Devices()
	want := "no RDMA devices found"
	if len(devs) > 0 {
		want = devs[0].Name
	}
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "vrdma-no-such-device") {
		t.Errorf("error %q: want the name asked for and %q", err, want)
	}
}

func TestLayouts(t *testing.T) {
	c := cLayouts()
	check := func(v any, prefix string) {
		rt := reflect.TypeOf(v)
		if got, want := rt.Size(), c[prefix+".size"]; got != want {
			t.Errorf("sizeof %s = %d, C has %d", prefix, got, want)
		}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			want, ok := c[prefix+"."+f.Name]
			if !ok {
				continue
			}
			if f.Offset != want {
				t.Errorf("offset of %s.%s = %d, C has %d", prefix, f.Name, f.Offset, want)
			}
		}
	}
	check(SendWR{}, "SendWR")
	check(RecvWR{}, "RecvWR")
	check(SGE{}, "SGE")
	check(WC{}, "WC")
	if got, want := unsafe.Sizeof(WCStatus(0)), c["WC.Status.size"]; got != want {
		t.Errorf("sizeof WCStatus = %d, enum ibv_wc_status is %d", got, want)
	}
	// The fields checked by name are all there are.
	n := 0
	for k := range c {
		if !strings.HasSuffix(k, ".size") {
			n++
		}
	}
	if n != 9+2+2+12 {
		t.Errorf("%d offsets checked; update the test with the struct", n)
	}
}

// TestNoLibibverbsLink: the test binary (built like vrdmad) starts without
// libibverbs: it needs neither the library nor any ibv_ symbol.
func TestNoLibibverbsLink(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.Contains(l, "ibverbs") {
			t.Errorf("test binary needs %s (NEEDED: %v)", l, libs)
		}
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if strings.Contains(s.Name, "ibv_") {
			t.Errorf("test binary imports %s", s.Name)
		}
	}
}

func TestPostSendFake(t *testing.T) {
	qp := newFakeQP(4, 3, 4, 2)
	defer qp.freeFake()
	sges := []SGE{{0x1000, 10, 1}, {0x2000, 20, 2}, {0x3000, 30, 3}, {0x4000, 40, 4}}
	imm := binary.NativeEndian.Uint32([]byte{0, 0, 0, 7}) // 7 on the wire
	if imm != Htonl(7) || Ntohl(imm) != 7 {
		t.Fatalf("Htonl(7) = %#x, Ntohl = %d; want %#x, 7", Htonl(7), Ntohl(imm), imm)
	}
	var wrs []SendWR
	for i := 0; i < 10; i++ {
		wr := SendWR{WRID: uint64(100 + i), Opcode: WRRDMAWriteWithImm, SendFlags: SendSignaled,
			Imm: imm, RemoteAddr: 0x7000_0000_0000 + uint64(i), RKey: 0xabc, FirstSGE: uint32(i % 2), NumSGE: uint16(1 + i%3)}
		switch i {
		case 3:
			wr.Opcode, wr.CompareAdd, wr.Swap = WRAtomicCmpAndSwp, 5, 6
		case 4:
			wr.Opcode, wr.CompareAdd = WRAtomicFetchAndAdd, 9
		case 5:
			wr.Opcode, wr.NumSGE, wr.SendFlags = WRSend, 0, SendInline|SendSolicited|SendFence
		}
		wrs = append(wrs, wr)
	}
	fakeFailAt(-1, 0)
	n, err := qp.PostSend(wrs, sges)
	if n != 10 || err != nil {
		t.Fatalf("PostSend = %d, %v; want 10, nil", n, err)
	}
	if got := fakeCount(); got != 10 {
		t.Fatalf("provider saw %d WRs, want 10", got)
	}
	for i, wr := range wrs {
		f := fakeGet(i)
		want := fakeWR{WRID: wr.WRID, Opcode: wr.Opcode, SendFlags: wr.SendFlags, Imm: wr.Imm, NumSGE: int(wr.NumSGE),
			RemoteAddr: wr.RemoteAddr, CompareAdd: wr.CompareAdd, Swap: wr.Swap, RKey: wr.RKey}
		if wr.NumSGE > 0 {
			want.LastSGE = sges[int(wr.FirstSGE)+int(wr.NumSGE)-1]
		}
		if f != want {
			t.Errorf("WR %d: provider saw %+v, want %+v", i, f, want)
		}
	}
	if b := (*[4]byte)(unsafe.Pointer(&wrs[0].Imm)); b[3] != 7 {
		t.Errorf("imm bytes %v: want 7 last (network order)", b)
	}

	t.Run("bad_wr", func(t *testing.T) {
		fakeFailAt(6, int(syscall.ENOMEM))
		n, err := qp.PostSend(wrs, sges)
		var pe *PostError
		if n != 6 || !errors.As(err, &pe) || pe.Index != 6 || !errors.Is(err, syscall.ENOMEM) {
			t.Errorf("PostSend = %d, %v; want 6, WR 6 ENOMEM", n, err)
		}
		fakeFailAt(-1, 0)
	})
	for _, tc := range []struct {
		name string
		wr   SendWR
	}{
		{"sge range", SendWR{FirstSGE: 3, NumSGE: 2}},
		{"sge overflow", SendWR{FirstSGE: ^uint32(0), NumSGE: 2}},
		{"too many sge", SendWR{NumSGE: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeFailAt(-1, 0)
			bad := append([]SendWR{{}, {}}, tc.wr)
			n, err := qp.PostSend(bad, sges)
			var pe *PostError
			if n != 0 || !errors.As(err, &pe) || pe.Index != 2 || !errors.Is(err, ErrInvalid) {
				t.Errorf("PostSend = %d, %v; want 0, WR 2 invalid", n, err)
			}
			if c := fakeCount(); c != 0 {
				t.Errorf("provider saw %d WRs of an invalid batch, want 0", c)
			}
		})
	}
}

func TestPostRecvFake(t *testing.T) {
	qp := newFakeQP(4, 1, 3, 2)
	defer qp.freeFake()
	sges := []SGE{{0x1000, 10, 1}, {0x2000, 20, 2}}
	wrs := make([]RecvWR, 7)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(i), FirstSGE: uint32(i % 2), NumSGE: 1}
	}
	fakeFailAt(-1, 0)
	if n, err := qp.PostRecv(wrs, sges); n != 7 || err != nil {
		t.Fatalf("PostRecv = %d, %v; want 7, nil", n, err)
	}
	for i := range wrs {
		if f := fakeGet(i); f.WRID != uint64(i) || f.LastSGE != sges[i%2] {
			t.Errorf("WR %d: provider saw %+v", i, f)
		}
	}
	// A provider returning -errno (the fake's post_recv does).
	fakeFailAt(4, int(syscall.EINVAL))
	n, err := qp.PostRecv(wrs, sges)
	if n != 4 || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("PostRecv = %d, %v; want 4, EINVAL", n, err)
	}
	fakeFailAt(-1, 0)
}

func TestPollFake(t *testing.T) {
	cq := newFakeCQ(10)
	wc := make([]WC, 4)
	var got []WC
	for _, want := range []int{4, 4, 2, 0} {
		n, err := cq.Poll(wc)
		if n != want || err != nil {
			t.Fatalf("Poll = %d, %v; want %d", n, err, want)
		}
		got = append(got, wc[:n]...)
	}
	for i, w := range got {
		s := uint64(i + 1)
		var imm [4]byte
		*(*uint32)(unsafe.Pointer(&imm[0])) = w.ImmData
		status := WCSuccess
		if s%7 == 0 {
			status = WCRemAccessErr
		}
		want := WC{WRID: s, Status: status, Opcode: WCOpRecvRDMAWithImm, VendorErr: uint32(s) + 1,
			ByteLen: uint32(s) * 3, ImmData: w.ImmData, QPNum: 0x123, SrcQP: 0x456, WCFlags: WCWithImm,
			PKeyIndex: 7, SLID: 9, SL: 5, DLIDPathBits: 3}
		if w != want || binary.BigEndian.Uint32(imm[:]) != uint32(s) {
			t.Errorf("WC %d = %+v, want %+v with imm %d on the wire", i, w, want, s)
		}
	}
	if err := cq.ReqNotify(false); err != nil {
		t.Errorf("ReqNotify: %v", err)
	}
	if err := cq.ReqNotify(true); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("ReqNotify(solicited) = %v, want the fake's EOPNOTSUPP", err)
	}
}

func TestHotPathNoAlloc(t *testing.T) {
	qp := newFakeQP(64, 2, 64, 2)
	defer qp.freeFake()
	fakeFailAt(-1, 0)
	sges := make([]SGE, 64)
	swr := make([]SendWR, 32)
	rwr := make([]RecvWR, 32)
	for i := range swr {
		swr[i] = SendWR{WRID: uint64(i), Opcode: WRRDMAWrite, FirstSGE: uint32(i), NumSGE: 2}
		rwr[i] = RecvWR{WRID: uint64(i), FirstSGE: uint32(i), NumSGE: 1}
	}
	cq := newFakeCQ(1 << 40)
	wc := make([]WC, 32)
	for name, f := range map[string]func(){
		"PostSend": func() { fakeFailAt(-1, 0); qp.PostSend(swr, sges) },
		"PostRecv": func() { fakeFailAt(-1, 0); qp.PostRecv(rwr, sges) },
		"Poll":     func() { cq.Poll(wc) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s allocates %.1f times per call, want 0", name, a)
		}
	}
}

func BenchmarkPostSendFake32(b *testing.B) {
	qp := newFakeQP(64, 1, 1, 1)
	defer qp.freeFake()
	sges := make([]SGE, 32)
	swr := make([]SendWR, 32)
	for i := range swr {
		swr[i] = SendWR{WRID: uint64(i), Opcode: WRRDMAWrite, FirstSGE: uint32(i), NumSGE: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		fakeFailAt(-1, 0)
		qp.PostSend(swr, sges)
	}
}

func BenchmarkPollFake32(b *testing.B) {
	cq := newFakeCQ(1 << 60)
	wc := make([]WC, 32)
	b.ReportAllocs()
	for b.Loop() {
		cq.Poll(wc)
	}
}

// TestFdWaiter: the netpoller wait that GetCQEvent and GetAsyncEvent use
// wakes on data and, when closed, with ErrClosed.
func TestFdWaiter(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	w, err := newFdWaiter(p[0], "pipe")
	if err != nil {
		t.Fatal(err)
	}
	read := func() bool {
		var b [1]byte
		n, _ := syscall.Read(p[0], b[:])
		return n == 1
	}
	done := make(chan error, 1)
	go func() { done <- w.wait(read) }()
	time.Sleep(20 * time.Millisecond)
	syscall.Write(p[1], []byte{1})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not wake on data")
	}
	go func() { done <- w.wait(read) }()
	time.Sleep(20 * time.Millisecond)
	w.close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("wait after close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not wake the waiter")
	}
}
