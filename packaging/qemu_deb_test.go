package packaging

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// qemuBinary is what make qemu leaves and scripts/deb-qemu.sh packages.
const qemuBinary = "../bin/qemu-system-x86_64"

// packagedQEMU is where vrdma-qemu installs it.
const packagedQEMU = "/usr/lib/vrdma/bin/qemu-system-x86_64"

// TestDebQEMU builds both packages as make deb does (scripts/deb.sh, which
// runs scripts/deb-qemu.sh) and checks vrdma-qemu: its file list (nothing
// where Debian's QEMU has its files), control fields (Depends from
// dpkg-shlibdeps and the firmware packages, Recommends vrdma), md5sums,
// lintian, and the packaged binary itself: stripped, with vhost-user-rdma-pci
// and its defaults, booting SeaBIOS with a virtio NIC's boot ROM from the
// firmware of the packages it depends on. vrdma must recommend it, not
// Debian's QEMU.
func TestDebQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds two packages (make test runs it in its full pass)")
	}
	need(t, "dpkg-deb")
	need(t, "go")
	need(t, "dpkg-shlibdeps")
	if _, err := os.Stat(qemuBinary); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: %v (CI=true: make test builds it with make qemu)", qemuBinary, err)
		}
		t.Skipf("%s: %v (make qemu builds it)", qemuBinary, err)
	}
	out := t.TempDir()
	run(t, []string{"OUTDIR=" + out, "VERSION=" + testVersion, "DEB_COMPRESS=gzip"}, "bash", "../scripts/deb.sh")
	vrdmaDeb := filepath.Join(out, "vrdma_"+testDebVersion+"_amd64.deb")
	deb := filepath.Join(out, "vrdma-qemu_"+testDebVersion+"_amd64.deb")
	for _, p := range []string{vrdmaDeb, deb} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("make deb's packages: %v", err)
		}
	}
	field := func(deb, name string) string {
		return strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, name))
	}

	t.Run("vrdma recommends vrdma-qemu", func(t *testing.T) {
		rec := splitDeps(field(vrdmaDeb, "Recommends"))
		if !slices.Contains(rec, "vrdma-qemu") || slices.ContainsFunc(rec, func(d string) bool { return strings.HasPrefix(d, "qemu-system") }) {
			t.Errorf("vrdma Recommends %q: want vrdma-qemu and no Debian QEMU", rec)
		}
		for _, f := range []string{"Depends", "Suggests"} {
			if got := field(vrdmaDeb, f); strings.Contains(got, "qemu-system") {
				t.Errorf("vrdma %s %q names Debian's QEMU", f, got)
			}
		}
	})

	t.Run("contents", func(t *testing.T) {
		patches, err := filepath.Glob("../vmm/qemu/patches/*.patch")
		if err != nil || len(patches) < 3 {
			t.Fatalf("vmm/qemu/patches: %v, %v", patches, err)
		}
		want := map[string]string{
			packagedQEMU:                                    "-rwxr-xr-x",
			"/usr/share/doc/vrdma-qemu/copyright":           "-rw-r--r--",
			"/usr/share/doc/vrdma-qemu/changelog.Debian.gz": "-rw-r--r--",
			"/usr/share/doc/vrdma-qemu/README.vrdma":        "-rw-r--r--",
		}
		for _, p := range patches {
			want["/usr/share/doc/vrdma-qemu/patches/"+filepath.Base(p)+".gz"] = "-rw-r--r--"
		}
		got := map[string]string{}
		for path, mode := range debEntries(t, deb) {
			if !strings.HasSuffix(path, "/") {
				got[path] = mode
			}
		}
		for p, mode := range want {
			if got[p] != mode {
				t.Errorf("%s: got %q, want %s", p, got[p], mode)
			}
		}
		for p := range got {
			if _, ok := want[p]; !ok {
				t.Errorf("%s: in the package, not expected (Debian's QEMU owns /usr/bin/qemu-system-*, /usr/share/qemu)", p)
			}
		}
	})

	t.Run("control", func(t *testing.T) {
		for name, want := range map[string]string{
			"Package": "vrdma-qemu", "Source": "vrdma", "Version": testDebVersion, "Architecture": "amd64",
			"Section": "otherosfs", "Priority": "optional", "Recommends": "vrdma",
		} {
			if got := field(deb, name); got != want {
				t.Errorf("%s: got %q, want %q", name, got, want)
			}
		}
		deps := splitDeps(field(deb, "Depends"))
		// The libraries it links (dpkg-shlibdeps) and the firmware it loads.
		for _, want := range []string{"libc6", "libglib2.0-0", "libfdt1", "zlib1g", "seabios", "qemu-system-data", "ipxe-qemu"} {
			if !slices.Contains(deps, want) {
				t.Errorf("Depends %q lacks %s", deps, want)
			}
		}
		for _, d := range deps {
			if strings.HasPrefix(d, "qemu-system-x86") || d == "qemu-utils" {
				t.Errorf("Depends %q names Debian's QEMU", deps)
			}
		}
		if desc := field(deb, "Description"); !strings.Contains(desc, "vhost-user-rdma-pci") || !strings.Contains(desc, packagedQEMU) {
			t.Errorf("Description does not say what and where: %q", desc)
		}
	})

	root := t.TempDir()
	run(t, nil, "dpkg-deb", "-x", deb, root)
	ctrl := t.TempDir()
	run(t, nil, "dpkg-deb", "-e", deb, ctrl)
	bin := filepath.Join(root, packagedQEMU)

	t.Run("md5sums", func(t *testing.T) {
		cmd := exec.Command("md5sum", "--check", "--quiet", filepath.Join(ctrl, "md5sums"))
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("md5sum --check: %v\n%s", err, out)
		}
		b, _ := os.ReadFile(filepath.Join(ctrl, "md5sums"))
		if n, files := strings.Count(string(b), "\n"), countFiles(t, root); n != files {
			t.Errorf("md5sums lists %d files, the package has %d", n, files)
		}
	})

	t.Run("README", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(root, "usr/share/doc/vrdma-qemu/README.vrdma"))
		if err != nil {
			t.Fatal(err)
		}
		// What it takes to rebuild the binary from source: the pinned
		// tarball, the patches, the configure line.
		for _, want := range []string{"qemu_10.0.2+ds.orig.tar.xz", "0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1",
			"0003-vhost-user-rdma-device.patch", "--firmwarepath=/usr/share/seabios:/usr/share/qemu:/usr/lib/ipxe/qemu", "vhost-user-rdma-pci,chardev="} {
			if !strings.Contains(string(b), want) {
				t.Errorf("README.vrdma lacks %q", want)
			}
		}
	})

	t.Run("binary", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{".symtab", ".debug_info"} {
			if f.Section(s) != nil {
				t.Errorf("%s has %s: want it stripped", packagedQEMU, s)
			}
		}
		f.Close()
		if v := run(t, nil, bin, "--version"); !strings.HasPrefix(v, "QEMU emulator version 10.0.2") {
			t.Errorf("--version: %q", v)
		}
		if help := run(t, nil, bin, "-nodefaults", "-machine", "none", "-device", "help"); !strings.Contains(help, `name "vhost-user-rdma-pci", bus PCI`) ||
			!strings.Contains(help, `name "vhost-user-device-pci", bus PCI`) {
			t.Errorf("-device help lacks vhost-user-rdma-pci or the generic vhost-user-device-pci:\n%s", help)
		}
		props := run(t, nil, bin, "-nodefaults", "-machine", "none", "-device", "vhost-user-rdma-pci,help")
		for _, re := range []string{`num_vqs=<uint32> .*\(default: 3\)`, `vq_size=<uint32> .*\(default: 256\)`,
			`config_size=<uint32> .*\(default: 96\)`, `chardev=<str>`, `vectors=<uint32>`} {
			if !regexp.MustCompile(re).MatchString(props) {
				t.Errorf("vhost-user-rdma-pci,help lacks %s:\n%s", re, props)
			}
		}
		if strings.Contains(props, "virtio-id") {
			t.Errorf("vhost-user-rdma-pci has a virtio-id property; it is device 42:\n%s", props)
		}
	})

	t.Run("firmware from its Depends", func(t *testing.T) {
		readme, err := os.ReadFile(filepath.Join(root, "usr/share/doc/vrdma-qemu/README.vrdma"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`--firmwarepath=(\S+)`).FindSubmatch(readme)
		if m == nil {
			t.Fatal("README.vrdma gives no --firmwarepath")
		}
		checkQEMUFirmware(t, bin, strings.Split(string(m[1]), ":"), splitDeps(field(deb, "Depends")))
	})

	t.Run("lintian", func(t *testing.T) {
		lintian := need(t, "lintian")
		out, err := exec.Command(lintian, "--fail-on", "error,warning", "--no-tag-display-limit", deb).CombinedOutput()
		var bad []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "E: ") || strings.HasPrefix(line, "W: ") {
				bad = append(bad, line)
			}
		}
		if err != nil || len(bad) > 0 {
			t.Errorf("lintian: %v\n%s", err, out)
		}
	})
}

// checkQEMUFirmware boots bin without -L (q35, no default devices, a
// virtio NIC, whose boot ROM QEMU loads) until SeaBIOS prints its banner,
// and checks that each firmware file that takes, found on fwPath (the
// configured firmware path, whose directories bin must hold), belongs to a
// package of deps (dpkg -S).
func checkQEMUFirmware(t *testing.T, bin string, fwPath, deps []string) {
	dpkg := need(t, "dpkg")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range fwPath {
		if !bytes.Contains(b, []byte("\x00"+dir+"\x00")) {
			t.Errorf("%s: firmware directory %s is not compiled in", bin, dir)
		}
	}
	for _, file := range []string{"bios-256k.bin", "kvmvapic.bin", "linuxboot_dma.bin", "efi-virtio.rom"} {
		var found string
		for _, dir := range fwPath {
			if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
				found = filepath.Join(dir, file)
				break
			}
		}
		if found == "" {
			if os.Getenv("CI") == "true" {
				t.Errorf("%s: not on the firmware path %q (CI=true: install %v)", file, fwPath, deps)
				continue
			}
			t.Skipf("%s: not on the firmware path %q: install seabios, qemu-system-data, ipxe-qemu", file, fwPath)
		}
		real, err := filepath.EvalSymlinks(found)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := exec.Command(dpkg, "-S", real).Output()
		if err != nil {
			t.Errorf("dpkg -S %s: %v", real, err)
			continue
		}
		pkg, _, _ := strings.Cut(strings.TrimSpace(string(owner)), ":")
		if !slices.Contains(deps, pkg) {
			t.Errorf("%s comes from %s, which Depends %q lacks", real, pkg, deps)
		}
	}

	dir := t.TempDir()
	cmd := exec.Command(bin, "-machine", "q35,memory-backend=mem", "-object", "memory-backend-memfd,id=mem,size=64M,share=on",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-netdev", "hubport,id=n0,hubid=0", "-device", "virtio-net-pci,netdev=n0",
		"-chardev", "file,id=dbg,path="+filepath.Join(dir, "debugcon"), "-device", "isa-debugcon,iobase=0x402,chardev=dbg")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(filepath.Join(dir, "debugcon")); bytes.Contains(b, []byte("SeaBIOS")) {
			return
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the packaged QEMU exited before SeaBIOS started: %v\n%s", err, out.String())
		default:
		}
	}
	t.Fatalf("no SeaBIOS banner in 20 s\n%s", out.String())
}

// splitDeps returns the package names of a Depends-style field.
func splitDeps(field string) []string {
	var out []string
	for _, alt := range strings.Split(field, ",") {
		for _, d := range strings.Split(alt, "|") {
			name, _, _ := strings.Cut(strings.TrimSpace(d), " ")
			if name != "" {
				out = append(out, name)
			}
		}
	}
	return out
}

// countFiles counts the regular files under dir.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
