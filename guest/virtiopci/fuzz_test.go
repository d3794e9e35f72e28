package virtiopci

import (
	"reflect"
	"testing"
)

// FuzzParseCaps walks hostile config spaces: no panic, bounded, and an
// error means a zero Layout.
func FuzzParseCaps(f *testing.F) {
	f.Add(buildConfig(qemuCaps...))
	f.Fuzz(func(t *testing.T, cfg []byte) {
		l, err := ParseCaps(cfg)
		if err != nil {
			if !reflect.DeepEqual(l, Layout{}) {
				t.Fatalf("error %v with result %+v", err, l)
			}
			return
		}
		if l.Common == nil || l.Notify == nil || l.Device == nil || l.Common.Length < minCommonCfgLen {
			t.Fatalf("accepted layout lacks a structure: %+v", l)
		}
		for _, c := range l.All {
			if c.Offset < 0x40 || c.Offset+capHeaderLen > len(cfg) || c.BAR >= numBARs {
				t.Fatalf("capability out of range: %+v", c)
			}
		}
	})
}

// TestHugeSource maps one real hugepage when the host has one free (it
// never grows the pool here) and checks its physical address.
func TestHugeSource(t *testing.T) {
	free, err := readCount(freeHugepagesPath)
	if err != nil || free < 1 {
		t.Skip("no free 2 MiB hugepage on this machine")
	}
	h, err := newHugeSource()
	if err != nil {
		t.Skip(err)
	}
	defer h.Close()
	mem, gpas, err := h.Map(1)
	if err != nil {
		t.Skipf("hugepage unusable here: %v", err)
	}
	defer h.Unmap(mem)
	if len(mem) != HugePageSize || gpas[0] == 0 || gpas[0]%HugePageSize != 0 {
		t.Errorf("got %d bytes at physical %#x", len(mem), gpas[0])
	}
}
