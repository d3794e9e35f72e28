/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * vrdma provider: user-space verbs for the para-virtual RDMA device
 * (virtio device ID 42), on top of the guest kernel driver (guest/kernel).
 *
 * The kernel driver creates every object through the control queue; this
 * provider owns the data path. Send and receive queues, completion queues
 * and their doorbell records live in page-aligned buffers the provider
 * allocates and the kernel pins (ib_umem); posting writes WQEs and a
 * producer index, polling reads CQEs and writes a consumer index, arming a
 * CQ writes its arm word, and the doorbell is a 16-bit store to the virtio
 * notify register mapped into the process, made only when the doorbell
 * queue's used-ring flags say the device's engine is asleep
 * (docs/spec.md, "Doorbell queues and the data path"). Post, poll and
 * req_notify make no system call and allocate nothing.
 *
 * Locks: vrdma_context.db_lock (a mutex, control path only) protects the
 * doorbell-page cache; each work queue, each SRQ and each CQ has a
 * spinlock for its indices and ring. No path takes two of these locks at
 * once.
 */
#ifndef VRDMA_PROVIDER_H
#define VRDMA_PROVIDER_H

#include <endian.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ccan/list.h>
#include <infiniband/driver.h>
#include <vrdma-abi.h>

/* Every ring and record is read and written in place, little-endian. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "vrdma: the data path assumes a little-endian CPU"
#endif

#define VRDMA_MMAP_SIZE 4096
/* Fewest CQ entries a CQ gets: one 4 KiB page of struct vrdma_cqe. */
#define VRDMA_MIN_CQE (4096 / 32)

struct vrdma_device {
	struct verbs_device ibv_dev;
};

/*
 * The notify page and the used-ring flags page of one doorbell queue,
 * mapped once per context and shared by every QP of the context on that
 * queue. Protected by vrdma_context.db_lock.
 */
struct vrdma_db_map {
	struct list_node entry;
	uint32_t queue;		/* doorbell queue index */
	unsigned int refcnt;	/* QPs and SRQs using the mapping */
	void *notify_page;	/* PROT_WRITE, uncached */
	void *flags_page;	/* PROT_READ */
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	/* Immutable after alloc_context: the ucontext response. */
	uint32_t num_doorbell_queues;
	uint32_t max_qp_wr;
	uint32_t max_sge;
	uint32_t max_cqe;
	uint32_t max_inline_data;

	pthread_mutex_t db_lock;
	struct list_head db_maps;	/* protected by db_lock */
};

struct vrdma_cq {
	struct verbs_cq vcq;
	pthread_spinlock_t lock;
	/* Immutable after create_cq. */
	void *buf;			/* ring pages, then the record page */
	size_t buf_len;
	struct vrdma_cqe *ring;		/* depth entries */
	struct vrdma_cq_arm_record *rec;
	uint32_t depth;			/* power of two */
	/* Protected by lock. */
	uint32_t ci;
	/* Atomic: the arm sequence last written. */
	atomic_uint arm_seq;
	/* Atomic: completion events seen (cq_event), for diagnostics. */
	atomic_uint events;
	/*
	 * ibv_start_poll .. ibv_end_poll (vrdma_ex.c): lock is held from a
	 * successful start_poll to end_poll, and protects these. ex_wc is the
	 * current completion, decoded as ibv_poll_cq decodes it; ex_pi the
	 * producer index last read.
	 */
	struct ibv_wc ex_wc;
	uint32_t ex_pi;
};

/* One work queue of a QP. */
struct vrdma_wq {
	pthread_spinlock_t lock;
	/* Immutable after create_qp. */
	uint8_t *ring;
	uint32_t depth;		/* power of two */
	uint32_t shift;		/* log2 of the WQE stride */
	uint32_t max_sge;
	/* Protected by lock: the producer index last published. */
	uint32_t pi;
};

struct vrdma_qp {
	struct verbs_qp vqp;
	struct vrdma_wq sq;
	struct vrdma_wq rq;
	/* Immutable after create_qp. */
	uint32_t max_inline_data;
	bool sq_sig_all;
	void *buf;			/* SQ pages, RQ pages, record page */
	size_t buf_len;
	struct vrdma_qp_notify_record *rec;	/* VRDMA_QP_F_RQ_NOTIFY */
	struct vrdma_db_map *db;
	uint16_t *notify;		/* notify register (MMIO) */
	const uint16_t *flags;		/* the doorbell queue's used-ring flags */
	uint16_t notify_value;
	/*
	 * The ibv_wr_* batch (vrdma_ex.c): sq.lock is held from wr_start to
	 * wr_complete or wr_abort, and protects these. wr_pi is the slot the
	 * next builder takes (sq.pi until wr_complete publishes), wr_ci the
	 * consumer index last read, wr_wqe the WQE the setters complete (NULL
	 * before the batch's first builder), wr_inline_ok whether its opcode
	 * takes inline data, wr_err the batch's first error (wr_complete
	 * returns it and publishes nothing).
	 */
	uint32_t wr_pi;
	uint32_t wr_ci;
	struct vrdma_send_wqe *wr_wqe;
	bool wr_inline_ok;
	int wr_err;
};

struct vrdma_ah {
	struct ibv_ah ibv_ah;
	/* Immutable after create_ah: the device's AH number (UD WQEs). */
	uint32_t ahn;
};

/*
 * A shared receive queue: a receive ring (wq, with its lock) that the QPs
 * created with it consume from, and its record (docs/spec.md, struct
 * vrdma_srq_record). Posting follows the RQ_NOTIFY protocol with the
 * record's notify word.
 */
struct vrdma_srq {
	struct verbs_srq vsrq;
	struct vrdma_wq wq;
	/* Immutable after create_srq. */
	void *buf;			/* ring pages, then the record page */
	size_t buf_len;
	struct vrdma_srq_record *rec;
	struct vrdma_db_map *db;
	uint16_t *notify;		/* notify register (MMIO) */
	const uint16_t *flags;		/* the doorbell queue's used-ring flags */
	uint16_t notify_value;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

static inline struct vrdma_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, vcq.cq);
}

static inline struct vrdma_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp);
}

static inline struct vrdma_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, vsrq.srq);
}

static inline struct vrdma_ah *to_vah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibv_ah);
}

/*
 * Indices shared with the device: free-running u32 counters, little-endian
 * in guest memory (the CPU is little-endian, checked above).
 */
static inline uint32_t vrdma_load_acquire(const __le32 *p)
{
	return atomic_load_explicit((const _Atomic uint32_t *)p,
				    memory_order_acquire);
}

static inline void vrdma_store_release(__le32 *p, uint32_t v)
{
	atomic_store_explicit((_Atomic uint32_t *)p, v, memory_order_release);
}

/* Smallest power of two >= v (v >= 1); 0 if it does not fit in 32 bits. */
static inline uint32_t vrdma_roundup_pow2(uint32_t v)
{
	if (v <= 1)
		return 1;
	if (v > (1U << 31))
		return 0;
	return 1U << (32 - __builtin_clz(v - 1));
}

static inline size_t vrdma_page_align(size_t n)
{
	return (n + VRDMA_PAGE_SIZE - 1) & ~(size_t)(VRDMA_PAGE_SIZE - 1);
}

/* vrdma_verbs.c */
int vrdma_query_device(struct ibv_context *context,
		       const struct ibv_query_device_ex_input *input,
		       struct ibv_device_attr_ex *attr, size_t attr_size);
int vrdma_query_port(struct ibv_context *context, uint8_t port,
		     struct ibv_port_attr *attr);
struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context);
int vrdma_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			    uint64_t hca_va, int access);
int vrdma_dereg_mr(struct verbs_mr *vmr);
struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int vrdma_dealloc_mw(struct ibv_mw *mw);
int vrdma_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind);
struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int vrdma_destroy_ah(struct ibv_ah *ah);

struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe,
			       struct ibv_comp_channel *channel,
			       int comp_vector);
int vrdma_destroy_cq(struct ibv_cq *cq);
int vrdma_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int vrdma_req_notify_cq(struct ibv_cq *cq, int solicited_only);
void vrdma_cq_event(struct ibv_cq *cq);
void vrdma_cqe_to_wc(const struct vrdma_cqe *cqe, struct ibv_wc *wc);

struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
			       struct ibv_qp_init_attr *attr);
int vrdma_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		   struct ibv_qp_init_attr *init_attr);
int vrdma_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		    int attr_mask);
int vrdma_destroy_qp(struct ibv_qp *qp);
int vrdma_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad_wr);
int vrdma_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad_wr);

struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *attr);
int vrdma_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr,
		     int attr_mask);
int vrdma_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
int vrdma_destroy_srq(struct ibv_srq *srq);
int vrdma_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad_wr);

/* vrdma_ex.c: ibv_create_qp_ex with ibv_qp_ex, ibv_create_cq_ex. */
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context,
				  struct ibv_qp_init_attr_ex *attr);
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr);

#endif /* VRDMA_PROVIDER_H */
