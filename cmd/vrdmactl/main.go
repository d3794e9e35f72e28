// Command vrdmactl manages a running vrdmad through its control API (HTTP
// over a unix socket) and, for VMs, QEMU through QMP or libvirt.
//
// Usage:
//
//	vrdmactl [--control PATH] [--json] device add ID [--socket PATH] [--max-qps N] [--max-cqs N]
//	         [--max-mrs N] [--max-pinned SIZE] [--guid G] [--gid G] [--uuid U]
//	         [--weight N] [--max-bytes-per-s SIZE] [--max-ops-per-s N] [--roce-bind ADDR]...
//	         [--address ADDR]... [--rnic soft|verbs:DEVICE[:PORT]] [--incoming]
//	vrdmactl [--control PATH] [--json] device set ID [--weight N] [--max-bytes-per-s SIZE] [--max-ops-per-s N]
//	vrdmactl [--control PATH] [--json] device rm ID
//	vrdmactl [--control PATH] [--json] device ls
//	vrdmactl [--control PATH] [--json] device show ID
//	vrdmactl [--control PATH] [--json] device qps|cqs|mrs|pds|srqs|mws ID
//	vrdmactl [--control PATH] [--json] resource show [qp|cq|mr|pd|srq|mw]
//	vrdmactl [--control PATH] [--json] vm attach (--qmp SOCKET | --libvirt DOMAIN) --device ID [--bus PORT]
//	vrdmactl [--json] vm detach (--qmp SOCKET | --libvirt DOMAIN) --device ID
//	vrdmactl [--json] vm pci (--qmp SOCKET | --libvirt DOMAIN)
//	vrdmactl [--control PATH] [--json] daemon status
//	vrdmactl [--control PATH] [--json] daemon ack [PROBLEM]
//	vrdmactl [--control PATH] [--json] daemon upgrade [--binary PATH]
//	vrdmactl [--control PATH] [--json] version
//	vrdmactl completion bash|zsh
//
// The global flags (--control, --json) go anywhere on the command line,
// before or after the command. With --json a command's output is one JSON
// document, and an error is {"error": MSG, "exit_code": N} on standard
// error. Exit statuses: 0 success, 1 failure, 2 bad usage (including a
// request vrdmad rejects as invalid), 3 no such device, 4 conflict (the
// device ID or socket is in use, or the daemon holds all the devices it
// may), 5 vrdmad unreachable (no control socket, nobody answers on it, or
// its permissions keep the caller out: the error names the group to
// join).
//
// device add --incoming adds the destination of a live migration (from a
// QEMU served by this vrdmad or by another host's): it takes the source
// device's --uuid, holds no GID and no QP number until the destination
// QEMU loads the source's state into it, binds its --roce-bind addresses
// before they arrive with the VM, and enters vrdmad's state file only
// then (docs/state.md, "Through QEMU's device-state protocol").
//
// device set changes a running device's share of the engine (PATCH
// /v1/devices/{id}): only the flags given are sent, the rest is kept;
// --max-bytes-per-s 0 or --max-ops-per-s 0 removes that bound.
//
// vm attach hot-plugs a vrdmad device into a running QEMU (chardev-add of
// a reconnecting unix client socket, then device_add of vrdma's
// vhost-user-rdma-pci, or where the QEMU lacks it a generic vhost-user
// device, on a free pcie-root-port; a QEMU with neither is named as the
// problem before anything is added); vm detach unplugs it (device_del,
// wait until QEMU deleted it, chardev-remove). --qmp talks to QEMU's QMP
// socket; --libvirt goes through `virsh qemu-monitor-command` for a libvirt
// domain, whose QMP socket libvirt owns.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	cmdline "github.com/vrdma/vrdma/internal/cli"
)

const defaultControl = "/run/vrdma/control.sock"

// Exit statuses.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitConflict    = 4
	exitUnreachable = 5
)

// Errors that choose the exit status; errors.Is matches them.
var (
	errUsage       = cmdline.ErrUsage
	errNotFound    = errors.New("not found")
	errConflict    = errors.New("conflict")
	errUnreachable = errors.New("vrdmad unreachable")
)

// usageErr is a command line vrdmactl cannot run.
func usageErr(format string, args ...any) error { return cmdline.Usagef(format, args...) }

// exitCode is the exit status for err.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errNotFound):
		return exitNotFound
	case errors.Is(err, errConflict):
		return exitConflict
	case errors.Is(err, errUnreachable):
		return exitUnreachable
	}
	return exitFailure
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// cli is one invocation's settings.
type cli struct {
	control string
	json    bool
	out     io.Writer
	errOut  io.Writer // warnings of a command that succeeded
}

// command is one vrdmactl command.
type command struct {
	path     string // "device add"
	synopsis string // after the path
	summary  string
	// control: the command talks to vrdmad (--control matters).
	control bool
	// prints: the command prints a result (it takes --json).
	prints bool
	// define defines the command's flags on fs and returns its body,
	// which gets the positional arguments.
	define func(fs *flag.FlagSet, c *cli) func(pos []string) error
}

// commands is every command; the usage text, the completion scripts and
// the tests are generated from it. (Set by init: the completion command
// reads it.)
var commands []command

func init() {
	commands = []command{
		{"device add", "ID [--socket PATH] [--max-qps N] [--max-cqs N] [--max-mrs N] [--max-pinned SIZE] [--guid G] [--gid G] [--uuid U] [--doorbell-queues N] [--weight N] [--max-bytes-per-s SIZE] [--max-ops-per-s N] [--roce-bind ADDR]... [--address ADDR]... [--rnic soft|verbs:DEVICE[:PORT]] [--incoming]",
			"add a device (its socket defaults to ID.sock beside the control socket)", true, true, defineDeviceAdd},
		{"device set", "ID [--weight N] [--max-bytes-per-s SIZE] [--max-ops-per-s N]",
			"change a device's share of the engine (only the flags given; a max of 0 removes that bound)", true, true, defineDeviceSet},
		{"device rm", "ID", "remove a device (a connected front-end is disconnected)", true, true, defineDeviceRm},
		{"device ls", "", "list the devices", true, true, defineDeviceLs},
		{"device show", "ID", "show one device: every field of its JSON, sizes in binary units", true, true, defineDeviceShow},
		{"device qps", "ID", "list a device's QPs: number, type, state, peer, PSNs, error counters", true, true, defineDeviceObjects("qps")},
		{"device cqs", "ID", "list a device's CQs: depth, armed, overrun, completions written, in error and lost", true, true, defineDeviceObjects("cqs")},
		{"device mrs", "ID", "list a device's MRs: keys, PD, type, address, length, access, pinned bytes", true, true, defineDeviceObjects("mrs")},
		{"device pds", "ID", "list a device's PDs and the objects naming each", true, true, defineDeviceObjects("pds")},
		{"device srqs", "ID", "list a device's shared receive queues", true, true, defineDeviceObjects("srqs")},
		{"device mws", "ID", "list a device's memory windows", true, true, defineDeviceObjects("mws")},
		{"resource show", "[qp|cq|mr|pd|srq|mw]", "list every device's objects of a kind, one line each (without a kind: each device's counts), as rdma resource show does", true, true, defineResourceShow},
		{"vm attach", "(--qmp SOCKET | --libvirt DOMAIN [--connect URI]) --device ID [--bus PORT] [--vq-size N]",
			"hot-plug a device into a running QEMU", true, true, defineVMAttach},
		{"vm detach", "(--qmp SOCKET | --libvirt DOMAIN [--connect URI]) --device ID",
			"hot-unplug a device from a running QEMU", false, true, defineVMDetach},
		{"vm pci", "(--qmp SOCKET | --libvirt DOMAIN [--connect URI])", "list a running QEMU's PCI functions", false, true, defineVMPCI},
		{"daemon status", "", "show vrdmad's health: status, version, uptime, devices and, while degraded, its problems (exit status 1 while degraded)", true, true, defineDaemonStatus},
		{"daemon ack", "[PROBLEM]", "acknowledge a problem that stays until an operator has seen it (a state file set aside), or all of them", true, true, defineDaemonAck},
		{"daemon upgrade", "[--binary PATH]", "hand every device over to a new vrdmad (default: the running one's own path, as a package upgrade left it) without the guests noticing; exit status 0 once it serves them, 4 when it refused and the old one serves on", true, true, defineDaemonUpgrade},
		{"version", "", "print vrdmactl's version and the running vrdmad's (exit status 5 when vrdmad does not answer)", true, true, defineVersion},
		{"completion", "bash|zsh", "print a shell completion script (see below)", false, false, defineCompletion},
	}
}

// groups are the first words of two-word commands.
var groups = []string{"daemon", "device", "resource", "vm"}

func usage(w io.Writer) {
	fmt.Fprint(w, "Usage: vrdmactl [--control PATH] [--json] COMMAND [ARGS]\n\n"+
		"vrdmactl manages a running vrdmad through its control socket and hot-plugs\n"+
		"its devices into running VMs through QEMU's QMP or libvirt.\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  vrdmactl %s %s\n      %s\n", c.path, c.synopsis, c.summary)
	}
	fmt.Fprint(w, `  vrdmactl help [COMMAND]
      print this help, or a command's flags

Options:
  --control PATH
      vrdmad's control socket (default $VRDMA_CONTROL, else `+defaultControl+`)
  --json
      print JSON: every command that prints takes it; errors are then
      {"error": MSG, "exit_code": N} on standard error
  -h, --help
      print this help and exit
  --version
      print vrdmactl's version and exit

The options go anywhere on the command line, before or after the command.

Exit status:
  0  success
  1  failure (vrdmad, QEMU or libvirt reported an error)
  2  bad usage: unknown command or flag, missing or extra argument, a value
     vrdmad rejects as invalid
  3  no such device
  4  conflict: the device ID or socket is in use, or vrdmad holds all the
     devices it may
  5  vrdmad unreachable: no control socket, nobody answers on it, or its
     permissions keep you out (the error names the group to join)

Shell completion:
  source <(vrdmactl completion bash)      # bash; the .deb installs it
  source <(vrdmactl completion zsh)       # zsh, after compinit; the .deb installs it

Examples:
  vrdmactl device add vm1 --max-pinned 8G
  vrdmactl device set vm1 --weight 4 --max-bytes-per-s 2G
  vrdmactl vm attach --libvirt guest1 --device vm1
  vrdmactl --json device ls
`)
}

// commandUsage prints one command's help: its synopsis, summary and flags.
func commandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	ctl := ""
	if cmd.control {
		ctl = "[--control PATH] "
	}
	js := ""
	if cmd.prints {
		js = "[--json] "
	}
	fmt.Fprintf(w, "Usage: vrdmactl %s%s%s %s\n\n%s.\n", ctl, js, cmd.path, cmd.synopsis, cmd.summary)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprint(w, "\nOptions:\n")
		cmdline.PrintDefaults(w, fs)
	}
	fmt.Fprint(w, "\nGlobal options (anywhere on the command line): --control PATH, --json;\n"+
		"vrdmactl --help says more.\n")
}

func findCommand(path string) *command {
	for i := range commands {
		if commands[i].path == path {
			return &commands[i]
		}
	}
	return nil
}

// run is vrdmactl; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{out: stdout, errOut: stderr}
	err := dispatch(c, args, stdout)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	if c.json || jsonRequested(args) {
		b, _ := json.Marshal(struct {
			Error    string `json:"error"`
			ExitCode int    `json:"exit_code"`
		}{err.Error(), code})
		fmt.Fprintf(stderr, "%s\n", b)
	} else {
		fmt.Fprintln(stderr, "vrdmactl:", err)
		if code == exitUsage {
			fmt.Fprintln(stderr, "Try 'vrdmactl --help' for more information.")
		}
	}
	return code
}

// jsonRequested reports whether --json is on the command line (for errors
// found before it was parsed).
func jsonRequested(args []string) bool {
	for _, a := range args {
		if a == "--json" || a == "-json" || a == "--json=true" || a == "-json=true" {
			return true
		}
	}
	return false
}

// globalFlags defines the flags that go anywhere on the command line.
func globalFlags(c *cli, version *bool) *flag.FlagSet {
	fs := cmdline.New("vrdmactl")
	fs.StringVar(&c.control, "control", envOr("VRDMA_CONTROL", defaultControl), "vrdmad's control socket `PATH`")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	fs.BoolVar(version, "version", false, "print vrdmactl's version and exit")
	return fs
}

func dispatch(c *cli, args []string, stdout io.Writer) error {
	var version bool
	fs := globalFlags(c, &version)
	// Global flags after the command ("device ls --control X") count as
	// if they came before it; "__ids" and "completion" take theirs too.
	if err := cmdline.Parse(fs, cmdline.Hoist(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return nil
		}
		return err
	}
	if version {
		_, err := fmt.Fprintln(stdout, cmdline.VersionLine("vrdmactl"))
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usageErr("missing command")
	}
	switch rest[0] {
	case "help":
		if len(rest) == 1 {
			usage(stdout)
			return nil
		}
		return dispatch(c, append(append([]string{}, rest[1:]...), "--help"), stdout)
	case "__ids": // for the completion scripts
		return printIDs(c)
	}
	path := rest[0]
	n := 1
	for _, g := range groups {
		if rest[0] == g {
			if len(rest) < 2 || rest[1] == "-h" || rest[1] == "--help" || rest[1] == "-help" {
				if len(rest) >= 2 {
					groupUsage(stdout, g)
					return nil
				}
				return usageErr("%s needs a command: %s", g, strings.Join(groupCommands(g), ", "))
			}
			path, n = g+" "+rest[1], 2
		}
	}
	cmd := findCommand(path)
	if cmd == nil {
		return usageErr("unknown command %q", path)
	}
	cfs := flag.NewFlagSet("vrdmactl "+cmd.path, flag.ContinueOnError)
	cfs.SetOutput(io.Discard)
	body := cmd.define(cfs, c)
	if cmd.prints {
		cfs.BoolVar(&c.json, "json", c.json, "print JSON")
	}
	pos, err := cmdline.Interleaved(cfs, rest[n:])
	if errors.Is(err, flag.ErrHelp) {
		commandUsage(stdout, cmd, cfs)
		return nil
	}
	if err != nil {
		return usageErr("%s: %v", cmd.path, err)
	}
	return body(pos)
}

func groupCommands(g string) []string {
	var out []string
	for _, c := range commands {
		if w, sub, ok := strings.Cut(c.path, " "); ok && w == g {
			out = append(out, sub)
		}
	}
	return out
}

func groupUsage(w io.Writer, g string) {
	fmt.Fprintf(w, "Usage: vrdmactl %s COMMAND [ARGS]\n\nCommands:\n", g)
	for _, c := range commands {
		if strings.HasPrefix(c.path, g+" ") {
			fmt.Fprintf(w, "  vrdmactl %s %s\n      %s\n", c.path, c.synopsis, c.summary)
		}
	}
	fmt.Fprintf(w, "\nvrdmactl %s COMMAND --help prints a command's flags.\n", g)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// wantArgs checks the number of positional arguments.
func wantArgs(cmd string, pos []string, names ...string) error {
	if len(pos) != len(names) {
		if len(names) == 0 {
			return usageErr("%s: unexpected arguments %q", cmd, pos)
		}
		return usageErr("%s needs %s (got %d arguments)", cmd, strings.Join(names, " "), len(pos))
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// commandWords is every command path word by position, for completion.
func commandWords() (first []string, second map[string][]string) {
	second = map[string][]string{}
	seen := map[string]bool{}
	for _, c := range commands {
		w, sub, _ := strings.Cut(c.path, " ")
		if !seen[w] {
			seen[w] = true
			first = append(first, w)
		}
		if sub != "" {
			second[w] = append(second[w], sub)
		}
	}
	first = append(first, "help")
	sort.Strings(first)
	return first, second
}
