package hostniclab

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
)

// Lines a client process prints on its standard output for the agent.
const (
	// PrefixClient starts the client's one result line (ClientResult).
	PrefixClient = "HOSTNIC-CLIENT"
	// PrefixRunning says the client's test has started (ClientSpec.Running).
	PrefixRunning = "HOSTNIC-RUNNING"
)

// ClientSpec is one vrdma client process: a virtio-user front-end on a
// vrdmad device socket playing one perftest job (roceinterop's Serve or
// Client) against a peer.
type ClientSpec struct {
	// Socket is the device's vhost-user socket.
	Socket string `json:"socket"`
	// Role is perftest's role of this side: "client" (it dials Addr) or
	// "server" (it listens on Addr).
	Role string `json:"role"`
	// Job is roceinterop's OP:SIZE:ITERS.
	Job string `json:"job"`
	// Addr is the perftest exchange's TCP address, host:port.
	Addr string `json:"addr"`
	// Local is this host's IPv4 address: the device's GID table must hold
	// its IPv4-mapped GID (found with QUERY_GID).
	Local string `json:"local"`
	// Seed varies the initial content of the memory (roceinterop.Fill).
	Seed byte `json:"seed"`
	// Memory is the front-end's memory in bytes; zero means
	// DefaultClientMemory.
	Memory uint64 `json:"memory,omitempty"`
	// RDMADev, when set, is the kernel RDMA device whose resources the
	// client lists once its job is done, while its objects still exist.
	RDMADev string `json:"rdma_dev,omitempty"`
	// PerftestPeer says the peer is Debian's perftest: the memory checks
	// that know the peer's content (Expect) cannot run, weaker ones do.
	PerftestPeer bool `json:"perftest_peer,omitempty"`
	// Running makes the client print PrefixRunning shortly after its test
	// started (the kill scenario's signal).
	Running bool `json:"running,omitempty"`
	// Account, when set, makes a client (the requester) sample vrdmad
	// around its test (ClientResult.Window).
	Account *Account `json:"account,omitempty"`
}

// DefaultClientMemory is a client's front-end memory when the spec names
// none: room for a job's buffer (roceinterop.MaxJobBytes) and the rings.
const DefaultClientMemory = 96 << 20

// ClientResult is what a client process reports.
type ClientResult struct {
	Role string `json:"role"`
	Job  string `json:"job"`
	// GIDIndex is the index of the Local GID in the device's table.
	GIDIndex int `json:"gid_index"`
	// QPN, RKey and VAddr are what this side advertised; the Peer's the
	// other side's.
	QPN       uint32 `json:"qpn"`
	RKey      uint32 `json:"rkey"`
	VAddr     uint64 `json:"vaddr"`
	PeerQPN   uint32 `json:"peer_qpn"`
	PeerRKey  uint32 `json:"peer_rkey"`
	PeerVAddr uint64 `json:"peer_vaddr"`
	// PeerVersion is the peer's perftest version string.
	PeerVersion string `json:"peer_version,omitempty"`
	// Gbits is the requester's rate (zero for a server); ElapsedS its
	// test's time.
	Gbits    float64 `json:"gbits_per_s"`
	ElapsedS float64 `json:"elapsed_s"`
	// Checks are what this side verified.
	Checks []string `json:"checks,omitempty"`
	// MemLen and MemSHA256 describe the registered memory after the job.
	MemLen    int    `json:"mem_len"`
	MemSHA256 string `json:"mem_sha256"`
	Seed      byte   `json:"seed"`
	// During is RDMADev's resources while this client's objects exist.
	During *Resources `json:"during,omitempty"`
	// Window is what vrdmad spent over the test (ClientSpec.Account).
	Window *Window `json:"window,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// RunClient runs spec and writes its result line to out (also on
// failure, with Error set); the error is the failure.
func RunClient(ctx context.Context, spec ClientSpec, out io.Writer) error {
	res := ClientResult{Role: spec.Role, Job: spec.Job, Seed: spec.Seed, GIDIndex: -1}
	err := runClient(ctx, spec, out, &res)
	if err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(out, "%s %s\n", PrefixClient, b)
	return err
}

func runClient(ctx context.Context, spec ClientSpec, out io.Writer, res *ClientResult) error {
	job, err := roceinterop.ParseJob(spec.Job)
	if err != nil {
		return err
	}
	local, err := netip.ParseAddr(spec.Local)
	if err != nil {
		return fmt.Errorf("local address: %w", err)
	}
	if spec.Role != "client" && spec.Role != "server" {
		return fmt.Errorf("role %q: want client or server", spec.Role)
	}
	mem := spec.Memory
	if mem == 0 {
		mem = DefaultClientMemory
	}
	dev, err := roceinterop.OpenDevice(ctx, spec.Socket, local, mem)
	if err != nil {
		return err
	}
	defer dev.Close()
	dev.Seed = spec.Seed
	res.GIDIndex = dev.GIDIndex
	var from sample
	var ferr error
	account := spec.Account != nil && spec.Role == "client"
	dev.OnTest = func(*roceinterop.Run) {
		if account {
			// Before the first post.
			from, ferr = spec.Account.take(ctx, true)
		}
		if spec.Running {
			go func() {
				time.Sleep(300 * time.Millisecond)
				fmt.Fprintln(out, PrefixRunning)
			}()
		}
	}
	conn, err := exchangeConn(ctx, spec)
	if err != nil {
		return err
	}
	var r *roceinterop.Run
	if spec.Role == "server" {
		r, err = roceinterop.Serve(ctx, dev, conn, job)
	} else {
		r, err = roceinterop.Client(ctx, dev, conn, job)
	}
	if account && err == nil && ferr == nil {
		// After the last completion (and the local checks, which post
		// nothing), before the QP goes.
		to, terr := spec.Account.take(ctx, false)
		if terr != nil {
			ferr = terr
		} else {
			w := window(from, to)
			w.Memcpy64Ns, w.GetppidNs = Calibrate()
			res.Window = &w
		}
	}
	conn.Close()
	if r == nil {
		return err
	}
	defer r.Close()
	if err == nil && ferr != nil {
		return fmt.Errorf("account vrdmad's CPU: %w", ferr)
	}
	res.QPN, res.RKey, res.VAddr = r.Mine.QPN, r.Mine.RKey, r.Mine.VAddr
	res.PeerQPN, res.PeerRKey, res.PeerVAddr = r.Peer.QPN, r.Peer.RKey, r.Peer.VAddr
	res.PeerVersion, res.Gbits, res.ElapsedS = r.Version, r.Gbits(), r.Elapsed.Seconds()
	res.Checks = r.Local
	m := r.Memory()
	sum := sha256.Sum256(m)
	res.MemLen, res.MemSHA256 = len(m), hex.EncodeToString(sum[:])
	if spec.RDMADev != "" {
		// The run's PD, CQ, QP and MR still exist.
		rs, lerr := ShowResources(ctx, spec.RDMADev)
		if lerr != nil {
			return errors.Join(err, lerr)
		}
		res.During = &rs
	}
	if err != nil {
		return err
	}
	if spec.PerftestPeer {
		c, err := checkAgainstPerftest(job, spec.Role, spec.Seed, m)
		if err != nil {
			return err
		}
		if c != "" {
			res.Checks = append(res.Checks, c)
		}
	}
	return nil
}

// exchangeConn is the perftest exchange's connection: a server accepts
// one, a client dials, retrying while the server is not listening yet.
func exchangeConn(ctx context.Context, spec ClientSpec) (net.Conn, error) {
	if spec.Role == "server" {
		ln, err := net.Listen("tcp4", spec.Addr)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		go func() { <-ctx.Done(); ln.Close() }()
		return ln.Accept()
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp4", spec.Addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial perftest server %s: %w", spec.Addr, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkAgainstPerftest checks what a run against Debian's perftest left
// in our memory (mem, initially roceinterop.Fill(seed, ·)), whose content
// perftest makes random: as a write_bw server the first message's bytes
// changed and nothing else did (perftest writes every message to the
// address we advertised); as a send_bw server each receive's slot changed
// and nothing past them; as an atomic_bw server only whole 8-byte words
// changed, at most one per FETCH_ADD; as a read_bw client the bytes READ
// are not our own.
func checkAgainstPerftest(job roceinterop.Job, role string, seed byte, mem []byte) (string, error) {
	init := make([]byte, len(mem))
	for i := range init {
		init[i] = roceinterop.Fill(seed, i)
	}
	differ := func(a, b []byte) int {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return n
	}
	// mostly: perftest's random bytes equal ours one time in 256.
	mostly := func(n, of int) bool { return n >= of/2 }
	switch {
	case role == "server" && job.Op == pftexchange.WriteBW:
		n := differ(mem[:job.Size], init[:job.Size])
		if !mostly(n, job.Size) {
			return "", fmt.Errorf("%s: only %d of the %d bytes at our advertised address changed", job, n, job.Size)
		}
		if !bytes.Equal(mem[job.Size:], init[job.Size:]) {
			return "", fmt.Errorf("%s: bytes beyond the first message changed", job)
		}
		return fmt.Sprintf("the WRITEs landed at our advertised address (%d of %d bytes new), nothing beyond", n, job.Size), nil
	case role == "server" && job.Op == pftexchange.SendBW:
		for k := range job.Iters {
			s := mem[k*job.Size : (k+1)*job.Size]
			if n := differ(s, init[k*job.Size:(k+1)*job.Size]); !mostly(n, job.Size) {
				return "", fmt.Errorf("%s: receive %d: only %d of %d bytes changed", job, k, n, job.Size)
			}
		}
		if end := job.Iters * job.Size; !bytes.Equal(mem[end:], init[end:]) {
			return "", fmt.Errorf("%s: bytes beyond the receives changed", job)
		}
		return fmt.Sprintf("every receive's %d bytes are new, nothing beyond", job.Size), nil
	case role == "server" && job.Op == pftexchange.AtomicBW:
		words := 0
		for w := 0; w+8 <= len(mem); w += 8 {
			if !bytes.Equal(mem[w:w+8], init[w:w+8]) {
				words++
			}
		}
		if words == 0 || words > job.Iters {
			return "", fmt.Errorf("%s: %d words changed, want 1..%d", job, words, job.Iters)
		}
		return fmt.Sprintf("FETCH_ADDs changed %d whole words", words), nil
	case role == "client" && job.Op == pftexchange.ReadBW:
		if n := differ(mem[:job.Size], init[:job.Size]); !mostly(n, job.Size) {
			return "", fmt.Errorf("%s: the READs brought our own bytes (%d of %d differ)", job, n, job.Size)
		}
		return "the READs brought the peer's bytes, not ours", nil
	}
	return "", nil
}
