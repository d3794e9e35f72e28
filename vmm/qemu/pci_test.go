package qemu

import (
	"os"
	"slices"
	"testing"
)

// testdata/query-pci-q35.json is query-pci from the patched QEMU 10.0.2
// after SeaBIOS ran, for q35 with: root port rng0-port holding
// virtio-rng-pci rng0; root port br-port holding pcie-pci-bridge br0
// holding pci-testdev test0 at slot 3; free root ports vrdma-rp0 and
// vrdma-rp1.
func TestParseQueryPCI(t *testing.T) {
	raw, err := os.ReadFile("testdata/query-pci-q35.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseQueryPCI(raw)
	if err != nil {
		t.Fatalf("parseQueryPCI: %v", err)
	}
	want := []PCIDevice{
		{Bus: 0, Slot: 0, Function: 0, VendorID: 0x8086, DeviceID: 0x29c0, ClassInfo: "Host bridge"},
		{Bus: 0, Slot: 1, Function: 0, VendorID: 0x1b36, DeviceID: 0x000c, ClassInfo: "PCI bridge", ID: "rng0-port"},
		{Bus: 1, Slot: 0, Function: 0, VendorID: 0x1af4, DeviceID: 0x1044, ClassInfo: "0x00ff", ID: "rng0"},
		{Bus: 0, Slot: 2, Function: 0, VendorID: 0x1b36, DeviceID: 0x000c, ClassInfo: "PCI bridge", ID: "br-port"},
		{Bus: 2, Slot: 0, Function: 0, VendorID: 0x1b36, DeviceID: 0x000e, ClassInfo: "PCI bridge", ID: "br0"},
		{Bus: 3, Slot: 3, Function: 0, VendorID: 0x1b36, DeviceID: 0x0005, ClassInfo: "0x00ff", ID: "test0"},
		{Bus: 0, Slot: 3, Function: 0, VendorID: 0x1b36, DeviceID: 0x000c, ClassInfo: "PCI bridge", ID: "vrdma-rp0"},
		{Bus: 0, Slot: 4, Function: 0, VendorID: 0x1b36, DeviceID: 0x000c, ClassInfo: "PCI bridge", ID: "vrdma-rp1"},
		{Bus: 0, Slot: 31, Function: 0, VendorID: 0x8086, DeviceID: 0x2918, ClassInfo: "ISA bridge"},
		{Bus: 0, Slot: 31, Function: 2, VendorID: 0x8086, DeviceID: 0x2922, ClassInfo: "SATA controller"},
		{Bus: 0, Slot: 31, Function: 3, VendorID: 0x8086, DeviceID: 0x2930, ClassInfo: "SMBus"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %d devices:\n%+v\nwant %d:\n%+v", len(got), got, len(want), want)
	}
}

func TestParseQueryPCIInvalid(t *testing.T) {
	deep := `[{"bus":0,"devices":[`
	for i := 0; i < maxPCIDepth+2; i++ {
		deep += `{"bus":0,"slot":1,"function":0,"id":{"vendor":1,"device":2},"pci_bridge":{"devices":[`
	}
	for i := 0; i < maxPCIDepth+2; i++ {
		deep += `]}}`
	}
	deep += `]}]`
	tests := []struct{ name, in string }{
		{"not json", `{`},
		{"not a list", `{"bus":0}`},
		{"slot out of range", `[{"bus":0,"devices":[{"bus":0,"slot":32,"function":0,"id":{"vendor":1,"device":2}}]}]`},
		{"function out of range", `[{"bus":0,"devices":[{"bus":0,"slot":0,"function":8,"id":{"vendor":1,"device":2}}]}]`},
		{"bus out of range", `[{"bus":0,"devices":[{"bus":256,"slot":0,"function":0,"id":{"vendor":1,"device":2}}]}]`},
		{"vendor out of range", `[{"bus":0,"devices":[{"bus":0,"slot":0,"function":0,"id":{"vendor":65536,"device":2}}]}]`},
		{"negative device", `[{"bus":0,"devices":[{"bus":0,"slot":0,"function":0,"id":{"vendor":1,"device":-1}}]}]`},
		{"nested too deep", deep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseQueryPCI([]byte(tt.in))
			if err == nil {
				t.Fatalf("got %+v, nil error, want an error", got)
			}
			if got != nil {
				t.Errorf("got %+v with error, want nil", got)
			}
		})
	}
}
