package guestvm

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Typed errors below match them with errors.Is.
var (
	// ErrInvalidConfig means a Config cannot boot a guest. Returned as
	// *ConfigError.
	ErrInvalidConfig = errors.New("invalid guest config")

	// ErrGuestFailed means the guest reported a failure: a VRDMA-ERROR line
	// or a non-zero VRDMA-EXIT code. Returned as *GuestError.
	ErrGuestFailed = errors.New("guest failed")

	// ErrGuestGone means the guest's console closed (QEMU exited or was
	// killed) before it printed VRDMA-EXIT. Returned as *GuestError.
	ErrGuestGone = errors.New("guest exited without VRDMA-EXIT")
)

// ConfigError describes one invalid field of a Config.
type ConfigError struct {
	// Field names the offending field ("Args[2]").
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("guestvm: config %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// GuestError is a guest that failed or vanished.
type GuestError struct {
	// Guest is the guest's name (Config.Name).
	Guest string
	// Messages are the guest's VRDMA-ERROR messages, in order.
	Messages []string
	// ExitCode is the VRDMA-EXIT code, or -1 when the guest printed none.
	ExitCode int
}

func (e *GuestError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "guest %s: ", e.Guest)
	switch {
	case len(e.Messages) > 0:
		b.WriteString(strings.Join(e.Messages, "; "))
	case e.ExitCode < 0:
		b.WriteString("console closed before VRDMA-EXIT")
	default:
		b.WriteString("vrdma-guest failed")
	}
	if e.ExitCode >= 0 {
		fmt.Fprintf(&b, " (exit %d)", e.ExitCode)
	} else if len(e.Messages) > 0 {
		b.WriteString(" (no VRDMA-EXIT)")
	}
	return b.String()
}

// Is reports whether target is ErrGuestGone (no exit code) or
// ErrGuestFailed (error messages or a non-zero exit code).
func (e *GuestError) Is(target error) bool {
	switch target {
	case ErrGuestGone:
		return e.ExitCode < 0
	case ErrGuestFailed:
		return len(e.Messages) > 0 || e.ExitCode > 0
	}
	return false
}
