// Package providertest checks the vrdma rdma-core provider that
// scripts/guest-provider.sh builds (bin/guest-stack/libvrdma-rdmav34.so and
// vrdma.driver) against the system's libibverbs (Debian 12's 44.0): every
// symbol it imports is one the library exports, with its version; dlopen
// with RTLD_NOW after libibverbs.so.1 succeeds; and libibverbs itself picks
// the provider up — from a config directory holding vrdma.driver and its
// provider directory — and claims a vrdma device, by name or by its virtio
// modalias, with no "couldn't load driver" warning.
//
// The host has no RDMA devices, so TestLibibverbsLoadsProvider shows libibverbs a fake
// one: a sysfs tree under SYSFS_PATH (libibverbs' own knob; 44.0 has none
// for its config directory) and, in a private mount namespace (root,
// unshare), a /dev with infiniband/uverbs0, /etc/libibverbs.d holding only
// vrdma.driver and the provider directory holding only the built provider.
// Nothing outside the namespace changes.
//
// TestVerbsInGuest runs testdata/verbs_check.c in a guest of the standard
// stack image (vrdma-vmtest exec), with the provider under test laid over
// the image's copy: every verb the provider implements, with data checked.
//
// The tests skip when the build artefacts (or root, cc, libibverbs, the
// guest image) are missing, except under CI=true, where they fail.
package providertest

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const (
	providerName = "libvrdma-rdmav34.so"
	// The private ABI Debian 12's libibverbs 44.0 exports to providers.
	privateABI = "IBVERBS_PRIVATE_34"
	// Where Debian's libibverbs1 puts its library, config and providers.
	systemLib         = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
	systemConfigDir   = "/etc/libibverbs.d"
	systemProviderDir = "/usr/lib/x86_64-linux-gnu/libibverbs"
)

// unavailable skips the test with why, or fails it under CI, where every
// prerequisite is installed (make test builds the provider first).
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// artefacts returns the built provider and driver file.
func artefacts(t *testing.T) (so, driver string) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "bin", "guest-stack")
	so, driver = filepath.Join(dir, providerName), filepath.Join(dir, "vrdma.driver")
	for _, p := range []string{so, driver} {
		if _, err := os.Stat(p); err != nil {
			unavailable(t, "%s missing: build it with scripts/guest-provider.sh (%v)", p, err)
		}
	}
	return so, driver
}

func needSystemLib(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(systemLib); err != nil {
		unavailable(t, "system libibverbs missing (apt-get install libibverbs-dev): %v", err)
	}
}

// compile builds testdata/NAME.c into a temporary directory.
func compile(t *testing.T, name string, libs ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		unavailable(t, "no C compiler: %v", err)
	}
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-Wall", "-Werror", "-o", out, filepath.Join("testdata", name+".c")}, libs...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		unavailable(t, "cc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out
}

func TestDriverFile(t *testing.T) {
	_, driver := artefacts(t)
	b, err := os.ReadFile(driver)
	if err != nil {
		t.Fatal(err)
	}
	// libibverbs' read_config_file: "driver NAME"; NAME without a slash is
	// looked up as lib<NAME>-rdmav34.so in the provider directory.
	if got, want := string(b), "driver vrdma\n"; got != want {
		t.Errorf("vrdma.driver = %q, want %q", got, want)
	}
}

// TestSymbolsBindToSystemLibibverbs reads the ELF dynamic symbols: each
// import from libibverbs.so.1 must carry an IBVERBS_ version the system
// library defines it under, the provider must need IBVERBS_PRIVATE_34, and
// it must export nothing (rdma-core's provider.map).
func TestSymbolsBindToSystemLibibverbs(t *testing.T) {
	so, _ := artefacts(t)
	needSystemLib(t)

	lib, err := elf.Open(systemLib)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	libSyms, err := lib.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range libSyms {
		if s.Section != elf.SHN_UNDEF && s.Version != "" {
			exported[s.Name+"@"+s.Version] = true
		}
	}

	prov, err := elf.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer prov.Close()
	needed, err := prov.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if !contains(needed, "libibverbs.so.1") {
		t.Errorf("DT_NEEDED = %v, want libibverbs.so.1 among them", needed)
	}
	imports, err := prov.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	private := 0
	for _, s := range imports {
		if s.Library != "libibverbs.so.1" && !strings.HasPrefix(s.Version, "IBVERBS") {
			continue
		}
		if !strings.HasPrefix(s.Version, "IBVERBS_") {
			t.Errorf("import %s has version %q, want an IBVERBS_ version", s.Name, s.Version)
			continue
		}
		if !exported[s.Name+"@"+s.Version] {
			t.Errorf("import %s@%s: %s does not export it", s.Name, s.Version, systemLib)
		}
		if s.Version == privateABI {
			private++
		}
	}
	if private == 0 {
		t.Errorf("the provider imports nothing from %s; want verbs_register_driver_34 at least", privateABI)
	}

	syms, err := prov.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) != elf.STB_LOCAL {
			t.Errorf("the provider exports %s; provider.map should keep everything local", s.Name)
		}
	}
}

func TestDlopenAfterLibibverbs(t *testing.T) {
	so, _ := artefacts(t)
	needSystemLib(t)
	bin := compile(t, "dlopen", "-ldl")
	out, err := exec.Command(bin, so).CombinedOutput()
	if err != nil {
		t.Fatalf("dlopen(RTLD_NOW) of %s after libibverbs.so.1: %v\n%s", so, err, out)
	}
}

// fakeDevice is one uverbs device in the fake sysfs.
type fakeDevice struct {
	ibdev    string // class/infiniband_verbs/uverbs0/ibdev
	abi      string // its abi_version (the driver's uverbs ABI)
	modalias string // class/infiniband/IBDEV/device/modalias; "" for none
}

// fakeSystem lays out a root for libibverbs: sys/ (SYSFS_PATH), dev/,
// etc/ (the config directory) and providers/.
func fakeSystem(t *testing.T, dev fakeDevice) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"sys/class/infiniband_verbs/abi_version":           "6\n", // the kernel's uverbs ABI
		"sys/class/infiniband_verbs/uverbs0/ibdev":         dev.ibdev + "\n",
		"sys/class/infiniband_verbs/uverbs0/dev":           "231:192\n",
		"sys/class/infiniband_verbs/uverbs0/abi_version":   dev.abi + "\n",
		"sys/class/infiniband/" + dev.ibdev + "/node_type": "1\n",
		"sys/class/infiniband/" + dev.ibdev + "/node_guid": "0011:2233:4455:6677\n",
		"dev/infiniband/uverbs0":                           "",
	}
	if dev.modalias != "" {
		files["sys/class/infiniband/"+dev.ibdev+"/device/modalias"] = dev.modalias + "\n"
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "providers"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// runInNamespace runs bin in a private mount namespace where /dev,
// /etc/libibverbs.d and the provider directory are root's dev/, etc/ and
// providers/, with SYSFS_PATH=root/sys and the extra environment.
func runInNamespace(t *testing.T, root, bin string, env ...string) (string, error) {
	t.Helper()
	script := `set -e
mount --bind "$ROOT/dev" /dev
mount --bind "$ROOT/etc" "$CONFIG_DIR"
mount --bind "$ROOT/providers" "$PROVIDER_DIR"
exec "$BIN"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(),
		"ROOT="+root, "BIN="+bin, "CONFIG_DIR="+systemConfigDir, "PROVIDER_DIR="+systemProviderDir,
		"SYSFS_PATH="+filepath.Join(root, "sys"), "IBV_SHOW_WARNINGS=1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestLibibverbsLoadsProvider(t *testing.T) {
	so, driver := artefacts(t)
	needSystemLib(t)
	if os.Geteuid() != 0 {
		unavailable(t, "needs root for a private mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		unavailable(t, "no unshare (util-linux): %v", err)
	}
	for _, d := range []string{systemConfigDir, systemProviderDir} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			unavailable(t, "%s missing (package ibverbs-providers): %v", d, err)
		}
	}
	bin := compile(t, "devlist", "-libverbs")
	if out, err := exec.Command("unshare", "--mount", "true").CombinedOutput(); err != nil {
		unavailable(t, "unshare --mount: %v\n%s", err, out)
	}

	const vrdmaModalias = "virtio:d0000002Av00001AF4"
	tests := []struct {
		name string
		dev  fakeDevice
		// how libibverbs finds the provider: "config" puts vrdma.driver in
		// the config directory and the .so in the provider directory;
		// "env" names it by absolute path in RDMAV_DRIVERS.
		how      string
		noDriver bool // install no provider at all
		want     string
		warning  string // a warning libibverbs must print; "" for none
	}{
		{name: "by name", dev: fakeDevice{ibdev: "vrdma0", abi: "1"}, how: "config",
			want: "device vrdma0 node_type=1 guid=0011223344556677\ndevices 1\n"},
		{name: "by modalias", dev: fakeDevice{ibdev: "rdmadev7", abi: "1", modalias: vrdmaModalias}, how: "config",
			want: "device rdmadev7 node_type=1 guid=0011223344556677\ndevices 1\n"},
		{name: "RDMAV_DRIVERS path", dev: fakeDevice{ibdev: "vrdma0", abi: "1", modalias: vrdmaModalias}, how: "env",
			want: "device vrdma0 node_type=1 guid=0011223344556677\ndevices 1\n"},
		{name: "other virtio device", dev: fakeDevice{ibdev: "rdmadev7", abi: "1", modalias: "virtio:d00000001v00001AF4"}, how: "config",
			want: "devices 0\n", warning: "no userspace device-specific driver found for rdmadev7"},
		{name: "other uverbs ABI", dev: fakeDevice{ibdev: "vrdma0", abi: "2"}, how: "config",
			want: "devices 0\n", warning: "no userspace device-specific driver found for vrdma0"},
		// The control: without the provider the same device is not claimed
		// and libibverbs says why, so the cases above prove the provider.
		{name: "no provider installed", dev: fakeDevice{ibdev: "vrdma0", abi: "1"}, how: "config", noDriver: true,
			want: "devices 0\n", warning: "couldn't load driver"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeSystem(t, tc.dev)
			var env []string
			switch tc.how {
			case "config":
				copyFile(t, driver, filepath.Join(root, "etc", "vrdma.driver"))
				if !tc.noDriver {
					copyFile(t, so, filepath.Join(root, "providers", providerName))
				}
			case "env":
				dir := filepath.Join(root, "elsewhere")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				copyFile(t, so, filepath.Join(dir, providerName))
				// load_driver: an absolute name gets "-rdmav34.so" appended.
				env = append(env, "RDMAV_DRIVERS="+filepath.Join(dir, "libvrdma"))
			}
			out, err := runInNamespace(t, root, bin, env...)
			if err != nil {
				t.Fatalf("devlist: %v\n%s", err, out)
			}
			var stdout, warnings []string
			for _, l := range strings.SplitAfter(out, "\n") {
				if strings.HasPrefix(l, "device") {
					stdout = append(stdout, l)
				} else if l != "" {
					warnings = append(warnings, l)
				}
			}
			if got := strings.Join(stdout, ""); got != tc.want {
				t.Errorf("devices:\n%s\nwant:\n%s\n(full output:\n%s)", got, tc.want, out)
			}
			all := strings.Join(warnings, "")
			if tc.warning == "" {
				if all != "" {
					t.Errorf("libibverbs warned:\n%s", all)
				}
			} else if !strings.Contains(all, tc.warning) {
				t.Errorf("output lacks %q:\n%s", tc.warning, out)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// cpioEntry is one file of a newc archive.
type cpioEntry struct {
	name string
	mode uint32 // type and permission bits, e.g. 0o100755
	data []byte
}

// newcArchive returns entries as a gzip-compressed newc cpio archive, the
// format of the guest's initramfs; appended to it, its files replace the
// image's (the kernel unpacks concatenated archives in order).
func newcArchive(entries []cpioEntry) ([]byte, error) {
	var raw bytes.Buffer
	pad := func() {
		for raw.Len()%4 != 0 {
			raw.WriteByte(0)
		}
	}
	write := func(ino int, e cpioEntry) {
		fmt.Fprintf(&raw, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, e.mode, 0, 0, 1, 0, len(e.data), 0, 0, 0, 0, len(e.name)+1, 0)
		raw.WriteString(e.name)
		raw.WriteByte(0)
		pad()
		raw.Write(e.data)
		pad()
	}
	for i, e := range entries {
		write(i+1, e)
	}
	write(0, cpioEntry{name: "TRAILER!!!"})
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	if _, err := w.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return gz.Bytes(), nil
}

func TestVerbsInGuest(t *testing.T) {
	so, driver := artefacts(t)
	needSystemLib(t)
	root := repoRoot(t)
	vmtest := filepath.Join(root, "bin", "vrdma-vmtest")
	image := filepath.Join(root, "bin", "guest-stack", "initramfs.img")
	for _, p := range []string{vmtest, image, filepath.Join(root, "bin", "guest-stack", "vmlinuz"),
		filepath.Join(root, "bin", "guest-stack", "vrdma.ko"), filepath.Join(root, "bin", "qemu-system-x86_64")} {
		if _, err := os.Stat(p); err != nil {
			unavailable(t, "%s missing (make build qemu; scripts/guest-stack-image.sh): %v", p, err)
		}
	}
	bin := compile(t, "verbs_check", "-O2", "-libverbs")

	var entries []cpioEntry
	for _, f := range []struct{ src, dst string }{
		{bin, "vrdma-verbs-check"},
		{so, "usr/lib/x86_64-linux-gnu/libibverbs/" + providerName},
		{driver, "etc/libibverbs.d/vrdma.driver"},
	} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, cpioEntry{name: f.dst, mode: 0o100755, data: b})
	}
	extra, err := newcArchive(entries)
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(t.TempDir(), "initramfs.img")
	if err := os.WriteFile(initrd, append(base, extra...), 0o644); err != nil {
		t.Fatal(err)
	}

	// GID index 1: the port's RoCE v2 link-local GID (the image's eth0).
	cmd := exec.Command(vmtest, "exec", "--initrd", initrd, "--timeout", "5m",
		"--cmd", "/vrdma-verbs-check vrdma0 1")
	out, err := cmd.CombinedOutput()
	t.Logf("vrdma-vmtest exec:\n%s", out)
	if err != nil {
		t.Fatalf("verbs_check in the guest: %v", err)
	}
	if !strings.Contains(string(out), "verbs_check: all ") {
		t.Errorf("verbs_check did not report \"verbs_check: all N checks passed\"")
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "VRDMA-KERNEL-WARNING") {
			t.Errorf("kernel: %s", l)
		}
	}
}
