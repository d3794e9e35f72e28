// Package pcapfile reads and writes classic pcap files (the libpcap format,
// not pcapng) of Ethernet frames (LINKTYPE_ETHERNET), as QEMU's
// filter-dump writes them and tcpdump, tshark and Wireshark read them.
//
// The reader takes microsecond (magic 0xa1b2c3d4) and nanosecond
// (0xa1b23c4d) files in either byte order. It is bounded: a snapshot
// length above MaxSnapLen, a record longer than the file's snapshot length
// or with a fractional second out of range, and a record cut short by the
// end of the file are errors, never a packet. The writer writes
// little-endian files of either resolution.
package pcapfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

const (
	// LinkTypeEthernet is LINKTYPE_ETHERNET (IEEE 802.3 frames without
	// preamble or FCS), the only link type this package handles.
	LinkTypeEthernet = 1
	// MaxSnapLen is the largest snapshot length (and so record) accepted:
	// libpcap's MAXIMUM_SNAPLEN.
	MaxSnapLen = 262144
	// DefaultSnapLen is the snapshot length NewWriter uses for zero.
	DefaultSnapLen = 65535

	magicMicro = 0xa1b2c3d4
	magicNano  = 0xa1b23c4d
	fileHdrLen = 24
	recHdrLen  = 16
)

var (
	// ErrFormat means the file is not a classic pcap file this package
	// reads: a bad magic number, version, link type or snapshot length, or
	// a record whose lengths or timestamp do not fit the file.
	ErrFormat = errors.New("pcapfile: bad format")
	// ErrTruncated means the file ends inside its header or a record.
	ErrTruncated = errors.New("pcapfile: truncated")
	// ErrTooLong means a packet does not fit the writer's snapshot length.
	ErrTooLong = errors.New("pcapfile: packet longer than the snapshot length")
)

func formatErr(f string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(f, a...))
}

// Header is a file's global header.
type Header struct {
	// SnapLen is the snapshot length: no record holds more bytes.
	SnapLen uint32
	// LinkType is the link-layer header type (LinkTypeEthernet).
	LinkType uint32
	// Nanosecond is true for the nanosecond-resolution magic.
	Nanosecond bool
	// ByteOrder is the file's byte order (binary.LittleEndian or
	// binary.BigEndian).
	ByteOrder binary.ByteOrder
	// VersionMajor and VersionMinor are the format version (2.4).
	VersionMajor, VersionMinor uint16
}

// Packet is one record.
type Packet struct {
	// Time is the capture time (UTC).
	Time time.Time
	// Data are the captured bytes: the frame, or its first SnapLen bytes.
	Data []byte
	// OrigLen is the frame's length on the wire (>= len(Data)). The writer
	// takes zero as len(Data).
	OrigLen int
}

// Truncated reports whether the record holds less than the whole frame.
func (p Packet) Truncated() bool { return p.OrigLen > len(p.Data) }

// Reader reads the records of a pcap file in order.
type Reader struct {
	r   io.Reader
	hdr Header
	buf [recHdrLen]byte
	err error // sticky: the first error Next returned
}

// NewReader reads and checks the global header.
func NewReader(r io.Reader) (*Reader, error) {
	var b [fileHdrLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: file header: %d bytes wanted", ErrTruncated, fileHdrLen)
		}
		return nil, err
	}
	var h Header
	switch {
	case binary.LittleEndian.Uint32(b[0:]) == magicMicro:
		h.ByteOrder = binary.LittleEndian
	case binary.LittleEndian.Uint32(b[0:]) == magicNano:
		h.ByteOrder, h.Nanosecond = binary.LittleEndian, true
	case binary.BigEndian.Uint32(b[0:]) == magicMicro:
		h.ByteOrder = binary.BigEndian
	case binary.BigEndian.Uint32(b[0:]) == magicNano:
		h.ByteOrder, h.Nanosecond = binary.BigEndian, true
	default:
		return nil, formatErr("magic %#x is not a classic pcap magic (pcapng is not read)", binary.BigEndian.Uint32(b[0:]))
	}
	bo := h.ByteOrder
	h.VersionMajor, h.VersionMinor = bo.Uint16(b[4:]), bo.Uint16(b[6:])
	h.SnapLen, h.LinkType = bo.Uint32(b[16:]), bo.Uint32(b[20:])
	// Bytes 8..15 (thiszone, sigfigs) are zero in practice and unused.
	switch {
	case h.VersionMajor != 2:
		return nil, formatErr("version %d.%d, want 2.x", h.VersionMajor, h.VersionMinor)
	case h.SnapLen == 0 || h.SnapLen > MaxSnapLen:
		return nil, formatErr("snapshot length %d not in 1..%d", h.SnapLen, MaxSnapLen)
	case h.LinkType != LinkTypeEthernet:
		return nil, formatErr("link type %d, want %d (Ethernet)", h.LinkType, LinkTypeEthernet)
	}
	return &Reader{r: r, hdr: h}, nil
}

// Header is the file's global header.
func (r *Reader) Header() Header { return r.hdr }

// Next returns the next record. At the end of the file (on a record
// boundary) it returns io.EOF; a record cut short is ErrTruncated and a
// record that does not fit the header ErrFormat. On any error the packet
// is the zero Packet, and every later call returns the same error.
func (r *Reader) Next() (Packet, error) {
	if r.err != nil {
		return Packet{}, r.err
	}
	p, err := r.next()
	if err != nil {
		r.err = err
		return Packet{}, err
	}
	return p, nil
}

func (r *Reader) next() (Packet, error) {
	n, err := io.ReadFull(r.r, r.buf[:])
	switch {
	case n == 0 && errors.Is(err, io.EOF):
		return Packet{}, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return Packet{}, fmt.Errorf("%w: record header: %d of %d bytes", ErrTruncated, n, recHdrLen)
	case err != nil:
		return Packet{}, err
	}
	bo := r.hdr.ByteOrder
	sec, frac := bo.Uint32(r.buf[0:]), bo.Uint32(r.buf[4:])
	incl, orig := bo.Uint32(r.buf[8:]), bo.Uint32(r.buf[12:])
	unit, max := uint32(1000), uint32(1e6)
	if r.hdr.Nanosecond {
		unit, max = 1, 1e9
	}
	switch {
	case incl > r.hdr.SnapLen:
		return Packet{}, formatErr("record of %d bytes exceeds the snapshot length %d", incl, r.hdr.SnapLen)
	case orig < incl:
		return Packet{}, formatErr("record of %d bytes from a frame of %d", incl, orig)
	case frac >= max:
		return Packet{}, formatErr("fractional second %d out of range", frac)
	}
	data := make([]byte, incl)
	if n, err := io.ReadFull(r.r, data); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Packet{}, fmt.Errorf("%w: record data: %d of %d bytes", ErrTruncated, n, incl)
		}
		return Packet{}, err
	}
	return Packet{
		Time:    time.Unix(int64(sec), int64(frac)*int64(unit)).UTC(),
		Data:    data,
		OrigLen: int(orig),
	}, nil
}

// ReadAll reads every record of a pcap file from r.
func ReadAll(r io.Reader) (Header, []Packet, error) {
	pr, err := NewReader(r)
	if err != nil {
		return Header{}, nil, err
	}
	var ps []Packet
	for {
		p, err := pr.Next()
		if errors.Is(err, io.EOF) {
			return pr.Header(), ps, nil
		}
		if err != nil {
			return pr.Header(), ps, fmt.Errorf("record %d: %w", len(ps)+1, err)
		}
		ps = append(ps, p)
	}
}

// ReadFile reads every record of the pcap file at path.
func ReadFile(path string) (Header, []Packet, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, nil, err
	}
	defer f.Close()
	h, ps, err := ReadAll(f)
	if err != nil {
		return h, ps, fmt.Errorf("%s: %w", path, err)
	}
	return h, ps, nil
}

// Writer writes a little-endian pcap file of Ethernet frames.
type Writer struct {
	w       io.Writer
	snapLen uint32
	nano    bool
}

// NewWriter writes the global header: snapLen (zero means DefaultSnapLen;
// at most MaxSnapLen) and the timestamp resolution (nanosecond or
// microsecond).
func NewWriter(w io.Writer, snapLen uint32, nanosecond bool) (*Writer, error) {
	if snapLen == 0 {
		snapLen = DefaultSnapLen
	}
	if snapLen > MaxSnapLen {
		return nil, fmt.Errorf("pcapfile: snapshot length %d above %d", snapLen, MaxSnapLen)
	}
	var b [fileHdrLen]byte
	magic := uint32(magicMicro)
	if nanosecond {
		magic = magicNano
	}
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint16(b[4:], 2)
	le.PutUint16(b[6:], 4)
	le.PutUint32(b[16:], snapLen)
	le.PutUint32(b[20:], LinkTypeEthernet)
	if _, err := w.Write(b[:]); err != nil {
		return nil, err
	}
	return &Writer{w: w, snapLen: snapLen, nano: nanosecond}, nil
}

// WritePacket writes one record. The time must fall in 1970..2106 (32-bit
// seconds); a microsecond file drops the sub-microsecond part. Data longer
// than the snapshot length is ErrTooLong (the writer does not cut
// frames); OrigLen below len(Data) is an error.
func (w *Writer) WritePacket(p Packet) error {
	if len(p.Data) > int(w.snapLen) {
		return fmt.Errorf("%w: %d bytes, snapshot length %d", ErrTooLong, len(p.Data), w.snapLen)
	}
	orig := p.OrigLen
	if orig == 0 {
		orig = len(p.Data)
	}
	if orig < len(p.Data) || uint64(orig) > math.MaxUint32 {
		return fmt.Errorf("pcapfile: original length %d for %d captured bytes", p.OrigLen, len(p.Data))
	}
	sec, nsec := p.Time.Unix(), p.Time.Nanosecond()
	if sec < 0 || sec > math.MaxUint32 {
		return fmt.Errorf("pcapfile: time %v outside the 32-bit seconds of pcap", p.Time)
	}
	frac := uint32(nsec)
	if !w.nano {
		frac /= 1000
	}
	var b [recHdrLen]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(sec))
	le.PutUint32(b[4:], frac)
	le.PutUint32(b[8:], uint32(len(p.Data)))
	le.PutUint32(b[12:], uint32(orig))
	if _, err := w.w.Write(b[:]); err != nil {
		return err
	}
	_, err := w.w.Write(p.Data)
	return err
}

// WriteFile writes packets to a new pcap file at path (replacing it), with
// the given snapshot length and resolution.
func WriteFile(path string, snapLen uint32, nanosecond bool, packets []Packet) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	w, err := NewWriter(bw, snapLen, nanosecond)
	if err == nil {
		for _, p := range packets {
			if err = w.WritePacket(p); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
