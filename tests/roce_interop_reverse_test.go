package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// TestRoCEInteropReverse is TestRoCEInterop the other way round: the rxe
// guest runs perftest's servers and the Go RC endpoint is the client, so
// our requester and completer face rxe's responder. Every WRITE, SEND,
// READ and FETCH_ADD completes successfully; the capture's frames have good
// ICRCs and tshark finds nothing malformed; every READ response payload
// rxe sent is what landed in Go memory; the FETCH_ADDs on the server's
// word returned consecutive values (each executed once); rxe acknowledged
// the last PSN of every WRITE and SEND run.
func TestRoCEInteropReverse(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a TCG guest")
	}
	lab := newInteropLab(t)
	var ep *udp.Endpoint
	if err := lab.h.Do(func() error {
		var err error
		ep, err = udp.Listen(udp.Config{Addr: interopGoIP, RecoverIPv4ID: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	jobs := []string{"write_bw:65536:200", "read_bw:65536:200", "atomic_bw:8:200", "send_bw:65536:200", "write_lat:64:200"}
	runs := make([]*clientRun, len(jobs))
	errs := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		for i, j := range jobs {
			op, size, iters := parseJob(j)
			conn, err := dialPerftest(ctx, lab)
			if err != nil {
				errs <- err
				return
			}
			c := &perftestClient{ep: ep, local: interopGoIP, qpn: 0x200 + uint32(i), op: op, size: size, iters: iters, version: "6.06"}
			runs[i], err = c.run(ctx, conn)
			conn.Close()
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	dump := filepath.Join(t.TempDir(), "reverse.pcap")
	start := time.Now()
	results, glog := lab.runGuest(t, "server", jobs, dump)
	if err := <-errs; err != nil {
		t.Fatalf("perftest client: %v\n%s", err, glog)
	}
	t.Logf("guest served %d jobs in %v (%d results); endpoint %+v", len(jobs), time.Since(start), len(results), ep.Counters())
	frames := readInteropCapture(t, dump)
	for i, j := range jobs {
		op, size, iters := parseJob(j)
		r := runs[i]
		var mine []rocePacket
		for _, f := range frames {
			if f.dst == interopGoIP && f.qpn == r.qp.QPN() || f.src == interopGoIP && f.qpn == r.server.QPN {
				mine = append(mine, f)
			}
		}
		if len(r.comps) != iters || r.qp.Err() {
			t.Fatalf("%s: %d completions of %d, error state %t", op, len(r.comps), iters, r.qp.Err())
		}
		t.Logf("%s: %d frames, QP %+v", op, len(mine), r.qp.Counters())
		checkReverse(t, op, size, r, mine)
	}
	tsharkClean(t, lab.tshark, dump, len(frames))
}

// dialPerftest connects from h to the guest's perftest server, retrying
// while it is not listening yet (it boots, and starts one server per job).
func dialPerftest(ctx context.Context, lab *interopLab) (net.Conn, error) {
	return lab.Dial(ctx)
}

// checkReverse checks one reverse run against the capture.
func checkReverse(t *testing.T, op string, size int, r *clientRun, frames []rocePacket) {
	var lastReq, lastAck roce.PSN
	reqs := map[roce.PSN]int{} // READ request PSN -> message index
	var order []roce.PSN
	verified := 0
	for _, f := range frames {
		p := framePacket(t, f)
		switch o := p.BTH.Opcode; {
		case f.src == interopGoIP && o <= roce.OpWriteOnlyWithImmediate:
			lastReq = p.BTH.PSN
		case f.src == interopGoIP && o == roce.OpReadRequest:
			if _, ok := reqs[p.BTH.PSN]; !ok {
				reqs[p.BTH.PSN] = len(order)
				order = append(order, p.BTH.PSN)
			}
		case f.dst == interopGoIP && o == roce.OpAcknowledge && p.AETH.Syndrome.Type() == roce.AckTypeACK:
			lastAck = p.BTH.PSN
		case f.dst == interopGoIP && o >= roce.OpReadResponseFirst && o <= roce.OpReadResponseOnly:
			found := false
			for k := len(order) - 1; k >= 0 && !found; k-- {
				d := p.BTH.PSN.Diff(order[k])
				if d >= 0 && int(d)*interopPMTU < size {
					off := reqs[order[k]]*size + int(d)*interopPMTU
					if !bytes.Equal(r.mr.Copy(off, len(p.Payload)), p.Payload) {
						t.Fatalf("read_bw: response PSN %d differs from Go memory at offset %d", p.BTH.PSN, off)
					}
					verified += len(p.Payload)
					found = true
				}
			}
			if !found {
				t.Fatalf("read_bw: response PSN %d answers no request", p.BTH.PSN)
			}
		}
	}
	switch op {
	case "write_bw", "send_bw", "write_lat":
		if lastAck != lastReq {
			t.Fatalf("%s: rxe acknowledged up to PSN %d, the last request was %d", op, lastAck, lastReq)
		}
	case "read_bw":
		if verified != len(r.comps)*size {
			t.Fatalf("read_bw: %d bytes verified, want %d", verified, len(r.comps)*size)
		}
		t.Logf("read_bw: %d bytes rxe sent verified in Go memory", verified)
	case "atomic_bw":
		first := binary.LittleEndian.Uint64(r.mr.Copy(0, 8))
		for k := range r.comps {
			if got := binary.LittleEndian.Uint64(r.mr.Copy(8*k, 8)); got != first+uint64(k) {
				t.Fatalf("atomic_bw: FETCH_ADD %d returned %d, want %d", k, got, first+uint64(k))
			}
		}
	}
}
