package qemu

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// libvirtDomainXML is the documented domain: docs/libvirt-domain.xml, which
// docs/operations.md ("The same with libvirt") quotes whole.
const libvirtDomainXML = "../../docs/libvirt-domain.xml"

// docXMLBlocks returns the ```xml blocks of the section of
// docs/operations.md that starts with heading.
func docXMLBlocks(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/operations.md has no %q section", heading)
	}
	sec := doc[i+1:]
	if j := strings.Index(sec[len(heading):], "\n## "); j >= 0 {
		sec = sec[:len(heading)+j]
	}
	var blocks []string
	for {
		k := strings.Index(sec, "\n```xml\n")
		if k < 0 {
			return blocks
		}
		sec = sec[k+len("\n```xml\n"):]
		end := strings.Index(sec, "```")
		if end < 0 {
			t.Fatalf("docs/operations.md: unterminated xml block in %q", heading)
		}
		blocks = append(blocks, sec[:end])
		sec = sec[end:]
	}
}

// TestLibvirtDomainXMLValidates runs the documented domain through
// virt-xml-validate (libvirt's RelaxNG schema; packages libvirt-clients
// and libxml2-utils). With CI set a missing validator is a failure.
func TestLibvirtDomainXMLValidates(t *testing.T) {
	want, err := os.ReadFile(libvirtDomainXML)
	if err != nil {
		t.Fatal(err)
	}
	blocks := docXMLBlocks(t, "## The same with libvirt")
	if len(blocks) != 1 {
		t.Fatalf("docs/operations.md, \"The same with libvirt\": got %d xml blocks, want 1", len(blocks))
	}
	if blocks[0] != string(want) {
		t.Errorf("the XML in docs/operations.md differs from docs/libvirt-domain.xml:\n%s", blocks[0])
	}
	validator, err := exec.LookPath("virt-xml-validate")
	if err == nil {
		_, err = exec.LookPath("xmllint") // virt-xml-validate's own dependency
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but virt-xml-validate cannot run (install libvirt-clients and libxml2-utils): %v", err)
		}
		t.Skipf("virt-xml-validate cannot run (install libvirt-clients and libxml2-utils): %v", err)
	}
	inDoc := filepath.Join(t.TempDir(), "operations-domain.xml")
	if err := os.WriteFile(inDoc, []byte(blocks[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{libvirtDomainXML, inDoc} {
		out, err := exec.Command(validator, f, "domain").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "validates") {
			t.Errorf("virt-xml-validate %s: %v\n%s", f, err, out)
		}
	}
	// A broken domain must fail, or the check above proves nothing.
	broken := filepath.Join(t.TempDir(), "broken.xml")
	bad := strings.Replace(string(want), "<access mode='shared'/>", "<access mode='sharedd'/>", 1)
	if err := os.WriteFile(broken, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(validator, broken, "domain").CombinedOutput(); err == nil {
		t.Errorf("virt-xml-validate accepted an invalid access mode:\n%s", out)
	}
}

// libvirtDomain is the part of a domain XML the checks below read.
type libvirtDomain struct {
	Type          string `xml:"type,attr"`
	MemoryBacking struct {
		Source struct {
			Type string `xml:"type,attr"`
		} `xml:"source"`
		Access struct {
			Mode string `xml:"mode,attr"`
		} `xml:"access"`
	} `xml:"memoryBacking"`
	OS struct {
		Type struct {
			Machine string `xml:"machine,attr"`
		} `xml:"type"`
	} `xml:"os"`
	Emulator   string `xml:"devices>emulator"`
	Memballoon struct {
		Model string `xml:"model,attr"`
	} `xml:"devices>memballoon"`
	Args []struct {
		Value string `xml:"value,attr"`
	} `xml:"http://libvirt.org/schemas/domain/qemu/1.0 commandline>arg"`
}

// TestLibvirtDomainXMLDevice checks the documented domain against what
// this package builds and expects: shared memfd RAM on q35, the packaged
// emulator, a reconnecting chardev, vhost-user-rdma-pci with vrdma's
// virtio ID and config size on a root port of its own, spare ports that
// FreeRootPort prefers, and -device values in JSON (QEMU creates
// key=value devices before libvirt's JSON ones, so a key=value root port
// takes a slot libvirt assigned: QEMU refuses to start).
func TestLibvirtDomainXMLDevice(t *testing.T) {
	b, err := os.ReadFile(libvirtDomainXML)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtDomain
	if err := xml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.MemoryBacking.Source.Type != "memfd" || d.MemoryBacking.Access.Mode != "shared" {
		t.Errorf("memoryBacking: got source %q access %q, want memfd shared", d.MemoryBacking.Source.Type, d.MemoryBacking.Access.Mode)
	}
	if d.OS.Type.Machine != "q35" {
		t.Errorf("machine %q, want q35", d.OS.Type.Machine)
	}
	if d.Emulator != InstalledBinary {
		t.Errorf("emulator %q, want the patched QEMU of the package vrdma-qemu (%s)", d.Emulator, InstalledBinary)
	}
	if d.Memballoon.Model != "none" {
		t.Errorf("memballoon model %q, want none", d.Memballoon.Model)
	}
	if len(d.Args)%2 != 0 {
		t.Fatalf("qemu:commandline has %d args, want option/value pairs", len(d.Args))
	}
	chardevs := map[string]string{} // id -> value
	ports := map[string]bool{}
	var devs []map[string]any
	for i := 0; i < len(d.Args); i += 2 {
		opt, val := d.Args[i].Value, d.Args[i+1].Value
		switch opt {
		case "-chardev":
			for _, kv := range strings.Split(val, ",") {
				if id, ok := strings.CutPrefix(kv, "id="); ok {
					chardevs[id] = val
				}
			}
		case "-device":
			var dev map[string]any
			if err := json.Unmarshal([]byte(val), &dev); err != nil {
				t.Errorf("-device %s: not JSON (%v): QEMU would create it before libvirt's devices", val, err)
				continue
			}
			switch dev["driver"] {
			case rootPortType:
				ports[dev["id"].(string)] = true
			case DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest:
				devs = append(devs, dev)
			default:
				t.Errorf("-device %s: unexpected driver", val)
			}
		default:
			t.Errorf("qemu:commandline option %q, want -chardev or -device", opt)
		}
	}
	if len(devs) != 1 {
		t.Fatalf("got %d vrdma devices, want 1", len(devs))
	}
	dev := devs[0]
	if dev["driver"] != DeviceNameRDMA {
		t.Errorf("device driver %v, want vrdma's own %s", dev["driver"], DeviceNameRDMA)
	}
	if _, ok := dev["virtio-id"]; ok && dev["driver"] == DeviceNameRDMA {
		t.Errorf("device %s: virtio-id given, which %s does not have", dev["id"], DeviceNameRDMA)
	}
	// A property left out is the named device's default, which is
	// this package's (patches/0003 and config.go agree).
	num := func(k string) int {
		v, ok := dev[k]
		if !ok && dev["driver"] == DeviceNameRDMA {
			return 0
		}
		f, ok := v.(float64)
		if !ok {
			t.Errorf("device %s: %q is %v, want a number", dev["id"], k, v)
		}
		return int(f)
	}
	v := VhostUserDevice{ID: dev["id"].(string), Socket: "/run/vrdma/x.sock", VirtioID: num("virtio-id"),
		NumVQs: num("num_vqs"), VQSize: num("vq_size"), ConfigSize: num("config_size")}
	v = v.withDefaults()
	if err := v.validate("device"); err != nil {
		t.Error(err)
	}
	if v.VirtioID != abi.DeviceID || v.ConfigSize != abi.ConfigSize || v.NumVQs != abi.FirstDoorbellQueue+1 {
		t.Errorf("device: virtio-id %d config_size %d num_vqs %d, want %d %d %d (one vCPU)",
			v.VirtioID, v.ConfigSize, v.NumVQs, abi.DeviceID, abi.ConfigSize, abi.FirstDoorbellQueue+1)
	}
	chr, _ := dev["chardev"].(string)
	if cv, ok := chardevs[chr]; !ok || !strings.HasPrefix(cv, "socket,") || !strings.Contains(cv, ",reconnect-ms=") || !strings.Contains(cv, ",path=/run/vrdma/") {
		t.Errorf("device's chardev %q: got %q, want a reconnecting unix socket in /run/vrdma", chr, chardevs[chr])
	}
	if bus, _ := dev["bus"].(string); !ports[bus] || bus != v.ID+portSuffix {
		t.Errorf("device on bus %q, want its own root port %s", bus, v.ID+portSuffix)
	}
	spare := 0
	for p := range ports {
		if isVrdmaPort(p) {
			spare++
		}
	}
	if spare < 1 {
		t.Errorf("root ports %v: want spare ones named %s* for hot-plug", ports, freePortPrefix)
	}
}
