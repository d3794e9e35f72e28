//go:build !amd64

package virtiopci

import "fmt"

type barRegs struct{ Regs }

func mapBAR(dir string, i int) (*barRegs, func() error, error) {
	return nil, nil, fmt.Errorf("BAR %d: MMIO accessors exist for amd64 only: %w", i, ErrBAR)
}
