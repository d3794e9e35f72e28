// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vrdma provider: the extended verbs. ibv_create_qp_ex with send_ops_flags
 * gives an ibv_qp_ex whose ibv_wr_* calls build WQEs in the send queue with
 * the encoder ibv_post_send uses (vrdma_post.h); ibv_create_cq_ex gives an
 * ibv_cq_ex read with ibv_start_poll / ibv_next_poll / ibv_end_poll. Both
 * objects are the provider's ordinary QP and CQ (vrdma_create_qp,
 * vrdma_create_cq), so ibv_post_send, ibv_post_recv and ibv_poll_cq keep
 * working on them.
 *
 * The ibv_wr_* semantics follow rdma-core's providers: wr_start takes the
 * send queue's lock and wr_complete or wr_abort drops it; each builder
 * (wr_send, wr_rdma_write, ...) takes the next slot and begins a WQE from
 * qp_ex->wr_id and wr_flags, the setters (wr_set_sge, wr_set_inline_data,
 * wr_set_ud_addr, ...) complete the WQE the last builder began. Nothing is
 * the device's before wr_complete, which publishes the whole batch with one
 * producer-index store and one doorbell step. The first error of a batch
 * (ENOMEM: the ring is full; EINVAL: more SGEs than the QP holds, inline
 * data past max_inline_data or on an operation without outgoing data, a
 * setter before any builder, a UD address on a connected QP or one without
 * an AH or with a QP number past 24 bits, FENCE on UD) makes the
 * rest of the batch no-ops and is what wr_complete returns, publishing
 * nothing; the errnos are ibv_post_send's for the same faults.
 *
 * What the device cannot do is refused when the object is created, with
 * EOPNOTSUPP: send operations other than SEND, SEND_WITH_IMM, SEND_WITH_INV,
 * RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, the two atomics, BIND_MW and
 * LOCAL_INV (UD: SEND and SEND_WITH_IMM), QP create flags, and completion fields other than the
 * standard ones (the device has no completion clock: no timestamps, and no
 * CVLAN, flow tag or tag-matching information).
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "vrdma.h"
#include "vrdma_post.h"

/* ---------------------------------------------------------------------- */
/* ibv_qp_ex                                                              */
/* ---------------------------------------------------------------------- */

#define VRDMA_RC_SEND_OPS                                                      \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV |  \
	 IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV)
#define VRDMA_UD_SEND_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)

#define VRDMA_QP_INIT_ATTR_SUP                                                 \
	(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |                 \
	 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)

/*
 * Debian 12's libibverbs (rdma-core 44.0) reads verbs_qp.comp_mask at
 * offset 352, the end of 44.0's struct ibv_qp_ex; the 56.1 headers the
 * provider is compiled with put it at 360, after qp_ex.wr_flush
 * (abi_check.c, difference 1).
 */
#define VRDMA_V44_VERBS_QP_COMP_MASK 352
static_assert(offsetof(struct ibv_qp_ex, wr_flush) ==
		      VRDMA_V44_VERBS_QP_COMP_MASK,
	      "44.0's verbs_qp.comp_mask lies on 56.1's qp_ex.wr_flush");
static_assert(offsetof(struct verbs_qp, comp_mask) >=
		      VRDMA_V44_VERBS_QP_COMP_MASK + sizeof(uint32_t),
	      "44.0's comp_mask lies inside the provider's verbs_qp");

static inline struct vrdma_qp *qpx_to_vqp(struct ibv_qp_ex *qpx)
{
	return container_of(qpx, struct vrdma_qp, vqp.qp_ex);
}

/*
 * vrdma_wr_begin is every builder's first step: the next slot (or ENOMEM
 * for the batch when the ring is full), a WQE begun from the QP's wr_id and
 * wr_flags, and the slot becomes the one the setters complete. NULL when
 * the batch has failed.
 */
static struct vrdma_send_wqe *vrdma_wr_begin(struct ibv_qp_ex *qpx,
					     uint8_t opcode, bool inline_ok)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe;

	if (qp->wr_err)
		return NULL;
	/* As ibv_post_send: a UD work request cannot be fenced. */
	if (qpx->qp_base.qp_type == IBV_QPT_UD &&
	    (qpx->wr_flags & IBV_SEND_FENCE)) {
		qp->wr_err = EINVAL;
		qp->wr_wqe = NULL;
		return NULL;
	}
	wqe = vrdma_sq_slot(qp, qp->wr_pi, &qp->wr_ci);
	if (!wqe) {
		qp->wr_err = ENOMEM;
		qp->wr_wqe = NULL;
		return NULL;
	}
	vrdma_wqe_begin(qp, wqe, qpx->wr_id, opcode, qpx->wr_flags);
	qp->wr_pi++;
	qp->wr_wqe = wqe;
	qp->wr_inline_ok = inline_ok;
	return wqe;
}

/* The WQE a setter completes; NULL (and EINVAL if none) when it cannot. */
static struct vrdma_send_wqe *vrdma_wr_cur(struct vrdma_qp *qp)
{
	if (qp->wr_err)
		return NULL;
	if (!qp->wr_wqe) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	return qp->wr_wqe;
}

static void vrdma_wr_fail(struct vrdma_qp *qp, int err)
{
	if (err && !qp->wr_err)
		qp->wr_err = err;
}

static void vrdma_wr_send(struct ibv_qp_ex *qpx)
{
	vrdma_wr_begin(qpx, VRDMA_WR_SEND, true);
}

static void vrdma_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm_data)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_SEND_WITH_IMM, true);
	if (wqe)
		vrdma_wqe_set_imm(wqe, imm_data);
}

static void vrdma_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey,
				uint64_t remote_addr)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_RDMA_WRITE, true);
	if (wqe)
		vrdma_wqe_set_rdma(wqe, remote_addr, rkey);
}

static void vrdma_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey,
				    uint64_t remote_addr, __be32 imm_data)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_RDMA_WRITE_WITH_IMM, true);
	if (!wqe)
		return;
	vrdma_wqe_set_rdma(wqe, remote_addr, rkey);
	vrdma_wqe_set_imm(wqe, imm_data);
}

static void vrdma_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey,
			       uint64_t remote_addr)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_RDMA_READ, false);
	if (wqe)
		vrdma_wqe_set_rdma(wqe, remote_addr, rkey);
}

static void vrdma_wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey,
				    uint64_t remote_addr, uint64_t compare,
				    uint64_t swap)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_ATOMIC_CMP_AND_SWP, false);
	if (wqe)
		vrdma_wqe_set_atomic(wqe, remote_addr, rkey, compare, swap);
}

static void vrdma_wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey,
				      uint64_t remote_addr, uint64_t add)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_ATOMIC_FETCH_AND_ADD, false);
	if (wqe)
		vrdma_wqe_set_atomic(wqe, remote_addr, rkey, add, 0);
}

static void vrdma_wr_send_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_SEND_WITH_INV, true);
	if (wqe)
		vrdma_wqe_set_inv(wqe, invalidate_rkey);
}

/* LOCAL_INV carries no data: the setters after it have nothing to set. */
static void vrdma_wr_local_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	struct vrdma_send_wqe *wqe;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_LOCAL_INV, false);
	if (wqe)
		vrdma_wqe_set_inv(wqe, invalidate_rkey);
}

/*
 * As ibv_post_send's IBV_WR_BIND_MW: the MW is named by its current rkey
 * in the WQE and takes the new one once the WQE is built (an aborted batch
 * leaves it so; the device never saw that bind, and the next one fails
 * with MW_BIND_ERR rather than binding the wrong window).
 */
static void vrdma_wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw,
			     uint32_t rkey,
			     const struct ibv_mw_bind_info *bind_info)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe;
	int err;

	wqe = vrdma_wr_begin(qpx, VRDMA_WR_BIND_MW, false);
	if (!wqe)
		return;
	err = vrdma_wqe_set_bind(qp, wqe, mw, rkey, bind_info);
	if (err) {
		vrdma_wr_fail(qp, err);
		return;
	}
	mw->rkey = rkey;
}

static void vrdma_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey,
			     uint64_t addr, uint32_t length)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };
	struct vrdma_send_wqe *wqe = vrdma_wr_cur(qp);

	if (wqe)
		vrdma_wr_fail(qp, vrdma_wqe_set_sges(qp, wqe, &sge, 1));
}

static void vrdma_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge,
				  const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe = vrdma_wr_cur(qp);

	if (wqe)
		vrdma_wr_fail(qp, vrdma_wqe_set_sges(qp, wqe, sg_list, num_sge));
}

static void vrdma_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr,
				     size_t length)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe = vrdma_wr_cur(qp);
	uint32_t total = 0, off = 0;

	if (!wqe)
		return;
	if (!qp->wr_inline_ok || vrdma_inline_add_len(qp, &total, length)) {
		vrdma_wr_fail(qp, EINVAL);
		return;
	}
	vrdma_wqe_put_inline(wqe, &off, addr, length);
	vrdma_wqe_set_inline(wqe, total);
}

static void vrdma_wr_set_inline_data_list(struct ibv_qp_ex *qpx,
					  size_t num_buf,
					  const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe = vrdma_wr_cur(qp);
	uint32_t total = 0, off = 0;
	size_t i;

	if (!wqe)
		return;
	if (!qp->wr_inline_ok) {
		vrdma_wr_fail(qp, EINVAL);
		return;
	}
	/* Every length first: nothing is copied for a refused list. */
	for (i = 0; i < num_buf; i++) {
		if (vrdma_inline_add_len(qp, &total, buf_list[i].length)) {
			vrdma_wr_fail(qp, EINVAL);
			return;
		}
	}
	for (i = 0; i < num_buf; i++)
		vrdma_wqe_put_inline(wqe, &off, buf_list[i].addr,
				     buf_list[i].length);
	vrdma_wqe_set_inline(wqe, total);
}

static void vrdma_wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah,
				 uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct vrdma_send_wqe *wqe = vrdma_wr_cur(qp);

	if (!wqe)
		return;
	/* As ibv_post_send: an AH and a 24-bit QP number. */
	if (qpx->qp_base.qp_type != IBV_QPT_UD || !ah ||
	    remote_qpn > 0xffffff) {
		vrdma_wr_fail(qp, EINVAL);
		return;
	}
	vrdma_wqe_set_ud(wqe, to_vah(ah)->ahn, remote_qpn, remote_qkey);
}

static void vrdma_wr_start(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	pthread_spin_lock(&qp->sq.lock);
	qp->wr_pi = qp->sq.pi;
	qp->wr_ci = vrdma_load_acquire(&qp->rec->sq_ci);
	qp->wr_wqe = NULL;
	qp->wr_err = 0;
}

static int vrdma_wr_complete(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	int err = qp->wr_err;

	/* A failed batch is discarded whole: sq.pi never moved. */
	if (!err && qp->wr_pi != qp->sq.pi)
		vrdma_sq_publish(qp, qp->wr_pi);
	qp->wr_wqe = NULL;
	pthread_spin_unlock(&qp->sq.lock);
	return err;
}

static void vrdma_wr_abort(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	qp->wr_wqe = NULL;
	pthread_spin_unlock(&qp->sq.lock);
}

/*
 * vrdma_mark_qp_ex tells libibverbs that the QP is an ibv_qp_ex
 * (ibv_qp_to_qp_ex). The library reads comp_mask where its own headers put
 * it: after setting the 56.1 field, a library that still answers NULL is
 * 44.0, and gets the bit at its offset, in the storage 56.1 names wr_flush,
 * which no 44.0 program knows and this provider never installs.
 */
static void vrdma_mark_qp_ex(struct vrdma_qp *qp)
{
	uint32_t mask = VERBS_QP_EX;

	qp->vqp.comp_mask |= VERBS_QP_EX;
	if (ibv_qp_to_qp_ex(&qp->vqp.qp))
		return;
	memcpy((uint8_t *)&qp->vqp + VRDMA_V44_VERBS_QP_COMP_MASK, &mask,
	       sizeof(mask));
}

static void vrdma_qp_ex_init(struct vrdma_qp *qp, uint64_t ops)
{
	struct ibv_qp_ex *qpx = &qp->vqp.qp_ex;

	if (ops & IBV_QP_EX_WITH_SEND)
		qpx->wr_send = vrdma_wr_send;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM)
		qpx->wr_send_imm = vrdma_wr_send_imm;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE)
		qpx->wr_rdma_write = vrdma_wr_rdma_write;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
		qpx->wr_rdma_write_imm = vrdma_wr_rdma_write_imm;
	if (ops & IBV_QP_EX_WITH_RDMA_READ)
		qpx->wr_rdma_read = vrdma_wr_rdma_read;
	if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
		qpx->wr_atomic_cmp_swp = vrdma_wr_atomic_cmp_swp;
	if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
		qpx->wr_atomic_fetch_add = vrdma_wr_atomic_fetch_add;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_INV)
		qpx->wr_send_inv = vrdma_wr_send_inv;
	if (ops & IBV_QP_EX_WITH_LOCAL_INV)
		qpx->wr_local_inv = vrdma_wr_local_inv;
	if (ops & IBV_QP_EX_WITH_BIND_MW)
		qpx->wr_bind_mw = vrdma_wr_bind_mw;

	qpx->wr_set_sge = vrdma_wr_set_sge;
	qpx->wr_set_sge_list = vrdma_wr_set_sge_list;
	qpx->wr_set_inline_data = vrdma_wr_set_inline_data;
	qpx->wr_set_inline_data_list = vrdma_wr_set_inline_data_list;
	qpx->wr_set_ud_addr = vrdma_wr_set_ud_addr;
	qpx->wr_start = vrdma_wr_start;
	qpx->wr_complete = vrdma_wr_complete;
	qpx->wr_abort = vrdma_wr_abort;
	vrdma_mark_qp_ex(qp);
}

struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context,
				  struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp_init_attr init;
	uint64_t ops = 0, sup;
	bool qp_ex;
	struct ibv_qp *ibqp;

	if ((attr->comp_mask & ~(uint32_t)VRDMA_QP_INIT_ATTR_SUP) ||
	    ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	     attr->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd ||
	    attr->pd->context != context) {
		errno = EINVAL;
		return NULL;
	}
	qp_ex = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (qp_ex) {
		switch (attr->qp_type) {
		case IBV_QPT_RC:
			sup = VRDMA_RC_SEND_OPS;
			break;
		case IBV_QPT_UD:
			sup = VRDMA_UD_SEND_OPS;
			break;
		default:
			sup = 0;
			break;
		}
		ops = attr->send_ops_flags;
		if (ops & ~sup) {
			errno = EOPNOTSUPP;
			return NULL;
		}
	}

	init = (struct ibv_qp_init_attr){
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
	};
	ibqp = vrdma_create_qp(attr->pd, &init);
	if (!ibqp)
		return NULL;
	attr->cap = init.cap;
	/* Not yet returned to anyone: no lock needed to fill the ops in. */
	if (qp_ex)
		vrdma_qp_ex_init(to_vqp(ibqp), ops);
	return ibqp;
}

/* ---------------------------------------------------------------------- */
/* ibv_cq_ex                                                              */
/* ---------------------------------------------------------------------- */

/* What a CQE carries; slid, sl and dlid_path_bits read 0, as on RoCE. */
#define VRDMA_CQ_WC_FLAGS IBV_WC_STANDARD_FLAGS

static inline struct vrdma_cq *cqx_to_vcq(struct ibv_cq_ex *cqx)
{
	return container_of(cqx, struct vrdma_cq, vcq.cq_ex);
}

/*
 * vrdma_cq_ex_take decodes the completion at ci into ex_wc and consumes it
 * (the consumer index is published by end_poll). ENOENT when ex_pi says
 * there is none, EIO when the device wrote a producer index past the ring.
 */
static int vrdma_cq_ex_take(struct vrdma_cq *cq)
{
	struct vrdma_cqe cqe;

	if (cq->ex_pi - cq->ci > cq->depth)
		return EIO;
	if (cq->ex_pi == cq->ci)
		return ENOENT;
	memcpy(&cqe, &cq->ring[cq->ci & (cq->depth - 1)], sizeof(cqe));
	vrdma_cqe_to_wc(&cqe, &cq->ex_wc);
	cq->ci++;
	cq->vcq.cq_ex.wr_id = cq->ex_wc.wr_id;
	cq->vcq.cq_ex.status = cq->ex_wc.status;
	return 0;
}

/*
 * The verbs contract: a start_poll that returns non-zero is not followed
 * by end_poll, so it drops the lock itself.
 */
static int vrdma_start_poll(struct ibv_cq_ex *cqx,
			    struct ibv_poll_cq_attr *attr)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);
	int err;

	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	/* Acquire: the CQEs before pi are visible once pi is. */
	cq->ex_pi = vrdma_load_acquire(&cq->rec->pi);
	err = vrdma_cq_ex_take(cq);
	if (err)
		pthread_spin_unlock(&cq->lock);
	return err;
}

static int vrdma_next_poll(struct ibv_cq_ex *cqx)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);

	if (cq->ex_pi == cq->ci)
		cq->ex_pi = vrdma_load_acquire(&cq->rec->pi);
	return vrdma_cq_ex_take(cq);
}

static void vrdma_end_poll(struct ibv_cq_ex *cqx)
{
	struct vrdma_cq *cq = cqx_to_vcq(cqx);

	/* Release: the slots are free for the device once ci is. */
	vrdma_store_release(&cq->rec->ci, cq->ci);
	pthread_spin_unlock(&cq->lock);
}

static enum ibv_wc_opcode vrdma_read_opcode(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.opcode;
}

static uint32_t vrdma_read_vendor_err(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.vendor_err;
}

static uint32_t vrdma_read_byte_len(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.byte_len;
}

static __be32 vrdma_read_imm_data(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.imm_data;
}

static uint32_t vrdma_read_qp_num(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.qp_num;
}

static uint32_t vrdma_read_src_qp(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.src_qp;
}

static unsigned int vrdma_read_wc_flags(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.wc_flags;
}

static uint32_t vrdma_read_slid(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.slid;
}

static uint8_t vrdma_read_sl(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.sl;
}

static uint8_t vrdma_read_dlid_path_bits(struct ibv_cq_ex *cqx)
{
	return cqx_to_vcq(cqx)->ex_wc.dlid_path_bits;
}

/*
 * libibverbs wraps this op: it refuses wc_flags it does not know, and
 * after a success it sets the CQ's context, channel (counting the
 * reference) and cq_context itself (verbs_init_cq), as ibv_create_cq does.
 */
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *context,
				     struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq_ex *cqx;
	struct ibv_cq *ibcq;

	/* No parent domain; SINGLE_THREADED is a hint the lock can ignore. */
	if ((attr->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) ||
	    (attr->wc_flags & ~(uint64_t)VRDMA_CQ_WC_FLAGS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->cqe > INT_MAX) {
		errno = EINVAL;
		return NULL;
	}
	ibcq = vrdma_create_cq(context, attr->cqe, attr->channel,
			       attr->comp_vector);
	if (!ibcq)
		return NULL;

	cqx = &to_vcq(ibcq)->vcq.cq_ex;
	cqx->start_poll = vrdma_start_poll;
	cqx->next_poll = vrdma_next_poll;
	cqx->end_poll = vrdma_end_poll;
	cqx->read_opcode = vrdma_read_opcode;
	cqx->read_vendor_err = vrdma_read_vendor_err;
	cqx->read_byte_len = vrdma_read_byte_len;
	cqx->read_imm_data = vrdma_read_imm_data;
	cqx->read_qp_num = vrdma_read_qp_num;
	cqx->read_src_qp = vrdma_read_src_qp;
	cqx->read_wc_flags = vrdma_read_wc_flags;
	cqx->read_slid = vrdma_read_slid;
	cqx->read_sl = vrdma_read_sl;
	cqx->read_dlid_path_bits = vrdma_read_dlid_path_bits;
	return cqx;
}
