package main

import (
	"context"
	"flag"
	"strconv"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/units"
)

// shareFlags are the flags of a device's share of the engine, for device
// add and device set.
type shareFlags struct {
	fs       *flag.FlagSet
	weight   uint
	maxBytes string
	maxOps   uint64
}

func defineShare(fs *flag.FlagSet) *shareFlags {
	f := &shareFlags{fs: fs}
	fs.UintVar(&f.weight, "weight", 0, "the device's weight in the engine's round robin over busy devices, 1 to 1000 (0: 1)")
	fs.StringVar(&f.maxBytes, "max-bytes-per-s", "0", "bound on the payload the device moves per second, a `SIZE` such as 1G (0: none; else at least 4K)")
	fs.Uint64Var(&f.maxOps, "max-ops-per-s", 0, "bound on the work requests the device executes per second (0: none)")
	return f
}

// patch is the share change the flags given on the command line ask for:
// only those fields are set.
func (f *shareFlags) patch() (controlapi.SharePatch, error) {
	var p controlapi.SharePatch
	var err error
	f.fs.Visit(func(fl *flag.Flag) {
		if err != nil {
			return
		}
		switch fl.Name {
		case "weight":
			if uint64(f.weight) > 1<<32-1 {
				err = usageErr("--weight %d: more than 2^32-1", f.weight)
				return
			}
			w := uint32(f.weight)
			p.Weight = &w
		case "max-bytes-per-s":
			var b uint64
			if b, err = units.ParseBytes(f.maxBytes); err != nil {
				err = usageErr("--max-bytes-per-s: %v", err)
				return
			}
			p.MaxBytesPerSec = &b
		case "max-ops-per-s":
			o := f.maxOps
			p.MaxOpsPerSec = &o
		}
	})
	return p, err
}

// share is the share of a new device, nil when no flag sets one.
func (f *shareFlags) share() (*controlapi.Share, error) {
	p, err := f.patch()
	if err != nil || (p.Weight == nil && p.MaxBytesPerSec == nil && p.MaxOpsPerSec == nil) {
		return nil, err
	}
	var s controlapi.Share
	if p.Weight != nil {
		s.Weight = *p.Weight
	}
	if p.MaxBytesPerSec != nil {
		s.MaxBytesPerSec = *p.MaxBytesPerSec
	}
	if p.MaxOpsPerSec != nil {
		s.MaxOpsPerSec = *p.MaxOpsPerSec
	}
	return &s, nil
}

func defineDeviceSet(fs *flag.FlagSet, c *cli) func([]string) error {
	sf := defineShare(fs)
	return func(pos []string) error {
		if err := wantArgs("device set", pos, "ID"); err != nil {
			return err
		}
		p, err := sf.patch()
		if err != nil {
			return err
		}
		if p.Weight == nil && p.MaxBytesPerSec == nil && p.MaxOpsPerSec == nil {
			return usageErr("device set needs at least one of --weight, --max-bytes-per-s, --max-ops-per-s")
		}
		info, err := c.api().SetShare(context.Background(), pos[0], p)
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			return printJSON(c.out, info)
		}
		return showInfo(c.out, info)
	}
}

// rateLimit prints a bound per second, "none" for 0.
func rateLimit(n uint64, bytes bool) string {
	switch {
	case n == 0:
		return "none"
	case bytes:
		return units.FormatBytes(n) + "/s"
	}
	return strconv.FormatUint(n, 10) + "/s"
}
