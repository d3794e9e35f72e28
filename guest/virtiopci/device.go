package virtiopci

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// struct virtio_pci_common_cfg (virtio 1.2 §4.1.4.3).
const (
	ccDeviceFeatureSelect = 0x00
	ccDeviceFeature       = 0x04
	ccDriverFeatureSelect = 0x08
	ccDriverFeature       = 0x0c
	ccMSIXConfig          = 0x10
	ccNumQueues           = 0x12
	ccDeviceStatus        = 0x14
	ccConfigGeneration    = 0x15
	ccQueueSelect         = 0x16
	ccQueueSize           = 0x18
	ccQueueMSIXVector     = 0x1a
	ccQueueEnable         = 0x1c
	ccQueueNotifyOff      = 0x1e
	ccQueueDesc           = 0x20
	ccQueueDriver         = 0x28
	ccQueueDevice         = 0x30

	noVector = 0xffff // VIRTIO_MSI_NO_VECTOR: we poll
)

// Defaults.
const (
	DefaultCommandTimeout = 10 * time.Second
	DefaultControlSize    = 64
	DefaultEventSize      = 64
	// DefaultDoorbellSize is the smallest size QEMU accepts (any non-zero
	// size up to the maximum): doorbell queues carry no descriptors.
	DefaultDoorbellSize = 1
	resetTimeout        = 2 * time.Second
	scratchSize         = 64 << 10 // bounds a command's request and response
)

// Option configures Open.
type Option func(*options)

type options struct {
	log           *logrus.Entry
	timeout       time.Duration
	ctrlSize      uint16
	evSize        uint16
	dbSize        uint16
	eventIdx      bool
	hugepageLimit int
	sysfs         string
}

func defaults() options {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return options{
		log: logrus.NewEntry(l), timeout: DefaultCommandTimeout,
		ctrlSize: DefaultControlSize, evSize: DefaultEventSize, dbSize: DefaultDoorbellSize,
		eventIdx: true, sysfs: sysfsDevices,
	}
}

// WithLogger sets the logger (default: warnings to stderr).
func WithLogger(l *logrus.Entry) Option { return func(o *options) { o.log = l } }

// WithCommandTimeout bounds one control command (default
// DefaultCommandTimeout).
func WithCommandTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithQueueSizes sets the sizes asked for the control, event and doorbell
// queues (powers of two; each is capped at the device's maximum).
func WithQueueSizes(ctrl, event, doorbell uint16) Option {
	return func(o *options) { o.ctrlSize, o.evSize, o.dbSize = ctrl, event, doorbell }
}

// WithoutEventIdx declines VIRTIO_F_EVENT_IDX.
func WithoutEventIdx() Option { return func(o *options) { o.eventIdx = false } }

// WithHugepageLimit caps the 2 MiB hugepages DMA memory may use (0: no cap).
func WithHugepageLimit(n int) Option { return func(o *options) { o.hugepageLimit = n } }

// queue is one virtqueue: rings in DMA memory, its notification offset.
type queue struct {
	index     int
	size      uint16
	mem       verbs.DMABuf
	rings     virtio.Rings
	notifyOff uint32              // byte offset in the notification structure
	dq        *virtio.DriverQueue // nil for doorbell queues
}

// Transport is the verbs.Transport over an initialised virtio-pci RDMA
// device (status DRIVER_OK). Everything polls: no interrupts.
type Transport struct {
	addr      string        // immutable: PCI address, "" for fakes
	log       *logrus.Entry // immutable
	common    Regs          // immutable
	notify    Regs          // immutable
	devcfg    Regs          // immutable
	notifyMul uint32        // immutable
	features  uint64        // immutable: negotiated
	timeout   time.Duration // immutable
	dma       *DMA          // immutable
	queues    []*queue      // immutable after init
	release   []func() error

	cmdMu   sync.Mutex // serialises commands and config reads
	scratch verbs.DMABuf
	broken  error // protected by cmdMu
	closed  bool  // protected by cmdMu

	evMu   sync.Mutex // protects the event queue and below
	evBuf  verbs.DMABuf
	slotOf []int // by chain head: the event slot it carries, -1 none
}

// Addr returns the device's PCI address.
func (d *Transport) Addr() string { return d.addr }

// Features returns the negotiated feature bits.
func (d *Transport) Features() uint64 { return d.features }

// NumQueues returns the number of virtqueues set up.
func (d *Transport) NumQueues() int { return len(d.queues) }

// QueueSize returns the size of virtqueue i, 0 if none.
func (d *Transport) QueueSize(i int) uint16 {
	if i < 0 || i >= len(d.queues) {
		return 0
	}
	return d.queues[i].size
}

// DMA returns the device's hugepage allocator.
func (d *Transport) DMA() *DMA { return d.dma }

func (d *Transport) status() uint8 { return d.common.Read8(ccDeviceStatus) }

// DeviceStatus reads the device_status register (virtio.Status* bits): what
// the device says about itself, e.g. NEEDS_RESET, after a surprise such as a
// DEVICE_FATAL event. It fails with ErrClosed after Close.
func (d *Transport) DeviceStatus() (uint8, error) {
	d.cmdMu.Lock()
	defer d.cmdMu.Unlock()
	if d.closed {
		return 0, ErrClosed
	}
	return d.status(), nil
}

func (d *Transport) setStatus(s uint8) { d.common.Write8(ccDeviceStatus, s) }

// fail sets FAILED ("something went wrong in the guest, and it has given
// up on the device") and returns err.
func (d *Transport) fail(err error) error {
	d.setStatus(d.status() | virtio.StatusFailed)
	d.log.WithError(err).Warn("device initialisation failed")
	return err
}

// reset writes 0 to device_status and waits until it reads 0: "the driver
// MUST wait for a read of device_status to return 0 before reinitializing
// the device".
func (d *Transport) reset() error {
	d.setStatus(0)
	deadline := time.Now().Add(resetTimeout)
	for d.status() != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("status %#x after reset for %v: %w", d.status(), resetTimeout, ErrDevice)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// initDevice runs virtio 1.2 §3.1.1 "Driver Requirements: Device
// Initialization" over the structures in d. On failure it sets FAILED.
func (d *Transport) initDevice(o options) error {
	if err := d.reset(); err != nil {
		return d.fail(err)
	}
	d.setStatus(virtio.StatusAcknowledge)
	d.setStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	d.common.Write32(ccDeviceFeatureSelect, 0)
	lo := d.common.Read32(ccDeviceFeature)
	d.common.Write32(ccDeviceFeatureSelect, 1)
	hi := d.common.Read32(ccDeviceFeature)
	offered := uint64(hi)<<32 | uint64(lo)
	if offered&virtio.FeatureVersion1 == 0 {
		return d.fail(fmt.Errorf("device offers %#x without VIRTIO_F_VERSION_1: %w", offered, ErrFeatures))
	}
	want := virtio.FeatureVersion1
	if o.eventIdx {
		want |= virtio.FeatureEventIdx
	}
	d.features = offered & want
	d.common.Write32(ccDriverFeatureSelect, 0)
	d.common.Write32(ccDriverFeature, uint32(d.features))
	d.common.Write32(ccDriverFeatureSelect, 1)
	d.common.Write32(ccDriverFeature, uint32(d.features>>32))
	st := virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK
	d.setStatus(st)
	if d.status()&virtio.StatusFeaturesOK == 0 {
		return d.fail(fmt.Errorf("device refused FEATURES_OK for %#x (offered %#x): %w", d.features, offered, ErrFeatures))
	}
	d.common.Write16(ccMSIXConfig, noVector)
	n := int(d.common.Read16(ccNumQueues))
	if n < abi.FirstDoorbellQueue+1 {
		return d.fail(fmt.Errorf("device has %d queues, an RDMA device has at least %d: %w", n, abi.FirstDoorbellQueue+1, ErrQueue))
	}
	// QEMU's generic vhost-user device starts only the queues whose
	// descriptor address is set: set up every one.
	for i := range n {
		size := o.dbSize
		switch i {
		case abi.ControlQueue:
			size = o.ctrlSize
		case abi.EventQueue:
			size = o.evSize
		}
		q, err := d.setupQueue(i, size)
		if err != nil {
			return d.fail(err)
		}
		d.queues = append(d.queues, q)
	}
	d.setStatus(st | virtio.StatusDriverOK)
	if s := d.status(); s&virtio.StatusDriverOK == 0 || s&virtio.StatusNeedsReset != 0 {
		return d.fail(fmt.Errorf("status %#x after DRIVER_OK: %w", s, ErrDevice))
	}
	return nil
}

// pow2Floor returns the largest power of two <= n (n > 0).
func pow2Floor(n uint16) uint16 {
	p := uint16(1)
	for p <= n/2 {
		p *= 2
	}
	return p
}

// write64 writes a 64-bit common-config field as two 32-bit halves, low
// first, as the transport allows.
func (d *Transport) write64(off uint32, v uint64) {
	d.common.Write32(off, uint32(v))
	d.common.Write32(off+4, uint32(v>>32))
}

// setupQueue selects queue i, sizes it, allocates its rings and enables it.
func (d *Transport) setupQueue(i int, want uint16) (*queue, error) {
	d.common.Write16(ccQueueSelect, uint16(i))
	maxSize := d.common.Read16(ccQueueSize)
	if maxSize == 0 {
		return nil, &QueueError{Queue: i, Reason: "not available (size 0)"}
	}
	if d.common.Read16(ccQueueEnable) != 0 {
		return nil, &QueueError{Queue: i, Reason: "already enabled after reset"}
	}
	size := pow2Floor(min(max(want, 1), maxSize, virtio.MaxQueueSize))
	d.common.Write16(ccQueueSize, size)
	if got := d.common.Read16(ccQueueSize); got != size {
		if got == 0 || got > maxSize || got&(got-1) != 0 {
			return nil, &QueueError{Queue: i, Reason: fmt.Sprintf("size %d did not stick (reads %d)", size, got)}
		}
		size = got
	}
	d.common.Write16(ccQueueMSIXVector, noVector)
	notifyOff := uint64(d.common.Read16(ccQueueNotifyOff)) * uint64(d.notifyMul)
	if notifyOff+2 > uint64(d.notify.Len()) {
		return nil, &QueueError{Queue: i, Reason: fmt.Sprintf("notify offset %#x outside a %d-byte structure", notifyOff, d.notify.Len())}
	}
	descLen := virtio.DescTableSize(size)
	availOff := descLen
	usedOff := (availOff + virtio.AvailRingSize(size) + virtio.UsedAlign - 1) &^ (virtio.UsedAlign - 1)
	total := usedOff + virtio.UsedRingSize(size)
	mem, err := d.dma.Alloc(total, abi.PageSize)
	if err != nil {
		return nil, &QueueError{Queue: i, Reason: "rings: " + err.Error()}
	}
	if mem.Pages != nil {
		d.dma.Free(mem)
		return nil, &QueueError{Queue: i, Reason: "rings not physically contiguous"}
	}
	q := &queue{index: i, size: size, mem: mem, notifyOff: uint32(notifyOff),
		rings: virtio.Rings{Desc: mem.Buf[:descLen], Avail: mem.Buf[availOff:usedOff], Used: mem.Buf[usedOff:total]}}
	if i == abi.ControlQueue || i == abi.EventQueue {
		q.dq, err = virtio.NewDriverQueue(virtio.DriverQueueConfig{Size: size, EventIdx: d.features&virtio.FeatureEventIdx != 0, Index: i}, q.rings)
		if err != nil {
			d.dma.Free(mem)
			return nil, &QueueError{Queue: i, Reason: err.Error()}
		}
		q.dq.DisableInterrupts() // we poll
	}
	d.write64(ccQueueDesc, uint64(mem.Addr))
	d.write64(ccQueueDriver, uint64(mem.Addr)+availOff)
	d.write64(ccQueueDevice, uint64(mem.Addr)+usedOff)
	d.common.Write16(ccQueueEnable, 1)
	if d.common.Read16(ccQueueEnable) != 1 {
		d.dma.Free(mem)
		return nil, &QueueError{Queue: i, Reason: "queue_enable did not stick"}
	}
	d.log.WithFields(logrus.Fields{"queue": i, "size": size, "desc": fmt.Sprintf("%#x", uint64(mem.Addr))}).Debug("queue enabled")
	return q, nil
}

// kick notifies queue q: "the driver ... writes the 16-bit virtqueue index
// to the Notification address" (queue_notify_off × notify_off_multiplier).
func (d *Transport) kick(q *queue) {
	abi.Fence()
	d.notify.Write16(q.notifyOff, uint16(q.index))
}

// newDevice initialises a device whose structures are already mapped, and
// stocks the event queue. On failure it releases what it allocated (not
// the release list).
func newTransport(common, notify, devcfg Regs, notifyMul uint32, dma *DMA, o options) (*Transport, error) {
	d := &Transport{log: o.log, common: common, notify: notify, devcfg: devcfg, notifyMul: notifyMul,
		timeout: o.timeout, dma: dma}
	if err := d.initDevice(o); err != nil {
		d.freeQueues()
		return nil, err
	}
	var err error
	if d.scratch, err = dma.Alloc(2*scratchSize, abi.PageSize); err != nil {
		d.freeQueues()
		return nil, d.fail(fmt.Errorf("control scratch: %w", err))
	}
	if err := d.stockEvents(); err != nil {
		d.freeQueues()
		return nil, d.fail(err)
	}
	return d, nil
}

func (d *Transport) freeQueues() {
	for _, q := range d.queues {
		d.dma.Free(q.mem)
	}
	d.dma.Free(d.scratch)
	d.dma.Free(d.evBuf)
}

// stockEvents posts one EventSize buffer per event-queue descriptor.
func (d *Transport) stockEvents() error {
	q := d.queues[abi.EventQueue]
	n := int(q.size)
	var err error
	if d.evBuf, err = d.dma.Alloc(uint64(n*abi.EventSize), abi.PageSize); err != nil {
		return fmt.Errorf("event buffers: %w", err)
	}
	d.slotOf = make([]int, n)
	for i := range d.slotOf {
		d.slotOf[i] = -1
	}
	for s := range n {
		if err := d.postEvent(s); err != nil {
			return err
		}
	}
	d.kick(q)
	return nil
}

// postEvent posts event slot s. Precondition: evMu held or d not shared.
func (d *Transport) postEvent(s int) error {
	clear(d.evBuf.Buf[s*abi.EventSize : (s+1)*abi.EventSize])
	gpa := d.evBuf.Addr + abi.GPA(s*abi.EventSize)
	h, err := d.queues[abi.EventQueue].dq.Add([]virtio.Buf{{Addr: gpa, Len: abi.EventSize, Writable: true}})
	if err != nil {
		return fmt.Errorf("post event buffer: %w", err)
	}
	d.slotOf[h] = s
	return nil
}

// backoff waits a little longer each round: spinning first (the device
// answers in microseconds when its worker is awake), then sleeping up to
// 1 ms.
type backoff struct{ n int }

func (b *backoff) wait(deadline time.Time) {
	b.n++
	if b.n < 200 {
		runtime.Gosched()
		return
	}
	d := min(time.Duration(b.n-199)*20*time.Microsecond, time.Millisecond, time.Until(deadline))
	if d > 0 {
		time.Sleep(d)
	}
}
