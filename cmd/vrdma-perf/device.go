package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// lookupTimeout bounds each control API request of -d.
const lookupTimeout = 5 * time.Second

// resolveDevices turns -d's device IDs into sockets through vrdmad's
// control API, or checks them against --socket and --sockets. A -d that is
// the socket's own path needs no daemon to ask.
func resolveDevices(ctx context.Context, o *options) error {
	if len(o.devices) == 0 {
		return nil
	}
	socks := o.sockets
	if o.twoProc {
		socks = []string{o.socket}
	}
	var c *controlapi.Client
	for i, id := range o.devices {
		have := socks[i]
		if have != "" && filepath.Clean(id) == filepath.Clean(have) {
			continue
		}
		if c == nil {
			c = controlapi.New(o.control, controlapi.WithTimeout(lookupTimeout))
			defer c.CloseIdleConnections()
		}
		info, err := c.Device(ctx, id)
		switch {
		case errors.Is(err, controlapi.ErrNotFound):
			return fmt.Errorf("-d %s: vrdmad at %s has no device %s (vrdmactl device ls lists them)", id, o.control, id)
		case errors.Is(err, controlapi.ErrUnreachable) && have == "":
			return fmt.Errorf("-d %s: %w; name vrdmad's control socket with --control, or the device's socket with --socket", id, err)
		case errors.Is(err, controlapi.ErrUnreachable):
			return fmt.Errorf("-d %s: cannot check it against %s: %w; drop -d, or name vrdmad's control socket with --control", id, have, err)
		case err != nil:
			return fmt.Errorf("-d %s: %w", id, err)
		case info.Socket == "":
			return fmt.Errorf("-d %s: vrdmad serves it on no socket (an inherited --fd device): give --socket", id)
		case have != "" && filepath.Clean(info.Socket) != filepath.Clean(have):
			return fmt.Errorf("-d %s: the device's socket is %s, not %s", id, info.Socket, have)
		}
		socks[i] = info.Socket
	}
	if o.twoProc {
		o.socket = socks[0]
	}
	return nil
}

// deviceName is what the table's "Device" line says for side i: the -d ID
// when there is one, else the socket.
func (o *options) deviceName(i int, socket string) string {
	if i < len(o.devices) {
		return o.devices[i]
	}
	return socket
}

// mtuCode is -m as an abi.MTU* code; 0 for the port's active MTU.
func mtuCode(bytes int) uint32 {
	for c := uint32(abi.MTU256); c <= abi.MTU4096; c++ {
		if mtuBytes(c) == bytes {
			return c
		}
	}
	return 0
}

// mtuBytes is the size of an abi.MTU* code (256 << (code-1)).
func mtuBytes(code uint32) int {
	if code < abi.MTU256 || code > abi.MTU4096 {
		return 0
	}
	return 256 << (code - abi.MTU256)
}

// linkParams are the path MTU and inline size a run uses on a device, from
// -m and -I and what the device offers; notes are what perftest would
// print about a lowered value.
type linkParams struct {
	mtu    uint32 // an abi.MTU* code
	inline int
	notes  []string
}

// linkFor applies -m and -I to the device of c as perftest does: an MTU
// above the port's active one is lowered to it, an inline size above the
// device's max_inline_data is cut to it, and a device without inline data
// refuses -I.
func linkFor(o *options, c *verbs.Context, port abi.PortAttr) (linkParams, error) {
	return linkParamsFor(o, port, int(c.Config().MaxInlineData))
}

// linkParamsFor is linkFor on a port and a device that carries at most
// maxInline bytes inline.
func linkParamsFor(o *options, port abi.PortAttr, maxInline int) (linkParams, error) {
	p := linkParams{mtu: port.ActiveMTU, inline: o.inline}
	if mtuBytes(p.mtu) == 0 {
		return p, fmt.Errorf("the port reports active MTU code %d", port.ActiveMTU)
	}
	if o.mtu != 0 {
		p.mtu = mtuCode(o.mtu)
		if p.mtu > port.ActiveMTU {
			p.notes = append(p.notes, fmt.Sprintf("Requested mtu is higher than active mtu \nChanging to active mtu - %d", mtuBytes(port.ActiveMTU)))
			p.mtu = port.ActiveMTU
		}
	}
	if o.inline > maxInline {
		if maxInline == 0 {
			return p, unsupported("-I %d: the device carries no inline data (max_inline_data 0)", o.inline)
		}
		p.notes = append(p.notes, fmt.Sprintf("  Actual inline-size(%d) < requested inline-size(%d)", maxInline, o.inline))
		p.inline = maxInline
	}
	return p, nil
}
