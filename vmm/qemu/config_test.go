package qemu

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// flagValues returns the values following every occurrence of flag.
func flagValues(args []string, flag string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			out = append(out, args[i+1])
		}
	}
	return out
}

func TestArgs(t *testing.T) {
	dev := VhostUserDevice{ID: "rdma0", Socket: "/run/vrdma/rdma0.sock", NumVQs: 4, VQSize: 256, ConfigSize: 64}
	tests := []struct {
		name string
		cfg  Config
		// want maps a flag to the exact list of its values.
		want map[string][]string
		// bare flags that must be present.
		bare []string
		// tail is what the command line must end with.
		tail []string
	}{
		{
			name: "defaults",
			cfg:  Config{QMPSocket: "/tmp/q.sock"},
			want: map[string][]string{
				"-machine": {"q35,memory-backend=mem"},
				"-m":       {"256M"},
				"-object":  {"memory-backend-memfd,id=mem,size=256M,share=on"},
				"-smp":     {"1"},
				"-chardev": {"stdio,id=serial0,signal=off", "socket,id=qmp,path=/tmp/q.sock,server=on,wait=off"},
				"-serial":  {"chardev:serial0"},
				"-mon":     {"chardev=qmp,mode=control"},
				"-kernel":  nil,
				"-device":  nil,
			},
			bare: []string{"-nodefaults", "-no-user-config", "-nographic", "-no-reboot"},
		},
		{
			name: "no qmp socket",
			cfg:  Config{},
			want: map[string][]string{"-mon": nil, "-chardev": {"stdio,id=serial0,signal=off"}},
		},
		{
			name: "kernel serial log and ports",
			cfg: Config{
				MemoryMiB: 512, SMP: 2,
				Kernel: "/k/vmlinuz", Initrd: "/k/initrd", Append: "console=ttyS0 quiet",
				SerialLog: "/tmp/a,b.log", RootPorts: 2,
			},
			want: map[string][]string{
				"-m":       {"512M"},
				"-object":  {"memory-backend-memfd,id=mem,size=512M,share=on"},
				"-smp":     {"2"},
				"-kernel":  {"/k/vmlinuz"},
				"-initrd":  {"/k/initrd"},
				"-append":  {"console=ttyS0 quiet"},
				"-chardev": {"file,id=serial0,path=/tmp/a,,b.log"},
				"-device": {
					"pcie-root-port,id=vrdma-rp0,bus=pcie.0,chassis=1",
					"pcie-root-port,id=vrdma-rp1,bus=pcie.0,chassis=2",
				},
			},
		},
		{
			name: "device and extra args",
			cfg: Config{
				Devices:   []VhostUserDevice{dev, {ID: "rdma1", Socket: "/s1"}},
				RootPorts: 1,
				ExtraArgs: []string{"-accel", "kvm"},
			},
			want: map[string][]string{
				"-chardev": {
					"stdio,id=serial0,signal=off",
					"socket,id=rdma0-chr,path=/run/vrdma/rdma0.sock",
					"socket,id=rdma1-chr,path=/s1",
				},
				"-device": {
					"pcie-root-port,id=rdma0-port,bus=pcie.0,chassis=1",
					"vhost-user-device-pci,id=rdma0,bus=rdma0-port,chardev=rdma0-chr,virtio-id=42,num_vqs=4,vq_size=256,config_size=64",
					"pcie-root-port,id=rdma1-port,bus=pcie.0,chassis=2",
					"vhost-user-device-pci,id=rdma1,bus=rdma1-port,chardev=rdma1-chr,virtio-id=42,num_vqs=3,vq_size=256,config_size=96",
					"pcie-root-port,id=vrdma-rp0,bus=pcie.0,chassis=3",
				},
			},
			tail: []string{"-accel", "kvm"},
		},
		{
			name: "reconnecting device",
			cfg: Config{
				Devices: []VhostUserDevice{{ID: "rdma0", Socket: "/r,s.sock", ReconnectMs: 250}},
			},
			want: map[string][]string{
				"-chardev": {
					"stdio,id=serial0,signal=off",
					"socket,id=rdma0-chr,path=/r,,s.sock,reconnect-ms=250",
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := tt.cfg.Args(DeviceNameGeneric)
			if err != nil {
				t.Fatalf("Args: got error %v, want nil", err)
			}
			for flag, want := range tt.want {
				if got := flagValues(args, flag); !slices.Equal(got, want) {
					t.Errorf("%s: got %q, want %q", flag, got, want)
				}
			}
			for _, b := range tt.bare {
				if !slices.Contains(args, b) {
					t.Errorf("got args without %s, want it: %q", b, args)
				}
			}
			if len(tt.tail) > 0 && !slices.Equal(args[len(args)-len(tt.tail):], tt.tail) {
				t.Errorf("got tail %q, want %q", args[len(args)-len(tt.tail):], tt.tail)
			}
		})
	}
}

// TestArgsRDMADevice: the named device gets no virtio-id (it has no such
// property) and refuses another virtio ID; the back-end's queue count, queue
// size and config size are given as they are.
func TestArgsRDMADevice(t *testing.T) {
	cfg := Config{Devices: []VhostUserDevice{{ID: "vm1", Socket: "/run/vrdma/vm1.sock", NumVQs: 6}}}
	args, err := cfg.Args(DeviceNameRDMA)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"pcie-root-port,id=vm1-port,bus=pcie.0,chassis=1",
		"vhost-user-rdma-pci,id=vm1,bus=vm1-port,chardev=vm1-chr,num_vqs=6,vq_size=256,config_size=96"}
	if got := flagValues(args, "-device"); !slices.Equal(got, want) {
		t.Errorf("-device: got %q, want %q", got, want)
	}
	cfg.Devices[0].VirtioID = 41
	var ce *ConfigError
	if _, err := cfg.Args(DeviceNameRDMA); !errors.As(err, &ce) || ce.Field != "Devices[0].VirtioID" {
		t.Errorf("virtio ID 41 on %s: got %v, want a ConfigError on Devices[0].VirtioID", DeviceNameRDMA, err)
	}
	if _, err := cfg.Args(DeviceNameGeneric); err != nil {
		t.Errorf("virtio ID 41 on %s: got %v, want nil", DeviceNameGeneric, err)
	}
}

func TestArgsTestDeviceName(t *testing.T) {
	cfg := Config{Devices: []VhostUserDevice{{ID: "d", Socket: "/s"}}}
	args, err := cfg.Args(DeviceNameTest)
	if err != nil {
		t.Fatal(err)
	}
	devs := flagValues(args, "-device")
	if len(devs) != 2 || !strings.HasPrefix(devs[1], DeviceNameTest+",id=d,") {
		t.Errorf("got devices %q, want a %s", devs, DeviceNameTest)
	}
}

func TestArgsInvalid(t *testing.T) {
	okDev := VhostUserDevice{ID: "d0", Socket: "/s"}
	withDev := func(mod func(*VhostUserDevice)) Config {
		d := okDev
		mod(&d)
		return Config{Devices: []VhostUserDevice{d}}
	}
	tests := []struct {
		name       string
		cfg        Config
		deviceName string
		field      string
	}{
		{"negative memory", Config{MemoryMiB: -1}, "", "MemoryMiB"},
		{"huge memory", Config{MemoryMiB: MaxMemoryMiB + 1}, "", "MemoryMiB"},
		{"negative smp", Config{SMP: -2}, "", "SMP"},
		{"too many cpus", Config{SMP: 256}, "", "SMP"},
		{"initrd without kernel", Config{Initrd: "/i"}, "", "Initrd"},
		{"append without kernel", Config{Append: "quiet"}, "", "Append"},
		{"nul in kernel", Config{Kernel: "/k\x00"}, "", "Kernel"},
		{"long qmp path", Config{QMPSocket: "/" + strings.Repeat("q", 200)}, "", "QMPSocket"},
		{"newline in serial", Config{SerialLog: "/a\nb"}, "", "SerialLog"},
		{"negative ports", Config{RootPorts: -1}, "", "RootPorts"},
		{"too many ports", Config{RootPorts: MaxPCIePorts + 1}, "", "RootPorts"},
		{"ports plus devices", Config{RootPorts: MaxPCIePorts, Devices: []VhostUserDevice{okDev}}, DeviceNameGeneric, "RootPorts"},
		{"empty id", withDev(func(d *VhostUserDevice) { d.ID = "" }), DeviceNameGeneric, "Devices[0].ID"},
		{"id starts with digit", withDev(func(d *VhostUserDevice) { d.ID = "0d" }), DeviceNameGeneric, "Devices[0].ID"},
		{"id with comma", withDev(func(d *VhostUserDevice) { d.ID = "a,b" }), DeviceNameGeneric, "Devices[0].ID"},
		{"id reserved", withDev(func(d *VhostUserDevice) { d.ID = "mem" }), DeviceNameGeneric, "Devices[0].ID"},
		{"empty socket", withDev(func(d *VhostUserDevice) { d.Socket = "" }), DeviceNameGeneric, "Devices[0].Socket"},
		{"long socket", withDev(func(d *VhostUserDevice) { d.Socket = "/" + strings.Repeat("s", 107) }), DeviceNameGeneric, "Devices[0].Socket"},
		{"virtio id too big", withDev(func(d *VhostUserDevice) { d.VirtioID = 70000 }), DeviceNameGeneric, "Devices[0].VirtioID"},
		{"negative num vqs", withDev(func(d *VhostUserDevice) { d.NumVQs = -1 }), DeviceNameGeneric, "Devices[0].NumVQs"},
		{"too many vqs", withDev(func(d *VhostUserDevice) { d.NumVQs = 1025 }), DeviceNameGeneric, "Devices[0].NumVQs"},
		{"vq size not power of two", withDev(func(d *VhostUserDevice) { d.VQSize = 100 }), DeviceNameGeneric, "Devices[0].VQSize"},
		{"vq size too big", withDev(func(d *VhostUserDevice) { d.VQSize = 2048 }), DeviceNameGeneric, "Devices[0].VQSize"},
		{"config too big", withDev(func(d *VhostUserDevice) { d.ConfigSize = 257 }), DeviceNameGeneric, "Devices[0].ConfigSize"},
		{"negative config", withDev(func(d *VhostUserDevice) { d.ConfigSize = -1 }), DeviceNameGeneric, "Devices[0].ConfigSize"},
		{"negative reconnect", withDev(func(d *VhostUserDevice) { d.ReconnectMs = -1 }), DeviceNameGeneric, "Devices[0].ReconnectMs"},
		{"reconnect too slow", withDev(func(d *VhostUserDevice) { d.ReconnectMs = MaxReconnectMs + 1 }), DeviceNameGeneric, "Devices[0].ReconnectMs"},
		{"duplicate ids", Config{Devices: []VhostUserDevice{okDev, okDev}}, DeviceNameGeneric, "Devices[1].ID"},
		{"id collides with free port", Config{RootPorts: 1, Devices: []VhostUserDevice{{ID: "vrdma-rp0", Socket: "/s"}}}, DeviceNameGeneric, "Devices[0].ID"},
		{"id collides with other chardev", Config{Devices: []VhostUserDevice{okDev, {ID: "d0-chr", Socket: "/s"}}}, DeviceNameGeneric, "Devices[1].ID"},
		{"nul in extra args", Config{ExtraArgs: []string{"-a\x00"}}, "", "ExtraArgs[0]"},
		{"unknown device name", Config{DeviceName: "virtio-net-pci"}, "", "DeviceName"},
		{"no device name", Config{Devices: []VhostUserDevice{okDev}}, "", "deviceName"},
		{"bad device name", Config{Devices: []VhostUserDevice{okDev}}, "x,chardev=y", "deviceName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := tt.cfg.Args(tt.deviceName)
			if err == nil {
				t.Fatalf("Args: got nil error and %q, want an error on %s", args, tt.field)
			}
			if args != nil {
				t.Errorf("Args: got %q with error, want nil", args)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got error %v, want one matching ErrInvalidConfig", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("got %T, want *ConfigError", err)
			}
			if ce.Field != tt.field {
				t.Errorf("got field %q, want %q (error %v)", ce.Field, tt.field, err)
			}
		})
	}
}

func TestFindBinary(t *testing.T) {
	repo := t.TempDir()
	t.Setenv(EnvBinary, "")
	installed := t.TempDir() + "/qemu-system-x86_64"
	defer func(p string) { installedBinary = p }(installedBinary)
	installedBinary = installed
	if _, err := FindBinary(repo); !errors.Is(err, ErrNoBinary) {
		t.Errorf("empty repo, nothing installed: got %v, want ErrNoBinary", err)
	}
	if err := os.WriteFile(installed, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindBinary(repo); err != nil || got != installed {
		t.Errorf("empty repo, package installed: got %q, %v, want %q", got, err, installed)
	}
	if err := os.Remove(installed); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(repo+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	bin := repo + "/bin/qemu-system-x86_64"
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FindBinary(repo); !errors.Is(err, ErrNoBinary) {
		t.Errorf("not executable: got %v, want ErrNoBinary", err)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindBinary(repo); err != nil || got != bin {
		t.Errorf("repo binary before the installed one: got %q, %v, want %q", got, err, bin)
	}
	t.Setenv(EnvBinary, repo+"/missing")
	if _, err := FindBinary(repo); !errors.Is(err, ErrNoBinary) {
		t.Errorf("bad $%s: got %v, want ErrNoBinary", EnvBinary, err)
	}
	t.Setenv(EnvBinary, bin)
	if got, err := FindBinary("/nonexistent"); err != nil || got != bin {
		t.Errorf("$%s: got %q, %v, want %q", EnvBinary, got, err, bin)
	}
}

func TestParseDeviceHelp(t *testing.T) {
	tests := []struct {
		name, out, want string
	}{
		{"vrdma-qemu", "Network devices:\nname \"vhost-user-rdma-pci\", bus PCI, desc \"vhost-user RDMA device\"\nMisc devices:\nname \"vhost-user-device-pci\", bus PCI\n", DeviceNameRDMA},
		{"patched 10.0 without 0003", "Misc devices:\nname \"pci-testdev\", bus PCI\nname \"vhost-user-device-pci\", bus PCI\n", DeviceNameGeneric},
		{"bus-agnostic only", "name \"vhost-user-rdma\", bus virtio-bus\n", ""},
		{"10.2", "name \"vhost-user-test-device-pci\", bus PCI, desc \"x\"\n", DeviceNameTest},
		{"both prefers generic", "name \"vhost-user-test-device-pci\", bus PCI\nname \"vhost-user-device-pci\", bus PCI\n", DeviceNameGeneric},
		{"stock", "name \"vhost-user-fs-pci\", bus PCI\nname \"vhost-user-device\", bus virtio-bus\n", ""},
		{"prefix only", "name \"vhost-user-device-pci-x\", bus PCI\nname \"vhost-user-device-pci\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDeviceHelp([]byte(tt.out), "qemu")
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if (tt.want == "") != errors.Is(err, ErrNoRDMADevice) {
				t.Errorf("got error %v, want ErrNoRDMADevice: %v", err, tt.want == "")
			}
			if err != nil && !strings.Contains(err.Error(), "vrdma-qemu") {
				t.Errorf("got error %v, want it to name the package vrdma-qemu", err)
			}
		})
	}
}

func TestTailBuffer(t *testing.T) {
	b := newTailBuffer(8)
	for _, s := range []string{"abc", "defg", "hij"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q): got %d, %v, want %d, nil", s, n, err, len(s))
		}
	}
	if got, want := b.String(), "cdefghij"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	b.Write([]byte("0123456789"))
	if got, want := b.String(), "23456789"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
