package roce

// PSN is a 24-bit packet sequence number. Arithmetic wraps modulo 2^24 and
// order is defined within half the sequence space: p is after q when p-q
// modulo 2^24 is in (0, 2^23).
type PSN uint32

// PSNMask is the largest PSN; PSNs live in [0, PSNMask].
const PSNMask PSN = 1<<24 - 1

// psnHalf is half the sequence space: distances are in [-psnHalf, psnHalf).
const psnHalf = 1 << 23

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return (p + PSN(n)) & PSNMask }

// Diff returns the signed distance p-q modulo 2^24, in [-2^23, 2^23). At
// exactly half the space (p-q = 2^23 mod 2^24) the order is ambiguous and
// Diff says -2^23, as rxe's psn_compare does.
func (p PSN) Diff(q PSN) int32 {
	// Shift the 24-bit difference into the top of an int32 and back: the
	// arithmetic right shift sign-extends bit 23.
	return int32(uint32(p-q)<<8) >> 8
}

// Before reports whether p comes before q within the half window.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p comes after q within the half window.
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }
