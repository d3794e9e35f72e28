package qemu

import (
	"context"
	"fmt"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// DialQMP connects to the QMP socket of a QEMU this process did not start
// (vrdmactl's view of a VM an operator or libvirt runs).
func DialQMP(ctx context.Context, socket string) (*qmp.SocketMonitor, error) {
	mon, err := qmp.NewSocketMonitor("unix", socket, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", socket, err)
	}
	res := make(chan error, 1)
	go func() { res <- mon.Connect() }()
	select {
	case err = <-res:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		mon.Disconnect()
		return nil, fmt.Errorf("qmp %s: handshake: %w", socket, err)
	}
	return mon, nil
}

// QueryPCISocket runs query-pci on the QEMU behind a QMP socket.
func QueryPCISocket(ctx context.Context, socket string) ([]PCIDevice, error) {
	mon, err := DialQMP(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer mon.Disconnect()
	raw, err := runQMP(ctx, mon, "query-pci", nil)
	if err != nil {
		return nil, err
	}
	return parseQueryPCI(raw)
}
