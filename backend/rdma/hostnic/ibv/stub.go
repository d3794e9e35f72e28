//go:build !cgo || !linux

package ibv

// Built without cgo (CGO_ENABLED=0) or off Linux: the same API, every
// entry point failing with ErrNoCgo, so the rest of the tree builds both
// ways.

// Load fails: see ErrNoCgo.
func Load() error { return ErrNoCgo }

// Devices fails: see ErrNoCgo.
func Devices() ([]DeviceInfo, error) { return nil, ErrNoCgo }

// Open fails: see ErrNoCgo.
func Open(name string) (*Context, error) { return nil, ErrNoCgo }

// Context is an open RDMA device (never one in this build).
type Context struct{}

func (c *Context) Name() string                                    { return "" }
func (c *Context) Close() error                                    { return ErrNoCgo }
func (c *Context) QueryDevice() (DeviceAttr, error)                { return DeviceAttr{}, ErrNoCgo }
func (c *Context) QueryPort(port int) (PortAttr, error)            { return PortAttr{}, ErrNoCgo }
func (c *Context) QueryGID(port, index int) (GID, error)           { return GID{}, ErrNoCgo }
func (c *Context) GIDType(port, index int) (GIDType, error)        { return 0, ErrNoCgo }
func (c *Context) AsyncFd() int                                    { return -1 }
func (c *Context) TryGetAsyncEvent() (AsyncEvent, bool, error)     { return AsyncEvent{}, false, ErrNoCgo }
func (c *Context) GetAsyncEvent() (AsyncEvent, error)              { return AsyncEvent{}, ErrNoCgo }
func (c *Context) AllocPD() (*PD, error)                           { return nil, ErrNoCgo }
func (c *Context) NewCompChannel() (*CompChannel, error)           { return nil, ErrNoCgo }
func (c *Context) CreateCQ(int, *CompChannel, uint64) (*CQ, error) { return nil, ErrNoCgo }

// PD is a protection domain (never one in this build).
type PD struct{}

func (pd *PD) Close() error                                            { return ErrNoCgo }
func (pd *PD) RegMR(uintptr, uint64, uint64, AccessFlags) (*MR, error) { return nil, ErrNoCgo }
func (pd *PD) CreateQP(QPInit) (*QP, error)                            { return nil, ErrNoCgo }

// MR is a memory region (never one in this build).
type MR struct{}

func (mr *MR) LKey() uint32   { return 0 }
func (mr *MR) RKey() uint32   { return 0 }
func (mr *MR) IOVA() uint64   { return 0 }
func (mr *MR) Length() uint64 { return 0 }
func (mr *MR) Close() error   { return ErrNoCgo }

// CompChannel is a completion channel (never one in this build).
type CompChannel struct{}

func (ch *CompChannel) Fd() int                           { return -1 }
func (ch *CompChannel) TryGetCQEvent() (*CQ, bool, error) { return nil, false, ErrNoCgo }
func (ch *CompChannel) GetCQEvent() (*CQ, error)          { return nil, ErrNoCgo }
func (ch *CompChannel) Close() error                      { return ErrNoCgo }

// CQ is a completion queue (never one in this build).
type CQ struct{}

func (cq *CQ) CQE() int               { return 0 }
func (cq *CQ) UserContext() uint64    { return 0 }
func (cq *CQ) Poll([]WC) (int, error) { return 0, ErrNoCgo }
func (cq *CQ) ReqNotify(bool) error   { return ErrNoCgo }
func (cq *CQ) AckEvents(int)          {}
func (cq *CQ) Destroy() error         { return ErrNoCgo }

// QP is a queue pair (never one in this build).
type QP struct{}

func (qp *QP) Num() uint32                           { return 0 }
func (qp *QP) Caps() QPCaps                          { return QPCaps{} }
func (qp *QP) Destroy() error                        { return ErrNoCgo }
func (qp *QP) Modify(*QPAttr, QPAttrMask) error      { return ErrNoCgo }
func (qp *QP) Query(QPAttrMask) (QPAttr, error)      { return QPAttr{}, ErrNoCgo }
func (qp *QP) PostSend([]SendWR, []SGE) (int, error) { return 0, ErrNoCgo }
func (qp *QP) PostRecv([]RecvWR, []SGE) (int, error) { return 0, ErrNoCgo }
