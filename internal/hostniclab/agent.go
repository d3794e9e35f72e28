package hostniclab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// The names of vrdma-vmtest's hidden subcommands that run inside guest A.
const (
	// AgentCommand runs RunAgent with the spec file named by its argument.
	AgentCommand = "hostnic-agent"
	// ClientCommand runs RunClient with the spec (JSON) given as its
	// argument.
	ClientCommand = "hostnic-client"
)

// ResultRole is the role of the agent's VRDMA-RESULT lines.
const ResultRole = "hostnic"

// Seeds of the two sides of a local pair (roceinterop.Fill): different,
// so that a SEND or WRITE of one side's bytes shows in the other's.
const (
	seedServer byte = 0x5a
	seedClient byte = 0xa5
)

// AgentSpec is what the agent in guest A runs; the host writes it as
// /extra/spec.json.
type AgentSpec struct {
	// Vrdmad is the vrdmad binary; VrdmadArgs its RNIC's arguments
	// (--rnic verbs:rxe0, or --roce-bind ADDR for the soft RNIC).
	Vrdmad     string   `json:"vrdmad"`
	VrdmadArgs []string `json:"vrdmad_args"`
	// RNIC is the name the results carry ("soft", "verbs:rxe0").
	RNIC string `json:"rnic"`
	// RDMADev is the kernel RDMA device whose objects the agent counts
	// (rxe0); empty when guest A has none (the soft RNIC).
	RDMADev string `json:"rdma_dev,omitempty"`
	// Local is guest A's eth0 address; Peer guest B's (empty: local
	// pairs only).
	Local string `json:"local"`
	Peer  string `json:"peer,omitempty"`
	// Jobs are roceinterop's OP:SIZE:ITERS, run in order.
	Jobs []string `json:"jobs"`
	// Reverse: perftest in guest B is the requester (its client), the
	// vrdma side serves.
	Reverse bool `json:"reverse,omitempty"`
	// LocalPair runs each job between two vrdma devices of the vrdmad
	// (hn0 the requester, hn1 the server) through its RNIC instead of
	// against guest B.
	LocalPair bool `json:"local_pair,omitempty"`
	// KillJob, when set, is the kill scenario's job (a local pair whose
	// client gets SIGKILL mid-transfer).
	KillJob string `json:"kill_job,omitempty"`
	// ClientMemory is each client's front-end memory (0: the default).
	ClientMemory uint64 `json:"client_memory,omitempty"`
	// Settle bounds the wait for vrdmad's cleanup after a client ends
	// (0: DefaultSettle).
	Settle time.Duration `json:"settle,omitempty"`
	// Plain, with Reverse and a verbs RNIC, serves every job twice, in
	// the order plain, vrdma, vrdma, plain, plain, … (so that a drift
	// over the run weighs on both alike): once by Debian's perftest on
	// RDMADev in guest A itself, without vrdma (the NIC's own figure),
	// once by the vrdma client. Guest B's perftest runs each job twice.
	Plain bool `json:"plain,omitempty"`
	// LocalJobs run after Jobs between two vrdma devices of the vrdmad
	// (as LocalPair's), in the same boot.
	LocalJobs []string `json:"local_jobs,omitempty"`
	// Account makes vrdmad serve its metrics on a unix socket and every
	// vrdma requester account what vrdmad spent over its test
	// (JobResult.Window): vrdmad's CPU time and the NIC's posts.
	Account bool `json:"account,omitempty"`
}

// DefaultSettle bounds the wait, after a client process ended, for the
// RNIC's objects to go (vrdmad tears a device's objects down when its
// front-end's connection drops).
const DefaultSettle = 20 * time.Second

// JobResult is one VRDMA-RESULT line of the agent (role ResultRole).
type JobResult struct {
	Role  string `json:"role"`
	Op    string `json:"op"` // write, read, send, atomic, write_imm, kill
	Job   string `json:"job"`
	Size  uint64 `json:"size"`
	Iters int    `json:"iters"`
	Bytes int64  `json:"bytes"`
	// GbitsPerS is the requester's rate: the vrdma client's own clock, or
	// (Reverse) zero here: the host fills in perftest's figure.
	GbitsPerS  float64 `json:"gbits_per_s"`
	GBytesPerS float64 `json:"gbytes_per_s"`
	// PeerGbitsPerS is perftest's own figure (--report_gbits) when guest
	// B ran its client (Reverse); the host sets it, and GbitsPerS to it.
	PeerGbitsPerS float64 `json:"perftest_gbits_per_s,omitempty"`
	Verified      bool    `json:"verified"`
	RNIC          string  `json:"rnic"`
	Reverse       bool    `json:"reverse"`
	Local         bool    `json:"local"`
	// The vrdma side's advertised QP, rkey and address (the server's in a
	// local pair) and its peer's.
	GIDIndex  int    `json:"gid_index"`
	QPN       uint32 `json:"qpn"`
	RKey      uint32 `json:"rkey"`
	VAddr     uint64 `json:"vaddr"`
	PeerQPN   uint32 `json:"peer_qpn"`
	PeerRKey  uint32 `json:"peer_rkey"`
	PeerVAddr uint64 `json:"peer_vaddr"`
	// The RDMA device's objects: before vrdmad started (the baseline),
	// with vrdmad's devices up before the first client (idle: what vrdmad
	// holds of its own, such as its device context), while the client's
	// objects existed (with the MR listing), after it closed (or was
	// killed) and vrdmad cleaned up (must be idle again; after vrdmad
	// stopped, the baseline).
	Baseline Counts     `json:"baseline,omitempty"`
	Idle     Counts     `json:"idle,omitempty"`
	During   *Resources `json:"during,omitempty"`
	AtKill   Counts     `json:"at_kill,omitempty"` // just before the SIGKILL
	After    Counts     `json:"after,omitempty"`
	// Daemon is vrdmad's own count of the devices' objects after the job
	// ("pds 0 mrs 0 cqs 0 qps 0").
	Daemon string `json:"daemon,omitempty"`
	// Plain says Debian's perftest served the job on the RDMA device,
	// without vrdma (AgentSpec.Plain).
	Plain bool `json:"plain,omitempty"`
	// Window is what vrdmad spent over the requester's test
	// (AgentSpec.Account; a vrdma requester only).
	Window *Window  `json:"window,omitempty"`
	Checks []string `json:"checks,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// ShortOp is the subcommand's name of a job's op: write_bw → write,
// write_imm_bw → write_imm.
func ShortOp(op pftexchange.Op) string {
	return strings.TrimSuffix(string(op), "_bw")
}

// agent is one run of RunAgent.
type agent struct {
	spec     AgentSpec
	self     string // this executable
	stderr   io.Writer
	d        *vrdmadproc.Proc
	metrics  string // vrdmad's metrics socket (Account)
	baseline Counts // the RDMA device's objects before vrdmad started
	idle     Counts // and with vrdmad's devices up, before any client
	devices  []string
}

// RunAgent is guest A's part: it counts RDMADev's objects, starts
// vrdmad, runs each job with client processes (this executable's
// ClientCommand), checks what the clients verified and that nothing of
// theirs stays on the RNIC or in vrdmad after they ended, runs the kill
// scenario, stops vrdmad, and prints one VRDMA-RESULT line per job on
// stdout. Progress goes to stderr. It fails when any job failed.
func RunAgent(ctx context.Context, spec AgentSpec, stdout, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if spec.Settle == 0 {
		spec.Settle = DefaultSettle
	}
	a := &agent{spec: spec, self: self, stderr: stderr, devices: []string{"hn0"}}
	if spec.LocalPair || spec.KillJob != "" || len(spec.LocalJobs) > 0 {
		a.devices = append(a.devices, "hn1")
	}
	vargs := spec.VrdmadArgs
	if spec.Account {
		dir, err := os.MkdirTemp("", "hostnic-metrics-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		a.metrics = filepath.Join(dir, "metrics.sock")
		vargs = append(slices.Clip(vargs), "--metrics", "unix:"+a.metrics)
	}
	if spec.RDMADev != "" {
		rs, err := ShowResources(ctx, spec.RDMADev)
		if err != nil {
			return err
		}
		a.baseline = rs.Counts
		fmt.Fprintf(stderr, "hostnic: %s before vrdmad: %s\n", spec.RDMADev, a.baseline)
	}
	start := time.Now()
	a.d, err = vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: spec.Vrdmad, Devices: a.devices,
		StateDir: vrdmadproc.NoState, Args: vargs, ReadyTimeout: 90 * time.Second})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "hostnic: vrdmad %s up in %.1f s with devices %v\n", strings.Join(spec.VrdmadArgs, " "),
		time.Since(start).Seconds(), a.devices)
	if spec.RDMADev != "" {
		rs, err := ShowResources(ctx, spec.RDMADev)
		if err != nil {
			a.d.Stop()
			return err
		}
		a.idle = rs.Counts
		fmt.Fprintf(stderr, "hostnic: %s with vrdmad's devices up: %s\n", spec.RDMADev, a.idle)
	}
	var errs []error
	emit := func(r JobResult, err error) {
		if err != nil {
			r.Error = err.Error()
			errs = append(errs, fmt.Errorf("%s: %w", r.Job, err))
		}
		r.Verified = err == nil && r.Verified
		guestresult.Write(stdout, r)
	}
	for i, s := range spec.Jobs {
		if !spec.Plain {
			emit(a.job(ctx, s, spec.LocalPair))
			continue
		}
		if i%2 == 0 {
			emit(a.plain(ctx, s))
			emit(a.job(ctx, s, false))
		} else {
			emit(a.job(ctx, s, false))
			emit(a.plain(ctx, s))
		}
	}
	for _, s := range spec.LocalJobs {
		emit(a.job(ctx, s, true))
	}
	if spec.KillJob != "" {
		r, err := a.kill(ctx, spec.KillJob)
		emit(r, err)
	}
	if err := a.d.Stop(); err != nil {
		errs = append(errs, err)
	} else if len(errs) > 0 {
		fmt.Fprintf(stderr, "=== vrdmad log ===\n%s", a.d.Log())
	}
	if spec.RDMADev != "" {
		if c, err := a.settled(ctx, a.baseline); err != nil {
			errs = append(errs, fmt.Errorf("after vrdmad stopped: %w", err))
		} else {
			fmt.Fprintf(stderr, "hostnic: %s after vrdmad stopped: %s\n", spec.RDMADev, c)
		}
	}
	return errors.Join(errs...)
}

// result is a JobResult's common part.
func (a *agent) result(job roceinterop.Job) JobResult {
	return JobResult{Role: ResultRole, Op: ShortOp(job.Op), Job: job.String(), Size: uint64(job.Size), Iters: job.Iters,
		Bytes: job.Bytes(), RNIC: a.spec.RNIC, Reverse: a.spec.Reverse && !a.spec.LocalPair, Local: a.spec.LocalPair,
		Baseline: a.baseline, Idle: a.idle, GIDIndex: -1}
}

// exchangeAddr is the perftest exchange's address on host.
func exchangeAddr(host string) string {
	return net.JoinHostPort(host, strconv.Itoa(pftexchange.Port))
}

// job runs one job: against guest B's perftest, or as a local pair.
func (a *agent) job(ctx context.Context, s string, local bool) (JobResult, error) {
	job, err := roceinterop.ParseJob(s)
	if err != nil {
		return JobResult{Role: ResultRole, Job: s}, err
	}
	res := a.result(job)
	res.Local = local
	res.Reverse = res.Reverse && !local
	fmt.Fprintf(a.stderr, "hostnic: %s (rnic %s, %s)\n", job, a.spec.RNIC, a.mode(local))
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var mine ClientResult
	if local {
		srv, cli, err := a.pair(ctx, job, false, nil)
		if err != nil {
			return res, err
		}
		sSum, cSum, err := Expect(job, srv, cli)
		if err != nil {
			return res, err
		}
		if srv.MemSHA256 != sSum || cli.MemSHA256 != cSum {
			return res, fmt.Errorf("memory after the job: server %s, want %s; client %s, want %s",
				srv.MemSHA256, sSum, cli.MemSHA256, cSum)
		}
		for _, side := range []struct {
			name   string
			checks []string
		}{{"server", srv.Checks}, {"client", cli.Checks}} {
			if len(side.checks) > 0 {
				res.Checks = append(res.Checks, side.name+": "+strings.Join(side.checks, "; "))
			}
		}
		res.Checks = append(res.Checks, "both memories are what the op must leave (SHA-256 of each matches the model)")
		mine = srv
		res.GbitsPerS = cli.Gbits
		res.During = cli.During
		res.Window = cli.Window
	} else {
		spec := ClientSpec{Socket: a.d.Socket("hn0"), Role: "client", Job: job.String(), Addr: exchangeAddr(a.spec.Peer),
			Local: a.spec.Local, Memory: a.spec.ClientMemory, RDMADev: a.spec.RDMADev, PerftestPeer: true}
		if a.spec.Reverse {
			spec.Role, spec.Addr = "server", exchangeAddr(a.spec.Local)
		} else {
			spec.Account = a.account()
		}
		c, err := a.client(ctx, spec, nil)
		if err != nil {
			return res, err
		}
		mine = c
		res.Window = c.Window
		res.Checks = c.Checks
		res.GbitsPerS = c.Gbits
		res.During = c.During
	}
	res.GIDIndex, res.QPN, res.RKey, res.VAddr = mine.GIDIndex, mine.QPN, mine.RKey, mine.VAddr
	res.PeerQPN, res.PeerRKey, res.PeerVAddr = mine.PeerQPN, mine.PeerRKey, mine.PeerVAddr
	res.GBytesPerS = res.GbitsPerS / 8
	if err := a.checkDuring(&res); err != nil {
		return res, err
	}
	if err := a.cleanedUp(ctx, &res); err != nil {
		return res, err
	}
	res.Verified = true
	return res, nil
}

func (a *agent) mode(local bool) string {
	switch {
	case local:
		return "two vrdma devices"
	case a.spec.Reverse:
		return "perftest is the requester"
	}
	return "vrdma is the requester"
}

// checkDuring checks the listing taken while the client's objects
// existed: with the verbs RNIC they are the NIC's, so the device holds
// more MRs and QPs than before vrdmad; with the soft RNIC the NIC holds
// nothing of vrdma's (there is no NIC in guest A then).
func (a *agent) checkDuring(res *JobResult) error {
	if a.spec.RDMADev == "" || res.During == nil {
		return nil
	}
	up := res.During.Counts.Above(a.idle)
	if strings.HasPrefix(a.spec.RNIC, "verbs") {
		c := res.During.Counts
		if c["mr"] <= a.idle["mr"] || c["qp"] <= a.idle["qp"] {
			return fmt.Errorf("while the client ran, %s held %s (%s before it): no MR or QP of vrdma's", a.spec.RDMADev, c, a.idle)
		}
	}
	res.Checks = append(res.Checks, fmt.Sprintf("%s while the client's objects existed: %s (%s), %d MRs listed",
		a.spec.RDMADev, res.During.Counts, strings.Join(up, ", "), len(res.During.MRs)))
	return nil
}

// cleanedUp waits until the RDMA device holds what it held before vrdmad
// started and vrdmad's devices hold no object, within Settle.
func (a *agent) cleanedUp(ctx context.Context, res *JobResult) error {
	if a.spec.RDMADev != "" {
		c, err := a.settled(ctx, a.idle)
		res.After = c
		if err != nil {
			return err
		}
		res.Checks = append(res.Checks, fmt.Sprintf("%s after the client ended: %s, as before the first client", a.spec.RDMADev, c))
	}
	s, err := a.daemonEmpty(ctx)
	res.Daemon = s
	if err != nil {
		return err
	}
	res.Checks = append(res.Checks, "vrdmad's devices hold no object: "+s)
	return nil
}

// settled polls the RDMA device's counts until they equal want, for up
// to Settle.
func (a *agent) settled(ctx context.Context, want Counts) (Counts, error) {
	deadline := time.Now().Add(a.spec.Settle)
	for {
		rs, err := ShowResources(ctx, a.spec.RDMADev)
		if err != nil {
			return nil, err
		}
		if rs.Counts.Equal(want) {
			return rs.Counts, nil
		}
		if time.Now().After(deadline) {
			return rs.Counts, fmt.Errorf("%s still holds %s, want %s (%s left behind)\n%s", a.spec.RDMADev, rs.Counts,
				want, strings.Join(rs.Counts.Above(want), ", "), strings.Join(rs.MRs, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// daemonEmpty polls vrdmad's control API until no device holds a PD, MR,
// CQ or QP, for up to Settle.
func (a *agent) daemonEmpty(ctx context.Context) (string, error) {
	deadline := time.Now().Add(a.spec.Settle)
	for {
		devs, err := a.d.Client().Devices(ctx)
		if err != nil {
			return "", fmt.Errorf("vrdmad: list devices: %w", err)
		}
		var parts []string
		busy := false
		for _, d := range devs {
			parts = append(parts, fmt.Sprintf("%s: pds %d mrs %d cqs %d qps %d", d.ID, d.PDs, d.MRs, d.CQs, d.QPs))
			busy = busy || d.PDs+d.MRs+d.CQs+d.QPs > 0
		}
		s := strings.Join(parts, ", ")
		if !busy {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("vrdmad still holds objects after the client ended: %s", s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pair runs job between two client processes on hn1 (server) and hn0
// (client). With running set, the client prints PrefixRunning and
// running is called with its process once it did (the kill scenario).
func (a *agent) pair(ctx context.Context, job roceinterop.Job, killed bool, running func(*os.Process)) (srv, cli ClientResult, err error) {
	addr := exchangeAddr(a.spec.Local)
	sspec := ClientSpec{Socket: a.d.Socket("hn1"), Role: "server", Job: job.String(), Addr: addr, Local: a.spec.Local,
		Seed: seedServer, Memory: a.spec.ClientMemory}
	cspec := ClientSpec{Socket: a.d.Socket("hn0"), Role: "client", Job: job.String(), Addr: addr, Local: a.spec.Local,
		Seed: seedClient, Memory: a.spec.ClientMemory, RDMADev: a.spec.RDMADev, Running: running != nil}
	if !killed {
		cspec.Account = a.account()
	}
	var wg sync.WaitGroup
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv, serr = a.client(ctx, sspec, nil)
	}()
	cli, cerr := a.client(ctx, cspec, running)
	wg.Wait()
	if killed {
		// Both fail: the client was killed, the server's exchange ended
		// with it.
		return srv, cli, nil
	}
	if cerr != nil {
		return srv, cli, fmt.Errorf("client: %w", cerr)
	}
	if serr != nil {
		return srv, cli, fmt.Errorf("server: %w", serr)
	}
	return srv, cli, nil
}

// client runs one client process and returns its result. running, when
// set, is called once the client printed PrefixRunning.
func (a *agent) client(ctx context.Context, spec ClientSpec, running func(*os.Process)) (ClientResult, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return ClientResult{}, err
	}
	cmd := exec.CommandContext(ctx, a.self, ClientCommand, string(b))
	cmd.Stderr = a.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return ClientResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return ClientResult{}, err
	}
	var res ClientResult
	var found bool
	var perr error
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == PrefixRunning && running != nil:
			running(cmd.Process)
		case strings.HasPrefix(line, PrefixClient+" "):
			found = true
			perr = json.Unmarshal([]byte(strings.TrimPrefix(line, PrefixClient+" ")), &res)
		default:
			fmt.Fprintf(a.stderr, "hostnic %s: %s\n", spec.Role, line)
		}
	}
	werr := cmd.Wait()
	switch {
	case perr != nil:
		return res, fmt.Errorf("%s result: %w", spec.Role, perr)
	case res.Error != "":
		return res, errors.New(res.Error)
	case werr != nil:
		return res, fmt.Errorf("%s process: %w", spec.Role, werr)
	case !found:
		return res, fmt.Errorf("%s process printed no result", spec.Role)
	}
	return res, nil
}

// kill is the kill scenario: a local pair runs job, the client process
// gets SIGKILL once its test runs, and within Settle the RNIC and vrdmad
// must hold nothing of it (nor of the server, which ends with the
// exchange); then a small job on the same devices must pass.
func (a *agent) kill(ctx context.Context, s string) (JobResult, error) {
	job, err := roceinterop.ParseJob(s)
	if err != nil {
		return JobResult{Role: ResultRole, Op: "kill", Job: s}, err
	}
	res := a.result(job)
	res.Op, res.Local, res.Reverse = "kill", true, false
	fmt.Fprintf(a.stderr, "hostnic: kill scenario: %s between two vrdma devices, SIGKILL to the requester mid-transfer\n", job)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var killedAt time.Time
	_, cli, _ := a.pair(ctx, job, true, func(p *os.Process) {
		if !killedAt.IsZero() {
			return
		}
		// What the RNIC holds mid-transfer, just before the kill.
		if a.spec.RDMADev != "" {
			if rs, err := ShowResources(ctx, a.spec.RDMADev); err == nil {
				res.AtKill = rs.Counts
			}
		}
		killedAt = time.Now()
		p.Signal(syscall.SIGKILL)
	})
	if killedAt.IsZero() {
		return res, fmt.Errorf("the client never reached its test (result %+v)", cli)
	}
	if cli.MemSHA256 != "" {
		return res, fmt.Errorf("the client finished before the kill: make the kill job longer")
	}
	res.Checks = append(res.Checks, "the requester got SIGKILL with its QP in RTS, posting")
	if a.spec.RDMADev != "" && res.AtKill != nil {
		res.Checks = append(res.Checks, fmt.Sprintf("%s just before the kill: %s", a.spec.RDMADev, res.AtKill))
		if strings.HasPrefix(a.spec.RNIC, "verbs") && res.AtKill["qp"] <= a.idle["qp"] {
			return res, fmt.Errorf("at the kill %s held %s (%s before it): no QP of vrdma's", a.spec.RDMADev, res.AtKill, a.idle)
		}
	}
	if err := a.cleanedUp(ctx, &res); err != nil {
		return res, err
	}
	res.Checks = append(res.Checks, fmt.Sprintf("cleaned up within %.1f s of the kill", time.Since(killedAt).Seconds()))
	// The devices still serve a new front-end.
	after, err := roceinterop.ParseJob("write_bw:4096:16")
	if err != nil {
		return res, err
	}
	srv, cli2, err := a.pair(ctx, after, false, nil)
	if err != nil {
		return res, fmt.Errorf("a job after the kill: %w", err)
	}
	sSum, cSum, err := Expect(after, srv, cli2)
	if err != nil {
		return res, err
	}
	if srv.MemSHA256 != sSum || cli2.MemSHA256 != cSum {
		return res, fmt.Errorf("a job after the kill: memories differ from the model")
	}
	if err := a.cleanedUp(ctx, &res); err != nil {
		return res, fmt.Errorf("after the job after the kill: %w", err)
	}
	res.Checks = append(res.Checks, fmt.Sprintf("%s after the kill passed, verified", after))
	res.Verified = true
	return res, nil
}
