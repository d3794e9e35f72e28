package backend

import (
	"errors"
	"net"
)

// FromListener serves cfg.Device on ln, a listening unix socket the caller
// already holds: one inherited with vrdmad --fd or from systemd's socket
// activation. The socket file belongs to whoever created it: FromListener
// does not create, chmod, chown or replace it (cfg.Mode and cfg.Owner are
// ignored), and Close closes ln without removing the file, so a socket
// that systemd holds keeps accepting connections (queued until the next
// vrdmad) across a restart. An empty cfg.Socket becomes ln's bound path.
//
// The Server owns ln from the call on, also when FromListener fails.
func FromListener(ln *net.UnixListener, cfg Config, opts ...Option) (*Server, error) {
	if ln == nil {
		return nil, errors.New("backend: listener and device are required")
	}
	ln.SetUnlinkOnClose(false)
	if cfg.Device == nil {
		ln.Close()
		return nil, errors.New("backend: listener and device are required")
	}
	if cfg.Socket == "" {
		cfg.Socket = ln.Addr().String()
	}
	s := newServer(cfg, opts)
	s.ln = ln
	s.unlink = false
	return s, nil
}
