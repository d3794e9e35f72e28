package backend

import (
	"sync"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
)

// Device is what a device type implements. It never sees the vhost-user
// wire: the session negotiates, maps memory and runs the rings, and calls the
// device for its features, its config space and the work on its queues.
//
// Methods may be called from several goroutines at once (the session's and
// one worker per started queue); implementations synchronise themselves.
type Device interface {
	// Features returns the virtio feature bits the device offers. The
	// session adds VHOST_USER_F_PROTOCOL_FEATURES (bit 30) on the wire.
	Features() uint64
	// NumQueues is the number of virtqueues (GET_QUEUE_NUM).
	NumQueues() int
	// MaxQueueSize bounds SET_VRING_NUM.
	MaxQueueSize() int
	// ConfigSize is the size of the device config space in bytes.
	ConfigSize() int
	// ReadConfig fills buf from config space at off. The session has
	// checked that [off, off+len(buf)) lies within ConfigSize.
	ReadConfig(off int, buf []byte) error
	// WriteConfig writes data at off (checked like ReadConfig).
	WriteConfig(off int, data []byte) error

	// Attach is called when a front-end connects, with the host services
	// the device may use until Detach: its guest memory and queues.
	Attach(h Host)
	// MemoryChanged follows every change of the guest memory table
	// (SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG), on the session goroutine.
	MemoryChanged()
	// HandleQueue processes what the driver made available on q. It is
	// called by q's worker after a kick, with q locked and a memory table
	// held; it must return promptly once q.Stopping() is true. A returned
	// error breaks the ring (it stays stopped until the front-end sets it
	// up again).
	HandleQueue(q *Queue) error
	// Reset returns the device to its initial state, releasing everything
	// the driver created (RESET_DEVICE, front-end disconnect).
	Reset()
	// Detach follows Reset when the front-end is gone.
	Detach()
}

// KickReceiver is implemented by a Device that runs the work of some of
// its queues itself, on its own workers (vrdma's doorbell queues, served by
// a shared engine pool): for a queue it claims, the queue's worker only
// waits for kicks and hands each to Kicked, without locking the queue or
// touching its notification state; the device works on the queue through
// Queue.Run. Kicked must not block. For the queues it does not claim it
// returns false and HandleQueue runs as usual.
type KickReceiver interface {
	Kicked(q *Queue) bool
}

// Interrupter is implemented by a Device some of whose queues never
// interrupt the driver (vrdma's doorbell queues carry no buffers, so
// nothing is ever pushed to their used rings): the session checks the call
// eventfd the front-end sends for such a queue and closes it at once, one
// descriptor less per queue. Interrupts must be a fixed property of the
// queue index.
type Interrupter interface {
	Interrupts(queue int) bool
}

// Suspender is implemented by a Device that must know when its front-end
// suspends it: QEMU stopping the VM stops every ring (GET_VRING_BASE each)
// with the driver running (DRIVER_OK, when STATUS was negotiated) and
// keeps the device's state, for a migration or a pause. Suspend(true)
// follows the GET_VRING_BASE that stopped the last started ring, before
// its reply: once it returns, the device must not write guest memory
// (QEMU copies it afterwards). Suspend(false) precedes the start of a ring
// while none is started (every first start, also one that follows no
// suspension: the device ignores what it does not need). Both are called
// on the session goroutine. A device reset or teardown (Reset) ends a
// suspension without a call.
type Suspender interface {
	Suspend(on bool)
}

// Host is what the session offers a device.
type Host interface {
	// Memory is the guest memory of the connected front-end.
	Memory() *memmap.Memory
	// Queue returns queue i (nil if out of range). Use Queue.Run to work
	// on it from outside HandleQueue.
	Queue(i int) *Queue
	// Resumed reports that the front-end restarted rings from indices
	// this back-end never produced: the driver was running against a
	// back-end (or connection) that is gone, and whatever state the device
	// kept for it is lost (the daemon restarted, or QEMU reconnected).
	Resumed() bool
	// NotifyConfigChange asks the front-end to raise a config-change
	// interrupt (BACKEND_CONFIG_CHANGE_MSG). It is a no-op without a
	// backend channel. It is safe from any goroutine and may block until
	// the front-end reads its channel; the session's end closes the
	// channel, which makes a blocked call return an error.
	NotifyConfigChange() error
}

// Queue is a device's handle on one virtqueue. Between HandleQueue calls a
// device can reach it only through Run, which takes the same lock as the
// worker.
type Queue struct {
	index int // immutable

	mu    sync.Mutex          // serialises work on the queue (worker, Run); lock order in doc.go
	vr    *vring              // immutable
	vq    *virtio.DeviceQueue // protected by mu; nil while the ring is stopped
	table *memmap.Table       // protected by mu; set only while locked for work
	dirty bool                // protected by mu; something was pushed
}

// Index is the queue's index.
func (q *Queue) Index() int { return q.index }

// Memory is the guest memory table held for the current piece of work.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) Memory() *memmap.Table { return q.table }

// Pop takes the next available chain into c; see virtio.DeviceQueue.Pop.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) Pop(c *virtio.Chain) (bool, error) {
	return q.vq.Pop(q.table, c)
}

// Push returns a chain to the driver; the interrupt, if the driver wants
// one, is sent when the current HandleQueue or Run returns, or at Notify.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) Push(head uint16, written uint32) error {
	if err := q.vq.Push(head, written); err != nil {
		return err
	}
	q.dirty = true
	return nil
}

// Notify sends the interrupt for the chains pushed so far now, if the
// driver wants one, instead of when the handler returns: a handler that
// goes on polling for more work answers first.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) Notify() { q.vr.notify() }

// SetNotify enables or disables the driver's notifications (kicks) for a
// queue the device polls (virtio's avail_event or NO_NOTIFY). Handlers run
// with them disabled; the worker enables them again before it sleeps and
// looks once more, so a handler that polls may leave them disabled.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) SetNotify(on bool) {
	if on {
		q.vq.EnableNotify()
	} else {
		q.vq.DisableNotify()
	}
}

// Pending reports whether the driver has made chains available that the
// device has not popped yet (a cheap look at the available index).
// Precondition: called inside HandleQueue or Run.
func (q *Queue) Pending() bool { return q.vq.AvailIdx() != q.vq.LastAvail() }

// SetPolling publishes whether the device is polling the queue's work
// (used-ring flag NO_NOTIFY), for queues that carry no buffers.
// Precondition: called inside HandleQueue or Run.
func (q *Queue) SetPolling(on bool) { q.vq.SetUsedFlagNoNotify(on) }

// Wake makes the queue's worker run HandleQueue soon, as a kick from the
// driver would (a timer's expiry, work made available by another device).
// Safe from any goroutine; a no-op while the ring is stopped.
func (q *Queue) Wake() { q.vr.wake() }

// Stopping reports whether the ring is being stopped or the front-end is
// going away; long-running handlers poll it.
func (q *Queue) Stopping() bool { return q.vr.stopping.Load() }

// Run runs fn with the queue locked and a memory table held, and signals
// the driver afterwards if fn pushed and the driver wants it. It returns
// ErrQueueStopped when the ring is not running, and breaks the ring if fn
// returns an error or faults on guest memory.
//
// Run takes q's lock: a caller that holds its own locks, or is inside
// HandleQueue of another queue, must take them in one order everywhere
// (doc.go, "Lock order"); Run on q from inside HandleQueue(q) deadlocks.
func (q *Queue) Run(fn func(q *Queue) error) error {
	return q.vr.run(fn)
}
