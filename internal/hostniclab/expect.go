package hostniclab

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
)

// Expect computes what the memories of a local pair (two vrdma clients,
// both roceinterop runs whose initial content is roceinterop.Fill of
// their seeds) hold after job, from the lengths and seeds they reported:
// the requester (perftest's client) WRITEs (with or without immediate)
// message k from its slot k to the server's advertised address, so the
// server's first message holds the client's last; READs bring the
// server's first message into every slot; SEND k lands in receive k;
// FETCH_ADD k adds 1 to the server's first word and stores the value
// before it at the client's offset 8k. It returns the SHA-256 of each
// (hex).
func Expect(job roceinterop.Job, server, client ClientResult) (serverSum, clientSum string, err error) {
	mk := func(n int, seed byte) []byte {
		m := make([]byte, n)
		for i := range m {
			m[i] = roceinterop.Fill(seed, i)
		}
		return m
	}
	s, c := mk(server.MemLen, server.Seed), mk(client.MemLen, client.Seed)
	size, iters := job.Size, job.Iters
	if int64(len(c)) < job.Bytes() || len(s) < size || (job.Op == pftexchange.SendBW && int64(len(s)) < job.Bytes()) {
		return "", "", fmt.Errorf("%s: memories of %d and %d bytes are too small", job, len(s), len(c))
	}
	switch job.Op {
	case pftexchange.WriteBW, pftexchange.WriteImmBW:
		copy(s[:size], c[(iters-1)*size:iters*size])
	case pftexchange.ReadBW:
		for k := range iters {
			copy(c[k*size:(k+1)*size], s[:size])
		}
	case pftexchange.SendBW:
		copy(s[:iters*size], c[:iters*size])
	case pftexchange.AtomicBW:
		first := binary.LittleEndian.Uint64(s)
		for k := range iters {
			binary.LittleEndian.PutUint64(c[8*k:], first+uint64(k))
		}
		binary.LittleEndian.PutUint64(s, first+uint64(iters))
	default:
		return "", "", fmt.Errorf("%s: no expectation for this op", job)
	}
	hs, hc := sha256.Sum256(s), sha256.Sum256(c)
	return hex.EncodeToString(hs[:]), hex.EncodeToString(hc[:]), nil
}
