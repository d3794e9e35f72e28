package main

import (
	"bufio"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// opened is one device the restart run opened, over a Go front-end that
// the test reconnects as QEMU's chardev would. The run's close of it
// waits for release, so it never races the test's Reconnect.
type opened struct {
	f       *frontend.Frontend
	release chan struct{}
}

// restartEnv is an env whose opens go to an in-process daemon's socket and
// are handed to the test on a channel.
func restartEnv(sock string, in io.Reader, out io.Writer, opens chan<- opened) *env {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return &env{stdin: in, stdout: out, log: logrus.NewEntry(l),
		open: func(string, *logrus.Entry) (*verbs.Context, func(), error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, f, err := frontend.OpenRDMA(ctx, sock, 64<<20)
			if err != nil {
				return nil, nil, err
			}
			o := opened{f: f, release: make(chan struct{})}
			opens <- o
			return c, func() { <-o.release; c.Close(); f.Close() }, nil
		}}
}

func startRestartDaemon(t *testing.T, sock string) *daemon.Daemon {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	if _, err := d.AddDevice(daemon.DeviceSpec{ID: "r", Socket: sock}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestRestart runs the restart mode against a daemon that is closed and
// started again twice on the same socket while the front-end reconnects,
// and checks the order of the events the guest reports and that the
// recovered objects live on the new daemon.
func TestRestart(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	d := startRestartDaemon(t, sock)
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	defer inW.Close()
	opens := make(chan opened, 4)
	const rounds = 2
	errc := make(chan error, 1)
	go func() {
		errc <- restartEnv(sock, inR, outW, opens).run([]string{"restart", "--rounds", "2", "--timeout", "30s", "--ack"})
		outW.Close()
	}()
	lines := make(chan guestresult.Restart, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), guestresult.Prefix+" ")
			if !ok {
				t.Errorf("unexpected line %q", sc.Text())
				continue
			}
			var r guestresult.Restart
			if err := guestresult.Decode(rest, &r); err != nil {
				t.Errorf("line %q: %v", rest, err)
				continue
			}
			lines <- r
		}
	}()
	next := func(event string, round int) guestresult.Restart {
		t.Helper()
		select {
		case r, ok := <-lines:
			if !ok {
				t.Fatalf("output ended before %s of round %d: %v", event, round, <-errc)
			}
			if r.Role != "restart" || r.Event != event || r.Round != round {
				t.Fatalf("got %+v, want %s of round %d", r, event, round)
			}
			return r
		case <-time.After(60 * time.Second):
			t.Fatalf("no %s of round %d", event, round)
		}
		return guestresult.Restart{}
	}
	ready := next("ready", 0)
	if !ready.Verified || len(ready.QPs) != 2 {
		t.Fatalf("ready: got %+v, want verified traffic on 2 QPs", ready)
	}
	cur := <-opens
	for r := 1; r <= rounds; r++ {
		// The daemon dies (everything it held is released) and a new one
		// serves the same socket; the front-end reconnects.
		d.Close()
		d = startRestartDaemon(t, sock)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cur.f.Reconnect(ctx)
		cancel()
		close(cur.release)
		if err != nil {
			t.Fatalf("round %d: reconnect: %v", r, err)
		}
		next("device_fatal", r)
		nf := next("not_found", r)
		if nf.Command != abi.CmdQueryQP.String() || nf.Answer != "NOT_FOUND" {
			t.Errorf("round %d: got %s answering %s, want QUERY_QP answering NOT_FOUND", r, nf.Command, nf.Answer)
		}
		next("reset", r)
		cur = <-opens
		rec := next("recovered", r)
		if !rec.Verified || len(rec.QPs) != 2 {
			t.Errorf("round %d: recovered %+v, want verified traffic on 2 QPs", r, rec)
		}
		// The recovered objects live on the new daemon; the run waits
		// for VRDMA-NEXT before it goes on.
		dv, ok := d.Device("r")
		if !ok {
			t.Fatal("device gone from the new daemon")
		}
		if info := dv.Info(); !info.Connected || info.QPs != 2 || info.MRs != 2 || info.BytesMoved == 0 {
			t.Errorf("round %d: new daemon has %+v, want connected with 2 QPs, 2 MRs and bytes moved", r, info)
		}
		if r == rounds {
			close(cur.release)
		}
		if _, err := io.WriteString(inW, "noise\n"+lineNext+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if r, ok := <-lines; ok {
		t.Errorf("line after the last round: %+v", r)
	}
}

// TestRestartNoEvent: without a restart there is no DEVICE_FATAL, and the
// run fails at its deadline after reporting ready.
func TestRestartNoEvent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	startRestartDaemon(t, sock)
	var out strings.Builder
	opens := make(chan opened, 1)
	e := restartEnv(sock, nil, &out, opens)
	go func() { close((<-opens).release) }()
	err := e.run([]string{"restart", "--timeout", "1s"})
	if err == nil || !strings.Contains(err.Error(), "no DEVICE_FATAL") {
		t.Fatalf("got %v, want a missing DEVICE_FATAL", err)
	}
	if !strings.Contains(out.String(), `"event":"ready"`) || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("output %q, want only the ready line", out.String())
	}
}

func TestRestartFlags(t *testing.T) {
	for _, args := range [][]string{
		{"restart", "--rounds", "0"},
		{"restart", "--rounds", "1001"},
		{"restart", "--timeout", "0s"},
		{"restart", "--timeout", "25h"},
		{"restart", "--op", "write"},
	} {
		e := &env{stdout: io.Discard, log: logrus.NewEntry(logrus.New()),
			open: func(string, *logrus.Entry) (*verbs.Context, func(), error) {
				t.Fatalf("%q opened the device", args)
				return nil, nil, nil
			}}
		if err := e.run(args); err == nil {
			t.Errorf("%q: got nil error, want one", args)
		}
	}
}
