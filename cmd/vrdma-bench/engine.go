package main

import (
	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
)

// enginePool is the pool the rigs' daemons share when --engine-threads
// asks for one; nil: sched.Default(), GOMAXPROCS workers.
var enginePool *sched.Pool

// setEngineThreads makes the rigs' daemons share a pool of n workers (0:
// sched.Default()).
func setEngineThreads(n int) error {
	if n == 0 {
		return nil
	}
	p, err := sched.New(sched.Config{Workers: n})
	if err != nil {
		return err
	}
	enginePool = p
	return nil
}

// engineWorkers is the number of engine workers that run the doorbell
// queues of the rigs' devices.
func engineWorkers() int {
	if enginePool != nil {
		return enginePool.Workers()
	}
	return sched.Default().Workers()
}

// daemonConfig is a rig's daemon configuration.
func daemonConfig(pin memmap.PinConfig) daemon.Config {
	return daemon.Config{Pin: pin, Pool: enginePool}
}
