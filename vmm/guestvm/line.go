package guestvm

import (
	"errors"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/guestresult"
)

// Line prefixes of the console protocol (see the package comment).
const (
	PrefixInit     = "VRDMA-INIT"
	PrefixResult   = guestresult.Prefix
	PrefixExchange = "VRDMA-EXCHANGE"
	PrefixPeer     = "VRDMA-PEER"
	PrefixError    = "VRDMA-ERROR"
	PrefixExit     = "VRDMA-EXIT"

	// The standard-stack image's /init (guest/stack-init) adds these.
	PrefixWait          = "VRDMA-WAIT"
	PrefixGo            = "VRDMA-GO"
	PrefixCmdStart      = "VRDMA-CMD-START"
	PrefixListen        = "VRDMA-LISTEN"
	PrefixCmdExit       = "VRDMA-CMD-EXIT"
	PrefixRmmod         = "VRDMA-RMMOD"
	PrefixKernelWarning = "VRDMA-KERNEL-WARNING"
)

// Kind is the kind of a console line.
type Kind int

// Line kinds. KindOther is anything without a protocol prefix.
const (
	KindOther Kind = iota
	KindInit
	KindResult
	KindExchange
	KindPeer
	KindError
	KindExit
	KindWait
	KindGo
	KindCmdStart
	KindListen
	KindCmdExit
	KindRmmod
	KindKernelWarning
)

var prefixes = []struct {
	p string
	k Kind
}{
	{PrefixInit, KindInit}, {PrefixResult, KindResult}, {PrefixExchange, KindExchange},
	{PrefixPeer, KindPeer}, {PrefixError, KindError}, {PrefixExit, KindExit},
	{PrefixWait, KindWait}, {PrefixGo, KindGo}, {PrefixCmdStart, KindCmdStart},
	{PrefixListen, KindListen}, {PrefixCmdExit, KindCmdExit}, {PrefixRmmod, KindRmmod},
	{PrefixKernelWarning, KindKernelWarning},
}

// Classify splits a console line into its kind and its payload (the text
// after the prefix and one space, trimmed). A prefix counts only as a whole
// word: "VRDMA-RESULTS x" is KindOther.
func Classify(line string) (Kind, string) {
	for _, p := range prefixes {
		rest, ok := strings.CutPrefix(line, p.p)
		if !ok {
			continue
		}
		if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			return KindOther, line
		}
		return p.k, strings.TrimSpace(rest)
	}
	return KindOther, line
}

// Result is one VRDMA-RESULT line, as package guestresult defines it for
// the guest program and the harnesses alike.
type Result = guestresult.Result

// errExitCode is ParseExit's error.
var errExitCode = errors.New("exit code is not a number in 0..255")

// ParseResult decodes the payload of a VRDMA-RESULT line: it is
// guestresult.Parse (one JSON object; keys of the wrong type are an error;
// on error the Result is zero).
func ParseResult(payload string) (Result, error) { return guestresult.Parse(payload) }

// ParseExit decodes the payload of a VRDMA-EXIT line: a decimal exit code
// in 0..255. On error the code is 0.
func ParseExit(payload string) (int, error) {
	s := strings.TrimSpace(payload)
	if s == "" || len(s) > 3 {
		return 0, errExitCode
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 255 || s[0] == '+' || s[0] == '-' {
		return 0, errExitCode
	}
	return n, nil
}
