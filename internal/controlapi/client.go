package controlapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultTimeout bounds one request of a Client made without WithTimeout.
const DefaultTimeout = 10 * time.Second

const (
	// baseURL is the scheme and host of every request; the host name is
	// a convention (the transport dials the socket whatever it says).
	baseURL = "http://vrdmad"
	// maxAnswer bounds the bytes of a 2xx answer the client decodes.
	maxAnswer = 16 << 20
	// maxErrorAnswer bounds the bytes of another answer it reads.
	maxErrorAnswer = 1 << 20
)

// Errors that errors.Is matches against what a Client returns.
var (
	// ErrUnreachable means the request got no answer: the socket is
	// missing, nobody accepts on it, or the answer did not come in time.
	// Returned as *UnreachableError.
	ErrUnreachable = errors.New("no answer from the control API")
	// ErrBadRequest is a 400 answer: the daemon rejected the request as
	// malformed or out of range. Returned as *StatusError.
	ErrBadRequest = errors.New("bad request")
	// ErrNotFound is a 404 answer: no such device (or endpoint).
	// Returned as *StatusError.
	ErrNotFound = errors.New("not found")
	// ErrConflict is a 409 answer: the device ID or socket is in use, or
	// the daemon holds all the devices it may. Returned as *StatusError.
	ErrConflict = errors.New("conflict")
)

// StatusError is an answer other than 2xx, with the daemon's message.
type StatusError struct {
	Method string // "POST"
	Path   string // "/v1/devices"
	// Code is the HTTP status code (404); Status its line ("404 Not
	// Found").
	Code   int
	Status string
	// Message is the answer's "error" (ErrorAnswer), or its text when it
	// is not one.
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Message)
}

// Is matches ErrBadRequest, ErrNotFound and ErrConflict by the status
// code.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Code == http.StatusBadRequest
	case ErrNotFound:
		return e.Code == http.StatusNotFound
	case ErrConflict:
		return e.Code == http.StatusConflict
	}
	return false
}

// UnreachableError is a request that got no answer.
type UnreachableError struct {
	Socket string // the control socket
	Err    error  // what net/http said (a *url.Error)
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("control API at %s: %v", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Is matches ErrUnreachable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// Client calls the control API of the vrdmad listening on one unix
// socket.
type Client struct {
	socket string       // immutable
	hc     *http.Client // immutable; safe for concurrent use
}

// Option configures a Client.
type Option func(*options)

type options struct {
	timeout time.Duration
}

// WithTimeout bounds each request, from dialling to the answer's last
// byte; 0 means no bound. Without it a request has DefaultTimeout. A
// context given to a method bounds the request too.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// New is a client of the control API on the unix socket at socket. It
// connects only when a method is called.
func New(socket string, opts ...Option) *Client {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return &Client{socket: socket, hc: HTTPClient(socket, o.timeout)}
}

// HTTPClient is an HTTP client whose every connection goes to the unix
// socket at path, whatever host the URL names ("http://vrdmad/..." by
// convention), with timeout per request (0: none). Client uses it for the
// control socket; it reaches a --metrics unix: socket as well.
func HTTPClient(path string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// Socket is the control socket's path.
func (c *Client) Socket() string { return c.socket }

// CloseIdleConnections closes the connections kept for later requests.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Devices lists the daemon's devices (GET /v1/devices).
func (c *Client) Devices(ctx context.Context) ([]DeviceInfo, error) {
	var out []DeviceInfo
	if err := c.do(ctx, http.MethodGet, PathDevices, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Device is one device (GET /v1/devices/{id}); ErrNotFound when there is
// none of that ID.
func (c *Client) Device(ctx context.Context, id string) (DeviceInfo, error) {
	var out DeviceInfo
	if err := c.do(ctx, http.MethodGet, DevicePath(id), nil, &out); err != nil {
		return DeviceInfo{}, err
	}
	return out, nil
}

// AddDevice adds a device (POST /v1/devices) and returns it as the daemon
// shows it. A refusal is a *StatusError with the daemon's reason
// (ErrBadRequest, ErrConflict, or a 413, 422, 500 or 503).
func (c *Client) AddDevice(ctx context.Context, req AddRequest) (DeviceInfo, error) {
	var out DeviceInfo
	if err := c.do(ctx, http.MethodPost, PathDevices, req, &out); err != nil {
		return DeviceInfo{}, err
	}
	return out, nil
}

// SetShare changes a device's share (PATCH /v1/devices/{id}): the fields
// p sets, the others kept. It returns the device as the daemon shows it
// afterwards. ErrNotFound when there is no device of that ID,
// ErrBadRequest when the daemon rejects the share (a *StatusError with
// its reason); a 500 means the change could not be saved in the state
// file and was not made.
func (c *Client) SetShare(ctx context.Context, id string, p SharePatch) (DeviceInfo, error) {
	var out DeviceInfo
	if err := c.do(ctx, http.MethodPatch, DevicePath(id), PatchRequest{Share: &p}, &out); err != nil {
		return DeviceInfo{}, err
	}
	return out, nil
}

// RemoveDevice removes a device (DELETE /v1/devices/{id}); ErrNotFound
// when there is none of that ID. A 500 answer means the device is gone
// but its server stopped with an error, which the StatusError holds. A
// device removed whose removal could not be saved is a success with
// StillListed and Warning set.
func (c *Client) RemoveDevice(ctx context.Context, id string) (Removed, error) {
	var out Removed
	if err := c.do(ctx, http.MethodDelete, DevicePath(id), nil, &out); err != nil {
		return Removed{}, err
	}
	return out, nil
}

// Health is the daemon's health (GET /v1/health).
func (c *Client) Health(ctx context.Context) (Health, error) {
	var out Health
	if err := c.do(ctx, http.MethodGet, PathHealth, nil, &out); err != nil {
		return Health{}, err
	}
	return out, nil
}

// Ack acknowledges the problem id of the daemon's health (POST
// /v1/health/ack), or every problem that needs it when id is "". It
// returns what was cleared and the health afterwards. ErrNotFound when
// there is no problem id, ErrConflict when it clears by itself instead.
func (c *Client) Ack(ctx context.Context, id string) (AckAnswer, error) {
	var out AckAnswer
	if err := c.do(ctx, http.MethodPost, PathHealthAck, AckRequest{ID: id}, &out); err != nil {
		return AckAnswer{}, err
	}
	return out, nil
}

// do sends one request with body as JSON (nil: none) and decodes a 2xx
// answer into out.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	_, err := c.exchange(ctx, method, path, body, out)
	return err
}

// exchange is do, returning the answer's header as well (a listing's
// Link to its next page).
func (c *Client) exchange(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &UnreachableError{Socket: c.socket, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorAnswer))
		var e ErrorAnswer
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return nil, &StatusError{Method: method, Path: path, Code: resp.StatusCode, Status: resp.Status, Message: e.Error}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out); err != nil {
		return nil, fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return resp.Header, nil
}
