package daemon

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend"
)

// Audit of the control API. Whoever may open the control socket may add,
// change and remove devices, so every request that changes something
// (any method but GET and HEAD) and every refusal of one is logged at
// info (success), warning (4xx) or error (5xx) level, with who asked —
// the peer's pid, uid and gid from SO_PEERCRED, read once per connection
// (http.Server.ConnContext) — what (method, path, device) and how it
// ended (status, error). Reads are logged at debug level only: a
// monitoring system polling /v1/health must not flood the journal.
// Values a client chose (path, device, error text) are cut to a bounded
// length, so a hostile request makes one line of bounded size.

// peerKey is the context key of a control connection's peer.
type peerKey struct{}

// peer is the process at the other end of a control connection.
type peer struct {
	cred *unix.Ucred // nil when it could not be read
	err  error       // why cred is nil
}

// peerContext is the control server's ConnContext: it reads the peer's
// credentials once, when the connection is accepted.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	cred, err := backend.PeerCredentials(uc)
	return context.WithValue(ctx, peerKey{}, peer{cred: cred, err: err})
}

// auditWriter records what a handler answered.
type auditWriter struct {
	http.ResponseWriter
	code   int    // the status written; 0: none yet
	device string // the device the request is about, if any
	err    string // the error answered (writeError) or warned of
}

func (w *auditWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// noteDevice names the device a request is about, when the path does not
// (POST /v1/devices has it in the body).
func noteDevice(w http.ResponseWriter, id string) {
	if aw, ok := w.(*auditWriter); ok {
		aw.device = id
	}
}

// noteError records the error (or warning) a request is answered with.
func noteError(w http.ResponseWriter, msg string) {
	if aw, ok := w.(*auditWriter); ok {
		aw.err = msg
	}
}

// Bounds of the client-chosen values in an audit line.
const (
	maxAuditPath  = 256
	maxAuditError = 1024
)

// audit wraps the control API's handler with the audit log.
func (d *Daemon) audit(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aw := &auditWriter{ResponseWriter: w, device: pathDevice(r.URL.EscapedPath())}
		start := time.Now()
		h.ServeHTTP(aw, r)
		d.logRequest(r, aw, time.Since(start))
	})
}

func (d *Daemon) logRequest(r *http.Request, aw *auditWriter, took time.Duration) {
	code := aw.code
	if code == 0 {
		code = http.StatusOK // the handler wrote nothing: net/http answers 200
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if read && !d.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
		return
	}
	f := logrus.Fields{
		"method":   clip(r.Method, 16),
		"path":     clip(r.URL.EscapedPath(), maxAuditPath),
		"status":   code,
		"duration": took.Round(time.Microsecond).String(),
	}
	if aw.device != "" {
		f["device"] = clip(aw.device, maxIDLen)
	}
	if aw.err != "" {
		f["error"] = clip(aw.err, maxAuditError)
	}
	if p, ok := r.Context().Value(peerKey{}).(peer); ok && p.cred != nil {
		f["pid"], f["uid"], f["gid"] = p.cred.Pid, p.cred.Uid, p.cred.Gid
	} else if ok {
		f["peer_error"] = p.err.Error()
	} else {
		f["peer"] = "unknown"
	}
	log := d.log.WithFields(f)
	switch {
	case read:
		log.Debug("control request")
	case code >= 500:
		log.Error("control request failed")
	case code >= 400:
		log.Warn("control request refused")
	default:
		log.Info("control request")
	}
}

// pathDevice is the device ID in an escaped path /v1/devices/ID[/...],
// or "".
func pathDevice(escaped string) string {
	rest, ok := strings.CutPrefix(escaped, "/v1/devices/")
	if !ok {
		return ""
	}
	seg, _, _ := strings.Cut(rest, "/")
	id, err := url.PathUnescape(seg)
	if err != nil {
		return seg
	}
	return id
}

// clip cuts s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
