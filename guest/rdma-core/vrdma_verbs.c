// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vrdma provider: the verbs. Control verbs go to the kernel through the
 * ibv_cmd_* helpers; the data path (post, poll, arm) works on the rings in
 * this process's memory and never enters the kernel.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <util/udma_barrier.h>

#include "vrdma.h"
#include "vrdma_abi.h"
#include "vrdma_post.h"

/* ---------------------------------------------------------------------- */
/* Device, port, PD, MR, AH: the kernel does the work.                    */
/* ---------------------------------------------------------------------- */

int vrdma_query_device(struct ibv_context *context,
		       const struct ibv_query_device_ex_input *input,
		       struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(context, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;

	/* fw_ver is the daemon's ABI revision (docs/spec.md, QUERY_DEVICE). */
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

int vrdma_query_port(struct ibv_context *context, uint8_t port,
		     struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context)
{
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_alloc_pd cmd;
	struct ibv_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	ret = ibv_cmd_alloc_pd(context, pd, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	return pd;
}

int vrdma_dealloc_pd(struct ibv_pd *pd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(pd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			    uint64_t hca_va, int access)
{
	struct ib_uverbs_reg_mr_resp resp;
	struct ibv_reg_mr cmd;
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;
	ret = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd,
			     sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/*
 * Memory windows (docs/spec.md § Memory windows and fast registration): the
 * kernel allocates them (ALLOC_MW); binding is a send WQE, posted here for
 * type 1 (ibv_bind_mw) and through ibv_post_send / ibv_wr_bind_mw for
 * type 2.
 */
struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ib_uverbs_alloc_mw_resp resp;
	struct ibv_alloc_mw cmd;
	struct ibv_mw *mw;

	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return NULL;
	if (ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp,
			     sizeof(resp))) {
		free(mw);
		return NULL;
	}
	return mw;
}

int vrdma_dealloc_mw(struct ibv_mw *mw)
{
	int ret;

	ret = ibv_cmd_dealloc_mw(mw);
	if (ret)
		return ret;
	free(mw);
	return 0;
}

/*
 * ibv_bind_mw: a type 1 window, bound by a BIND_MW WQE on qp with the next
 * key byte (ibv_inc_rkey), which becomes mw->rkey once posted.
 */
int vrdma_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind)
{
	struct ibv_send_wr wr = {}, *bad;

	if (mw->type != IBV_MW_TYPE_1 || qp->qp_type != IBV_QPT_RC)
		return EINVAL;
	wr.wr_id = mw_bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = mw_bind->bind_info;
	return vrdma_post_send(qp, &wr, &bad);
}

struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vrdma_ucmd_create_ah_resp resp = {};
	struct vrdma_ah *ah;
	int ret;

	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return NULL;
	/*
	 * RoCE: the kernel resolves the destination from the GID. The
	 * response carries the device's AH number, which UD WQEs name.
	 */
	ret = ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp,
				sizeof(resp));
	if (ret) {
		free(ah);
		errno = ret;
		return NULL;
	}
	ah->ahn = resp.ahn;
	return &ah->ibv_ah;
}

int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	int ret;

	ret = ibv_cmd_destroy_ah(ibah);
	if (ret)
		return ret;
	free(to_vah(ibah));
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Ring buffers                                                           */
/* ---------------------------------------------------------------------- */

/*
 * vrdma_alloc_buf returns len bytes of zeroed, page-aligned memory excluded
 * from fork (the kernel pins it with ib_umem), or NULL with errno set.
 */
static void *vrdma_alloc_buf(size_t len)
{
	void *buf;
	int ret;

	ret = posix_memalign(&buf, VRDMA_PAGE_SIZE, len);
	if (ret) {
		errno = ret;
		return NULL;
	}
	memset(buf, 0, len);
	ret = ibv_dontfork_range(buf, len);
	if (ret) {
		free(buf);
		errno = ret;
		return NULL;
	}
	return buf;
}

static void vrdma_free_buf(void *buf, size_t len)
{
	ibv_dofork_range(buf, len);
	free(buf);
}

/* ---------------------------------------------------------------------- */
/* Completion queues                                                      */
/* ---------------------------------------------------------------------- */

struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe,
			       struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct vrdma_context *ctx = to_vctx(context);
	struct vrdma_ucmd_create_cq_resp resp = {};
	struct vrdma_ucmd_create_cq cmd = {};
	size_t ring_len;
	struct vrdma_cq *cq;
	uint32_t depth;
	int ret;

	if (cqe < 0 || (uint32_t)cqe > ctx->max_cqe) {
		errno = EINVAL;
		return NULL;
	}
	/*
	 * At least one page of entries (the ring takes a page anyway), as
	 * RNIC providers round up: applications size CQs by their queue
	 * depths and count on slack (perftest -e with a TX depth of 1).
	 */
	depth = vrdma_roundup_pow2(cqe > VRDMA_MIN_CQE ? cqe : VRDMA_MIN_CQE);
	if (depth > ctx->max_cqe)
		depth = vrdma_roundup_pow2(cqe ? cqe : 1);
	if (!depth || depth > ctx->max_cqe) {
		errno = EINVAL;
		return NULL;
	}

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;

	/* The ring in whole pages, then the arm record in a page of its own. */
	ring_len = vrdma_page_align((size_t)depth * sizeof(struct vrdma_cqe));
	cq->buf_len = ring_len + VRDMA_PAGE_SIZE;
	cq->buf = vrdma_alloc_buf(cq->buf_len);
	if (!cq->buf)
		goto err_free;
	cq->ring = cq->buf;
	cq->rec = (struct vrdma_cq_arm_record *)((uint8_t *)cq->buf +
						  ring_len);
	cq->depth = depth;

	cmd.buf_addr = (uintptr_t)cq->buf;
	cmd.buf_len = cq->buf_len;
	cmd.record_offset = ring_len;
	ret = ibv_cmd_create_cq(context, depth, channel, comp_vector,
				&cq->vcq.cq, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_buf;
	}

	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	return &cq->vcq.cq;

err_buf:
	vrdma_free_buf(cq->buf, cq->buf_len);
err_free:
	free(cq);
	return NULL;
}

int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	pthread_spin_destroy(&cq->lock);
	vrdma_free_buf(cq->buf, cq->buf_len);
	free(cq);
	return 0;
}

void vrdma_cqe_to_wc(const struct vrdma_cqe *cqe, struct ibv_wc *wc)
{
	/* The CQE's status and opcode are ibv_wc_status / ibv_wc_opcode. */
	wc->wr_id = le64toh(cqe->wr_id);
	wc->status = (enum ibv_wc_status)cqe->status;
	wc->opcode = (enum ibv_wc_opcode)cqe->opcode;
	wc->vendor_err = le32toh(cqe->vendor_err);
	wc->byte_len = le32toh(cqe->byte_len);
	wc->qp_num = le32toh(cqe->qp_num);
	wc->src_qp = le32toh(cqe->src_qp);
	wc->wc_flags = 0;
	wc->imm_data = 0;
	/* A UD receive: the buffer starts with the 40-byte GRH. */
	if (le16toh(cqe->wc_flags) & VRDMA_WC_F_GRH)
		wc->wc_flags |= IBV_WC_GRH;
	if (le16toh(cqe->wc_flags) & VRDMA_WC_F_WITH_IMM) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		/*
		 * The device returns the 32 bits as the peer posted them, and
		 * ibv_send_wr.imm_data was already in network order: no swap.
		 */
		wc->imm_data = (__be32)cqe->imm_data;
	} else if (le16toh(cqe->wc_flags) & VRDMA_WC_F_WITH_INV) {
		/* The key the SEND_WITH_INV freed, a number. */
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = le32toh(cqe->imm_data);
	}
	wc->pkey_index = 0;
	wc->slid = 0;
	wc->sl = 0;
	wc->dlid_path_bits = 0;
}

int vrdma_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_cqe cqe;
	uint32_t pi, ci;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	ci = cq->ci;
	/* Acquire: the CQEs before pi are visible once pi is. */
	pi = vrdma_load_acquire(&cq->rec->pi);
	if (pi - ci > cq->depth) {
		/* The device wrote a producer index past the ring. */
		pthread_spin_unlock(&cq->lock);
		errno = EIO;
		return -1;
	}
	while (n < num_entries && ci != pi) {
		memcpy(&cqe, &cq->ring[ci & (cq->depth - 1)], sizeof(cqe));
		vrdma_cqe_to_wc(&cqe, &wc[n]);
		ci++;
		n++;
	}
	if (n) {
		cq->ci = ci;
		/* Release: the slots are free for the device once ci is. */
		vrdma_store_release(&cq->rec->ci, ci);
	}
	pthread_spin_unlock(&cq->lock);
	return n;
}

int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	uint32_t seq, arm;

	/*
	 * No system call: a new sequence in the arm word re-arms the CQ
	 * (vrdma-abi.h, struct vrdma_cq_arm_record); the device posts the
	 * event for the next (solicited) completion, or at once if entries are
	 * waiting, and ibv_get_cq_event wakes through the kernel.
	 */
	seq = atomic_fetch_add_explicit(&cq->arm_seq, 1,
					memory_order_relaxed) + 1;
	arm = (seq << VRDMA_CQ_ARM_SEQ_SHIFT) |
	      (solicited_only ? VRDMA_CQ_ARM_SOLICITED : 0);
	vrdma_store_release(&cq->rec->arm, arm);
	/* Full barrier: the arm word before any later read of the ring. */
	atomic_thread_fence(memory_order_seq_cst);
	return 0;
}

void vrdma_cq_event(struct ibv_cq *ibcq)
{
	/* libibverbs counts events for ibv_ack_cq_events itself. */
	atomic_fetch_add_explicit(&to_vcq(ibcq)->events, 1,
				  memory_order_relaxed);
}

/* ---------------------------------------------------------------------- */
/* Doorbell pages                                                         */
/* ---------------------------------------------------------------------- */

/*
 * vrdma_check_db checks the doorbell of a create_qp or create_srq response
 * (struct vrdma_create_qp_resp): a queue the context has, and 16-bit words
 * inside the mapped pages. 0 or EPROTO.
 */
static int vrdma_check_db(struct vrdma_context *ctx, const char *what,
			  uint32_t queue, uint32_t notify_offset,
			  uint32_t flags_offset)
{
	if (queue < ctx->num_doorbell_queues &&
	    notify_offset <= VRDMA_MMAP_SIZE - sizeof(uint16_t) &&
	    flags_offset <= VRDMA_MMAP_SIZE - sizeof(uint16_t) &&
	    !(notify_offset & 1) && !(flags_offset & 1))
		return 0;
	verbs_err(&ctx->ibv_ctx,
		  "bad doorbell in %s response: queue %u of %u, notify offset %u, flags offset %u\n",
		  what, queue, ctx->num_doorbell_queues, notify_offset,
		  flags_offset);
	return EPROTO;
}

/*
 * vrdma_get_db returns the mapping of doorbell queue `queue`'s pages for
 * this context, mapping them with the mmap keys of the create_qp or
 * create_srq response if the context has none yet. NULL with errno set on
 * failure.
 */
static struct vrdma_db_map *vrdma_get_db(struct vrdma_context *ctx,
					 uint32_t queue, uint64_t notify_key,
					 uint64_t flags_key)
{
	int fd = ctx->ibv_ctx.context.cmd_fd;
	struct vrdma_db_map *m;

	pthread_mutex_lock(&ctx->db_lock);
	list_for_each(&ctx->db_maps, m, entry) {
		if (m->queue == queue) {
			m->refcnt++;
			goto out;
		}
	}

	m = calloc(1, sizeof(*m));
	if (!m)
		goto out;
	m->queue = queue;
	m->refcnt = 1;
	m->notify_page = mmap(NULL, VRDMA_MMAP_SIZE, PROT_WRITE, MAP_SHARED, fd,
			      notify_key);
	if (m->notify_page == MAP_FAILED)
		goto err_free;
	m->flags_page = mmap(NULL, VRDMA_MMAP_SIZE, PROT_READ, MAP_SHARED, fd,
			     flags_key);
	if (m->flags_page == MAP_FAILED)
		goto err_notify;
	list_add_tail(&ctx->db_maps, &m->entry);
out:
	pthread_mutex_unlock(&ctx->db_lock);
	return m;

err_notify:
	munmap(m->notify_page, VRDMA_MMAP_SIZE);
err_free:
	free(m);
	pthread_mutex_unlock(&ctx->db_lock);
	return NULL;
}

static void vrdma_put_db(struct vrdma_context *ctx, struct vrdma_db_map *m)
{
	pthread_mutex_lock(&ctx->db_lock);
	if (--m->refcnt == 0) {
		list_del(&m->entry);
		munmap(m->notify_page, VRDMA_MMAP_SIZE);
		munmap(m->flags_page, VRDMA_MMAP_SIZE);
		free(m);
	}
	pthread_mutex_unlock(&ctx->db_lock);
}

/* ---------------------------------------------------------------------- */
/* Queue pairs                                                            */
/* ---------------------------------------------------------------------- */

/* Smallest shift in [min, VRDMA_MAX_WQE_SHIFT] with 1 << shift >= bytes. */
static int vrdma_wqe_shift(uint32_t bytes, uint32_t min)
{
	uint32_t s;

	for (s = min; s <= VRDMA_MAX_WQE_SHIFT; s++)
		if ((1U << s) >= bytes)
			return s;
	return -1;
}

/*
 * vrdma_qp_layout checks the capabilities asked for against the context's
 * limits, picks depths and strides (docs/spec.md, CREATE_QP), and writes
 * the capabilities granted back into cap. A QP on an SRQ has no receive
 * queue: its receive capabilities are ignored, as verbs defines it, and
 * granted as zero. max_inline bounds the inline data (a UD QP's datagram
 * fits the port's MTU).
 */
static int vrdma_qp_layout(struct vrdma_context *ctx, struct vrdma_qp *qp,
			   struct ibv_qp_cap *cap, bool srq,
			   uint32_t max_inline)
{
	uint32_t send_wr = cap->max_send_wr ? cap->max_send_wr : 1;
	uint32_t recv_wr = cap->max_recv_wr ? cap->max_recv_wr : 1;
	uint32_t send_sge = cap->max_send_sge ? cap->max_send_sge : 1;
	uint32_t recv_sge = cap->max_recv_sge ? cap->max_recv_sge : 1;
	uint32_t inline_data = cap->max_inline_data;
	uint32_t sq_bytes;
	int sq_shift, rq_shift = 0;

	if (srq)
		recv_wr = recv_sge = 0;
	if (send_wr > ctx->max_qp_wr || recv_wr > ctx->max_qp_wr ||
	    send_sge > ctx->max_sge || recv_sge > ctx->max_sge ||
	    inline_data > max_inline)
		return EINVAL;

	qp->sq.depth = vrdma_roundup_pow2(send_wr);
	qp->rq.depth = srq ? 0 : vrdma_roundup_pow2(recv_wr);
	if (!qp->sq.depth || qp->sq.depth > ctx->max_qp_wr ||
	    (!srq && (!qp->rq.depth || qp->rq.depth > ctx->max_qp_wr)))
		return EINVAL;

	sq_bytes = sizeof(struct vrdma_send_wqe) +
		   sizeof(struct vrdma_sge) * send_sge;
	if (sq_bytes < sizeof(struct vrdma_send_wqe) + inline_data)
		sq_bytes = sizeof(struct vrdma_send_wqe) + inline_data;
	sq_shift = vrdma_wqe_shift(sq_bytes, VRDMA_MIN_SQ_WQE_SHIFT);
	if (!srq)
		rq_shift = vrdma_wqe_shift(sizeof(struct vrdma_recv_wqe) +
					   sizeof(struct vrdma_sge) * recv_sge,
					   VRDMA_MIN_RQ_WQE_SHIFT);
	if (sq_shift < 0 || rq_shift < 0)
		return EINVAL;
	qp->sq.shift = sq_shift;
	qp->rq.shift = rq_shift;

	/* What the strides hold, within the device's limits. */
	qp->sq.max_sge = ((1U << sq_shift) - sizeof(struct vrdma_send_wqe)) /
			 sizeof(struct vrdma_sge);
	if (qp->sq.max_sge > ctx->max_sge)
		qp->sq.max_sge = ctx->max_sge;
	qp->rq.max_sge = 0;
	if (!srq) {
		qp->rq.max_sge = ((1U << rq_shift) -
				  sizeof(struct vrdma_recv_wqe)) /
				 sizeof(struct vrdma_sge);
		if (qp->rq.max_sge > ctx->max_sge)
			qp->rq.max_sge = ctx->max_sge;
	}
	qp->max_inline_data = (1U << sq_shift) - sizeof(struct vrdma_send_wqe);
	if (qp->max_inline_data > max_inline)
		qp->max_inline_data = max_inline;

	cap->max_send_wr = qp->sq.depth;
	cap->max_recv_wr = qp->rq.depth;
	cap->max_send_sge = qp->sq.max_sge;
	cap->max_recv_sge = qp->rq.max_sge;
	cap->max_inline_data = qp->max_inline_data;
	return 0;
}

/*
 * vrdma_qp_max_inline is the most inline data a QP of this type may carry:
 * the device's limit, and for UD also the port's MTU in bytes (docs/spec.md
 * CREATE_QP: a UD QP's max_inline_data is at most the MTU's bytes). 0 with
 * errno set when the port cannot be queried.
 */
static uint32_t vrdma_qp_max_inline(struct vrdma_context *ctx,
				    enum ibv_qp_type type)
{
	struct ibv_port_attr port = {};
	uint32_t mtu;
	int ret;

	if (type != IBV_QPT_UD)
		return ctx->max_inline_data;
	ret = vrdma_query_port(&ctx->ibv_ctx.context, 1, &port);
	if (ret) {
		errno = ret;
		return 0;
	}
	if (port.active_mtu < IBV_MTU_256 || port.active_mtu > IBV_MTU_4096) {
		errno = EPROTO;
		return 0;
	}
	mtu = 128U << port.active_mtu;	/* IBV_MTU_256 is 1 */
	return mtu < ctx->max_inline_data ? mtu : ctx->max_inline_data;
}

struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
			       struct ibv_qp_init_attr *attr)
{
	struct vrdma_context *ctx = to_vctx(pd->context);
	struct vrdma_ucmd_create_qp_resp resp = {};
	struct vrdma_ucmd_create_qp cmd = {};
	size_t sq_len, rq_len;
	struct vrdma_qp *qp;
	struct ibv_qp_cap cap;
	uint32_t max_inline;
	int ret;

	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	errno = 0;
	max_inline = vrdma_qp_max_inline(ctx, attr->qp_type);
	if (!max_inline && errno)
		return NULL;

	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;

	cap = attr->cap;
	ret = vrdma_qp_layout(ctx, qp, &cap, attr->srq != NULL, max_inline);
	if (ret) {
		errno = ret;
		goto err_free;
	}

	sq_len = vrdma_page_align((size_t)qp->sq.depth << qp->sq.shift);
	rq_len = vrdma_page_align((size_t)qp->rq.depth << qp->rq.shift);
	qp->buf_len = sq_len + rq_len + VRDMA_PAGE_SIZE;
	qp->buf = vrdma_alloc_buf(qp->buf_len);
	if (!qp->buf)
		goto err_free;
	qp->sq.ring = qp->buf;
	qp->rq.ring = rq_len ? (uint8_t *)qp->buf + sq_len : NULL;
	qp->rec = (struct vrdma_qp_notify_record *)((uint8_t *)qp->buf +
						     sq_len + rq_len);
	qp->sq_sig_all = attr->sq_sig_all;

	/* With an SRQ the RQ fields stay zero; the kernel adds the SRQ. */
	cmd.buf_addr = (uintptr_t)qp->buf;
	cmd.buf_len = qp->buf_len;
	cmd.sq_depth = qp->sq.depth;
	cmd.rq_depth = qp->rq.depth;
	cmd.sq_wqe_shift = qp->sq.shift;
	cmd.rq_wqe_shift = qp->rq.shift;
	cmd.record_offset = sq_len + rq_len;
	cmd.flags = VRDMA_QP_F_RQ_NOTIFY;

	/* The standard command carries the granted caps and sq_sig_all. */
	attr->cap = cap;
	ret = ibv_cmd_create_qp(pd, &qp->vqp.qp, attr, &cmd.ibv_cmd,
				sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_buf;
	}
	/* The provider's layout is what the rings really hold. */
	attr->cap = cap;

	ret = vrdma_check_db(ctx, "create_qp", resp.doorbell_queue,
			     resp.notify_offset, resp.flags_offset);
	if (ret) {
		errno = ret;
		goto err_destroy;
	}
	qp->db = vrdma_get_db(ctx, resp.doorbell_queue, resp.notify_mmap_key,
			      resp.flags_mmap_key);
	if (!qp->db)
		goto err_destroy;
	qp->notify = (uint16_t *)((uint8_t *)qp->db->notify_page +
				  resp.notify_offset);
	qp->flags = (const uint16_t *)((const uint8_t *)qp->db->flags_page +
				       resp.flags_offset);
	qp->notify_value = resp.notify_value;

	pthread_spin_init(&qp->sq.lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq.lock, PTHREAD_PROCESS_PRIVATE);
	return &qp->vqp.qp;

err_destroy:
	ret = errno;
	ibv_cmd_destroy_qp(&qp->vqp.qp);
	errno = ret;
err_buf:
	vrdma_free_buf(qp->buf, qp->buf_len);
err_free:
	free(qp);
	return NULL;
}

int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		   int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_query_qp cmd;
	int ret;

	ret = ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd,
			       sizeof(cmd));
	if (ret)
		return ret;
	attr->cap.max_send_wr = qp->sq.depth;
	attr->cap.max_recv_wr = qp->rq.depth;
	attr->cap.max_send_sge = qp->sq.max_sge;
	attr->cap.max_recv_sge = qp->rq.max_sge;
	attr->cap.max_inline_data = qp->max_inline_data;
	init_attr->cap = attr->cap;
	init_attr->sq_sig_all = qp->sq_sig_all;
	return 0;
}

int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		    int attr_mask)
{
	struct ibv_modify_qp cmd;

	return ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
}

int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	int ret;

	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;
	/* The device no longer touches the rings once DESTROY_QP answered. */
	vrdma_put_db(to_vctx(ibqp->context), qp->db);
	pthread_spin_destroy(&qp->sq.lock);
	pthread_spin_destroy(&qp->rq.lock);
	vrdma_free_buf(qp->buf, qp->buf_len);
	free(qp);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Posting                                                                */
/* ---------------------------------------------------------------------- */

/*
 * vrdma_build_send_wqe encodes one work request into wqe with the encoder
 * the ibv_wr_* API shares (vrdma_post.h). Returns 0 or EINVAL; a refused
 * WQE is left unpublished.
 */
static inline int vrdma_build_send_wqe(struct vrdma_qp *qp,
				       struct vrdma_send_wqe *wqe,
				       const struct ibv_send_wr *wr)
{
	uint32_t inline_len = 0, off = 0;
	bool can_inline;
	int opcode, i, err;

	opcode = vrdma_wqe_opcode(wr->opcode, &can_inline);
	if (opcode < 0 || wr->num_sge < 0)
		return EINVAL;
	/*
	 * docs/spec.md, Semantics (UD): SEND and SEND_WITH_IMM only, no
	 * FENCE, to an AH and a 24-bit QP number. The device would fail the
	 * QP for the others; refusing the work request is kinder.
	 */
	if (qp->vqp.qp.qp_type == IBV_QPT_UD &&
	    ((opcode != VRDMA_WR_SEND && opcode != VRDMA_WR_SEND_WITH_IMM) ||
	     (wr->send_flags & IBV_SEND_FENCE) || !wr->wr.ud.ah ||
	     wr->wr.ud.remote_qpn > 0xffffff))
		return EINVAL;
	vrdma_wqe_begin(qp, wqe, wr->wr_id, opcode, wr->send_flags);
	if (qp->vqp.qp.qp_type == IBV_QPT_UD)
		vrdma_wqe_set_ud(wqe, to_vah(wr->wr.ud.ah)->ahn,
				 wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);

	switch (opcode) {
	case VRDMA_WR_SEND_WITH_IMM:
		vrdma_wqe_set_imm(wqe, wr->imm_data);
		break;
	case VRDMA_WR_SEND_WITH_INV:
		vrdma_wqe_set_inv(wqe, wr->invalidate_rkey);
		break;
	case VRDMA_WR_LOCAL_INV:
		vrdma_wqe_set_inv(wqe, wr->invalidate_rkey);
		return 0;
	case VRDMA_WR_BIND_MW:
		err = vrdma_wqe_set_bind(qp, wqe, wr->bind_mw.mw,
					 wr->bind_mw.rkey,
					 &wr->bind_mw.bind_info);
		if (err)
			return err;
		/* The MW is named by its current rkey in the next bind. */
		wr->bind_mw.mw->rkey = wr->bind_mw.rkey;
		return 0;
	case VRDMA_WR_RDMA_WRITE_WITH_IMM:
		vrdma_wqe_set_imm(wqe, wr->imm_data);
		/* fall through */
	case VRDMA_WR_RDMA_WRITE:
	case VRDMA_WR_RDMA_READ:
		vrdma_wqe_set_rdma(wqe, wr->wr.rdma.remote_addr,
				   wr->wr.rdma.rkey);
		break;
	case VRDMA_WR_ATOMIC_CMP_AND_SWP:
		vrdma_wqe_set_atomic(wqe, wr->wr.atomic.remote_addr,
				     wr->wr.atomic.rkey,
				     wr->wr.atomic.compare_add,
				     wr->wr.atomic.swap);
		break;
	case VRDMA_WR_ATOMIC_FETCH_AND_ADD:
		vrdma_wqe_set_atomic(wqe, wr->wr.atomic.remote_addr,
				     wr->wr.atomic.rkey,
				     wr->wr.atomic.compare_add, 0);
		break;
	}

	/* INLINE applies to SEND and RDMA WRITE; READ and atomics ignore it. */
	if (!can_inline || !(wr->send_flags & IBV_SEND_INLINE))
		return vrdma_wqe_set_sges(qp, wqe, wr->sg_list, wr->num_sge);
	for (i = 0; i < wr->num_sge; i++)
		if (vrdma_inline_add_len(qp, &inline_len,
					 wr->sg_list[i].length))
			return EINVAL;
	for (i = 0; i < wr->num_sge; i++)
		vrdma_wqe_put_inline(wqe, &off,
				     (const void *)(uintptr_t)wr->sg_list[i].addr,
				     wr->sg_list[i].length);
	vrdma_wqe_set_inline(wqe, inline_len);
	return 0;
}

int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_send_wqe *wqe;
	uint32_t pi, ci;
	int err = 0;

	pthread_spin_lock(&qp->sq.lock);
	pi = qp->sq.pi;
	ci = vrdma_load_acquire(&qp->rec->sq_ci);
	for (; wr; wr = wr->next) {
		wqe = vrdma_sq_slot(qp, pi, &ci);
		if (!wqe) {
			err = ENOMEM;
			break;
		}
		err = vrdma_build_send_wqe(qp, wqe, wr);
		if (err)
			break;
		pi++;
	}
	if (pi != qp->sq.pi)
		vrdma_sq_publish(qp, pi);
	pthread_spin_unlock(&qp->sq.lock);
	if (err)
		*bad_wr = wr;
	return err;
}

/*
 * vrdma_put_recv_wqe checks one receive work request against a ring's
 * max_sge and, only if it is good, writes its WQE into slot. 0 or EINVAL.
 */
static inline int vrdma_put_recv_wqe(const struct vrdma_wq *wq, uint32_t pi,
				     const struct ibv_recv_wr *wr)
{
	struct vrdma_recv_wqe *wqe;
	struct vrdma_sge *sge;
	int i;

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > wq->max_sge)
		return EINVAL;
	wqe = (struct vrdma_recv_wqe *)(wq->ring +
					((pi & (wq->depth - 1)) << wq->shift));
	sge = (struct vrdma_sge *)(wqe + 1);
	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(wr->wr_id);
	wqe->num_sge = htole16(wr->num_sge);
	for (i = 0; i < wr->num_sge; i++) {
		sge[i].addr = htole64(wr->sg_list[i].addr);
		sge[i].length = htole32(wr->sg_list[i].length);
		sge[i].lkey = htole32(wr->sg_list[i].lkey);
	}
	return 0;
}

/*
 * vrdma_post_recvs writes the WQEs of a receive list into wq, up to the
 * first bad or the first that finds the ring full, and returns the new
 * producer index (not yet published) in *pi. ci is the record's consumer
 * index, read again only when the ring looks full; a consumer index the
 * device moved past pi makes pi - ci wrap to a large value: full, never an
 * overwrite.
 */
static inline int vrdma_post_recvs(struct vrdma_wq *wq, const __le32 *ci_p,
				   struct ibv_recv_wr **wr, uint32_t *pi)
{
	uint32_t ci = vrdma_load_acquire(ci_p);
	int err;

	for (*pi = wq->pi; *wr; *wr = (*wr)->next) {
		if (*pi - ci >= wq->depth) {
			ci = vrdma_load_acquire(ci_p);
			if (*pi - ci >= wq->depth)
				return ENOMEM;
		}
		err = vrdma_put_recv_wqe(wq, *pi, *wr);
		if (err)
			return err;
		(*pi)++;
	}
	return 0;
}

int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_wq *rq = &qp->rq;
	uint32_t pi;
	int err;

	/* A QP on an SRQ has no receive queue: post to the SRQ. */
	if (ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&rq->lock);
	err = vrdma_post_recvs(rq, &qp->rec->rq_ci, &wr, &pi);
	if (pi != rq->pi) {
		rq->pi = pi;
		vrdma_store_release(&qp->rec->rq_pi, pi);
		/*
		 * docs/spec.md, vrdma_qp_notify_record: the device reads rq_pi
		 * when a message arrives; only a QP in ERR (rq_notify set, a
		 * full barrier after our store) needs the doorbell step.
		 */
		atomic_thread_fence(memory_order_seq_cst);
		if (vrdma_load_acquire(&qp->rec->rq_notify))
			vrdma_ring_doorbell(qp);
	}
	pthread_spin_unlock(&rq->lock);
	if (err)
		*bad_wr = wr;
	return err;
}

/* ---------------------------------------------------------------------- */
/* Shared receive queues                                                  */
/* ---------------------------------------------------------------------- */

struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *attr)
{
	struct vrdma_context *ctx = to_vctx(pd->context);
	struct vrdma_ucmd_create_srq_resp resp = {};
	struct vrdma_ucmd_create_srq cmd = {};
	struct ibv_srq_init_attr init;
	uint32_t max_wr = attr->attr.max_wr;
	uint32_t max_sge = attr->attr.max_sge ? attr->attr.max_sge : 1;
	struct vrdma_srq *srq;
	size_t ring_len;
	int shift, ret;

	if (!max_wr || max_wr > ctx->max_qp_wr || max_sge > ctx->max_sge) {
		errno = EINVAL;
		return NULL;
	}
	shift = vrdma_wqe_shift(sizeof(struct vrdma_recv_wqe) +
				sizeof(struct vrdma_sge) * max_sge,
				VRDMA_MIN_RQ_WQE_SHIFT);
	if (shift < 0) {
		errno = EINVAL;
		return NULL;
	}

	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	srq->wq.depth = vrdma_roundup_pow2(max_wr);
	if (!srq->wq.depth || srq->wq.depth > ctx->max_qp_wr) {
		errno = EINVAL;
		goto err_free;
	}
	srq->wq.shift = shift;
	/* What the stride holds, within the device's limit. */
	srq->wq.max_sge = ((1U << shift) - sizeof(struct vrdma_recv_wqe)) /
			  sizeof(struct vrdma_sge);
	if (srq->wq.max_sge > ctx->max_sge)
		srq->wq.max_sge = ctx->max_sge;

	/* The ring in whole pages, then the record in a page of its own. */
	ring_len = vrdma_page_align((size_t)srq->wq.depth << shift);
	srq->buf_len = ring_len + VRDMA_PAGE_SIZE;
	srq->buf = vrdma_alloc_buf(srq->buf_len);
	if (!srq->buf)
		goto err_free;
	srq->wq.ring = srq->buf;
	srq->rec = (struct vrdma_srq_record *)((uint8_t *)srq->buf + ring_len);

	cmd.buf_addr = (uintptr_t)srq->buf;
	cmd.buf_len = srq->buf_len;
	cmd.depth = srq->wq.depth;
	cmd.wqe_shift = shift;
	cmd.record_offset = ring_len;
	/* The standard command carries what the ring holds. */
	init = *attr;
	init.attr.max_wr = srq->wq.depth;
	init.attr.max_sge = srq->wq.max_sge;
	ret = ibv_cmd_create_srq(pd, &srq->vsrq.srq, &init, &cmd.ibv_cmd,
				 sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_buf;
	}

	ret = vrdma_check_db(ctx, "create_srq", resp.doorbell_queue,
			     resp.notify_offset, resp.flags_offset);
	if (ret) {
		errno = ret;
		goto err_destroy;
	}
	srq->db = vrdma_get_db(ctx, resp.doorbell_queue, resp.notify_mmap_key,
			       resp.flags_mmap_key);
	if (!srq->db)
		goto err_destroy;
	srq->notify = (uint16_t *)((uint8_t *)srq->db->notify_page +
				   resp.notify_offset);
	srq->flags = (const uint16_t *)((const uint8_t *)srq->db->flags_page +
					resp.flags_offset);
	srq->notify_value = resp.notify_value;
	attr->attr.max_wr = srq->wq.depth;
	attr->attr.max_sge = srq->wq.max_sge;

	pthread_spin_init(&srq->wq.lock, PTHREAD_PROCESS_PRIVATE);
	return &srq->vsrq.srq;

err_destroy:
	ret = errno;
	ibv_cmd_destroy_srq(&srq->vsrq.srq);
	errno = ret;
err_buf:
	vrdma_free_buf(srq->buf, srq->buf_len);
err_free:
	free(srq);
	return NULL;
}

int vrdma_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr,
		     int attr_mask)
{
	struct ibv_modify_srq cmd;

	/* IBV_SRQ_MAX_WR: the kernel answers EOPNOTSUPP (no resizing). */
	return ibv_cmd_modify_srq(srq, attr, attr_mask, &cmd, sizeof(cmd));
}

int vrdma_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(srq, attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	/* The device no longer touches the ring once DESTROY_SRQ answered. */
	vrdma_put_db(to_vctx(ibsrq->context), srq->db);
	pthread_spin_destroy(&srq->wq.lock);
	vrdma_free_buf(srq->buf, srq->buf_len);
	free(srq);
	return 0;
}

/*
 * docs/spec.md, struct vrdma_srq_record: "after advancing pi (release) and
 * a full barrier, the driver reads notify and takes the doorbell step only
 * when it is 1" (a message waits for a receive). No system call.
 */
int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_wq *wq = &srq->wq;
	uint16_t flags;
	uint32_t pi;
	int err;

	pthread_spin_lock(&wq->lock);
	err = vrdma_post_recvs(wq, &srq->rec->ci, &wr, &pi);
	if (pi != wq->pi) {
		wq->pi = pi;
		vrdma_store_release(&srq->rec->pi, pi);
		atomic_thread_fence(memory_order_seq_cst);
		if (vrdma_load_acquire(&srq->rec->notify) == 1) {
			/* The doorbell step, as vrdma_ring_doorbell's. */
			atomic_thread_fence(memory_order_seq_cst);
			flags = le16toh(*(const volatile uint16_t *)srq->flags);
			if (!(flags & VRDMA_DOORBELL_NO_NOTIFY))
				mmio_write16(srq->notify, srq->notify_value);
		}
	}
	pthread_spin_unlock(&wq->lock);
	if (err)
		*bad_wr = wr;
	return err;
}
