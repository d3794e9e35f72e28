/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vrdma: Linux driver for the para-virtual RDMA device (virtio device 42).
 * Shared declarations of vrdma_main.c, vrdma_cmd.c and vrdma_verbs.c; the
 * design notes are at the top of vrdma_main.c.
 */
#ifndef VRDMA_H
#define VRDMA_H

#include <linux/completion.h>
#include <linux/if_ether.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/virtio_types.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>

#include "vrdma-abi.h"

#define VRDMA_PORT		1
#define VRDMA_MAX_DOORBELLQ	64	/* bound on num_doorbell_queues */
#define VRDMA_EVENT_BUFS	64	/* event buffers kept posted */
#define VRDMA_MAX_GID_TBL	128	/* bound on the port's gid_tbl_len */
#define VRDMA_MAX_CQE		(1U << 22)	/* driver's own bounds, */
#define VRDMA_MAX_QP_WR		(1U << 16)	/* below the device's */

/* Bits of vrdma_dev.flags. */
enum {
	VRDMA_DEAD,		/* no more commands; teardown succeeds */
	VRDMA_STOPPED,		/* the virtio device was reset */
	VRDMA_REMOVING,		/* remove() runs: queue no more work */
	VRDMA_REGISTERED,	/* ib_dispatch_event is allowed */
};

struct vrdma_cmd;

struct vrdma_doorbell {
	struct virtqueue *vq;
	phys_addr_t notify_pa;	/* the queue's notify register */
	phys_addr_t flags_pa;	/* its used ring's flags word */
	const __virtio16 *used_flags;	/* the same word, for kernel posts */
	u16 notify_value;	/* what a notification writes there */
};

struct vrdma_dev {
	struct ib_device ibdev;
	struct virtio_device *vdev;
	struct pci_dev *pdev;
	unsigned long flags;
	spinlock_t lock;	/* flags REMOVING/REGISTERED, reprobe */

	/* Control queue (vrdma_cmd.c). */
	struct virtqueue *ctrlq;
	struct mutex cmd_mutex;	/* one command in flight */
	spinlock_t ctrl_lock;	/* ctrlq and cmd_inflight */
	struct vrdma_cmd *cmd_inflight;
	unsigned long cmd_timeout;	/* jiffies */

	/* Event queue. */
	struct virtqueue *eventq;
	spinlock_t event_lock;	/* eventq and the counters below */
	struct vrdma_event *event_bufs;
	unsigned int num_event_bufs;
	struct work_struct event_work;
	u64 events_unknown_handle;
	u64 events_malformed;

	/* Doorbell queues. */
	unsigned int num_dbq;
	atomic_t next_dbq;
	struct vrdma_doorbell dbq[VRDMA_MAX_DOORBELLQ];

	/* Device handle -> object, for events; irq-safe xa_lock. */
	struct xarray cq_xa;
	struct xarray qp_xa;
	struct xarray srq_xa;

	/* Limits, from QUERY_DEVICE and QUERY_PORT at probe. */
	struct vrdma_device_attr dattr;
	u32 max_qp_wr;
	u32 max_sge;
	u32 max_cqe;
	u32 max_inline;
	u32 max_rd_atom;
	u32 max_srq;		/* 0: the device has no SRQs */
	bool gsi;		/* device_caps GSI: kernel verbs, ib_mad, rdma_cm */
	u64 dev_cap_flags;	/* IB_DEVICE_MEM_* the device offers */
	u32 gid_tbl_len;
	u32 max_msg_sz;
	u8 max_mtu;
	u8 active_mtu;
	u8 active_width;
	u16 active_speed;

	/* Port: the device's word and the bound net_device. */
	bool dev_port_active;	/* READ_ONCE/WRITE_ONCE */
	enum ib_port_state port_state;	/* last reported; port_work */
	bool has_mac;
	u8 mac[ETH_ALEN];
	spinlock_t netdev_lock;	/* netdev; writers also hold rtnl */
	struct net_device *netdev;	/* holds a reference */
	struct notifier_block netdev_nb;
	/*
	 * <virtio device>/net/<name> -> the bound net_device, as a NIC's
	 * PCI function has it, so /sys/class/infiniband/vrdmaN/device/net
	 * names the port's netdev (ibdev2netdev, NCCL). rtnl.
	 */
	struct kobject *net_kobj;
	char net_link[IFNAMSIZ];
	struct work_struct port_work;

	struct mutex stop_mutex;	/* device reset */
	struct work_struct fatal_work;
	struct vrdma_reprobe *reprobe;	/* under lock */
};

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
	struct mutex lock;	/* the entries below */
	struct rdma_user_mmap_entry *notify[VRDMA_MAX_DOORBELLQ];
	struct rdma_user_mmap_entry *flags[VRDMA_MAX_DOORBELLQ];
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

struct vrdma_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;	/* NULL for a DMA or fast-registration MR */

	/*
	 * Fast registration (ib_alloc_mr): the page list the REG_MR WQE
	 * names (ib_map_mr_sg fills it), and the key the device knows the MR
	 * by: the last one a REG_MR WQE set (ibmr.lkey may run ahead of it,
	 * ib_update_fast_reg_key). Under the posting QP's sq_lock.
	 */
	__le64 *pages;
	u32 max_pages;
	u32 npages;
	u32 dev_key;
};

struct vrdma_mw {
	struct ib_mw ibmw;
};

/*
 * Guest memory a kernel CQ or QP keeps its rings and record in
 * (vrdma_kverbs.c): physically contiguous, zeroed, freed only once the
 * device has let go of it.
 */
struct vrdma_kbuf {
	void *va;
	size_t size;		/* page multiple */
};

struct vrdma_cq {
	struct ib_cq ibcq;
	u32 cqn;
	struct ib_umem *umem;	/* a user CQ's buffer */

	/* A kernel CQ's (umem NULL), under lock. */
	struct vrdma_kbuf kbuf;
	spinlock_t lock;
	struct vrdma_cqe *ring;
	struct vrdma_cq_arm_record *rec;
	u32 ci;
	u32 arm_seq;
};

struct vrdma_qp {
	struct ib_qp ibqp;
	u32 qpn;		/* the device's handle (ibqp.qp_num is 1 for GSI) */
	struct ib_umem *umem;	/* a user QP's buffer */
	struct ib_qp_cap cap;
	bool sq_sig_all;

	/* A kernel QP's (umem NULL): rings, record, and the posting state. */
	struct vrdma_kbuf kbuf;
	struct vrdma_qp_record *rec;
	void *sq, *rq;
	unsigned int dbq;
	u32 sq_depth, rq_depth;
	u8 sq_shift, rq_shift;
	spinlock_t sq_lock;	/* sq, sq_pi */
	u32 sq_pi;
	spinlock_t rq_lock;	/* rq, rq_pi */
	u32 rq_pi;
};

struct vrdma_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	struct ib_umem *umem;
	/* Immutable after create_srq: what the ring holds. */
	u32 max_wr;
	u32 max_sge;
};

/*
 * A user AH is the device's (ahn). A kernel AH may be created where the
 * caller cannot sleep, so it is the driver's alone: its address vector
 * goes into each send WQE (VRDMA_WQE_AV).
 */
struct vrdma_ah {
	struct ib_ah ibah;
	u32 ahn;		/* 0 for a kernel AH */
	bool kernel;
	u8 dgid[16];
	u32 sgid_index;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vrdma_dev, ibdev);
}

static inline struct vrdma_ucontext *to_vuctx(struct ib_ucontext *ibuc)
{
	return container_of(ibuc, struct vrdma_ucontext, ibuc);
}

static inline struct vrdma_pd *to_vpd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibpd);
}

static inline struct vrdma_mr *to_vmr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct vrdma_mr, ibmr);
}

static inline struct vrdma_cq *to_vcq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, ibcq);
}

static inline struct vrdma_qp *to_vqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, ibqp);
}

static inline struct vrdma_srq *to_vsrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, ibsrq);
}

static inline struct vrdma_ah *to_vah(struct ib_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibah);
}

static inline bool vrdma_dead(struct vrdma_dev *dev)
{
	return test_bit(VRDMA_DEAD, &dev->flags);
}

/* vrdma_main.c */
void vrdma_set_dead(struct vrdma_dev *dev, const char *why);
void vrdma_quiesce(struct vrdma_dev *dev);
void vrdma_dispatch_port_event(struct vrdma_dev *dev, enum ib_event_type type);
enum ib_port_state vrdma_port_state(struct vrdma_dev *dev);

/* vrdma_cmd.c */
void vrdma_ctrlq_cb(struct virtqueue *vq);
int vrdma_exec(struct vrdma_dev *dev, u16 opcode, const void *req,
	       size_t req_len, void *resp, size_t resp_len, void *aux);
void vrdma_exec_destroy(struct vrdma_dev *dev, u16 opcode, u32 handle);
void vrdma_cmd_abort(struct vrdma_dev *dev);
void vrdma_cmd_cleanup(struct vrdma_dev *dev);

/* vrdma_verbs.c */
extern const struct ib_device_ops vrdma_dev_ops;
bool vrdma_valid_qpn(u32 qpn);

/* vrdma_kverbs.c: the verbs of kernel consumers (no udata) */
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access);
int vrdma_create_kcq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr);
void vrdma_free_kcq(struct vrdma_cq *cq);
int vrdma_kcq_notify(struct vrdma_cq *cq, enum ib_cq_notify_flags flags);
int vrdma_kcq_poll(struct vrdma_cq *cq, int num_entries, struct ib_wc *wc);
int vrdma_create_kqp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr);
void vrdma_free_kqp(struct vrdma_qp *qp);
int vrdma_kqp_post_send(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			const struct ib_send_wr **bad_wr);
int vrdma_kqp_post_recv(struct vrdma_qp *qp, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr);
int vrdma_create_kah(struct vrdma_ah *ah, const struct rdma_ah_attr *ah_attr);
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg);
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset);

#endif /* VRDMA_H */
