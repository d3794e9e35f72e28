package backend

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// loggingDevice is the fake device, saying it logs its writes (it writes
// only through Chain.Scatter).
type loggingDevice struct{ *fakeDevice }

func (loggingDevice) LogsDirty() bool { return true }

// newLoggingFrontend is newFrontend for a device that logs its writes.
func newLoggingFrontend(t *testing.T) *testFrontend {
	t.Helper()
	dev := newFakeDevice(2)
	a, b := socketpair(t)
	stats := &Stats{}
	s := newSession(b, loggingDevice{dev}, discardLog(), stats)
	f := &testFrontend{t: t, conn: vu.NewConn(a), dev: dev, sess: s, stats: stats, done: make(chan error, 1)}
	go func() { f.done <- s.serve() }()
	f.initMemory()
	t.Cleanup(f.close)
	return f
}

// logMaps counts the process's mappings of the memfd named name.
func logMaps(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/memfd:"+name+" ")
}

// TestDirtyLogSession drives a migration's dirty logging as QEMU does:
// SET_LOG_BASE, SET_FEATURES with VHOST_F_LOG_ALL, SET_VRING_ADDR with
// VHOST_VRING_F_LOG on a running ring. Every guest page the device then
// changes (the echoed buffer, the used ring) has its bit; logging off
// marks nothing and releases the log. Hostile logs are refused with a
// non-zero answer and never written.
func TestDirtyLogSession(t *testing.T) {
	f := newLoggingFrontend(t)
	f.ready(0)
	if f.feats&virtio.FeatureLogAll == 0 {
		t.Fatalf("GET_FEATURES %#x: VHOST_F_LOG_ALL not offered by a device that logs", f.feats)
	}
	// QEMU acks LOG_ALL only while it migrates.
	f.feats &^= virtio.FeatureLogAll
	f.mustAck(vu.SetFeatures, vu.EncodeU64(f.feats))
	r := f.rings[0]
	f.roundTrip(r, "before")

	const logName = "vrdma-dirty-log"
	logSize := uint64(memSize / memmap.LogPageSize / 8)
	lfd, err := memmap.NewMemfd(logName, 2*logSize)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	logMem, err := unix.Mmap(lfd, 0, int(2*logSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(logMem)
	efd, err := eventfd.New()
	if err != nil {
		t.Fatal(err)
	}
	defer efd.Close()

	// Hostile logs: refused, the session goes on, nothing written.
	for _, tc := range []struct {
		name string
		info vu.LogInfo
		fd   int
	}{
		{"smaller than the memory table", vu.LogInfo{MmapSize: logSize / 2}, lfd},
		{"misaligned offset", vu.LogInfo{MmapSize: logSize, MmapOffset: 4}, lfd},
		{"past the file", vu.LogInfo{MmapSize: logSize, MmapOffset: 2 * logSize}, lfd},
		{"offset overflows", vu.LogInfo{MmapSize: logSize, MmapOffset: 1<<64 - 8}, lfd},
		{"an eventfd", vu.LogInfo{MmapSize: logSize}, efd.Fd()},
	} {
		if st := f.ack(vu.SetLogBase, tc.info.Encode(), tc.fd); st == 0 {
			t.Errorf("SET_LOG_BASE %s: status 0, want a refusal", tc.name)
		}
	}
	if logMaps(t, logName) != 1 {
		t.Fatalf("a refused log is still mapped (%d mappings)", logMaps(t, logName))
	}

	// Logging on, with the log at offset logSize of the file.
	f.mustAck(vu.SetLogBase, vu.LogInfo{MmapSize: logSize, MmapOffset: logSize}.Encode(), lfd)
	f.mustAck(vu.SetLogFd, nil, efd.Fd())
	logAddr := vu.VringAddr{Index: 0, Flags: vu.VringAddrFLog, Desc: r.desc + userBase,
		Avail: r.avail + userBase, Used: r.used + userBase, Log: r.used}
	f.mustAck(vu.SetVringAddr, logAddr.Encode()) // while the ring runs
	f.mustAck(vu.SetFeatures, vu.EncodeU64(f.feats|virtio.FeatureLogAll))
	log := logMem[logSize:]
	if !bytes.Equal(logMem[:logSize], make([]byte, logSize)) {
		t.Fatal("the refused logs' bytes were written")
	}

	// Only the device's writes count: the driver's (descriptors, avail
	// ring, the readable buffer) are made before the snapshot.
	out := f.add(r, []byte("logged while migrating"))
	before := bytes.Clone(f.mem)
	r.kick.Signal()
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		t.Fatalf("no interrupt: %v", err)
	}
	after := bytes.Clone(f.mem) // before the driver reads the used ring (and writes used_event)
	if _, n, ok, err := r.dq.Used(); err != nil || !ok || string(f.mem[out:out+uint64(n)]) != "logged while migrating" {
		t.Fatalf("echo: ok=%v err=%v", ok, err)
	}
	changed, marked := 0, 0
	for p := 0; p < memSize/memmap.LogPageSize; p++ {
		bit := log[p/8]&(1<<(p%8)) != 0
		if bit {
			marked++
		}
		lo, hi := p*memmap.LogPageSize, (p+1)*memmap.LogPageSize
		if !bytes.Equal(before[lo:hi], after[lo:hi]) {
			changed++
			if !bit {
				t.Errorf("page %#x changed but is not marked", lo)
			}
		}
	}
	if changed < 2 {
		t.Fatalf("%d pages changed, want the buffer's and the used ring's", changed)
	}
	// The echo writes the buffer and the used ring: exact at page level.
	if marked != changed {
		t.Errorf("%d pages marked, %d changed: the log over-approximates", marked, changed)
	}

	// Logging off: the log is released, nothing is marked.
	f.mustAck(vu.SetFeatures, vu.EncodeU64(f.feats))
	clear(log)
	f.roundTrip(r, "after the migration")
	for i, v := range log {
		if v != 0 {
			t.Errorf("logging off, byte %d of the log is %#x (pages from %#x)", i, v, i*8*memmap.LogPageSize)
		}
	}
	if got := logMaps(t, logName); got != 1 {
		t.Errorf("the log is still mapped after logging stopped (%d mappings, want the test's)", got)
	}
	// LOG_ALL cannot be acked by a device that does not log.
	if f.sess.offered()&virtio.FeatureLogAll == 0 {
		t.Error("offered lost LOG_ALL")
	}
}

// TestDirtyLogNotOffered: a device that does not say it logs never gets
// VHOST_F_LOG_ALL.
func TestDirtyLogNotOffered(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	if feat := f.getU64(vu.GetFeatures); feat&virtio.FeatureLogAll != 0 {
		t.Fatalf("GET_FEATURES %#x offers VHOST_F_LOG_ALL", feat)
	}
	f.negotiate(ProtocolFeatures)
	f.nack(vu.SetFeatures, vu.EncodeU64(f.feats|virtio.FeatureLogAll))
}
