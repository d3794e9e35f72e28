package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/daemon"
)

// Flag checks: the command line obeys the control API's rules (package
// daemon's CheckLimits, CheckID, … — the same functions POST /v1/devices
// calls), so a device started from flags could also have been added
// through the API. Every error here is bad usage (exit status 2).

// cmdSocket is a device socket named on the command line.
type cmdSocket struct {
	flag string // "--socket vm1=/run/vrdma/vm1.sock", for errors
	id   string
	path string // absolute
}

// apiFlags names vrdmad's flag for each key of the API's device
// settings, so that an API rule's error names what the operator typed.
var apiFlags = map[string]string{
	"limits.max_qps":          "--max-qps",
	"limits.max_cqs":          "--max-cqs",
	"limits.max_mrs":          "--max-mrs",
	"limits.max_pinned_bytes": "--max-pinned",
	"doorbell_queues":         "--doorbell-queues",
}

// flagError restates an API rule's error (*daemon.RequestError) with
// vrdmad's flag in place of the API's key, as a usage error.
func flagError(err error) error {
	var re *daemon.RequestError
	if errors.As(err, &re) {
		if name, ok := apiFlags[re.Field]; ok {
			return cli.Usagef("%s: %s", name, re.Reason)
		}
	}
	return cli.Usagef("%w", err)
}

// check checks the flags that need nothing but themselves, and works out
// the command-line devices' IDs and paths (f.cmdSockets).
func (f *flags) check() error {
	if f.fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments: %q (flags start with --)", f.fs.Args())
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["socket-path"] && set["fd"] {
		return cli.Usagef("--socket-path and --fd are incompatible (one names the socket, the other hands it over)")
	}
	if set["socket-path"] && f.socketPath == "" {
		return cli.Usagef("--socket-path: empty path")
	}
	if set["fd"] && f.fd < 0 {
		return cli.Usagef("--fd %d: want a file descriptor number", f.fd)
	}
	if err := daemon.CheckDoorbellQueues(f.doorbells); err != nil {
		return flagError(err)
	}
	if f.rocePaths < 1 || f.rocePaths > hostnet.MaxPaths {
		return cli.Usagef("--roce-paths %d: out of range [1, %d]", f.rocePaths, hostnet.MaxPaths)
	}
	if f.cmdRate < 0 {
		return cli.Usagef("--max-commands-per-sec %d: want 0 or more", f.cmdRate)
	}
	used := map[string]string{} // ID → the flag that named it
	add := func(flagText, id, path string, derived bool) error {
		abs, err := filepath.Abs(path)
		if err != nil {
			return cli.Usagef("%s: %w", flagText, err)
		}
		if err := daemon.CheckSocketPath(abs); err != nil {
			return cli.Usagef("%s: %s", flagText, reason(err))
		}
		if err := daemon.CheckID(id); err != nil {
			return cli.Usagef("%s: device ID %q: %s (IDs follow the control API's rule)", flagText, id, reason(err))
		}
		if prev, ok := used[id]; ok {
			if derived {
				return cli.Usagef("%s: device ID %q, taken from the file name, is %s's too: name the device, --socket ID=PATH", flagText, id, prev)
			}
			return cli.Usagef("%s: device ID %q is %s's too", flagText, id, prev)
		}
		used[id] = flagText
		f.cmdSockets = append(f.cmdSockets, cmdSocket{flag: flagText, id: id, path: abs})
		return nil
	}
	for i, s := range f.sockets {
		id, path, named := strings.Cut(s, "=")
		if !named {
			path, id = s, socketID(s, i)
		}
		if err := add("--socket "+s, id, path, !named); err != nil {
			return err
		}
	}
	if f.socketPath != "" {
		if err := add("--socket-path "+f.socketPath, socketID(f.socketPath, len(f.sockets)), f.socketPath, true); err != nil {
			return err
		}
	}
	return nil
}

// reason is what a *daemon.RequestError says without its key.
func reason(err error) string {
	var re *daemon.RequestError
	if errors.As(err, &re) {
		return re.Reason
	}
	return err.Error()
}

// socketID names the device of a socket given without an ID: its file
// name without the extension, made a valid device ID (daemon.DeriveID:
// "1 vm.sock" → "vrdma-1-vm"), else vrdma<i>.
func socketID(path string, i int) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	if strings.HasPrefix(path, "@") || base == "." || base == "/" {
		base = ""
	}
	if id := daemon.DeriveID(base); id != "" {
		return id
	}
	return fmt.Sprintf("vrdma%d", i)
}
