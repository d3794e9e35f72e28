package tests

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

func quietDaemon(b *testing.B, dcfg daemon.Config) string {
	b.Helper()
	l := logrus.New()
	l.SetLevel(logrus.PanicLevel)
	d := daemon.New(logrus.NewEntry(l), dcfg)
	sock := filepath.Join(b.TempDir(), "dev.sock")
	if _, err := d.AddDevice(daemon.DeviceSpec{ID: "dev0", Socket: sock, Device: rdma.Config{}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return sock
}

// BenchmarkRegMR registers a 4 MiB buffer: cold (pages never pinned, so
// they are faulted in and locked) and again from the map cache, beside
// mlock of the same amount of fresh memory as the baseline.
func BenchmarkRegMR(b *testing.B) {
	const size = 4 << 20
	b.Run("cold", func(b *testing.B) {
		sock := quietDaemon(b, daemon.Config{Pin: memmap.PinConfig{CacheBytes: 1 << 30}})
		guest := uint64(b.N+4)*size + 64<<20
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, f, err := frontend.OpenRDMA(ctx, sock, guest)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		defer c.Close()
		pd, _ := c.AllocPD()
		bufs := make([]*verbs.Buffer, b.N)
		for i := range bufs {
			if bufs[i], err = c.AllocBuffer(size); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(size)
		b.ResetTimer()
		for i := range b.N {
			if _, err := pd.RegMR(bufs[i], 0, size, abi.AccessLocalWrite); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		sock := quietDaemon(b, daemon.Config{Pin: memmap.PinConfig{CacheBytes: 1 << 30}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, f, err := frontend.OpenRDMA(ctx, sock, 64<<20)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		defer c.Close()
		pd, _ := c.AllocPD()
		buf, err := c.AllocBuffer(size)
		if err != nil {
			b.Fatal(err)
		}
		mr, err := pd.RegMR(buf, 0, size, abi.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		mr.Dereg()
		b.SetBytes(size)
		b.ResetTimer()
		for range b.N {
			mr, err := pd.RegMR(buf, 0, size, abi.AccessLocalWrite)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			mr.Dereg()
			b.StartTimer()
		}
	})
	b.Run("mlock-baseline", func(b *testing.B) {
		fd, err := memmap.NewMemfd("mlock-baseline", uint64(b.N)*size)
		if err != nil {
			b.Fatal(err)
		}
		r, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: uint64(b.N) * size})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Release()
		b.SetBytes(size)
		b.ResetTimer()
		for i := range b.N {
			if err := mlock(r.Bytes()[i*size : (i+1)*size]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		munlock(r.Bytes())
	})
}
