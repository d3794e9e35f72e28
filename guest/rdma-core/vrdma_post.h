/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * vrdma provider: posting to a send queue, shared by ibv_post_send
 * (vrdma_verbs.c) and the ibv_wr_* API (vrdma_ex.c), so that the two write
 * the same bytes for the same work request: taking a slot (the full-ring
 * check), the send-WQE encoder (docs/spec.md, struct vrdma_send_wqe) and
 * the publish step (one producer-index store, then the doorbell rule).
 *
 * ibv_post_send encodes a whole ibv_send_wr at once; the ibv_wr_* API
 * builds a WQE in steps (a builder, then setters), so the encoder is a set
 * of pieces: begin (header and flags), the operation's fields, then the
 * data (SGEs or inline bytes). A piece that can fail checks before it
 * writes and returns an errno; a slot beyond the published producer index
 * is the provider's scratch space until the next publish, so a WQE that
 * fails half-written is simply never published.
 *
 * Everything here runs with the send queue's lock held.
 */
#ifndef VRDMA_POST_H
#define VRDMA_POST_H

#include <errno.h>
#include <string.h>

#include <util/mmio.h>

#include "vrdma.h"

/*
 * vrdma_ring_doorbell runs after a producer index was published (release).
 * docs/spec.md: "advances the producer index in the QP record (release),
 * issues a full memory barrier, and then reads the flags field of the used
 * ring of the QP's doorbell queue: if bit 0 is clear, ... the driver
 * notifies the queue".
 */
static inline void vrdma_ring_doorbell(struct vrdma_qp *qp)
{
	uint16_t flags;

	atomic_thread_fence(memory_order_seq_cst);
	flags = le16toh(*(const volatile uint16_t *)qp->flags);
	if (!(flags & VRDMA_DOORBELL_NO_NOTIFY))
		mmio_write16(qp->notify, qp->notify_value);
}

/*
 * vrdma_sq_slot returns the slot of producer index pi, or NULL when the
 * ring is full. *ci is the caller's cached consumer index; it is reloaded
 * only when the cached one says full. A consumer index the device moved
 * past pi makes pi - ci wrap to a large value: full, never an overwrite.
 */
static inline struct vrdma_send_wqe *vrdma_sq_slot(struct vrdma_qp *qp,
						   uint32_t pi, uint32_t *ci)
{
	struct vrdma_wq *sq = &qp->sq;

	if (pi - *ci >= sq->depth) {
		*ci = vrdma_load_acquire(&qp->rec->sq_ci);
		if (pi - *ci >= sq->depth)
			return NULL;
	}
	return (struct vrdma_send_wqe *)(sq->ring + ((pi & (sq->depth - 1))
						     << sq->shift));
}

/*
 * vrdma_sq_publish makes every WQE before pi the device's: one release
 * store of the producer index, then one doorbell step.
 */
static inline void vrdma_sq_publish(struct vrdma_qp *qp, uint32_t pi)
{
	qp->sq.pi = pi;
	vrdma_store_release(&qp->rec->sq_pi, pi);
	vrdma_ring_doorbell(qp);
}

/*
 * vrdma_wqe_opcode maps a verbs opcode to the WQE's; *can_inline says
 * whether the operation carries data out (SEND and WRITE), the only ones
 * inline data applies to. -1 for an opcode the device does not have.
 */
static inline int vrdma_wqe_opcode(enum ibv_wr_opcode op, bool *can_inline)
{
	*can_inline = false;
	switch (op) {
	case IBV_WR_SEND:
		*can_inline = true;
		return VRDMA_WR_SEND;
	case IBV_WR_SEND_WITH_IMM:
		*can_inline = true;
		return VRDMA_WR_SEND_WITH_IMM;
	case IBV_WR_RDMA_WRITE:
		*can_inline = true;
		return VRDMA_WR_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		*can_inline = true;
		return VRDMA_WR_RDMA_WRITE_WITH_IMM;
	case IBV_WR_RDMA_READ:
		return VRDMA_WR_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return VRDMA_WR_ATOMIC_CMP_AND_SWP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return VRDMA_WR_ATOMIC_FETCH_AND_ADD;
	case IBV_WR_SEND_WITH_INV:
		*can_inline = true;
		return VRDMA_WR_SEND_WITH_INV;
	case IBV_WR_LOCAL_INV:
		return VRDMA_WR_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return VRDMA_WR_BIND_MW;
	default:
		return -1;
	}
}

/*
 * vrdma_wqe_begin starts a WQE: every field zero (RC leaves the UD fields
 * and reserved zero, as the spec requires), then wr_id, opcode and the
 * flags that ibv_send_flags give. IBV_SEND_INLINE is not one of them: the
 * data step decides it.
 */
static inline void vrdma_wqe_begin(const struct vrdma_qp *qp,
				   struct vrdma_send_wqe *wqe, uint64_t wr_id,
				   uint8_t opcode, unsigned int send_flags)
{
	uint8_t flags = 0;

	if ((send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all)
		flags |= VRDMA_WQE_SIGNALED;
	if (send_flags & IBV_SEND_FENCE)
		flags |= VRDMA_WQE_FENCE;
	if (send_flags & IBV_SEND_SOLICITED)
		flags |= VRDMA_WQE_SOLICITED;

	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(wr_id);
	wqe->opcode = opcode;
	wqe->flags = flags;
}

/* The 32 bits as posted: ibv_send_wr.imm_data is already network order. */
static inline void vrdma_wqe_set_imm(struct vrdma_send_wqe *wqe, __be32 imm)
{
	wqe->imm_data = (__le32)imm;
}

/* LOCAL_INV and SEND_WITH_INV: the key to invalidate, a number. */
static inline void vrdma_wqe_set_inv(struct vrdma_send_wqe *wqe, uint32_t rkey)
{
	wqe->imm_data = htole32(rkey);
}

/*
 * vrdma_wqe_set_bind makes a begun WQE a BIND_MW of mw (by its current
 * rkey) to new_rkey over the window bind describes (docs/spec.md, struct
 * vrdma_bind_mw_wqe). EINVAL, nothing written, for what the device would
 * only fail the QP for: an rkey that changes the MW's index, a window
 * without an MR, of another PD, or access flags a window cannot have.
 * Length 0 (no MR needed) unbinds a type 1 window.
 */
static inline int vrdma_wqe_set_bind(const struct vrdma_qp *qp,
				     struct vrdma_send_wqe *wqe,
				     const struct ibv_mw *mw, uint32_t new_rkey,
				     const struct ibv_mw_bind_info *bind)
{
	struct vrdma_bind_mw_wqe *b = (struct vrdma_bind_mw_wqe *)wqe;

	if (!mw || mw->pd != qp->vqp.qp.pd ||
	    ((new_rkey ^ mw->rkey) & ~(uint32_t)VRDMA_KEY_BYTE_MASK))
		return EINVAL;
	if (bind->mw_access_flags & ~(IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ |
				      IBV_ACCESS_REMOTE_ATOMIC))
		return EINVAL;
	if (bind->length && (!bind->mr || bind->mr->pd != qp->vqp.qp.pd))
		return EINVAL;
	if (!bind->length && mw->type != IBV_MW_TYPE_1)
		return EINVAL;
	b->mw = htole32(mw->rkey);
	b->new_rkey = htole32(new_rkey);
	b->addr = htole64(bind->addr);
	b->length = htole64(bind->length);
	b->lkey = htole32(bind->length ? bind->mr->lkey : 0);
	b->access = htole32(bind->mw_access_flags);
	return 0;
}

static inline void vrdma_wqe_set_rdma(struct vrdma_send_wqe *wqe,
				      uint64_t remote_addr, uint32_t rkey)
{
	wqe->remote_addr = htole64(remote_addr);
	wqe->rkey = htole32(rkey);
}

/* FETCH_AND_ADD leaves swap zero. */
static inline void vrdma_wqe_set_atomic(struct vrdma_send_wqe *wqe,
					uint64_t remote_addr, uint32_t rkey,
					uint64_t compare_add, uint64_t swap)
{
	wqe->remote_addr = htole64(remote_addr);
	wqe->rkey = htole32(rkey);
	wqe->compare_add = htole64(compare_add);
	wqe->swap = htole64(swap);
}

/*
 * UD: the destination. The Q_Key goes as given: bit 31 set asks the device
 * for the QP's own Q_Key (VRDMA_QKEY_USE_QP), as the verbs define it.
 */
static inline void vrdma_wqe_set_ud(struct vrdma_send_wqe *wqe, uint32_t ahn,
				    uint32_t remote_qpn, uint32_t remote_qkey)
{
	wqe->ah = htole32(ahn);
	wqe->remote_qpn = htole32(remote_qpn);
	wqe->remote_qkey = htole32(remote_qkey);
}

/*
 * vrdma_wqe_set_sges makes the WQE's data n SGEs (replacing inline data a
 * previous step gave it). EINVAL, nothing written, when the QP's stride
 * holds fewer; the count is checked before sg is read.
 */
static inline int vrdma_wqe_set_sges(const struct vrdma_qp *qp,
				     struct vrdma_send_wqe *wqe,
				     const struct ibv_sge *sg, size_t n)
{
	struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);
	size_t i;

	if (n > qp->sq.max_sge)
		return EINVAL;
	for (i = 0; i < n; i++) {
		sge[i].addr = htole64(sg[i].addr);
		sge[i].length = htole32(sg[i].length);
		sge[i].lkey = htole32(sg[i].lkey);
	}
	wqe->num_sge = htole16(n);
	wqe->flags &= ~VRDMA_WQE_INLINE;
	wqe->inline_len = 0;
	return 0;
}

/*
 * Inline data is gathered in two passes, so that nothing is copied for a
 * work request that is refused: vrdma_inline_add_len adds one buffer's
 * length to *total (EINVAL past the QP's max_inline_data, overflow-safe),
 * then vrdma_wqe_put_inline copies the buffers one after the other and
 * vrdma_wqe_set_inline makes the WQE's data those total bytes.
 */
static inline int vrdma_inline_add_len(const struct vrdma_qp *qp,
				       uint32_t *total, uint64_t len)
{
	if (len > qp->max_inline_data - *total)
		return EINVAL;
	*total += len;
	return 0;
}

static inline void vrdma_wqe_put_inline(struct vrdma_send_wqe *wqe,
					uint32_t *off, const void *src,
					size_t len)
{
	memcpy((uint8_t *)(wqe + 1) + *off, src, len);
	*off += len;
}

static inline void vrdma_wqe_set_inline(struct vrdma_send_wqe *wqe,
					uint32_t total)
{
	wqe->num_sge = 0;
	wqe->flags |= VRDMA_WQE_INLINE;
	wqe->inline_len = htole32(total);
}

#endif /* VRDMA_POST_H */
