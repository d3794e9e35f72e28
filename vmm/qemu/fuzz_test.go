package qemu

import (
	"testing"
)

// FuzzParseQueryPCI feeds arbitrary query-pci replies to the decoder: it
// must not panic, and an error means a nil result.
func FuzzParseQueryPCI(f *testing.F) {
	f.Add([]byte(`[{"bus":0,"devices":[{"bus":0,"slot":0,"function":0,"class_info":{"class":1536,"desc":"Host bridge"},"id":{"device":10688,"vendor":32902},"qdev_id":""}]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		devs, err := parseQueryPCI(data)
		if err != nil && devs != nil {
			t.Fatalf("parseQueryPCI: got %d devices with error %v, want none", len(devs), err)
		}
		for _, d := range devs {
			if d.Bus < 0 || d.Bus > 255 || d.Slot < 0 || d.Slot > 31 || d.Function < 0 || d.Function > 7 {
				t.Fatalf("parseQueryPCI: got address %d:%d.%d out of range", d.Bus, d.Slot, d.Function)
			}
		}
	})
}

// FuzzParseDeviceHelp: an error means no name, a name is one of the three.
func FuzzParseDeviceHelp(f *testing.F) {
	f.Add([]byte("Misc devices:\nname \"vhost-user-device-pci\", bus PCI\n"))
	f.Add([]byte("Network devices:\nname \"vhost-user-rdma-pci\", bus PCI, desc \"x\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		name, err := parseDeviceHelp(data, "qemu")
		if err != nil && name != "" {
			t.Fatalf("got %q with error %v, want \"\"", name, err)
		}
		if err == nil && name != DeviceNameRDMA && name != DeviceNameGeneric && name != DeviceNameTest {
			t.Fatalf("got name %q, want %q, %q or %q", name, DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest)
		}
	})
}
