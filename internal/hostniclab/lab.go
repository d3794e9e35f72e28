package hostniclab

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/rxepair"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// The guests' addresses on their link (internal/rxepair's): guest A, the
// "host" with vrdmad, and guest B, perftest's.
const (
	HostIP = rxepair.ServerIP
	PeerIP = rxepair.ClientIP
)

// Defaults of Config's zero values.
const (
	// DefaultMemoryMiB is guest A's RAM: the initramfs with the extra
	// archive (about 30 MiB, unpacked into its rootfs), vrdmad, and two
	// clients' front-end memories, touched only where they register.
	DefaultMemoryMiB = 1024
	// DefaultSMP is guest A's vCPUs: vrdmad's engine, a client's polling
	// and rxe's kernel threads share them.
	DefaultSMP = 2
	// DefaultKillJob is the kill scenario's job: long enough under TCG
	// that the SIGKILL lands mid-transfer.
	DefaultKillJob = "write_bw:65536:1000"
)

// SoftRNIC is the embedded software RNIC's name (vrdmad's default);
// verbs:DEV[:PORT] names the host's RDMA device through rdma-core.
const SoftRNIC = "soft"

// Config is one hostnic run.
type Config struct {
	// QEMU, Kernel and Initrd: the binary and the rxe image
	// (bin/rxe/vmlinux, bin/rxe/initramfs.img). Required.
	QEMU, Kernel, Initrd string
	// Vrdmad is the vrdmad binary put in guest A; Agent the static
	// vrdma-vmtest (CGO_ENABLED=0) that runs there as the agent and the
	// clients. Required.
	Vrdmad, Agent string
	// RNIC is vrdmad's: SoftRNIC (with --roce-bind guest A's address;
	// guest A then loads no rdma_rxe, whose socket would hold UDP port
	// 4791) or "verbs:rxe0" (vrdmad --rnic verbs:rxe0).
	RNIC string
	// Jobs run in order, each with fresh client processes.
	Jobs []roceinterop.Job
	// Reverse makes guest B's perftest the requester (its client); the
	// vrdma side serves.
	Reverse bool
	// Local runs the jobs between two vrdma devices of guest A's vrdmad
	// through its RNIC; guest B is not booted.
	Local bool
	// KillJob, when set, adds the kill scenario (see AgentSpec.KillJob).
	KillJob string
	// Plain, with Reverse and a verbs RNIC, serves every job twice,
	// alternately by Debian's perftest on the RDMA device of guest A
	// itself (no vrdma) and by the vrdma client (AgentSpec.Plain): the
	// results hold both, in the order run, the plain ones marked.
	Plain bool
	// LocalJobs run after Jobs, in the same boot, between two vrdma
	// devices of guest A's vrdmad (as Local's jobs).
	LocalJobs []roceinterop.Job
	// Account makes every vrdma requester report what vrdmad spent over
	// its test (JobResult.Window: vrdmad's CPU time, the NIC's posts).
	Account bool
	// MemoryMiB and SMP are guest A's; zero means the defaults. Guest B
	// has guestvm's defaults.
	MemoryMiB, SMP int
	// Settle bounds the wait for vrdmad's cleanup (0: DefaultSettle).
	Settle time.Duration
	// Progress, when set, gets a line per step.
	Progress io.Writer
}

// Outcome is what Run did.
type Outcome struct {
	// Results are the agent's, one per job and one for the kill scenario,
	// with PeerGbitsPerS filled from perftest's results when guest B ran
	// its client.
	Results []JobResult
	// Peer are guest B's perftest results (its client's: Reverse).
	Peer []guestresult.Result
	// HostInit and PeerInit are each guest's time from boot to its
	// /init; HostTime and PeerTime from boot to the end of its results.
	HostInit, PeerInit, HostTime, PeerTime time.Duration
	// Log is both guests' consoles.
	Log string
}

// RNICArgs returns vrdmad's arguments for rnic in guest A, the kernel
// RDMA device whose objects the agent counts (none for the soft RNIC),
// and rxe-init's rxe.rxe.
func RNICArgs(rnic string) (args []string, rdmaDev, rxe string, err error) {
	if rnic == SoftRNIC {
		return []string{"--roce-bind", HostIP}, "", "off", nil
	}
	spec, ok := strings.CutPrefix(rnic, "verbs:")
	dev, _, _ := strings.Cut(spec, ":")
	if !ok || dev == "" || strings.ContainsAny(dev, " /,") {
		return nil, "", "", fmt.Errorf("rnic %q: want %s or verbs:DEVICE[:PORT]", rnic, SoftRNIC)
	}
	return []string{"--rnic", rnic}, dev, "on", nil
}

// CheckAgent checks that the agent binary is static: guest A's user space
// is Debian's, but the agent must not depend on its libraries.
func CheckAgent(binary string) error {
	f, err := elf.Open(binary)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("agent %s is dynamically linked: build it with CGO_ENABLED=0", binary)
		}
	}
	return nil
}

// CheckVrdmad checks that a dynamically linked vrdmad can run from the
// image initrd: its program interpreter and every DT_NEEDED library
// (looked up in /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib64,
// /lib, /usr/lib, symbolic links followed) are files of the image. It
// returns the libraries found ("static" for a static vrdmad).
func CheckVrdmad(binary, initrd string) ([]string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("vrdmad: %w", err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, fmt.Errorf("vrdmad: interpreter: %w", err)
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	if interp == "" {
		return []string{"static"}, nil
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("vrdmad: %w", err)
	}
	r, err := os.Open(initrd)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	names, links, err := ListNewc(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", initrd, err)
	}
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	// resolve follows symbolic links in the image (a few hops).
	resolve := func(p string) (string, bool) {
		p = strings.TrimPrefix(p, "/")
		for range 8 {
			t, ok := links[p]
			if !ok {
				return p, have[p]
			}
			if strings.HasPrefix(t, "/") {
				p = strings.TrimPrefix(t, "/")
			} else {
				p = path.Join(path.Dir(p), t)
			}
		}
		return p, false
	}
	var missing []string
	found := []string{interp}
	if _, ok := resolve(interp); !ok {
		missing = append(missing, interp)
	}
	for _, lib := range libs {
		ok := false
		for _, d := range []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib"} {
			if _, ok = resolve(d + "/" + lib); ok {
				found = append(found, d+"/"+lib)
				break
			}
		}
		if !ok {
			missing = append(missing, lib)
		}
	}
	if len(missing) > 0 {
		return found, fmt.Errorf("vrdmad needs %s, which %s lacks (add them to scripts/rxe-image.sh)", strings.Join(missing, ", "), initrd)
	}
	return found, nil
}

// JobScript is /extra/job.sh: guest/rxe-init runs it (vrdma.run=exec).
const JobScript = "#!/bin/sh\n# internal/hostniclab: the agent in guest A\nexec /extra/vrdma-vmtest " + AgentCommand + " /extra/spec.json\n"

// writeInitrd writes base followed by the extra archive (padded to the
// 4-byte boundary the kernel expects an uncompressed archive on) to dst.
func writeInitrd(dst, base string, extra []File) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return err
	}
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	var buf bytes.Buffer
	buf.Write(b)
	if err := WriteNewc(&buf, extra); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

// Run boots guest A (and guest B unless cfg.Local), runs the jobs and
// returns what happened, also on failure (Outcome.Log then says why).
func Run(ctx context.Context, cfg Config) (*Outcome, error) {
	out := &Outcome{}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "hostnic: "+format+"\n", args...)
		}
	}
	if cfg.RNIC == "" {
		cfg.RNIC = "verbs:rxe0"
	}
	vargs, rdmaDev, rxe, err := RNICArgs(cfg.RNIC)
	if err != nil {
		return out, err
	}
	if len(cfg.Jobs) == 0 && cfg.KillJob == "" && len(cfg.LocalJobs) == 0 {
		return out, errors.New("hostnic: no jobs")
	}
	if cfg.Plain && (!cfg.Reverse || cfg.Local || rdmaDev == "") {
		return out, errors.New("hostnic: Plain needs Reverse (perftest's client in guest B), a perftest peer and a verbs RNIC")
	}
	for _, j := range cfg.LocalJobs {
		if j.Op == pftexchange.WriteLat {
			return out, fmt.Errorf("%s: hostnic runs the bandwidth ops", j)
		}
	}
	for _, j := range cfg.Jobs {
		if j.Op == pftexchange.WriteImmBW && !cfg.Local {
			return out, fmt.Errorf("%s: perftest 6.06 has no WRITE with immediate; run it between two vrdma devices (Local)", j)
		}
		if j.Op == pftexchange.WriteLat {
			return out, fmt.Errorf("%s: hostnic runs the bandwidth ops", j)
		}
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = DefaultMemoryMiB
	}
	if cfg.SMP == 0 {
		cfg.SMP = DefaultSMP
	}
	if err := CheckAgent(cfg.Agent); err != nil {
		return out, err
	}
	libs, err := CheckVrdmad(cfg.Vrdmad, cfg.Initrd)
	if err != nil {
		return out, err
	}
	progress("vrdmad's libraries in the image: %s", strings.Join(libs, " "))

	spec := AgentSpec{Vrdmad: "/extra/vrdmad", VrdmadArgs: vargs, RNIC: cfg.RNIC, RDMADev: rdmaDev, Local: HostIP,
		Reverse: cfg.Reverse, LocalPair: cfg.Local, KillJob: cfg.KillJob, Settle: cfg.Settle, Plain: cfg.Plain, Account: cfg.Account}
	if !cfg.Local && len(cfg.Jobs) > 0 {
		spec.Peer = PeerIP
	}
	for _, j := range cfg.Jobs {
		spec.Jobs = append(spec.Jobs, j.String())
	}
	for _, j := range cfg.LocalJobs {
		spec.LocalJobs = append(spec.LocalJobs, j.String())
	}
	// Guest B's perftest runs each job as many times as guest A serves it.
	peerJobs := spec.Jobs
	if cfg.Plain {
		peerJobs = nil
		for _, j := range spec.Jobs {
			peerJobs = append(peerJobs, j, j)
		}
	}
	specJSON, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return out, err
	}
	extra := []File{{Name: "extra/job.sh", Mode: 0o755, Data: []byte(JobScript)}, {Name: "extra/spec.json", Mode: 0o644, Data: specJSON}}
	for _, b := range []struct{ name, path string }{{"extra/vrdmad", cfg.Vrdmad}, {"extra/vrdma-vmtest", cfg.Agent}} {
		data, err := os.ReadFile(b.path)
		if err != nil {
			return out, err
		}
		extra = append(extra, File{Name: b.name, Mode: 0o755, Data: data})
	}
	dir, err := os.MkdirTemp("", "vrdma-hostnic-")
	if err != nil {
		return out, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.img")
	if err := writeInitrd(initrd, cfg.Initrd, extra); err != nil {
		return out, err
	}

	p1, p2, err := rxepair.FreeUDPPorts()
	if err != nil {
		return out, err
	}
	acfg := guestvm.Config{Name: "hostnic-a", QEMU: cfg.QEMU, Kernel: cfg.Kernel, Initrd: initrd,
		MemoryMiB: cfg.MemoryMiB, SMP: cfg.SMP, HugePages: 1, Run: "exec",
		Append:        fmt.Sprintf("rxe.ip=%s rxe.gid=%d rxe.rxe=%s", HostIP, rxepair.GIDIPv4, rxe),
		ExtraQEMUArgs: rxepair.DgramNIC(p1, p2, rxepair.ServerMAC)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	ga, err := guestvm.Boot(ctx, acfg)
	if err != nil {
		return out, fmt.Errorf("boot guest A: %w", err)
	}
	defer ga.Close()
	progress("guest A (vrdmad, rnic %s) booting: %d MiB, %d vCPUs, TCG", cfg.RNIC, cfg.MemoryMiB, cfg.SMP)
	var gb *guestvm.Guest
	if spec.Peer != "" {
		role, app := "server", fmt.Sprintf("rxe.role=server rxe.ip=%s rxe.runs=1 rxe.gid=%d", PeerIP, rxepair.GIDIPv4)
		if cfg.Reverse {
			role, app = "client", fmt.Sprintf("rxe.role=client rxe.ip=%s rxe.peer=%s rxe.runs=1 rxe.gid=%d", PeerIP, HostIP, rxepair.GIDIPv4)
		}
		bcfg := guestvm.Config{Name: "hostnic-b", QEMU: cfg.QEMU, Kernel: cfg.Kernel, Initrd: cfg.Initrd,
			SMP: 1, HugePages: 1, Run: "perftest", Args: peerJobs, Append: app,
			ExtraQEMUArgs: rxepair.DgramNIC(p2, p1, rxepair.ClientMAC)}
		if gb, err = guestvm.Boot(ctx, bcfg); err != nil {
			return out, fmt.Errorf("boot guest B: %w", err)
		}
		defer gb.Close()
		progress("guest B (perftest %s) booting", role)
	}

	var wg sync.WaitGroup
	var berr error
	if gb != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out.Peer, berr = gb.WaitResult(ctx)
			out.PeerTime = time.Since(start)
			if berr != nil {
				// Guest A's clients would wait for a peer that is gone.
				ga.Kill()
			}
		}()
	}
	ares, aerr := ga.WaitResult(ctx)
	out.HostTime = time.Since(start)
	if aerr != nil && gb != nil {
		gb.Kill()
	}
	wg.Wait()
	out.HostInit = ga.InitTime()
	out.Log = ga.Log()
	if gb != nil {
		out.PeerInit = gb.InitTime()
		out.Log += gb.Log()
	}
	var derr error
	for _, r := range ares {
		var jr JobResult
		if err := json.Unmarshal(r.Raw, &jr); err != nil || jr.Role != ResultRole {
			derr = errors.Join(derr, fmt.Errorf("guest A: result %s: %v", r.Raw, err))
			continue
		}
		out.Results = append(out.Results, jr)
	}
	if cfg.Reverse && gb != nil {
		for i := range out.Results {
			if i < len(out.Peer) && out.Results[i].Op != "kill" && !out.Results[i].Local {
				g := out.Peer[i].GBytesPerS * 8
				out.Results[i].PeerGbitsPerS, out.Results[i].GbitsPerS, out.Results[i].GBytesPerS = g, g, g/8
			}
		}
	}
	if aerr != nil {
		return out, fmt.Errorf("guest A: %w", aerr)
	}
	if berr != nil {
		return out, fmt.Errorf("guest B: %w", berr)
	}
	if derr != nil {
		return out, derr
	}
	want := len(peerJobs) + len(cfg.LocalJobs)
	if cfg.KillJob != "" {
		want++
	}
	if len(out.Results) != want {
		return out, fmt.Errorf("guest A: %d results, want %d", len(out.Results), want)
	}
	if cfg.Reverse && !cfg.Local && len(out.Peer) != len(peerJobs) {
		return out, fmt.Errorf("guest B: %d perftest results, want %d", len(out.Peer), len(peerJobs))
	}
	for _, r := range out.Results {
		if !r.Verified {
			return out, fmt.Errorf("%s: not verified: %s", r.Job, r.Error)
		}
	}
	return out, nil
}
