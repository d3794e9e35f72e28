package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/controlapi"
)

// The status protocol of an upgrade, old process's side (handover.go).

// newProc is a new vrdmad started to take over, and its status channel.
type newProc struct {
	cmd *exec.Cmd
	sc  *net.UnixConn
}

func (np *newProc) pid() int { return np.cmd.Process.Pid }

// kill ends a new process that did not take over, and reaps it.
func (np *newProc) kill() {
	np.sc.Close()
	np.cmd.Process.Kill()
	np.cmd.Wait()
}

// startNew starts binary with this process's arguments and the status
// channel as fd HandoverStatusFD, and waits until it says "waiting" (it
// has started and can take devices up) or refuses.
func startNew(binary string) (*newProc, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("status channel: %w", err)
	}
	childEnd := os.NewFile(uintptr(pair[1]), "vrdmad-handover-status")
	defer childEnd.Close()
	sc, err := unixConn(pair[0])
	if err != nil {
		return nil, fmt.Errorf("status channel: %w", err)
	}
	cmd := exec.Command(binary, os.Args[1:]...)
	cmd.Env = append(handoverEnviron(), HandoverEnv+"="+strconv.Itoa(HandoverStatusFD))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{childEnd}
	// Its own session: the new daemon outlives this one, and a signal to
	// this one's process group (a terminal's ^C) is not for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		sc.Close()
		return nil, fmt.Errorf("%w: start %s: %v", ErrRefused, binary, err)
	}
	childEnd.Close()
	np := &newProc{cmd: cmd, sc: sc}
	m, err := readStatus(sc, time.Now().Add(readyTimeout))
	switch {
	case err != nil:
		err = fmt.Errorf("%w: the new vrdmad (pid %d) did not start: %v", ErrRefused, np.pid(), err)
	case m.State == "refused":
		err = fmt.Errorf("%w: %s", ErrRefused, m.Error)
	case m.State != "waiting":
		err = fmt.Errorf("%w: the new vrdmad (pid %d) said %q", ErrRefused, np.pid(), m.State)
	}
	if err != nil {
		np.kill()
		return nil, err
	}
	return np, nil
}

// unixConn makes a *net.UnixConn of a socket descriptor (owning it).
func unixConn(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "vrdmad-handover-status")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("not a unix socket")
	}
	return uc, nil
}

// handOver sends the document (as a sealed memfd) and the descriptors,
// then runs "ready" → commit → "serving". It returns the new process's
// answer once it serves; an error before commit leaves this process
// owning the devices (the caller thaws them and kills the new one).
func (np *newProc) handOver(doc []byte, fds []int, log *logrus.Entry) (controlapi.UpgradeAnswer, error) {
	memfd, err := sealedMemfd(StoreStateName, doc)
	if err != nil {
		return controlapi.UpgradeAnswer{}, fmt.Errorf("handover state: %w", err)
	}
	defer memfd.Close()
	if err := writeStatusFDs(np.sc, statusMsg{State: "state", NumFDs: len(fds)}, []int{int(memfd.Fd())}); err != nil {
		return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: send the state: %v", ErrRefused, err)
	}
	for first := 0; first < len(fds); first += maxFDsPerMessage {
		batch := fds[first:min(first+maxFDsPerMessage, len(fds))]
		if err := writeStatusFDs(np.sc, statusMsg{State: "fds", First: first}, batch); err != nil {
			return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: send the descriptors: %v", ErrRefused, err)
		}
	}
	m, err := readStatus(np.sc, time.Now().Add(readyTimeout))
	if err != nil {
		return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: the new vrdmad (pid %d) said nothing: %v", ErrRefused, np.pid(), err)
	}
	switch m.State {
	case "ready":
	case "refused":
		return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: %s", ErrRefused, m.Error)
	default:
		return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: the new vrdmad (pid %d) said %q", ErrRefused, np.pid(), m.State)
	}
	// Commit: from here the devices are the new process's; this one never
	// touches them again, whatever happens.
	if err := writeStatus(np.sc, statusMsg{State: "commit"}); err != nil {
		return controlapi.UpgradeAnswer{}, fmt.Errorf("%w: commit: %v", ErrRefused, err)
	}
	m, err = readStatus(np.sc, time.Now().Add(servingTimeout))
	np.sc.Close()
	// The new process lives on without this one: its parent becomes init
	// (or the service manager) when this one exits.
	go np.cmd.Wait()
	if err != nil || m.State != "serving" {
		log.WithError(err).Error("upgrade: the new vrdmad took over but did not say it serves")
		return controlapi.UpgradeAnswer{PID: np.pid()}, nil
	}
	return controlapi.UpgradeAnswer{PID: np.pid(), Version: m.Version, Revision: m.Revision}, nil
}

// writeStatusFDs sends one status message with descriptors.
func writeStatusFDs(c *net.UnixConn, m statusMsg, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _, err = c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	return err
}

// readStatusFDs reads one status message and the descriptors that came
// with it (at most maxFDsPerMessage; close-on-exec).
func readStatusFDs(c *net.UnixConn, deadline time.Time) (statusMsg, []int, error) {
	var m statusMsg
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxFDsPerMessage))
	c.SetReadDeadline(deadline)
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	var fds []int
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, cm := range cmsgs {
				if rights, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, rights...)
				}
			}
		}
	}
	fail := func(err error) (statusMsg, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return m, nil, err
	}
	switch {
	case err != nil:
		return fail(err)
	case flags&unix.MSG_CTRUNC != 0:
		return fail(errors.New("status message: descriptors truncated"))
	case n == 0:
		return fail(errors.New("end of the status channel"))
	}
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		return fail(fmt.Errorf("status message: %w", err))
	}
	return m, fds, nil
}
