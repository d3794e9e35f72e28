package hostniclab

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
)

// File is one entry of an initramfs archive.
type File struct {
	// Name is the path inside the archive, relative ("extra/job.sh"); a
	// directory of it that no earlier entry made is added before it.
	Name string
	// Mode is the permission bits (0755, 0644).
	Mode os.FileMode
	// Data is the content.
	Data []byte
}

// newc's fixed header: magic and thirteen 8-digit hexadecimal fields.
const (
	newcMagic   = "070701"
	newcHeader  = 110
	newcTrailer = "TRAILER!!!"
	// maxNewcSize bounds one entry (the header's field is 32 bits).
	maxNewcSize = 1<<32 - 1
	sIFREG      = 0o100000
	sIFDIR      = 0o040000
)

// ErrCpio is an archive that does not parse as newc.
var ErrCpio = errors.New("bad newc cpio archive")

// WriteNewc writes files as an uncompressed newc ("070701") cpio archive
// owned by root, the format the kernel unpacks into its rootfs (and which
// it also accepts appended to another archive, compressed or not: the
// extra archive of a boot). Missing parent directories are added.
func WriteNewc(w io.Writer, files []File) error {
	bw := bufio.NewWriter(w)
	ino := 1
	dirs := map[string]bool{".": true, "": true}
	entry := func(name string, mode uint32, data []byte) error {
		if len(data) > maxNewcSize {
			return fmt.Errorf("cpio: %s: %d bytes is too large for newc", name, len(data))
		}
		nlink := 1
		if mode&sIFDIR != 0 {
			nlink = 2
		}
		fields := []int{ino, int(mode), 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0}
		ino++
		var h strings.Builder
		h.WriteString(newcMagic)
		for _, f := range fields {
			fmt.Fprintf(&h, "%08x", f)
		}
		h.WriteString(name)
		h.WriteByte(0)
		for h.Len()%4 != 0 {
			h.WriteByte(0)
		}
		bw.WriteString(h.String())
		bw.Write(data)
		for n := len(data); n%4 != 0; n++ {
			bw.WriteByte(0)
		}
		return nil
	}
	var mkdirs func(dir string) error
	mkdirs = func(dir string) error {
		if dirs[dir] {
			return nil
		}
		if err := mkdirs(path.Dir(dir)); err != nil {
			return err
		}
		dirs[dir] = true
		return entry(dir, sIFDIR|0o755, nil)
	}
	for _, f := range files {
		name := path.Clean(strings.TrimPrefix(f.Name, "/"))
		if name == "." || strings.HasPrefix(name, "../") || name == ".." {
			return fmt.Errorf("cpio: bad name %q", f.Name)
		}
		if err := mkdirs(path.Dir(name)); err != nil {
			return err
		}
		if err := entry(name, sIFREG|uint32(f.Mode.Perm()), f.Data); err != nil {
			return err
		}
	}
	if err := entry(newcTrailer, 0, nil); err != nil {
		return err
	}
	return bw.Flush()
}

// ListNewc returns the names (without a leading "./" or "/") of the
// entries of a newc archive, gzip-compressed or not, with the symlink
// targets of the symbolic links. Concatenated archives are read one after
// the other.
func ListNewc(r io.Reader) (names []string, links map[string]string, err error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("cpio: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	links = map[string]string{}
	read := 0
	skip := func(n int) error {
		_, err := io.CopyN(io.Discard, br, int64(n))
		read += n
		return err
	}
	for {
		// Archives may be padded with zeros between them.
		for {
			b, err := br.Peek(1)
			if err == io.EOF {
				return names, links, nil
			}
			if err != nil {
				return names, links, err
			}
			if b[0] != 0 {
				break
			}
			skip(1)
		}
		h := make([]byte, newcHeader)
		if _, err := io.ReadFull(br, h); err != nil {
			return names, links, fmt.Errorf("%w: short header: %v", ErrCpio, err)
		}
		read += newcHeader
		if string(h[:6]) != newcMagic && string(h[:6]) != "070702" {
			return names, links, fmt.Errorf("%w: magic %q", ErrCpio, h[:6])
		}
		field := func(i int) (int, error) {
			v, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
			return int(v), err
		}
		mode, err1 := field(1)
		size, err2 := field(6)
		nameLen, err3 := field(11)
		if err := errors.Join(err1, err2, err3); err != nil || nameLen < 1 || nameLen > 4096 {
			return names, links, fmt.Errorf("%w: header fields", ErrCpio)
		}
		nb := make([]byte, nameLen)
		if _, err := io.ReadFull(br, nb); err != nil {
			return names, links, fmt.Errorf("%w: name: %v", ErrCpio, err)
		}
		read += nameLen
		if err := skip((4 - read%4) % 4); err != nil {
			return names, links, fmt.Errorf("%w: %v", ErrCpio, err)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(string(bytes.TrimRight(nb, "\x00")), "./"), "/")
		if name == newcTrailer {
			// The next archive (if any) starts on a 4-byte boundary too.
			read = 0
			continue
		}
		if mode&0o170000 == 0o120000 && size < 4096 {
			t := make([]byte, size)
			if _, err := io.ReadFull(br, t); err != nil {
				return names, links, fmt.Errorf("%w: link: %v", ErrCpio, err)
			}
			read += size
			links[name] = string(t)
		} else if err := skip(size); err != nil {
			return names, links, fmt.Errorf("%w: data of %s: %v", ErrCpio, name, err)
		}
		if err := skip((4 - read%4) % 4); err != nil {
			return names, links, fmt.Errorf("%w: %v", ErrCpio, err)
		}
		if name != "." {
			names = append(names, name)
		}
	}
}
