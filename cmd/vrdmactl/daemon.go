package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/units"
	"github.com/vrdma/vrdma/internal/version"
)

// The daemon as a whole: which build runs and since when (version), its
// health (daemon status), and the acknowledgement of problems that stay
// until an operator has seen them (daemon ack).

// errDegraded is daemon status's error while vrdmad is degraded: the
// health is printed, and the exit status says it was not ok.
var errDegraded = errors.New("vrdmad is degraded")

// buildVersion is a program's build as version --json prints it.
type buildVersion struct {
	Version  string `json:"version"`
	Revision string `json:"revision"`
}

// runningVersion is the daemon's build and how long it has run.
type runningVersion struct {
	buildVersion
	Started       time.Time `json:"started"`
	UptimeSeconds int64     `json:"uptime_seconds"`
}

// versionAnswer is what version --json prints. Daemon is null when vrdmad
// did not answer.
type versionAnswer struct {
	Client    buildVersion    `json:"client"`
	GoVersion string          `json:"go_version"`
	Daemon    *runningVersion `json:"daemon"`
}

// versionString is "VERSION (revision REV)", or VERSION alone.
func versionString(v, rev string) string {
	if rev != "" {
		return v + " (revision " + rev + ")"
	}
	return v
}

// uptime is whole seconds as a duration ("3h4m5s").
func uptime(s int64) string { return (time.Duration(s) * time.Second).String() }

func defineVersion(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("version", pos); err != nil {
			return err
		}
		out := versionAnswer{Client: buildVersion{version.Version, version.Revision()}, GoVersion: runtime.Version()}
		h, herr := c.api().Health(context.Background())
		if herr == nil {
			out.Daemon = &runningVersion{buildVersion{h.Version, h.Revision}, h.Started, h.UptimeSeconds}
		}
		var err error
		if c.json {
			err = printJSON(c.out, out)
		} else {
			tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "vrdmactl\t%s\n", versionString(out.Client.Version, out.Client.Revision))
			if d := out.Daemon; d != nil {
				fmt.Fprintf(tw, "vrdmad\t%s, started %s, up %s\n", versionString(d.Version, d.Revision),
					d.Started.Format(time.RFC3339), uptime(d.UptimeSeconds))
			} else {
				fmt.Fprintf(tw, "vrdmad\tunreachable at %s\n", c.control)
			}
			err = tw.Flush()
		}
		// The client's version is printed either way; the exit status
		// (and standard error) say the daemon did not answer.
		return errors.Join(err, apiErr(herr))
	}
}

func defineDaemonStatus(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("daemon status", pos); err != nil {
			return err
		}
		h, err := c.api().Health(context.Background())
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			err = printJSON(c.out, h)
		} else {
			err = showHealth(c.out, h)
		}
		if err == nil && len(h.Problems) > 0 {
			err = fmt.Errorf("%w (problems: %d, listed above)", errDegraded, len(h.Problems))
		}
		return err
	}
}

func defineDaemonAck(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if len(pos) > 1 {
			return usageErr("daemon ack takes at most one PROBLEM (got %d arguments)", len(pos))
		}
		id := ""
		if len(pos) == 1 {
			id = pos[0]
		}
		a, err := c.api().Ack(context.Background(), id)
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			return printJSON(c.out, a)
		}
		if len(a.Acknowledged) == 0 {
			fmt.Fprintln(c.out, "nothing to acknowledge")
		}
		for _, p := range a.Acknowledged {
			fmt.Fprintf(c.out, "acknowledged %s\n", p)
		}
		if n := len(a.Health.Problems); n > 0 {
			_, err = fmt.Fprintf(c.out, "status: %s, %d problems left (vrdmactl daemon status)\n", a.Health.Status, n)
			return err
		}
		_, err = fmt.Fprintf(c.out, "status: %s\n", a.Health.Status)
		return err
	}
}

// showHealth prints the daemon's health as a two-column table, each
// problem with its message and what clears it.
func showHealth(out io.Writer, h controlapi.Health) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, r := range [][2]string{
		{"status", h.Status},
		{"version", versionString(h.Version, h.Revision)},
		{"started", h.Started.Format(time.RFC3339) + " (up " + uptime(h.UptimeSeconds) + ")"},
		{"devices", fmt.Sprint(h.Devices)},
		{"engine_threads", fmt.Sprint(h.EngineThreads)},
		{"pinned", units.FormatBytes(h.PinnedBytes)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range h.Problems {
		clear := "clears when a write of the state file succeeds"
		if p.NeedsAck {
			clear = "clear it with: vrdmactl daemon ack " + p.ID
		}
		fmt.Fprintf(out, "\nproblem %s (%s, since %s; %s)\n  %s\n", p.ID, p.Kind, p.Since.Format(time.RFC3339), clear, p.Message)
	}
	return nil
}

// defineDaemonUpgrade is daemon upgrade: the running vrdmad hands every
// device over to a new vrdmad process (docs/state.md); exit status 0 once
// the new one serves them all, 4 (conflict) when it refused and the old
// one serves on.
func defineDaemonUpgrade(fs *flag.FlagSet, c *cli) func([]string) error {
	binary := fs.String("binary", "", "the vrdmad `PATH` to hand over to (default: the file at the running vrdmad's own path)")
	return func(pos []string) error {
		if err := wantArgs("daemon upgrade", pos); err != nil {
			return err
		}
		if *binary != "" && !filepath.IsAbs(*binary) {
			abs, err := filepath.Abs(*binary)
			if err != nil {
				return usageErr("--binary %s: %v", *binary, err)
			}
			*binary = abs
		}
		api := controlapi.New(c.control, controlapi.WithTimeout(controlapi.UpgradeTimeout))
		a, err := api.Upgrade(context.Background(), *binary)
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			return printJSON(c.out, a)
		}
		_, err = fmt.Fprintf(c.out, "upgraded: vrdmad %s now serves %d devices (%d connected) as pid %d; data paths paused %.1f ms\n",
			versionString(a.Version, a.Revision), a.Devices, a.Connected, a.PID, a.PauseMS)
		return err
	}
}
