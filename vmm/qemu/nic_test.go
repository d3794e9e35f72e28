package qemu

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNICArgs(t *testing.T) {
	cfg := Config{NICs: []NIC{
		{ID: "net0", MAC: "52:54:00:00:00:01", LocalSocket: "/tmp/a,b/server.net", RemoteSocket: "/tmp/x/client.net"},
		{ID: "net1"},
	}}
	args, err := cfg.Args("")
	if err != nil {
		t.Fatal(err)
	}
	got := flagValues(args, "-netdev")
	want := []string{
		"dgram,id=net0-net,local.type=unix,local.path=/tmp/a,,b/server.net,remote.type=unix,remote.path=/tmp/x/client.net",
		"hubport,id=net1-net,hubid=1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("-netdev: got %q, want %q", got, want)
	}
	got = flagValues(args, "-device")
	want = []string{
		"virtio-net-pci,id=net0,netdev=net0-net,romfile=,mac=52:54:00:00:00:01",
		"virtio-net-pci,id=net1,netdev=net1-net,romfile=",
	}
	if !slices.Equal(got, want) {
		t.Errorf("-device: got %q, want %q", got, want)
	}
	// ExtraArgs still come last.
	cfg.ExtraArgs = []string{"-S"}
	args, err = cfg.Args("")
	if err != nil {
		t.Fatal(err)
	}
	if args[len(args)-1] != "-S" {
		t.Errorf("ExtraArgs are not last: %q", args)
	}
}

func TestNICValidate(t *testing.T) {
	ok := NIC{ID: "net0", MAC: "52:54:00:00:00:01", LocalSocket: "/tmp/a.net", RemoteSocket: "/tmp/b.net"}
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"hub port, no mac", func(c *Config) { c.NICs[0] = NIC{ID: "n"} }, ""},
		{"no id", func(c *Config) { c.NICs[0].ID = "" }, "NICs[0].ID"},
		{"bad id", func(c *Config) { c.NICs[0].ID = "0net" }, "NICs[0].ID"},
		{"bad mac", func(c *Config) { c.NICs[0].MAC = "52:54:00:00:01" }, "NICs[0].MAC"},
		{"eui-64 mac", func(c *Config) { c.NICs[0].MAC = "52:54:00:ff:fe:00:00:01" }, "NICs[0].MAC"},
		{"multicast mac", func(c *Config) { c.NICs[0].MAC = "01:00:5e:00:00:01" }, "NICs[0].MAC"},
		{"local only", func(c *Config) { c.NICs[0].RemoteSocket = "" }, "NICs[0].LocalSocket"},
		{"remote only", func(c *Config) { c.NICs[0].LocalSocket = "" }, "NICs[0].LocalSocket"},
		{"same socket", func(c *Config) { c.NICs[0].RemoteSocket = c.NICs[0].LocalSocket }, "NICs[0].RemoteSocket"},
		{"long socket", func(c *Config) { c.NICs[0].LocalSocket = "/" + strings.Repeat("a", 110) }, "NICs[0].LocalSocket"},
		{"newline in socket", func(c *Config) { c.NICs[0].RemoteSocket = "/tmp/a\nb" }, "NICs[0].RemoteSocket"},
		{"id taken by a device", func(c *Config) { c.Devices = []VhostUserDevice{{ID: "net0", Socket: "/tmp/d.sock"}} }, "NICs[0].ID"},
		{"netdev id taken", func(c *Config) { c.NICs = append(c.NICs, NIC{ID: "net0-net"}) }, "NICs[1].ID"},
		{"too many", func(c *Config) {
			c.NICs = []NIC{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}, {ID: "e"}}
		}, "NICs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{NICs: []NIC{ok}}
			tt.edit(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want a *ConfigError", err)
			}
			if ce.Field != tt.field {
				t.Fatalf("got field %q, want %q (%v)", ce.Field, tt.field, err)
			}
		})
	}
}
