package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Config describes a device.
type Config struct {
	// ID names the device in logs and the control API.
	ID string
	// UUID identifies the device; node GUID and GID derive from it. The
	// zero UUID means a random one.
	UUID uuid.UUID
	// DoorbellQueues is the number of doorbell queues (one per guest
	// vCPU); zero means 1.
	DoorbellQueues int
	// MaxQueueSize bounds each virtqueue's size; zero means 1024.
	MaxQueueSize int
	// Limits; zero fields take DefaultLimits' values.
	Limits Limits
	// Fabric connects the devices of one daemon; nil means a private one.
	Fabric *engine.Fabric
	// NetGIDs: the device's own network GIDs (roce_bind), not the fabric's.
	NetGIDs [][16]byte
	// AllowedGIDs are the addresses the operator assigned the device:
	// ADD_GID may claim a GID within these prefixes (an IPv4 prefix covers
	// the IPv4-mapped GIDs of its addresses), besides the port GID and its
	// network GIDs. None (the zero value) allows nothing more: a guest's
	// driver then keeps only the port GID (docs/security.md).
	AllowedGIDs []netip.Prefix
	// Pin configures PVDMA pinning (on demand by default, pin-all, map
	// cache, quota). Its Accounting is shared by a daemon's devices.
	Pin memmap.PinConfig
	// Spin is the longest a doorbell engine keeps polling after its last
	// work before it sleeps; zero means 50µs, a negative value never.
	// Each doorbell queue adapts its window below it (spinWindow): the
	// window shrinks to nothing while spinning does not find the driver's
	// next post, which is the case when the driver's vCPU needs the core
	// the engine spins on.
	Spin time.Duration
	// ControlSpin is how long the control queue's worker keeps polling for
	// the next command after answering one, with the driver's kicks
	// suppressed; zero means 20µs, a negative value not at all. A driver
	// issuing commands back to back then pays neither a kick nor a
	// wake-up per command.
	ControlSpin time.Duration
	// MaxCommandsPerSec bounds the control commands a driver may issue per
	// second (a token bucket holding one second's worth); beyond it a
	// command answers QUOTA. Zero means no bound.
	MaxCommandsPerSec int
	// Share is the device's part of the engine (weight, rate bounds);
	// SetShare changes it later.
	Share Share
	// Pool runs the device's doorbell queues; nil means sched.Default(),
	// a pool shared by every device of the process.
	Pool *sched.Pool
	// Incoming creates the destination of a migration from a device of
	// the same UUID on this daemon (identity.go): the device holds no GID
	// and no QP number, and is not registered on the Fabric, until a
	// state is loaded into it (LoadState takes the source's identity) or,
	// when nobody holds the identity, its driver starts it. Not with NIC.
	Incoming bool
	// OnMigratedIn, if not nil, is called after a state was loaded into
	// an incoming device (it holds the identity now), on the goroutine
	// that called LoadState, with no lock of the device held.
	OnMigratedIn func()
	// NIC, if not nil, runs the device's work on a host RDMA NIC (the
	// "verbs" RNIC, package hostnic) instead of the software RNIC: the
	// device then belongs to no Fabric, its limits are capped by the
	// NIC's, and its GID table holds the host port's GIDs within
	// AllowedGIDs (all of the port's RoCE v2 GIDs when none are
	// assigned).
	NIC HostNIC
}

// maxRequest bounds a control request's size (header included). The largest
// command, REG_MR with an inline page list, fits in it.
const maxRequest = 64 << 10

// maxResponse bounds a control response (header included).
const maxResponse = 4 << 10

// Device is the vrdma device served on one socket.
type Device struct {
	cfg  Config        // immutable
	log  *logrus.Entry // immutable
	conf abi.Config    // immutable config space image
	raw  [abi.ConfigSize]byte

	// Control-queue scratch, protected by the control queue's lock (only
	// HandleQueue on queue 0 uses them). req and resp are allocated by the
	// first command, grown to the largest one seen (scratch), and dropped
	// by Detach: a device without a driver, and an idle one that only
	// answered small commands, holds little (backend/doc.go, "Cost of a
	// device").
	chain virtio.Chain
	req   []byte
	resp  []byte

	eng *engine.RNIC // immutable

	mu     sync.Mutex
	host   backend.Host   // protected by mu
	res    *resources     // protected by mu; nil while detached
	pinner *memmap.Pinner // protected by mu; nil while detached
	memory *memmap.Memory // protected by mu; nil while detached

	hostp        atomic.Pointer[backend.Host] // = host, for postEvent, which must not take mu
	eventChain   virtio.Chain                 // protected by the event queue's lock
	eventsLost   atomic.Uint64
	lostReported atomic.Bool // DEVICE_FATAL sent for this attachment

	// The doorbell queues' tasks while attached; doorbellsp mirrors
	// doorbells for wakeDoorbell, which must not take mu.
	pool       *sched.Pool                 // immutable
	doorbells  []*doorbell                 // protected by mu
	doorbellsp atomic.Pointer[[]*doorbell] // = doorbells
	rate       bucket                      // the Share's rate bounds

	commands atomic.Uint64
	errors   atomic.Uint64

	// quiesced: no engine pass runs on the doorbell queues until
	// Unquiesce (quiesce.go); set under mu, read by the visits.
	quiesced atomic.Bool
	// imported is what ImportState left for FinishImport (protected by
	// mu; nil otherwise).
	imported *imported

	// Migration (identity.go), protected by mu: incoming (no state
	// loaded, no identity held), migratedIn (a state was loaded into an
	// incoming device), suspended (the front-end stopped every ring:
	// Suspend). fatalPending: DEVICE_FATAL to post on the event queue
	// (rings restarted on a migrated-out device).
	incoming     bool
	migratedIn   bool
	suspended    bool
	fatalPending atomic.Bool

	share atomic.Pointer[Share] // never nil

	// Command rate limit; protected by the control queue's lock.
	tokens   float64
	tokensAt time.Time
}

// Option configures a Device.
type Option func(*Device)

// WithLogger sets the logger.
func WithLogger(l *logrus.Entry) Option { return func(d *Device) { d.log = l } }

// New creates a device.
func New(cfg Config, opts ...Option) (*Device, error) {
	if cfg.DoorbellQueues == 0 {
		cfg.DoorbellQueues = 1
	}
	if cfg.DoorbellQueues < 0 || cfg.DoorbellQueues > 256 {
		return nil, fmt.Errorf("rdma: %d doorbell queues out of range [1, 256]", cfg.DoorbellQueues)
	}
	if cfg.MaxQueueSize == 0 {
		cfg.MaxQueueSize = 1024
	}
	if cfg.MaxQueueSize < 2 || cfg.MaxQueueSize > virtio.MaxQueueSize || cfg.MaxQueueSize&(cfg.MaxQueueSize-1) != 0 {
		return nil, fmt.Errorf("rdma: max queue size %d is not a power of two in [2, %d]", cfg.MaxQueueSize, virtio.MaxQueueSize)
	}
	if err := cfg.Share.Check(); err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	cfg.Limits = cfg.Limits.WithDefaults(DefaultLimits())
	var nicGIDs [][16]byte
	if cfg.NIC != nil {
		cfg.Limits = cfg.Limits.Min(cfg.NIC.Limits())
		var err error
		if nicGIDs, err = selectGIDs(cfg.NIC, cfg.AllowedGIDs); err != nil {
			return nil, fmt.Errorf("rdma: %w", err)
		}
	}
	if cfg.UUID == uuid.Nil {
		cfg.UUID = uuid.New()
	}
	if cfg.Incoming && cfg.NIC != nil {
		return nil, errors.New("rdma: an incoming device (a migration's destination) runs on the software RNIC")
	}
	d := &Device{cfg: cfg}
	share := cfg.Share
	d.share.Store(&share)
	for _, o := range opts {
		o(d)
	}
	if d.log == nil {
		l := logrus.New()
		l.SetLevel(logrus.PanicLevel)
		d.log = logrus.NewEntry(l)
	}
	d.log = d.log.WithField("device", cfg.ID)
	guid := abi.GUIDOfUUID(cfg.UUID)
	l := cfg.Limits
	d.conf = abi.Config{
		ABIVersion:        abi.ABIVersion,
		NumDoorbellQueues: uint32(cfg.DoorbellQueues),
		NodeGUID:          guid,
		PortGID:           abi.LinkLocalGID(guid),
		MaxQP:             l.MaxQP,
		MaxQPWR:           l.MaxQPWR,
		MaxSGE:            l.MaxSGE,
		MaxCQ:             l.MaxCQ,
		MaxCQE:            l.MaxCQE,
		MaxMR:             l.MaxMR,
		MaxPD:             l.MaxPD,
		MaxAH:             l.MaxAH,
		MaxMRSize:         l.MaxMRSize,
		MaxInlineData:     l.MaxInlineData,
		ActiveMTU:         abi.MTU4096,
		PortState:         abi.PortActive,
		MaxQPRdAtom:       l.MaxQPRdAtom,
		MaxSRQ:            l.MaxSRQ,
		DeviceCaps:        abi.DeviceCapGSI,
	}
	if cfg.NIC != nil {
		d.conf.MaxSRQ = 0     // "On a device whose RNIC is a host NIC, CREATE_SRQ is UNSUPPORTED"
		d.conf.DeviceCaps = 0 // "its device_caps is 0"
		d.conf.PortGID = nicGIDs[0]
		d.conf.ActiveMTU = cfg.NIC.ActiveMTU()
	}
	copy(d.raw[:], abi.Marshal(&d.conf))
	if cfg.NIC != nil {
		d.eng = engine.NewRNIC(nil, d.conf.PortGID, d.log)
		d.eng.SetNIC(cfg.NIC, nicGIDs)
	}
	if cfg.Fabric == nil {
		cfg.Fabric = engine.NewFabric()
		d.cfg.Fabric = cfg.Fabric
	}
	if d.cfg.Spin == 0 {
		d.cfg.Spin = 50 * time.Microsecond
	}
	if d.cfg.Spin < 0 {
		d.cfg.Spin = 0
	}
	d.pool = cfg.Pool
	if d.pool == nil {
		d.pool = sched.Default()
	}
	if d.cfg.ControlSpin == 0 {
		d.cfg.ControlSpin = 20 * time.Microsecond
	}
	if cfg.NIC != nil {
		d.eng.SetAllowedGIDs(cfg.AllowedGIDs)
		return d, nil
	}
	d.eng = engine.NewRNIC(cfg.Fabric, d.conf.PortGID, d.log)
	d.eng.SetActiveMTU(d.conf.ActiveMTU) // bounds a UD message
	d.eng.SetNetGIDs(cfg.NetGIDs)
	d.eng.SetAllowedGIDs(cfg.AllowedGIDs)
	if cfg.Incoming {
		// Fenced and off the fabric until it takes its identity.
		d.incoming = true
		d.eng.SetFence(true)
		return d, nil
	}
	if err := cfg.Fabric.Register(d.eng); err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	return d, nil
}

// Close unregisters the device from its fabric. The server must have been
// closed (the device detached).
func (d *Device) Close() {
	if d.cfg.NIC == nil {
		d.cfg.Fabric.Unregister(d.eng)
		return
	}
	d.eng.CloseNIC()
}

// ID is the device's ID.
func (d *Device) ID() string { return d.cfg.ID }

// UUID is the device's UUID.
func (d *Device) UUID() uuid.UUID { return d.cfg.UUID }

// ConfigSpace returns the config space as the driver sees it.
func (d *Device) ConfigSpace() abi.Config { return d.conf }

// Stats are the device's counters and resource counts.
type Stats struct {
	Commands   uint64
	Errors     uint64
	PDs        int
	MRs        int
	CQs        int
	QPs        int
	AHs        int
	SRQs       int
	Pin        memmap.PinStats
	Engine     engine.Stats
	EventsLost uint64
}

// Stats returns the device's counters.
func (d *Device) Stats() Stats {
	s := Stats{Commands: d.commands.Load(), Errors: d.errors.Load(), Engine: d.eng.Stats(), EventsLost: d.eventsLost.Load()}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.res != nil {
		e := d.eng
		s.PDs, s.MRs, s.CQs = e.Count(engine.KindPD), e.Count(engine.KindMR), e.Count(engine.KindCQ)
		s.QPs, s.AHs, s.SRQs = e.Count(engine.KindQP), e.Count(engine.KindAH), e.Count(engine.KindSRQ)
	}
	if d.pinner != nil {
		s.Pin = d.pinner.Stats()
	}
	return s
}

// backend.Device implementation.

func (d *Device) Features() uint64 {
	return virtio.FeatureVersion1 | virtio.FeatureIndirectDesc | virtio.FeatureEventIdx
}

// LogsDirty reports that every write of the device into guest memory is
// marked in the dirty log (backend.DirtyLogger; engine/doc.go, "Dirty
// logging"), so the session offers VHOST_F_LOG_ALL: true for the software
// RNIC, false on a host NIC, whose DMA the device cannot see.
func (d *Device) LogsDirty() bool { return d.cfg.NIC == nil }

func (d *Device) NumQueues() int { return abi.FirstDoorbellQueue + d.cfg.DoorbellQueues }

// Interrupts implements backend.Interrupter: only the control and event
// queues carry buffers the device returns; a doorbell queue's used ring
// only holds the engine's NO_NOTIFY flag.
func (d *Device) Interrupts(queue int) bool { return queue < abi.FirstDoorbellQueue }
func (d *Device) MaxQueueSize() int         { return d.cfg.MaxQueueSize }
func (d *Device) ConfigSize() int           { return abi.ConfigSize }

func (d *Device) ReadConfig(off int, buf []byte) error {
	if off < 0 || off > len(d.raw) || len(buf) > len(d.raw)-off {
		return fmt.Errorf("config read [%d, +%d) out of range", off, len(buf))
	}
	copy(buf, d.raw[off:])
	return nil
}

// WriteConfig ignores writes: the config space is read-only for the driver.
func (d *Device) WriteConfig(off int, data []byte) error { return nil }

func (d *Device) Attach(h backend.Host) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.host = h
	d.hostp.Store(&h)
	d.lostReported.Store(false)
	d.memory = h.Memory()
	d.res = &resources{}
	d.pinner = memmap.NewPinner(d.cfg.Pin)
	if err := d.startDoorbells(h); err != nil {
		// Only a closed pool (the daemon shutting down) gets here: the
		// device serves no data path then.
		d.log.WithError(err).Error("engine pool")
		d.stopDoorbells()
	}
	dbs := d.doorbells
	d.doorbellsp.Store(&dbs)
	d.eng.Attach(d.memory, d.postEvent, d.wakeDoorbell)
}

func (d *Device) Detach() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.doorbellsp.Store(nil)
	d.stopDoorbells()
	d.destroyAll()
	d.eng.Detach()
	if d.pinner != nil {
		d.pinner.Close()
	}
	d.host, d.res, d.pinner, d.memory = nil, nil, nil, nil
	d.hostp.Store(nil)
	// No worker runs (the session joined them before Detach): the control
	// queue's scratch can go.
	d.req, d.resp = nil, nil
}

// Reset destroys every object the driver created and releases every pin.
// It ends a suspension (Suspend): with no objects left the fence protects
// nothing, and peers' requests fail as to a device without the QP rather
// than wait; an incoming or migrated-out device stays fenced. A
// migrated-out device's reset touches no peer of the destination: they
// point at the destination since the handoff.
func (d *Device) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.destroyAll()
	if d.res != nil {
		d.res = &resources{}
	}
	if d.suspended {
		d.suspended = false
		if !d.incoming {
			d.eng.SetFence(false)
		}
	}
}

// MemoryChanged tells the pinner about the new table (pin=all pins it).
func (d *Device) MemoryChanged() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pinner == nil {
		return
	}
	t := d.memory.Acquire()
	if err := d.pinner.SetTable(t); err != nil {
		d.log.WithError(err).Warn("pinning guest memory (--pin=all)")
	}
	d.eng.DropStaleNIC(t)
	t.Release()
}

// mem is the attached guest memory. Precondition: d.mu held, attached.
func (d *Device) mem() *memmap.Memory { return d.memory }

// Connected reports whether a front-end is attached.
func (d *Device) Connected() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.host != nil
}

func (d *Device) HandleQueue(q *backend.Queue) error {
	switch q.Index() {
	case abi.ControlQueue:
		return d.handleControl(q)
	case abi.EventQueue:
		// The event queue's buffers stay posted until there is an event;
		// the first one after a resume says the device lost the driver's
		// objects (docs/spec.md, Reset and disconnect).
		if h := d.hostp.Load(); h != nil && (*h).Resumed() && !d.lostReported.Swap(true) {
			return d.writeEvent(q, abi.Event{Type: abi.EventDeviceFatal})
		}
		if d.fatalPending.Swap(false) {
			// Migrated out (Suspend): the objects are the destination's.
			return d.writeEvent(q, abi.Event{Type: abi.EventDeviceFatal})
		}
		return nil
	default:
		// Kicked claims the doorbell queues; a call here is a kick too.
		d.wakeDoorbell(q.Index() - abi.FirstDoorbellQueue)
		return nil
	}
}

// postEvent writes one event into a buffer the driver posted on the event
// queue; with none posted the event is lost and counted.
func (d *Device) postEvent(ev abi.Event) {
	// No d.mu here: events are posted from inside commands that hold it.
	hp := d.hostp.Load()
	if hp == nil {
		d.eventsLost.Add(1)
		return
	}
	evq := (*hp).Queue(abi.EventQueue)
	if evq == nil {
		d.eventsLost.Add(1)
		return
	}
	if err := evq.Run(func(q *backend.Queue) error { return d.writeEvent(q, ev) }); err != nil {
		d.eventsLost.Add(1)
	}
}

// writeEvent writes ev into the next buffer of the event queue q.
// Precondition: q locked (HandleQueue or Run).
func (d *Device) writeEvent(q *backend.Queue, ev abi.Event) error {
	ok, err := q.Pop(&d.eventChain)
	if err != nil {
		return err
	}
	if !ok {
		d.eventsLost.Add(1)
		return nil
	}
	n := d.eventChain.Scatter(abi.Marshal(&ev))
	return q.Push(d.eventChain.Head, uint32(n))
}
