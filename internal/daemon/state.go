package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The device state file: DIR/devices.json, where DIR is vrdmad's
// --state-dir. It lists the devices added through the control API, each
// as the POST /v1/devices body that recreates it with the same identity:
//
//	{
//	  "version": 1,
//	  "devices": [
//	    {"id": "vm1", "socket": "/run/vrdma/vm1.sock",
//	     "uuid": "0211…", "guid": "0211:2233:4455:6677",
//	     "limits": {"max_qps": 64, "max_pinned_bytes": 536870912}}
//	  ]
//	}
//
// Limits and doorbell_queues are kept as the request gave them: a zero
// field still means the daemon's default at the time of the restore. A
// device's share is kept as it is now (set at creation or by PATCH); a
// file that holds a share is version 2, which an older vrdmad refuses
// (and leaves in place) instead of setting it aside as corrupt; a file
// without one stays version 1, which every vrdmad reads.
const (
	// StateFile is the state file's name in the state directory.
	StateFile = "devices.json"
	// StateVersion is the newest version this vrdmad writes and reads; it
	// reads stateVersionNoShare too, and writes it when no device has a
	// share.
	StateVersion = 2
	// stateVersionNoShare is the version of files without shares.
	stateVersionNoShare = 1
	// MaxDevices bounds the devices of one daemon, and so the state file.
	MaxDevices = 16384
	// maxStateBytes bounds the state file: MaxDevices records of at most
	// about 500 bytes each (id 64, socket 107, uuid, guid, limits), with
	// room to spare.
	maxStateBytes = 16 << 20
	// stateTempPattern names the temporary files of an atomic write.
	stateTempPattern = ".devices.json.tmp-*"
	// corruptSuffix precedes the UTC time in the name a bad state file is
	// moved to.
	corruptSuffix = ".corrupt-"
)

// ErrState means the state directory or file cannot be used. Returned as
// *StateError.
var ErrState = errors.New("device state")

// StateError is a state directory or file that cannot be used.
type StateError struct {
	// Path is the state file or directory.
	Path string
	// Kept, when not empty, is where the unusable state file was moved so
	// that nothing is lost: the next start begins without its devices.
	Kept string
	// Err says what is wrong.
	Err error
}

func (e *StateError) Error() string {
	s := fmt.Sprintf("device state %s: %v", e.Path, e.Err)
	if e.Kept != "" {
		s += fmt.Sprintf("; the file was moved to %s (its devices are not served; "+
			"fix it and move it back, or add the devices again)", e.Kept)
	}
	return s
}

// Unwrap returns the cause.
func (e *StateError) Unwrap() error { return e.Err }

// Is reports whether target is ErrState.
func (e *StateError) Is(target error) bool { return target == ErrState }

// stateDoc is the state file's document.
type stateDoc struct {
	Version int          `json:"version"`
	Devices []AddRequest `json:"devices"`
}

// stateStore is an open, locked state directory.
type stateStore struct {
	dir  string   // immutable
	path string   // immutable: dir/StateFile
	dirf *os.File // immutable: holds the flock; fsync'd after a rename
}

// openStateStore creates dir if needed, locks it (one vrdmad per state
// directory), removes the temporary files of an interrupted write, and
// checks that a file can be written there.
func openStateStore(dir string) (*stateStore, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, &StateError{Path: dir, Err: errors.New("want an absolute directory path")}
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, &StateError{Path: dir, Err: fmt.Errorf("create the state directory: %w", err)}
	}
	dirf, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &StateError{Path: dir, Err: fmt.Errorf("open the state directory: %w", err)}
	}
	if err := unix.Flock(int(dirf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		dirf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			err = errors.New("in use by another vrdmad (give each vrdmad its own --state-dir)")
		}
		return nil, &StateError{Path: dir, Err: fmt.Errorf("lock the state directory: %w", err)}
	}
	s := &stateStore{dir: dir, path: filepath.Join(dir, StateFile), dirf: dirf}
	stale, _ := filepath.Glob(filepath.Join(dir, stateTempPattern))
	for _, p := range stale {
		os.Remove(p)
	}
	// Probe: a store that cannot write would lose every device added
	// from now on, and could not set a corrupt file aside.
	f, err := os.CreateTemp(dir, stateTempPattern)
	if err != nil {
		s.close()
		return nil, &StateError{Path: dir, Err: fmt.Errorf("state directory not writable: %w", err)}
	}
	f.Close()
	os.Remove(f.Name())
	return s, nil
}

func (s *stateStore) close() { s.dirf.Close() }

// inheritStateStore makes a store of dir from dirf, the directory's
// descriptor a live upgrade's old process passed with its lock: flock
// locks belong to the open file, which both processes share, so locking
// it again succeeds here and fails for any other vrdmad.
func inheritStateStore(dir string, dirf *os.File) (*stateStore, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		dirf.Close()
		return nil, &StateError{Path: dir, Err: errors.New("want an absolute directory path")}
	}
	dir = filepath.Clean(dir)
	var a, b unix.Stat_t
	if err := unix.Fstat(int(dirf.Fd()), &a); err != nil || unix.Stat(dir, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		dirf.Close()
		return nil, &StateError{Path: dir, Err: errors.New("the old vrdmad's state directory is another one (give both the same --state-dir)")}
	}
	if err := unix.Flock(int(dirf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		dirf.Close()
		return nil, &StateError{Path: dir, Err: fmt.Errorf("lock the state directory: %w", err)}
	}
	return &stateStore{dir: dir, path: filepath.Join(dir, StateFile), dirf: dirf}, nil
}

// corruptCopies lists the state files set aside by earlier starts.
func (s *stateStore) corruptCopies() []string {
	m, _ := filepath.Glob(s.path + corruptSuffix + "*")
	return m
}

// load reads and checks the state file. A missing file is an empty
// state. A file that cannot be read or fails any check is moved aside
// (StateError.Kept) unless it was written by another version.
func (s *stateStore) load() ([]DeviceSpec, error) {
	b, err := readBounded(s.path, maxStateBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err == nil {
		var specs []DeviceSpec
		specs, err = decodeState(b)
		if err == nil {
			return specs, nil
		}
		var ve *versionError
		if errors.As(err, &ve) {
			// Not corrupt: a file of another vrdmad version is left
			// where it is, for that version.
			return nil, &StateError{Path: s.path, Err: err}
		}
	}
	se := &StateError{Path: s.path, Err: err}
	kept, rerr := s.setAside()
	if rerr != nil {
		se.Err = fmt.Errorf("%w; moving it aside failed too: %w", err, rerr)
		return nil, se
	}
	se.Kept = kept
	return nil, se
}

// setAside renames the state file to devices.json.corrupt-<UTC time>.
func (s *stateStore) setAside() (string, error) {
	base := s.path + corruptSuffix + time.Now().UTC().Format("20060102T150405Z")
	for i := 0; i < 100; i++ {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		if _, err := os.Lstat(name); err == nil {
			continue
		}
		if err := os.Rename(s.path, name); err != nil {
			return "", err
		}
		if err := s.dirf.Sync(); err != nil {
			return name, fmt.Errorf("sync the state directory: %w", err)
		}
		return name, nil
	}
	return "", errors.New("too many corrupt copies with the same time stamp")
}

// save replaces the state file with devs, atomically: a temporary file
// in the same directory, fsync, rename over the old file, fsync of the
// directory. A crash at any point leaves the old or the new file whole.
func (s *stateStore) save(devs []AddRequest) error {
	sort.Slice(devs, func(i, j int) bool { return devs[i].ID < devs[j].ID })
	if devs == nil {
		devs = []AddRequest{}
	}
	version := stateVersionNoShare
	for _, r := range devs {
		if r.Share != nil {
			version = StateVersion
		}
	}
	b, err := json.MarshalIndent(stateDoc{Version: version, Devices: devs}, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	f, err := os.CreateTemp(s.dir, stateTempPattern)
	if err != nil {
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	tmp := f.Name()
	err = writeSynced(f, b)
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	if err := s.dirf.Sync(); err != nil {
		return fmt.Errorf("write %s: sync directory: %w", s.path, err)
	}
	return nil
}

func writeSynced(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readBounded reads a regular file of at most limit bytes. A symbolic
// link is not followed: the state file is vrdmad's own.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// versionError is a state file of a version this vrdmad does not read.
type versionError struct{ got int }

func (e *versionError) Error() string {
	return fmt.Sprintf("version %d: this vrdmad reads versions %d to %d (written by another vrdmad version?)", e.got, stateVersionNoShare, StateVersion)
}

// decodeState parses and checks a state file: the document's shape, its
// version, and every device as POST /v1/devices checks it, plus what a
// restore needs (a fixed identity, unique ids and sockets). On error the
// result is nil.
func decodeState(b []byte) ([]DeviceSpec, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	// Read the version alone first: a future version may have fields this
	// one does not know.
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	if head.Version == nil {
		return nil, errors.New("no version field")
	}
	if *head.Version < stateVersionNoShare || *head.Version > StateVersion {
		return nil, &versionError{got: *head.Version}
	}
	var doc stateDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	if doc.Devices == nil {
		return nil, errors.New("no devices field")
	}
	if len(doc.Devices) > MaxDevices {
		return nil, fmt.Errorf("%d devices, more than %d", len(doc.Devices), MaxDevices)
	}
	specs := make([]DeviceSpec, 0, len(doc.Devices))
	ids := make(map[string]bool, len(doc.Devices))
	socks := make(map[string]string, len(doc.Devices))
	for i, r := range doc.Devices {
		where := fmt.Sprintf("devices[%d]", i)
		if r.ID != "" {
			where += fmt.Sprintf(" (%q)", r.ID)
		}
		if r.UUID == "" {
			return nil, fmt.Errorf("%s: uuid missing (a saved device keeps its identity)", where)
		}
		if r.Incoming {
			return nil, fmt.Errorf("%s: incoming (a migration's destination is saved once it holds its identity, as a device like any)", where)
		}
		spec, err := requestSpec(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if ids[spec.ID] {
			return nil, fmt.Errorf("%s: id listed twice", where)
		}
		if other, ok := socks[spec.Socket]; ok {
			return nil, fmt.Errorf("%s: socket %s is also device %q's", where, spec.Socket, other)
		}
		ids[spec.ID], socks[spec.Socket] = true, spec.ID
		spec.Persist = true
		specs = append(specs, spec)
	}
	return specs, nil
}

// record is the state-file form of a device: the request that recreates
// it. spec's limits are the request's (before the daemon's defaults).
func (spec DeviceSpec) record() AddRequest {
	r := AddRequest{ID: spec.ID, Socket: spec.Socket, DoorbellQueues: spec.Device.DoorbellQueues, Share: shareRecord(spec.Device.Share),
		RoCEBind: addrStrings(spec.RoCEBind), RNIC: spec.RNIC}
	if len(spec.Device.AllowedGIDs) > 0 {
		r.Addresses = controlapi.PrefixStrings(spec.Device.AllowedGIDs)
	}
	if u := spec.Device.UUID; u != uuid.Nil {
		r.UUID = u.String()
		r.GUID = abi.FormatGUID(abi.GUIDOfUUID(u))
	}
	l := Limits{MaxQPs: spec.Device.Limits.MaxQP, MaxCQs: spec.Device.Limits.MaxCQ, MaxMRs: spec.Device.Limits.MaxMR, MaxPinnedBytes: spec.MaxPinned}
	if l != (Limits{}) {
		r.Limits = &l
	}
	return r
}

// OpenState makes dir the daemon's state directory and returns the
// devices its state file lists, for Restore. It creates dir if needed
// (mode 0750), locks it against a second vrdmad, and checks that it can
// write there. A state file that cannot be read or fails validation (the
// same checks as POST /v1/devices, plus bounded sizes, a known version,
// unique ids and sockets and a saved uuid) is moved to
// devices.json.corrupt-<UTC time>, and OpenState succeeds without its
// devices: the daemon is degraded (ProblemStateSetAside, naming the copy)
// until the problem is acknowledged, and so it is for each copy an
// earlier start left. A file of an unknown version, one that could not be
// moved aside and a directory that cannot be used are errors
// (*StateError, ErrState); a daemon whose OpenState failed keeps no
// state. OpenState is called once, before devices are added.
func (d *Daemon) OpenState(dir string) ([]DeviceSpec, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.state != nil {
		return nil, errors.New("state directory is open already")
	}
	s, err := openStateStore(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range s.corruptCopies() {
		d.log.WithField("file", c).Warn("a state file set aside by an earlier start is still here: its devices were not restored")
		d.raiseLocked(setAsideProblem(c, ""))
	}
	specs, err := s.load()
	var se *StateError
	if errors.As(err, &se) && se.Kept != "" {
		// Serve without its devices rather than not at all: the VMs of
		// the devices given otherwise, and the control API to add them
		// again, are worth more than a daemon that refuses to start.
		d.log.WithError(err).WithField("file", se.Kept).Error("device state file set aside: serving without its devices")
		d.raiseLocked(setAsideProblem(se.Kept, fmt.Sprintf("device state %s: %v; the file was moved to %s and its devices are not served",
			se.Path, se.Err, se.Kept)))
		d.state = s
		return nil, nil
	}
	if err != nil {
		s.close()
		return nil, err
	}
	d.state = s
	d.log.WithFields(logrus.Fields{"file": s.path, "devices": len(specs)}).Info("device state loaded")
	return specs, nil
}

// Restore adds the devices OpenState returned, with their saved identity,
// without rewriting the state file. It stops at the first device that
// cannot be served (its socket path is taken, its directory is gone, its
// id or socket is a command-line device's) and returns an error naming
// it; the devices restored before it stay added. Callers usually treat
// that as fatal, so that no saved device is silently left out.
func (d *Daemon) Restore(specs []DeviceSpec) error {
	d.mu.Lock()
	file := "the state file"
	if d.state != nil {
		file = d.state.path
	}
	d.mu.Unlock()
	for _, spec := range specs {
		spec.Persist = true
		if _, err := d.addDevice(spec, false); err != nil {
			return fmt.Errorf("restore device %s (socket %s) from %s: %w", spec.ID, spec.Socket, file, err)
		}
	}
	return nil
}
