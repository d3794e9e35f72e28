// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * datapath_check: the provider's data path on the host, without a kernel
 * driver or a device. It links vrdma_verbs.o with a fake of the libibverbs
 * calls it makes (the ibv_cmd_* "kernel" records what it was asked and
 * answers like the driver) and plays the device by hand: it reads the WQEs
 * the provider wrote, moves consumer indices, writes CQEs and producer
 * indices, and sets or clears the doorbell queue's NO_NOTIFY flag.
 *
 * The notify page and the flags page are two pages of a memfd that stands
 * in for the uverbs file descriptor, so the test sees every doorbell write.
 * The last check runs post and poll (ibv_post_send, ibv_wr_*, ibv_poll_cq,
 * ibv_start_poll) under SECCOMP_MODE_STRICT, where any system call but
 * read, write, _exit and sigreturn kills the process: the fast path makes
 * none.
 *
 * scripts/guest-provider.sh builds and runs it before it installs the
 * provider; it prints "datapath_check: all N checks passed", or the failures
 * and "... FAILED", and exits non-zero on a failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vrdma.h"
#include "vrdma_abi.h"

static int passed, failed;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
		} else {                                                       \
			failed++;                                              \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__,          \
				__LINE__, #cond);                              \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

/* ---------------------------------------------------------------------- */
/* The fake kernel: what the provider's ibv_cmd_* calls reach.            */
/* ---------------------------------------------------------------------- */

#define DOORBELL_QUEUE 3
#define NOTIFY_OFFSET 0x40
#define FLAGS_OFFSET 0x82
#define NOTIFY_VALUE 0x1234

static struct {
	struct vrdma_create_cq_cmd cq_cmd;
	int cq_cqe;
	struct vrdma_create_qp_cmd qp_cmd;
	struct ibv_qp_init_attr qp_attr;
	int qp_destroyed;
	int next_qpn;
	int lib_v56;		/* ibv_qp_to_qp_ex reads 56.1's layout */
} fk;

static int memfd;		/* the "uverbs fd": page 0 notify, page 1 flags */
static volatile uint16_t *notify;	/* RW view of the notify register */
static volatile uint16_t *flags;	/* RW view of the used-ring flags */

void __verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt,
		 ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "(provider log) ");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

int ibv_dontfork_range(void *base, size_t size) { return 0; }
int ibv_dofork_range(void *base, size_t size) { return 0; }

int ibv_cmd_create_cq(struct ibv_context *context, int cqe,
		      struct ibv_comp_channel *channel, int comp_vector,
		      struct ibv_cq *cq, struct ibv_create_cq *cmd,
		      size_t cmd_size, struct ib_uverbs_create_cq_resp *resp,
		      size_t resp_size)
{
	struct vrdma_ucmd_create_cq *c = (void *)cmd;

	if (cmd_size != sizeof(*c) ||
	    resp_size != sizeof(struct vrdma_ucmd_create_cq_resp))
		return EINVAL;
	fk.cq_cmd = c->drv_payload;
	fk.cq_cqe = cqe;
	cq->context = context;
	cq->cqe = cqe;
	return 0;
}

int ibv_cmd_destroy_cq(struct ibv_cq *cq) { return 0; }

int ibv_cmd_create_qp(struct ibv_pd *pd, struct ibv_qp *qp,
		      struct ibv_qp_init_attr *attr, struct ibv_create_qp *cmd,
		      size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
		      size_t resp_size)
{
	struct vrdma_ucmd_create_qp *c = (void *)cmd;
	struct vrdma_ucmd_create_qp_resp *r = (void *)resp;

	if (cmd_size != sizeof(*c) || resp_size != sizeof(*r))
		return EINVAL;
	fk.qp_cmd = c->drv_payload;
	fk.qp_attr = *attr;
	qp->context = pd->context;
	qp->pd = pd;
	qp->qp_type = attr->qp_type;
	qp->srq = attr->srq;
	qp->qp_num = ++fk.next_qpn;
	r->qpn = qp->qp_num;
	r->doorbell_queue = DOORBELL_QUEUE;
	r->notify_mmap_key = 0;
	r->flags_mmap_key = VRDMA_MMAP_SIZE;
	r->notify_offset = NOTIFY_OFFSET;
	r->flags_offset = FLAGS_OFFSET;
	r->notify_value = NOTIFY_VALUE;
	return 0;
}

int ibv_cmd_destroy_qp(struct ibv_qp *qp)
{
	fk.qp_destroyed++;
	return 0;
}

/* The fake kernel's SRQs, AHs and port (UD and SRQ checks). */
#define FAKE_AHN 0xabc123

static struct {
	struct vrdma_create_srq_cmd srq_cmd;
	struct ibv_srq_init_attr srq_attr;
	int srq_destroyed;
	enum ibv_mtu port_mtu;	/* 0: IBV_MTU_1024 */
} fks;

int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq,
		       struct ibv_srq_init_attr *attr,
		       struct ibv_create_srq *cmd, size_t cmd_size,
		       struct ib_uverbs_create_srq_resp *resp, size_t resp_size)
{
	struct vrdma_ucmd_create_srq *c = (void *)cmd;
	struct vrdma_ucmd_create_srq_resp *r = (void *)resp;

	if (cmd_size != sizeof(*c) || resp_size != sizeof(*r))
		return EINVAL;
	fks.srq_cmd = c->drv_payload;
	fks.srq_attr = *attr;
	srq->context = pd->context;
	srq->pd = pd;
	r->srqn = 0x51;
	r->doorbell_queue = DOORBELL_QUEUE;
	r->notify_mmap_key = 0;
	r->flags_mmap_key = VRDMA_MMAP_SIZE;
	r->notify_offset = NOTIFY_OFFSET;
	r->flags_offset = FLAGS_OFFSET;
	r->notify_value = NOTIFY_VALUE;
	return 0;
}

int ibv_cmd_destroy_srq(struct ibv_srq *srq)
{
	fks.srq_destroyed++;
	return 0;
}

int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah,
		      struct ibv_ah_attr *attr,
		      struct ib_uverbs_create_ah_resp *resp, size_t resp_size)
{
	struct vrdma_ucmd_create_ah_resp *r = (void *)resp;

	/* The driver's part follows the 4-byte ib_uverbs_create_ah_resp. */
	if (resp_size != sizeof(*r) || offsetof(typeof(*r), ahn) != 4)
		return EINVAL;
	ah->context = pd->context;
	ah->pd = pd;
	r->ahn = FAKE_AHN;
	return 0;
}

int ibv_cmd_destroy_ah(struct ibv_ah *ah) { return 0; }

int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num,
		       struct ibv_port_attr *port_attr,
		       struct ibv_query_port *cmd, size_t cmd_size)
{
	if (port_num != 1)
		return EINVAL;
	memset(port_attr, 0, sizeof(*port_attr));
	port_attr->active_mtu = fks.port_mtu ? fks.port_mtu : IBV_MTU_1024;
	return 0;
}

/*
 * ibv_qp_to_qp_ex as the guests' libibverbs (Debian 12, rdma-core 44.0)
 * has it, reading comp_mask at that library's offset, 352; with
 * fk.lib_v56 set, as 56.1 has it (the provider's headers: vqp.comp_mask).
 */
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct verbs_qp *vqp = container_of(qp, struct verbs_qp, qp);
	uint32_t mask;

	if (fk.lib_v56)
		mask = vqp->comp_mask;
	else
		memcpy(&mask, (uint8_t *)vqp + 352, sizeof(mask));
	return (mask & VERBS_QP_EX) ? &vqp->qp_ex : NULL;
}

/* Not reached by these checks; present so vrdma_verbs.o links. */
int ibv_cmd_query_device_any(struct ibv_context *context,
			     const struct ibv_query_device_ex_input *input,
			     struct ibv_device_attr_ex *attr, size_t attr_size,
			     struct ib_uverbs_ex_query_device_resp *resp,
			     size_t *resp_size) { return EOPNOTSUPP; }
int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
		     struct ibv_alloc_pd *cmd, size_t cmd_size,
		     struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size) { return EOPNOTSUPP; }
int ibv_cmd_dealloc_pd(struct ibv_pd *pd) { return EOPNOTSUPP; }
int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
		   uint64_t hca_va, int access, struct verbs_mr *vmr,
		   struct ibv_reg_mr *cmd, size_t cmd_size,
		   struct ib_uverbs_reg_mr_resp *resp, size_t resp_size) { return EOPNOTSUPP; }
int ibv_cmd_dereg_mr(struct verbs_mr *vmr) { return EOPNOTSUPP; }
int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type,
		     struct ibv_mw *mw, struct ibv_alloc_mw *cmd,
		     size_t cmd_size,
		     struct ib_uverbs_alloc_mw_resp *resp, size_t resp_size)
{
	mw->context = pd->context;
	mw->pd = pd;
	mw->type = type;
	mw->rkey = 0x12345600 | type;
	mw->handle = 77;
	return 0;
}
int ibv_cmd_dealloc_mw(struct ibv_mw *mw) { return 0; }
int ibv_cmd_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		       int srq_attr_mask, struct ibv_modify_srq *cmd,
		       size_t cmd_size) { return EOPNOTSUPP; }
int ibv_cmd_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		      struct ibv_query_srq *cmd, size_t cmd_size) { return EOPNOTSUPP; }
int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr,
		     int attr_mask, struct ibv_qp_init_attr *qp_init_attr,
		     struct ibv_query_qp *cmd, size_t cmd_size) { return EOPNOTSUPP; }
int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_modify_qp *cmd,
		      size_t cmd_size) { return EOPNOTSUPP; }

/* ---------------------------------------------------------------------- */
/* Set-up                                                                 */
/* ---------------------------------------------------------------------- */

static struct ibv_device fake_dev = { .name = "vrdma0" };
static struct vrdma_context *ctx;
static struct ibv_pd pd;

static void setup(void)
{
	void *rw;

	memfd = memfd_create("vrdma-uverbs", 0);
	if (memfd < 0 || ftruncate(memfd, 2 * VRDMA_MMAP_SIZE)) {
		perror("memfd");
		exit(2);
	}
	rw = mmap(NULL, 2 * VRDMA_MMAP_SIZE, PROT_READ | PROT_WRITE,
		  MAP_SHARED, memfd, 0);
	if (rw == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	notify = (uint16_t *)((uint8_t *)rw + NOTIFY_OFFSET);
	flags = (uint16_t *)((uint8_t *)rw + VRDMA_MMAP_SIZE + FLAGS_OFFSET);

	ctx = calloc(1, sizeof(*ctx));
	ctx->ibv_ctx.context.device = &fake_dev;
	ctx->ibv_ctx.context.cmd_fd = memfd;
	ctx->num_doorbell_queues = 4;
	ctx->max_qp_wr = 4096;
	ctx->max_sge = 16;
	ctx->max_cqe = 65536;
	ctx->max_inline_data = 256;
	pthread_mutex_init(&ctx->db_lock, NULL);
	list_head_init(&ctx->db_maps);
	pd.context = &ctx->ibv_ctx.context;
}

/* The device's side of the rings. */
static struct vrdma_send_wqe *sq_wqe(struct vrdma_qp *qp, uint32_t i)
{
	return (void *)(qp->sq.ring + ((i & (qp->sq.depth - 1)) << qp->sq.shift));
}

static struct vrdma_recv_wqe *rq_wqe(struct vrdma_qp *qp, uint32_t i)
{
	return (void *)(qp->rq.ring + ((i & (qp->rq.depth - 1)) << qp->rq.shift));
}

static void device_complete(struct vrdma_cq *cq, uint64_t wr_id,
			    uint8_t status, uint8_t opcode, uint16_t wc_flags,
			    uint32_t imm)
{
	uint32_t pi = cq->rec->pi;
	struct vrdma_cqe *e = &cq->ring[pi & (cq->depth - 1)];

	memset(e, 0, sizeof(*e));
	e->wr_id = wr_id;
	e->status = status;
	e->opcode = opcode;
	e->wc_flags = wc_flags;
	e->qp_num = 7;
	e->byte_len = 100;
	e->imm_data = imm;
	e->src_qp = 9;
	e->vendor_err = status ? 0x55 : 0;
	atomic_store_explicit((_Atomic uint32_t *)&cq->rec->pi, pi + 1,
			      memory_order_release);
}

/* ---------------------------------------------------------------------- */
/* Checks                                                                 */
/* ---------------------------------------------------------------------- */

static void check_cq(void)
{
	struct ibv_wc wc[8];
	struct vrdma_cq *cq;
	struct ibv_cq *ibcq;
	int n, i;

	ibcq = vrdma_create_cq(&ctx->ibv_ctx.context, 5, NULL, 0);
	CHECK(ibcq != NULL, "create_cq(5): %s", strerror(errno));
	if (!ibcq)
		return;
	cq = to_vcq(ibcq);
	CHECK(fk.cq_cqe == VRDMA_MIN_CQE, "cqe passed to the kernel = %d, want %d (one page)", fk.cq_cqe, VRDMA_MIN_CQE);
	CHECK(cq->depth == VRDMA_MIN_CQE, "depth = %u", cq->depth);
	CHECK(fk.cq_cmd.buf_addr == (uintptr_t)cq->buf, "buf_addr");
	CHECK(fk.cq_cmd.buf_addr % VRDMA_PAGE_SIZE == 0, "buf_addr not page aligned");
	CHECK(fk.cq_cmd.record_offset == VRDMA_PAGE_SIZE,
	      "record_offset = %u, want one page", fk.cq_cmd.record_offset);
	CHECK(fk.cq_cmd.buf_len == 2 * VRDMA_PAGE_SIZE, "buf_len = %llu",
	      (unsigned long long)fk.cq_cmd.buf_len);
	CHECK(fk.cq_cmd.reserved == 0, "reserved");

	CHECK(vrdma_poll_cq(ibcq, 8, wc) == 0, "poll of an empty CQ");

	/* Wrap the ring a few times, 3 entries at a time. */
	for (i = 0; i < 20; i++) {
		uint16_t f = (i % 2) ? VRDMA_WC_F_WITH_IMM : 0;

		device_complete(cq, 1000 + i, 0,
				(i % 2) ? VRDMA_WC_RECV_RDMA_WITH_IMM
					: VRDMA_WC_SEND,
				f, 0x11223344);
		if (i % 3 != 2)
			continue;
		n = vrdma_poll_cq(ibcq, 8, wc);
		CHECK(n == 3, "poll returned %d, want 3", n);
		if (n != 3)
			break;
		for (int k = 0; k < 3; k++) {
			int j = i - 2 + k;

			CHECK(wc[k].wr_id == 1000 + (uint64_t)j,
			      "wr_id %llu want %d",
			      (unsigned long long)wc[k].wr_id, 1000 + j);
			CHECK(wc[k].opcode == ((j % 2) ? IBV_WC_RECV_RDMA_WITH_IMM
						       : IBV_WC_SEND),
			      "opcode %d", wc[k].opcode);
			CHECK(!!(wc[k].wc_flags & IBV_WC_WITH_IMM) == (j % 2),
			      "wc_flags %x", wc[k].wc_flags);
			CHECK(wc[k].imm_data == ((j % 2) ? 0x11223344 : 0),
			      "imm %x (the bits as posted, no swap)", wc[k].imm_data);
			CHECK(wc[k].qp_num == 7 && wc[k].src_qp == 9 &&
			      wc[k].byte_len == 100, "qp_num/src_qp/byte_len");
		}
	}
	CHECK(cq->rec->ci == cq->rec->pi - 2, "record ci %u pi %u", cq->rec->ci,
	      cq->rec->pi);
	n = vrdma_poll_cq(ibcq, 1, wc);
	CHECK(n == 1, "poll(1) = %d", n);
	n = vrdma_poll_cq(ibcq, 8, wc);
	CHECK(n == 1, "poll = %d", n);
	CHECK(cq->rec->ci == cq->rec->pi, "record ci %u pi %u", cq->rec->ci,
	      cq->rec->pi);

	/* An error completion keeps its status and vendor_err. */
	device_complete(cq, 77, IBV_WC_REM_ACCESS_ERR, VRDMA_WC_RDMA_WRITE, 0, 0);
	n = vrdma_poll_cq(ibcq, 8, wc);
	CHECK(n == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR &&
	      wc[0].vendor_err == 0x55, "error completion");

	/* Arming writes (sequence << 1) | solicited, a new sequence each time. */
	CHECK(vrdma_req_notify_cq(ibcq, 0) == 0, "req_notify");
	CHECK(cq->rec->arm == (1u << 1), "arm = %#x", cq->rec->arm);
	CHECK(vrdma_req_notify_cq(ibcq, 1) == 0, "req_notify");
	CHECK(cq->rec->arm == ((2u << 1) | 1), "arm = %#x", cq->rec->arm);

	/* A producer index past the ring is a device error. */
	cq->rec->pi = cq->rec->ci + cq->depth + 1;
	CHECK(vrdma_poll_cq(ibcq, 8, wc) < 0, "overrun pi must fail the poll");
	cq->rec->pi = cq->rec->ci;

	CHECK(vrdma_destroy_cq(ibcq) == 0, "destroy_cq");

	errno = 0;
	CHECK(vrdma_create_cq(&ctx->ibv_ctx.context, 65537, NULL, 0) == NULL &&
	      errno == EINVAL, "cqe above max_cqe");
	ibcq = vrdma_create_cq(&ctx->ibv_ctx.context, 0, NULL, 0);
	CHECK(ibcq && to_vcq(ibcq)->depth == VRDMA_MIN_CQE, "cqe 0 gives one page of entries");
	if (ibcq)
		vrdma_destroy_cq(ibcq);
	ibcq = vrdma_create_cq(&ctx->ibv_ctx.context, 1000, NULL, 0);
	CHECK(ibcq && fk.cq_cmd.record_offset == 8 * VRDMA_PAGE_SIZE &&
	      fk.cq_cmd.buf_len == 9 * VRDMA_PAGE_SIZE,
	      "1024 entries: 8 ring pages, then the record page");
	if (ibcq)
		vrdma_destroy_cq(ibcq);
}

static struct vrdma_qp *make_qp(struct ibv_cq *cq, uint32_t send_wr,
				uint32_t recv_wr, uint32_t send_sge,
				uint32_t recv_sge, uint32_t inl, int sig_all)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.sq_sig_all = sig_all,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr,
			 .max_send_sge = send_sge, .max_recv_sge = recv_sge,
			 .max_inline_data = inl },
	};
	struct ibv_qp *qp = vrdma_create_qp(&pd, &attr);

	return qp ? to_vqp(qp) : NULL;
}

static void check_qp_layout(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = { .send_cq = cq, .recv_cq = cq };
	struct vrdma_qp *qp;

	qp = make_qp(cq, 100, 3, 4, 2, 60, 0);
	CHECK(qp != NULL, "create_qp: %s", strerror(errno));
	if (!qp)
		return;
	/* 64 + 16 * 4 = 128 and 64 + 60 = 124: a 128-byte stride. */
	CHECK(fk.qp_cmd.sq_depth == 128 && fk.qp_cmd.rq_depth == 4,
	      "depths %u/%u", fk.qp_cmd.sq_depth, fk.qp_cmd.rq_depth);
	CHECK(fk.qp_cmd.sq_wqe_shift == 7, "sq shift %u", fk.qp_cmd.sq_wqe_shift);
	/* 16 + 16 * 2 = 48: a 64-byte stride. */
	CHECK(fk.qp_cmd.rq_wqe_shift == 6, "rq shift %u", fk.qp_cmd.rq_wqe_shift);
	CHECK(fk.qp_cmd.record_offset == 4 * VRDMA_PAGE_SIZE + VRDMA_PAGE_SIZE,
	      "record offset %u: 4 SQ pages, 1 RQ page", fk.qp_cmd.record_offset);
	CHECK(fk.qp_cmd.buf_len == 6 * VRDMA_PAGE_SIZE, "buf_len %llu",
	      (unsigned long long)fk.qp_cmd.buf_len);
	CHECK(fk.qp_cmd.buf_addr % VRDMA_PAGE_SIZE == 0, "buf_addr alignment");
	CHECK(fk.qp_cmd.flags == VRDMA_QP_F_RQ_NOTIFY, "flags %#x: RQ_NOTIFY",
	      fk.qp_cmd.flags);
	/* The kernel was given the caps the rings hold. */
	CHECK(fk.qp_attr.cap.max_send_wr == 128 && fk.qp_attr.cap.max_recv_wr == 4 &&
	      fk.qp_attr.cap.max_send_sge == 4 && fk.qp_attr.cap.max_recv_sge == 3 &&
	      fk.qp_attr.cap.max_inline_data == 64,
	      "caps to the kernel: wr %u/%u sge %u/%u inline %u",
	      fk.qp_attr.cap.max_send_wr, fk.qp_attr.cap.max_recv_wr,
	      fk.qp_attr.cap.max_send_sge, fk.qp_attr.cap.max_recv_sge,
	      fk.qp_attr.cap.max_inline_data);
	CHECK(qp->notify_value == NOTIFY_VALUE, "notify value");
	vrdma_destroy_qp(&qp->vqp.qp);

	/* Zero caps still get one WR and one SGE each. */
	qp = make_qp(cq, 0, 0, 0, 0, 0, 0);
	CHECK(qp && fk.qp_cmd.sq_depth == 1 && fk.qp_cmd.rq_depth == 1 &&
	      fk.qp_cmd.sq_wqe_shift == 7 && fk.qp_cmd.rq_wqe_shift == 5,
	      "minimal QP: depth %u/%u shift %u/%u", fk.qp_cmd.sq_depth,
	      fk.qp_cmd.rq_depth, fk.qp_cmd.sq_wqe_shift, fk.qp_cmd.rq_wqe_shift);
	if (qp)
		vrdma_destroy_qp(&qp->vqp.qp);

	/* 16 SGEs: 64 + 256 = 320 -> 512; inline 256 fits too. */
	qp = make_qp(cq, 4096, 4096, 16, 16, 256, 0);
	CHECK(qp && fk.qp_cmd.sq_wqe_shift == 9 && fk.qp_cmd.rq_wqe_shift == 9,
	      "max QP shifts %u/%u", fk.qp_cmd.sq_wqe_shift, fk.qp_cmd.rq_wqe_shift);
	if (qp)
		vrdma_destroy_qp(&qp->vqp.qp);

	errno = 0;
	CHECK(!make_qp(cq, 4097, 1, 1, 1, 0, 0) && errno == EINVAL, "send_wr above max");
	errno = 0;
	CHECK(!make_qp(cq, 1, 1, 17, 1, 0, 0) && errno == EINVAL, "sge above max");
	errno = 0;
	CHECK(!make_qp(cq, 1, 1, 1, 1, 257, 0) && errno == EINVAL, "inline above max");
	errno = 0;
	attr.qp_type = IBV_QPT_UC;
	CHECK(!vrdma_create_qp(&pd, &attr) && errno == EOPNOTSUPP, "UC refused");
	attr.qp_type = IBV_QPT_XRC_SEND;
	CHECK(!vrdma_create_qp(&pd, &attr) && errno == EOPNOTSUPP, "XRC refused");
}

static void check_post(struct ibv_cq *ibcq)
{
	uint8_t payload[40];
	struct ibv_sge sge[3] = {
		{ .addr = 0x1000, .length = 10, .lkey = 0xa1 },
		{ .addr = 0x2000, .length = 20, .lkey = 0xa2 },
		{ .addr = 0x3000, .length = 30, .lkey = 0xa3 },
	};
	struct ibv_send_wr wr[6], *bad;
	struct ibv_recv_wr rwr[3], *rbad;
	struct vrdma_send_wqe *w;
	struct vrdma_recv_wqe *rw;
	struct vrdma_sge *s;
	struct vrdma_qp *qp;
	int ret, i;

	for (i = 0; i < (int)sizeof(payload); i++)
		payload[i] = i + 1;

	qp = make_qp(ibcq, 4, 2, 2, 2, 32, 0);
	if (!qp) {
		CHECK(0, "create_qp: %s", strerror(errno));
		return;
	}

	memset(wr, 0, sizeof(wr));
	wr[0] = (struct ibv_send_wr){ .wr_id = 1, .next = &wr[1],
		.sg_list = sge, .num_sge = 2, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED,
		.imm_data = htobe32(0xdeadbeef) };
	wr[0].wr.rdma.remote_addr = 0x123456789a;
	wr[0].wr.rdma.rkey = 0x77;
	wr[1] = (struct ibv_send_wr){ .wr_id = 2, .next = &wr[2],
		.sg_list = sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
		.send_flags = IBV_SEND_FENCE };
	wr[1].wr.atomic.remote_addr = 0x8000;
	wr[1].wr.atomic.rkey = 0x88;
	wr[1].wr.atomic.compare_add = 5;
	wr[1].wr.atomic.swap = 6;
	/* Inline: the bytes are copied, the SGE addresses are host pointers. */
	{
		static struct ibv_sge isge[2];

		isge[0] = (struct ibv_sge){ .addr = (uintptr_t)payload, .length = 12 };
		isge[1] = (struct ibv_sge){ .addr = (uintptr_t)(payload + 12), .length = 20 };
		wr[2] = (struct ibv_send_wr){ .wr_id = 3, .next = NULL,
			.sg_list = isge, .num_sge = 2, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_INLINE };
	}

	/* The engine sleeps: the doorbell rings. */
	*flags = 0;
	*notify = 0;
	ret = vrdma_post_send(&qp->vqp.qp, wr, &bad);
	CHECK(ret == 0, "post_send: %d", ret);
	CHECK(qp->rec->sq_pi == 3, "sq_pi %u", qp->rec->sq_pi);
	CHECK(*notify == NOTIFY_VALUE, "doorbell value %#x", *notify);

	w = sq_wqe(qp, 0);
	s = (struct vrdma_sge *)(w + 1);
	CHECK(w->wr_id == 1 && w->opcode == VRDMA_WR_RDMA_WRITE_WITH_IMM &&
	      w->flags == (VRDMA_WQE_SIGNALED | VRDMA_WQE_SOLICITED) &&
	      w->num_sge == 2 && w->remote_addr == 0x123456789aULL &&
	      w->rkey == 0x77 && w->inline_len == 0,
	      "WRITE_WITH_IMM header");
	CHECK(memcmp(&w->imm_data, &wr[0].imm_data, 4) == 0,
	      "imm_data must be the 32 bits as posted");
	CHECK(s[0].addr == 0x1000 && s[0].length == 10 && s[0].lkey == 0xa1 &&
	      s[1].addr == 0x2000 && s[1].length == 20 && s[1].lkey == 0xa2,
	      "SGEs");
	CHECK(w->ah == 0 && w->remote_qpn == 0 && w->remote_qkey == 0 &&
	      w->reserved == 0, "RC: the UD fields and reserved are zero");
	w = sq_wqe(qp, 1);
	CHECK(w->opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP &&
	      w->flags == VRDMA_WQE_FENCE && w->remote_addr == 0x8000 &&
	      w->rkey == 0x88 && w->compare_add == 5 && w->swap == 6 &&
	      w->num_sge == 1, "CMP_AND_SWP");
	w = sq_wqe(qp, 2);
	CHECK(w->opcode == VRDMA_WR_SEND && w->flags == VRDMA_WQE_INLINE &&
	      w->num_sge == 0 && w->inline_len == 32 &&
	      memcmp(w + 1, payload, 32) == 0, "inline SEND");

	/* The engine polls: no doorbell. One slot is left. */
	*flags = VRDMA_DOORBELL_NO_NOTIFY;
	*notify = 0;
	wr[3] = (struct ibv_send_wr){ .wr_id = 4, .sg_list = sge, .num_sge = 1,
				      .opcode = IBV_WR_RDMA_READ, .next = &wr[4],
				      .send_flags = IBV_SEND_INLINE };
	wr[4] = (struct ibv_send_wr){ .wr_id = 5, .sg_list = sge, .num_sge = 1,
				      .opcode = IBV_WR_SEND };
	ret = vrdma_post_send(&qp->vqp.qp, &wr[3], &bad);
	CHECK(ret == ENOMEM && bad == &wr[4], "full SQ: ret %d", ret);
	CHECK(qp->rec->sq_pi == 4, "sq_pi %u", qp->rec->sq_pi);
	CHECK(*notify == 0, "no doorbell while the engine polls");
	w = sq_wqe(qp, 3);
	CHECK(w->opcode == VRDMA_WR_RDMA_READ && w->flags == 0 && w->num_sge == 1,
	      "INLINE is ignored for READ");

	/* The device consumes two; a bad WR stops the list after one. */
	atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, 2);
	*flags = 0;
	wr[4].next = &wr[5];
	/* Not read: the count is checked first. */
	wr[5] = (struct ibv_send_wr){ .wr_id = 6, .sg_list = sge, .num_sge = 5,
				      .opcode = IBV_WR_SEND };
	ret = vrdma_post_send(&qp->vqp.qp, &wr[4], &bad);
	CHECK(ret == EINVAL && bad == &wr[5],
	      "5 SGEs where the stride holds %u: ret %d", qp->sq.max_sge, ret);
	CHECK(qp->rec->sq_pi == 5 && *notify == NOTIFY_VALUE,
	      "the good WR before the bad one is posted and rung");
	w = sq_wqe(qp, 4);
	CHECK(w->wr_id == 5 && w->opcode == VRDMA_WR_SEND, "slot 4 wraps to 0");

	wr[0].next = NULL;
	wr[0].opcode = (enum ibv_wr_opcode)99;
	ret = vrdma_post_send(&qp->vqp.qp, wr, &bad);
	CHECK(ret == EINVAL && bad == wr && qp->rec->sq_pi == 5, "unknown opcode");
	{
		/* Never read: the length is checked first. */
		struct ibv_sge big[2] = { { .addr = 0x1000, .length = 40 },
					  { .addr = 0x2000, .length = 40 } };

		wr[0].opcode = IBV_WR_SEND;
		wr[0].send_flags = IBV_SEND_INLINE;
		wr[0].sg_list = big;
		wr[0].num_sge = 2;
		ret = vrdma_post_send(&qp->vqp.qp, wr, &bad);
		CHECK(ret == EINVAL && qp->rec->sq_pi == 5,
		      "80 inline bytes above the QP's %u", qp->max_inline_data);
	}

	/* Receives. */
	memset(rwr, 0, sizeof(rwr));
	rwr[0] = (struct ibv_recv_wr){ .wr_id = 11, .next = &rwr[1], .sg_list = sge, .num_sge = 2 };
	rwr[1] = (struct ibv_recv_wr){ .wr_id = 12, .next = &rwr[2], .sg_list = sge, .num_sge = 0 };
	rwr[2] = (struct ibv_recv_wr){ .wr_id = 13, .sg_list = sge, .num_sge = 1 };
	*notify = 0;
	ret = vrdma_post_recv(&qp->vqp.qp, rwr, &rbad);
	CHECK(ret == ENOMEM && rbad == &rwr[2], "RQ of 2: ret %d", ret);
	/* rq_notify clear: no doorbell, whatever the used-ring flags say. */
	CHECK(qp->rec->rq_pi == 2 && *notify == 0, "rq_pi %u, notify %#x",
	      qp->rec->rq_pi, *notify);
	rw = rq_wqe(qp, 0);
	s = (struct vrdma_sge *)(rw + 1);
	CHECK(rw->wr_id == 11 && rw->num_sge == 2 && s[1].addr == 0x2000 &&
	      s[1].lkey == 0xa2, "receive WQE");
	/* The device set rq_notify (the QP is in ERR): the doorbell step. */
	atomic_store((_Atomic uint32_t *)&qp->rec->rq_notify, 1);
	atomic_store((_Atomic uint32_t *)&qp->rec->rq_ci, 1);
	rwr[1].next = NULL;
	ret = vrdma_post_recv(&qp->vqp.qp, &rwr[1], &rbad);
	CHECK(ret == 0 && qp->rec->rq_pi == 3 && *notify == NOTIFY_VALUE,
	      "rq_notify set: ret %d, rq_pi %u, notify %#x", ret,
	      qp->rec->rq_pi, *notify);
	rwr[1].next = &rwr[2];
	rwr[0].num_sge = 4;
	rwr[0].next = NULL;
	atomic_store((_Atomic uint32_t *)&qp->rec->rq_ci, 2);
	ret = vrdma_post_recv(&qp->vqp.qp, rwr, &rbad);
	CHECK(ret == EINVAL && rbad == rwr, "4 SGEs on a 3-SGE RQ");

	CHECK(vrdma_destroy_qp(&qp->vqp.qp) == 0, "destroy_qp");

	/* sq_sig_all: the provider sets SIGNALED itself. */
	qp = make_qp(ibcq, 2, 1, 1, 1, 0, 1);
	if (qp) {
		wr[0] = (struct ibv_send_wr){ .wr_id = 1, .sg_list = sge, .num_sge = 1,
					      .opcode = IBV_WR_SEND };
		CHECK(fk.qp_attr.sq_sig_all == 1, "sq_sig_all reaches the kernel");
		ret = vrdma_post_send(&qp->vqp.qp, wr, &bad);
		CHECK(ret == 0 && (sq_wqe(qp, 0)->flags & VRDMA_WQE_SIGNALED),
		      "sq_sig_all sets SIGNALED");
		vrdma_destroy_qp(&qp->vqp.qp);
	}
}

static void check_doorbell_sharing(struct ibv_cq *ibcq)
{
	struct vrdma_qp *a, *b;
	int maps = 0;
	struct vrdma_db_map *m;

	a = make_qp(ibcq, 1, 1, 1, 1, 0, 0);
	b = make_qp(ibcq, 1, 1, 1, 1, 0, 0);
	if (!a || !b) {
		CHECK(0, "create_qp");
		return;
	}
	list_for_each(&ctx->db_maps, m, entry)
		maps++;
	CHECK(maps == 1 && a->db == b->db && a->db->refcnt == 2,
	      "two QPs on one doorbell queue share one mapping (%d maps)", maps);
	vrdma_destroy_qp(&a->vqp.qp);
	CHECK(b->db->refcnt == 1, "refcnt after one destroy");
	vrdma_destroy_qp(&b->vqp.qp);
	CHECK(list_empty(&ctx->db_maps), "mapping dropped with the last QP");
}

/* ---------------------------------------------------------------------- */
/* UD QPs and shared receive queues                                       */
/* ---------------------------------------------------------------------- */

static struct vrdma_qp *make_qp_on(struct ibv_cq *cq, enum ibv_qp_type type,
				   struct ibv_srq *srq, uint32_t send_wr,
				   uint32_t recv_wr, uint32_t inl)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = type,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = inl },
	};
	struct ibv_qp *qp = vrdma_create_qp(&pd, &attr);

	return qp ? to_vqp(qp) : NULL;
}

static struct vrdma_recv_wqe *srq_wqe(struct vrdma_srq *srq, uint32_t i)
{
	return (void *)(srq->wq.ring +
			((i & (srq->wq.depth - 1)) << srq->wq.shift));
}

static void check_ud(struct ibv_cq *ibcq)
{
	static const struct {
		enum ibv_wr_opcode opcode;
		unsigned int send_flags;
		bool no_ah;
		uint32_t remote_qpn;
		const char *what;
	} refused[] = {
		{ IBV_WR_RDMA_WRITE, 0, false, 2, "RDMA_WRITE" },
		{ IBV_WR_RDMA_WRITE_WITH_IMM, 0, false, 2, "RDMA_WRITE_WITH_IMM" },
		{ IBV_WR_RDMA_READ, 0, false, 2, "RDMA_READ" },
		{ IBV_WR_ATOMIC_FETCH_AND_ADD, 0, false, 2, "FETCH_AND_ADD" },
		{ IBV_WR_SEND, IBV_SEND_FENCE, false, 2, "FENCE" },
		{ IBV_WR_SEND, 0, true, 2, "no AH" },
		{ IBV_WR_SEND, 0, false, 0x1000000, "a QPN beyond 24 bits" },
	};
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
	struct ibv_sge sge = { .addr = 0x1000, .length = 64, .lkey = 0xa1 };
	uint8_t payload[20];
	struct ibv_sge isge = { .addr = (uintptr_t)payload,
				.length = sizeof(payload) };
	uint32_t saved_inline = ctx->max_inline_data;
	struct ibv_send_wr wr, *bad;
	struct vrdma_send_wqe *w;
	struct vrdma_qp *qp;
	struct ibv_ah *ah;
	size_t i;
	int ret;

	for (i = 0; i < sizeof(payload); i++)
		payload[i] = 0xc0 + i;

	/* Inline data of a UD QP is bounded by the port's MTU too. */
	ctx->max_inline_data = 1024;
	fks.port_mtu = IBV_MTU_512;
	qp = make_qp_on(ibcq, IBV_QPT_UD, NULL, 4, 4, 500);
	CHECK(qp && qp->max_inline_data == 512 &&
	      fk.qp_attr.cap.max_inline_data == 512 &&
	      fk.qp_cmd.sq_wqe_shift == 10,
	      "UD, 500 inline bytes, MTU 512: granted %u, shift %u",
	      qp ? qp->max_inline_data : 0, fk.qp_cmd.sq_wqe_shift);
	if (qp)
		vrdma_destroy_qp(&qp->vqp.qp);
	errno = 0;
	CHECK(!make_qp_on(ibcq, IBV_QPT_UD, NULL, 4, 4, 513) && errno == EINVAL,
	      "UD inline above the 512-byte MTU");
	qp = make_qp_on(ibcq, IBV_QPT_RC, NULL, 4, 4, 513);
	CHECK(qp && qp->max_inline_data == 960,
	      "RC inline is not bound by the MTU: %u",
	      qp ? qp->max_inline_data : 0);
	if (qp)
		vrdma_destroy_qp(&qp->vqp.qp);
	ctx->max_inline_data = saved_inline;
	fks.port_mtu = 0;

	qp = make_qp_on(ibcq, IBV_QPT_UD, NULL, 4, 4, 32);
	if (!qp) {
		CHECK(0, "create UD QP: %s", strerror(errno));
		return;
	}
	CHECK(fk.qp_attr.qp_type == IBV_QPT_UD && fk.qp_cmd.rq_depth == 4 &&
	      fk.qp_cmd.flags == VRDMA_QP_F_RQ_NOTIFY, "UD QP to the kernel");

	ah = vrdma_create_ah(&pd, &ah_attr);
	CHECK(ah && to_vah(ah)->ahn == FAKE_AHN,
	      "create_ah keeps the device's AH number");
	if (!ah)
		goto out;

	*flags = 0;
	*notify = 0;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 21;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	wr.imm_data = htobe32(0x01020304);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xfedcba;
	wr.wr.ud.remote_qkey = 0x11111111;
	ret = vrdma_post_send(&qp->vqp.qp, &wr, &bad);
	CHECK(ret == 0 && qp->rec->sq_pi == 1 && *notify == NOTIFY_VALUE,
	      "UD post: ret %d, sq_pi %u", ret, qp->rec->sq_pi);
	w = sq_wqe(qp, 0);
	CHECK(w->wr_id == 21 && w->opcode == VRDMA_WR_SEND_WITH_IMM &&
	      w->flags == (VRDMA_WQE_SIGNALED | VRDMA_WQE_SOLICITED) &&
	      w->num_sge == 1 && memcmp(&w->imm_data, &wr.imm_data, 4) == 0,
	      "UD SEND_WITH_IMM header");
	CHECK(w->ah == FAKE_AHN && w->remote_qpn == 0xfedcba &&
	      w->remote_qkey == 0x11111111 && w->reserved == 0,
	      "UD destination: ah %#x, qpn %#x, qkey %#x, reserved %#x",
	      w->ah, w->remote_qpn, w->remote_qkey, w->reserved);
	/* wr.wr is a union: ud.ah overlays rdma.remote_addr. */
	CHECK(w->remote_addr == 0 && w->rkey == 0 && w->compare_add == 0,
	      "UD leaves the RDMA fields zero");

	/* Bit 31 of the Q_Key asks for the QP's own: passed through. */
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &isge;
	wr.send_flags = IBV_SEND_INLINE;
	wr.wr.ud.remote_qkey = VRDMA_QKEY_USE_QP | 5;
	ret = vrdma_post_send(&qp->vqp.qp, &wr, &bad);
	w = sq_wqe(qp, 1);
	CHECK(ret == 0 && w->opcode == VRDMA_WR_SEND &&
	      w->flags == VRDMA_WQE_INLINE && w->num_sge == 0 &&
	      w->inline_len == sizeof(payload) &&
	      memcmp(w + 1, payload, sizeof(payload)) == 0 &&
	      w->ah == FAKE_AHN && w->remote_qkey == (VRDMA_QKEY_USE_QP | 5),
	      "UD inline SEND with the QP's own Q_Key: ret %d", ret);

	/* What a UD QP cannot send is refused; nothing is published. */
	wr.sg_list = &sge;
	for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		wr.opcode = refused[i].opcode;
		wr.send_flags = refused[i].send_flags;
		wr.wr.ud.ah = refused[i].no_ah ? NULL : ah;
		wr.wr.ud.remote_qpn = refused[i].remote_qpn;
		*notify = 0;
		bad = NULL;
		ret = vrdma_post_send(&qp->vqp.qp, &wr, &bad);
		CHECK(ret == EINVAL && bad == &wr && qp->rec->sq_pi == 2 &&
		      *notify == 0, "UD %s: ret %d, sq_pi %u", refused[i].what,
		      ret, qp->rec->sq_pi);
	}
	CHECK(vrdma_destroy_ah(ah) == 0, "destroy_ah");
out:
	vrdma_destroy_qp(&qp->vqp.qp);
}

static void check_srq(struct ibv_cq *ibcq)
{
	struct ibv_srq_init_attr attr = {
		.attr = { .max_wr = 100, .max_sge = 3, .srq_limit = 7 },
	};
	struct ibv_sge sge[4] = {
		{ .addr = 0x1000, .length = 10, .lkey = 0xb1 },
		{ .addr = 0x2000, .length = 20, .lkey = 0xb2 },
		{ .addr = 0x3000, .length = 30, .lkey = 0xb3 },
		{ .addr = 0x4000, .length = 40, .lkey = 0xb4 },
	};
	struct ibv_recv_wr rwr[3], *rbad;
	struct ibv_qp_init_attr qattr;
	struct vrdma_recv_wqe *rw;
	struct vrdma_srq *srq;
	struct ibv_srq *ibsrq;
	struct vrdma_sge *s;
	struct ibv_qp *ibqp;
	uint32_t i;
	int ret;

	ibsrq = vrdma_create_srq(&pd, &attr);
	CHECK(ibsrq != NULL, "create_srq: %s", strerror(errno));
	if (!ibsrq)
		return;
	srq = to_vsrq(ibsrq);
	/* 16 + 16 * 3 = 64 bytes: 128 WQEs in two pages, then the record. */
	CHECK(fks.srq_cmd.depth == 128 && fks.srq_cmd.wqe_shift == 6 &&
	      fks.srq_cmd.record_offset == 2 * VRDMA_PAGE_SIZE &&
	      fks.srq_cmd.buf_len == 3 * VRDMA_PAGE_SIZE &&
	      fks.srq_cmd.buf_addr == (uintptr_t)srq->buf &&
	      fks.srq_cmd.buf_addr % VRDMA_PAGE_SIZE == 0 &&
	      fks.srq_cmd.reserved == 0,
	      "create_srq command: depth %u shift %u record %u len %llu",
	      fks.srq_cmd.depth, fks.srq_cmd.wqe_shift,
	      fks.srq_cmd.record_offset,
	      (unsigned long long)fks.srq_cmd.buf_len);
	CHECK(fks.srq_attr.attr.max_wr == 128 && fks.srq_attr.attr.max_sge == 3,
	      "the kernel is given what the ring holds: %u WRs, %u SGEs",
	      fks.srq_attr.attr.max_wr, fks.srq_attr.attr.max_sge);
	CHECK(attr.attr.max_wr == 128 && attr.attr.max_sge == 3,
	      "granted %u WRs, %u SGEs", attr.attr.max_wr, attr.attr.max_sge);
	CHECK((uint8_t *)srq->rec == (uint8_t *)srq->buf + 2 * VRDMA_PAGE_SIZE &&
	      srq->notify_value == NOTIFY_VALUE, "record and doorbell");

	/* notify 0: the device reads pi when a message arrives. */
	memset(rwr, 0, sizeof(rwr));
	rwr[0] = (struct ibv_recv_wr){ .wr_id = 31, .next = &rwr[1],
				       .sg_list = sge, .num_sge = 3 };
	rwr[1] = (struct ibv_recv_wr){ .wr_id = 32, .sg_list = sge };
	*flags = 0;
	*notify = 0;
	ret = vrdma_post_srq_recv(ibsrq, rwr, &rbad);
	CHECK(ret == 0 && srq->rec->pi == 2 && *notify == 0,
	      "notify 0: no doorbell (ret %d, pi %u, notify %#x)", ret,
	      srq->rec->pi, *notify);
	rw = srq_wqe(srq, 0);
	s = (struct vrdma_sge *)(rw + 1);
	CHECK(rw->wr_id == 31 && rw->num_sge == 3 && s[0].addr == 0x1000 &&
	      s[0].length == 10 && s[0].lkey == 0xb1 && s[2].addr == 0x3000 &&
	      s[2].lkey == 0xb3, "SRQ receive WQE");
	rw = srq_wqe(srq, 1);
	CHECK(rw->wr_id == 32 && rw->num_sge == 0, "SRQ WQE without SGEs");

	/* notify 1 (a message waits) and the engine asleep: notify. */
	atomic_store((_Atomic uint32_t *)&srq->rec->notify, 1);
	rwr[1].next = NULL;
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == 0 && srq->rec->pi == 3 && *notify == NOTIFY_VALUE,
	      "notify 1: the doorbell step notifies (notify %#x)", *notify);
	/* notify 1, the engine polling: no notification. */
	*flags = VRDMA_DOORBELL_NO_NOTIFY;
	*notify = 0;
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == 0 && srq->rec->pi == 4 && *notify == 0,
	      "notify 1, NO_NOTIFY: no doorbell");
	/* Only 1 asks for the doorbell step. */
	*flags = 0;
	atomic_store((_Atomic uint32_t *)&srq->rec->notify, 2);
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == 0 && srq->rec->pi == 5 && *notify == 0,
	      "notify 2 (not 1): no doorbell");
	atomic_store((_Atomic uint32_t *)&srq->rec->notify, 0);

	/* A bad WR stops the list; the good one before it is published. */
	rwr[0].num_sge = 1;
	rwr[0].next = &rwr[2];
	rwr[2] = (struct ibv_recv_wr){ .wr_id = 33, .sg_list = sge,
				       .num_sge = 4 };
	ret = vrdma_post_srq_recv(ibsrq, rwr, &rbad);
	CHECK(ret == EINVAL && rbad == &rwr[2] && srq->rec->pi == 6,
	      "4 SGEs on a 3-SGE SRQ: ret %d, pi %u", ret, srq->rec->pi);

	/* Full at 128 outstanding: ci is 0, pi 6, 122 more fit. */
	rwr[1].next = NULL;
	for (i = 0; i < 122; i++)
		if (vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad))
			break;
	CHECK(i == 122 && srq->rec->pi == 128, "122 more: %u, pi %u", i,
	      srq->rec->pi);
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == ENOMEM && rbad == &rwr[1] && srq->rec->pi == 128,
	      "full SRQ: ret %d", ret);
	/* A consumer index past pi (a broken device) reads as full. */
	atomic_store((_Atomic uint32_t *)&srq->rec->ci, 133);
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == ENOMEM && srq->rec->pi == 128,
	      "ci beyond pi: ret %d, pi %u", ret, srq->rec->pi);
	atomic_store((_Atomic uint32_t *)&srq->rec->ci, 128);
	rwr[1].wr_id = 99;
	ret = vrdma_post_srq_recv(ibsrq, &rwr[1], &rbad);
	CHECK(ret == 0 && srq->rec->pi == 129 && srq_wqe(srq, 0)->wr_id == 99,
	      "the ring wraps to slot 0");

	/*
	 * A QP on the SRQ has no receive queue: its receive capabilities
	 * are ignored (5000 is above max_qp_wr) and granted as zero.
	 */
	qattr = (struct ibv_qp_init_attr){
		.send_cq = ibcq, .recv_cq = ibcq, .srq = ibsrq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 5000,
			 .max_send_sge = 1, .max_recv_sge = 5 },
	};
	ibqp = vrdma_create_qp(&pd, &qattr);
	CHECK(ibqp != NULL, "create_qp on an SRQ: %s", strerror(errno));
	if (ibqp) {
		struct vrdma_qp *qp = to_vqp(ibqp);

		CHECK(fk.qp_cmd.rq_depth == 0 && fk.qp_cmd.rq_wqe_shift == 0 &&
		      fk.qp_cmd.record_offset == VRDMA_PAGE_SIZE &&
		      fk.qp_cmd.buf_len == 2 * VRDMA_PAGE_SIZE &&
		      fk.qp_cmd.flags == VRDMA_QP_F_RQ_NOTIFY,
		      "SRQ QP command: rq %u/%u, record %u, len %llu, flags %#x",
		      fk.qp_cmd.rq_depth, fk.qp_cmd.rq_wqe_shift,
		      fk.qp_cmd.record_offset,
		      (unsigned long long)fk.qp_cmd.buf_len, fk.qp_cmd.flags);
		CHECK(fk.qp_attr.srq == ibsrq && fk.qp_attr.cap.max_recv_wr == 0 &&
		      fk.qp_attr.cap.max_recv_sge == 0 &&
		      qattr.cap.max_recv_wr == 0 && qattr.cap.max_recv_sge == 0,
		      "receive caps of an SRQ QP are zero");
		rwr[1].next = NULL;
		rbad = NULL;
		ret = vrdma_post_recv(ibqp, &rwr[1], &rbad);
		CHECK(ret == EINVAL && rbad == &rwr[1],
		      "post_recv on a QP with an SRQ: ret %d", ret);
		CHECK(qp->db == srq->db && srq->db->refcnt == 2,
		      "the SRQ and a QP on one doorbell queue share the mapping");
		vrdma_destroy_qp(ibqp);
	}

	ret = fks.srq_destroyed;
	CHECK(vrdma_destroy_srq(ibsrq) == 0 && fks.srq_destroyed == ret + 1,
	      "destroy_srq");
	CHECK(list_empty(&ctx->db_maps), "mapping dropped with the SRQ");

	/* Limits. */
	attr.attr.max_wr = 0;
	attr.attr.max_sge = 1;
	errno = 0;
	CHECK(!vrdma_create_srq(&pd, &attr) && errno == EINVAL, "max_wr 0");
	attr.attr.max_wr = 4097;
	errno = 0;
	CHECK(!vrdma_create_srq(&pd, &attr) && errno == EINVAL,
	      "max_wr above max_qp_wr");
	attr.attr.max_wr = 1;
	attr.attr.max_sge = 17;
	errno = 0;
	CHECK(!vrdma_create_srq(&pd, &attr) && errno == EINVAL,
	      "max_sge above the device's");
	attr.attr.max_sge = 0;
	ibsrq = vrdma_create_srq(&pd, &attr);
	CHECK(ibsrq && fks.srq_cmd.depth == 1 && fks.srq_cmd.wqe_shift == 5 &&
	      attr.attr.max_sge == 1 && attr.attr.max_wr == 1,
	      "minimal SRQ: depth %u, shift %u, sge %u", fks.srq_cmd.depth,
	      fks.srq_cmd.wqe_shift, attr.attr.max_sge);
	if (ibsrq)
		vrdma_destroy_srq(ibsrq);
}

/*
 * check_mw: memory windows and invalidation (docs/spec.md § Memory windows
 * and fast registration). ibv_bind_mw writes a BIND_MW WQE naming the
 * window by its current rkey with the next key byte, which becomes the
 * window's; IBV_WR_BIND_MW takes the caller's rkey but may not change the
 * index; LOCAL_INV and SEND_WITH_INV carry the key as a number; a receive
 * with WITH_INV reports the invalidated key.
 */
static void check_mw(struct ibv_cq *ibcq)
{
	struct ibv_mr mr = { .pd = &pd, .lkey = 0xabc, .rkey = 0xabc };
	struct ibv_sge sge = { .addr = 0x1000, .length = 8, .lkey = 0xabc };
	struct ibv_send_wr wr[2], *bad;
	struct ibv_mw_bind bind = {
		.wr_id = 5, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = &mr, .addr = 0x4000, .length = 0x100,
			       .mw_access_flags = IBV_ACCESS_REMOTE_READ },
	};
	struct vrdma_bind_mw_wqe *b;
	struct vrdma_send_wqe *w;
	struct ibv_mw *mw1, *mw2;
	struct ibv_wc wc;
	struct vrdma_qp *qp;
	uint32_t pi;
	int ret;

	qp = make_qp(ibcq, 8, 2, 1, 1, 0, 0);
	mw1 = vrdma_alloc_mw(&pd, IBV_MW_TYPE_1);
	mw2 = vrdma_alloc_mw(&pd, IBV_MW_TYPE_2);
	if (!qp || !mw1 || !mw2) {
		CHECK(0, "create_qp/alloc_mw: %s", strerror(errno));
		return;
	}

	ret = vrdma_bind_mw(&qp->vqp.qp, mw1, &bind);
	CHECK(ret == 0, "bind_mw: %d", ret);
	b = (struct vrdma_bind_mw_wqe *)sq_wqe(qp, 0);
	CHECK(b->wr_id == 5 && b->opcode == VRDMA_WR_BIND_MW &&
	      b->flags == VRDMA_WQE_SIGNALED && b->mw == 0x12345601 &&
	      b->new_rkey == 0x12345602 && b->addr == 0x4000 &&
	      b->length == 0x100 && b->lkey == 0xabc &&
	      b->access == IBV_ACCESS_REMOTE_READ && b->reserved == 0,
	      "BIND_MW WQE: mw %#x new %#x", b->mw, b->new_rkey);
	CHECK(mw1->rkey == 0x12345602, "type 1 rkey after bind %#x", mw1->rkey);
	CHECK(vrdma_bind_mw(&qp->vqp.qp, mw2, &bind) == EINVAL,
	      "ibv_bind_mw of a type 2 window");
	bind.bind_info.length = 0;
	bind.bind_info.mr = NULL;
	CHECK(vrdma_bind_mw(&qp->vqp.qp, mw1, &bind) == 0 &&
	      ((struct vrdma_bind_mw_wqe *)sq_wqe(qp, 1))->lkey == 0 &&
	      ((struct vrdma_bind_mw_wqe *)sq_wqe(qp, 1))->length == 0,
	      "a type 1 unbind (length 0)");

	memset(wr, 0, sizeof(wr));
	wr[0].opcode = IBV_WR_BIND_MW;
	wr[0].bind_mw.mw = mw2;
	wr[0].bind_mw.rkey = 0x99345602;	/* another index */
	wr[0].bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = &mr,
		.addr = 0x4000, .length = 8,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	pi = qp->rec->sq_pi;
	CHECK(vrdma_post_send(&qp->vqp.qp, wr, &bad) == EINVAL && bad == wr &&
	      qp->rec->sq_pi == pi, "a type 2 bind may not change the index");
	wr[0].bind_mw.rkey = 0x123456aa;
	wr[0].next = &wr[1];
	wr[1].opcode = IBV_WR_LOCAL_INV;
	wr[1].invalidate_rkey = 0x123456aa;
	CHECK(vrdma_post_send(&qp->vqp.qp, wr, &bad) == 0 &&
	      qp->rec->sq_pi == pi + 2, "type 2 bind and LOCAL_INV");
	b = (struct vrdma_bind_mw_wqe *)sq_wqe(qp, pi);
	CHECK(b->opcode == VRDMA_WR_BIND_MW && b->mw == 0x12345602 &&
	      b->new_rkey == 0x123456aa && b->access == IBV_ACCESS_REMOTE_WRITE,
	      "type 2 BIND_MW WQE");
	CHECK(mw2->rkey == 0x123456aa, "type 2 rkey after bind %#x", mw2->rkey);
	w = sq_wqe(qp, pi + 1);
	CHECK(w->opcode == VRDMA_WR_LOCAL_INV && w->imm_data == 0x123456aa &&
	      w->num_sge == 0, "LOCAL_INV WQE");

	memset(wr, 0, sizeof(wr));
	wr[0] = (struct ibv_send_wr){ .opcode = IBV_WR_SEND_WITH_INV,
		.sg_list = &sge, .num_sge = 1, .invalidate_rkey = 0x5566 };
	CHECK(vrdma_post_send(&qp->vqp.qp, wr, &bad) == 0, "SEND_WITH_INV");
	w = sq_wqe(qp, pi + 2);
	CHECK(w->opcode == VRDMA_WR_SEND_WITH_INV && w->imm_data == 0x5566 &&
	      w->num_sge == 1, "SEND_WITH_INV WQE");

	device_complete(to_vcq(ibcq), 44, 0, VRDMA_WC_RECV,
			VRDMA_WC_F_WITH_INV, 0x5566);
	CHECK(vrdma_poll_cq(ibcq, 1, &wc) == 1 &&
	      wc.wc_flags == IBV_WC_WITH_INV && wc.invalidated_rkey == 0x5566,
	      "WITH_INV completion: flags %#x key %#x", wc.wc_flags,
	      wc.invalidated_rkey);
	device_complete(to_vcq(ibcq), 45, 0, VRDMA_WC_BIND_MW, 0, 0);
	CHECK(vrdma_poll_cq(ibcq, 1, &wc) == 1 && wc.opcode == IBV_WC_BIND_MW,
	      "BIND_MW completion");
	CHECK(vrdma_dealloc_mw(mw1) == 0 && vrdma_dealloc_mw(mw2) == 0,
	      "dealloc_mw");
	vrdma_destroy_qp(&qp->vqp.qp);
}

static void check_poll_grh(void)
{
	struct ibv_wc wc[4];
	struct ibv_cq *ibcq;
	int n;

	ibcq = vrdma_create_cq(&ctx->ibv_ctx.context, 8, NULL, 0);
	if (!ibcq) {
		CHECK(0, "create_cq: %s", strerror(errno));
		return;
	}
	device_complete(to_vcq(ibcq), 41, 0, VRDMA_WC_RECV,
			VRDMA_WC_F_GRH | VRDMA_WC_F_WITH_IMM, 0x55667788);
	device_complete(to_vcq(ibcq), 42, 0, VRDMA_WC_RECV, VRDMA_WC_F_GRH, 0);
	device_complete(to_vcq(ibcq), 43, 0, VRDMA_WC_RECV, 0, 0);
	n = vrdma_poll_cq(ibcq, 4, wc);
	CHECK(n == 3, "poll = %d", n);
	CHECK(wc[0].wc_flags == (IBV_WC_GRH | IBV_WC_WITH_IMM) &&
	      wc[0].imm_data == 0x55667788 && wc[0].src_qp == 9 &&
	      wc[0].opcode == IBV_WC_RECV, "GRH with immediate: flags %#x",
	      wc[0].wc_flags);
	CHECK(wc[1].wc_flags == IBV_WC_GRH && wc[1].imm_data == 0 &&
	      wc[1].src_qp == 9, "GRH: flags %#x", wc[1].wc_flags);
	CHECK(wc[2].wc_flags == 0, "no GRH: flags %#x", wc[2].wc_flags);
	vrdma_destroy_cq(ibcq);
}

/*
 * check_srq_ud_no_syscalls: post_srq_recv (both ways of the notify word)
 * and UD post_send under SECCOMP_MODE_STRICT, as check_no_syscalls.
 */
static void check_srq_ud_no_syscalls(struct ibv_cq *ibcq)
{
	struct ibv_srq_init_attr sattr = { .attr = { .max_wr = 64, .max_sge = 1 } };
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1 };
	struct ibv_sge sge = { .addr = 0x1000, .length = 8, .lkey = 1 };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND };
	struct ibv_srq *ibsrq;
	struct vrdma_srq *srq;
	struct vrdma_qp *qp;
	struct ibv_ah *ah;
	int status = 0;
	pid_t pid;

	ibsrq = vrdma_create_srq(&pd, &sattr);
	qp = make_qp_on(ibcq, IBV_QPT_UD, NULL, 64, 1, 0);
	ah = vrdma_create_ah(&pd, &ah_attr);
	if (!ibsrq || !qp || !ah) {
		CHECK(0, "create SRQ, UD QP, AH");
		return;
	}
	srq = to_vsrq(ibsrq);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0x123;
	wr.wr.ud.remote_qkey = 0x11111111;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct ibv_recv_wr *rbad;
		struct ibv_send_wr *bad;
		int i;

		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT))
			_exit(3);
		for (i = 0; i < 1000; i++) {
			*flags = (i & 2) ? VRDMA_DOORBELL_NO_NOTIFY : 0;
			atomic_store((_Atomic uint32_t *)&srq->rec->notify,
				     i & 1);
			if (vrdma_post_srq_recv(ibsrq, &rwr, &rbad) ||
			    vrdma_post_send(&qp->vqp.qp, &wr, &bad))
				syscall(SYS_exit, 4);
			atomic_store((_Atomic uint32_t *)&srq->rec->ci, i + 1);
			atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, i + 1);
		}
		syscall(SYS_exit, 0);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "post_srq_recv and UD post_send under SECCOMP_MODE_STRICT: %s %d",
	      WIFSIGNALED(status) ? "killed by signal (a system call)" : "exit",
	      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	vrdma_destroy_ah(ah);
	vrdma_destroy_qp(&qp->vqp.qp);
	vrdma_destroy_srq(ibsrq);
}

/* ---------------------------------------------------------------------- */
/* The extended API: ibv_qp_ex (ibv_wr_*) and ibv_cq_ex                   */
/* ---------------------------------------------------------------------- */

#define ALL_SEND_OPS                                                           \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

static struct ibv_qp *make_qp_ex(struct ibv_cq *cq, enum ibv_qp_type type,
				 uint32_t comp_mask, uint64_t ops,
				 uint32_t send_wr, uint32_t send_sge,
				 uint32_t inl, int sig_all)
{
	struct ibv_qp_init_attr_ex attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = type,
		.sq_sig_all = sig_all, .comp_mask = comp_mask, .pd = &pd,
		.send_ops_flags = ops,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = 1,
			 .max_send_sge = send_sge, .max_recv_sge = 1,
			 .max_inline_data = inl },
	};

	return vrdma_create_qp_ex(&ctx->ibv_ctx.context, &attr);
}

static struct ibv_qp_ex *make_wr_qp(struct ibv_cq *cq, uint32_t send_wr,
				    uint32_t send_sge, uint32_t inl)
{
	struct ibv_qp *qp = make_qp_ex(cq, IBV_QPT_RC,
				       IBV_QP_INIT_ATTR_PD |
					       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
				       ALL_SEND_OPS, send_wr, send_sge, inl, 0);

	return qp ? ibv_qp_to_qp_ex(qp) : NULL;
}

static void check_qp_ex_create(struct ibv_cq *cq)
{
	static const struct {
		const char *name;
		enum ibv_qp_type type;
		uint32_t comp_mask;
		uint64_t ops;
		uint32_t create_flags;
		int err;	/* 0: created */
	} cases[] = {
		{ "RC, every op the device has", IBV_QPT_RC, 0, ALL_SEND_OPS, 0, 0 },
		{ "RC, SEND only", IBV_QPT_RC, 0, IBV_QP_EX_WITH_SEND, 0, 0 },
		{ "RC, no op", IBV_QPT_RC, 0, 0, 0, 0 },
		{ "LOCAL_INV", IBV_QPT_RC, 0, IBV_QP_EX_WITH_LOCAL_INV, 0, 0 },
		{ "BIND_MW", IBV_QPT_RC, 0, IBV_QP_EX_WITH_BIND_MW, 0, 0 },
		{ "SEND_WITH_INV", IBV_QPT_RC, 0, IBV_QP_EX_WITH_SEND_WITH_INV, 0, 0 },
		{ "UD with LOCAL_INV", IBV_QPT_UD, 0, IBV_QP_EX_WITH_LOCAL_INV, 0, EOPNOTSUPP },
		{ "TSO", IBV_QPT_RC, 0, IBV_QP_EX_WITH_TSO, 0, EOPNOTSUPP },
		{ "FLUSH", IBV_QPT_RC, 0, IBV_QP_EX_WITH_FLUSH, 0, EOPNOTSUPP },
		{ "ATOMIC_WRITE", IBV_QPT_RC, 0, IBV_QP_EX_WITH_ATOMIC_WRITE, 0, EOPNOTSUPP },
		{ "UD with RDMA_WRITE", IBV_QPT_UD, 0, IBV_QP_EX_WITH_RDMA_WRITE, 0, EOPNOTSUPP },
		{ "UC", IBV_QPT_UC, 0, IBV_QP_EX_WITH_SEND, 0, EOPNOTSUPP },
		{ "create flags", IBV_QPT_RC, IBV_QP_INIT_ATTR_CREATE_FLAGS,
		  IBV_QP_EX_WITH_SEND, IBV_QP_CREATE_SCATTER_FCS, EOPNOTSUPP },
		{ "create flags 0", IBV_QPT_RC, IBV_QP_INIT_ATTR_CREATE_FLAGS,
		  IBV_QP_EX_WITH_SEND, 0, 0 },
		{ "TSO header", IBV_QPT_RC, IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
		  IBV_QP_EX_WITH_SEND, 0, EOPNOTSUPP },
	};
	struct ibv_qp_init_attr_ex attr;
	struct ibv_qp_ex *qpx;
	struct ibv_qp *qp;
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		attr = (struct ibv_qp_init_attr_ex){
			.send_cq = cq, .recv_cq = cq, .qp_type = cases[i].type,
			.comp_mask = IBV_QP_INIT_ATTR_PD |
				     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
				     cases[i].comp_mask,
			.pd = &pd, .send_ops_flags = cases[i].ops,
			.create_flags = cases[i].create_flags,
			.cap = { .max_send_wr = 4, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		errno = 0;
		qp = vrdma_create_qp_ex(&ctx->ibv_ctx.context, &attr);
		if (cases[i].err) {
			CHECK(!qp && errno == cases[i].err,
			      "%s: got %p errno %d, want errno %d",
			      cases[i].name, (void *)qp, errno, cases[i].err);
			if (qp)
				vrdma_destroy_qp(qp);
			continue;
		}
		CHECK(qp != NULL, "%s: %s", cases[i].name, strerror(errno));
		if (!qp)
			continue;
		qpx = ibv_qp_to_qp_ex(qp);
		CHECK(qpx == (struct ibv_qp_ex *)qp,
		      "%s: ibv_qp_to_qp_ex (44.0 layout) = %p", cases[i].name,
		      (void *)qpx);
		CHECK(attr.cap.max_send_wr == 4 &&
		      attr.cap.max_send_sge == to_vqp(qp)->sq.max_sge,
		      "%s: granted caps %u/%u", cases[i].name,
		      attr.cap.max_send_wr, attr.cap.max_send_sge);
		if (qpx) {
			CHECK(!!qpx->wr_send == !!(cases[i].ops & IBV_QP_EX_WITH_SEND) &&
			      !!qpx->wr_rdma_read == !!(cases[i].ops & IBV_QP_EX_WITH_RDMA_READ) &&
			      !!qpx->wr_atomic_fetch_add ==
				      !!(cases[i].ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) &&
			      !!qpx->wr_send_inv == !!(cases[i].ops & IBV_QP_EX_WITH_SEND_WITH_INV) &&
			      !!qpx->wr_local_inv == !!(cases[i].ops & IBV_QP_EX_WITH_LOCAL_INV) &&
			      !!qpx->wr_bind_mw == !!(cases[i].ops & IBV_QP_EX_WITH_BIND_MW),
			      "%s: the builders asked for, and only those", cases[i].name);
			CHECK(!qpx->wr_send_tso &&
			      !qpx->wr_set_xrc_srqn && !qpx->wr_atomic_write &&
			      qpx->wr_start && qpx->wr_complete && qpx->wr_abort &&
			      qpx->wr_set_sge && qpx->wr_set_sge_list &&
			      qpx->wr_set_inline_data &&
			      qpx->wr_set_inline_data_list && qpx->wr_set_ud_addr,
			      "%s: ops the device lacks stay NULL", cases[i].name);
		}
		vrdma_destroy_qp(qp);
	}

	/* Under 56.1's library the bit is found where 56.1 puts it, and the
	 * 44.0 word (56.1's wr_flush) is left alone. */
	fk.lib_v56 = 1;
	qpx = make_wr_qp(cq, 4, 1, 0);
	CHECK(qpx && !qpx->wr_flush, "56.1 library: qp_ex %p, wr_flush untouched",
	      (void *)qpx);
	if (qpx)
		vrdma_destroy_qp(&qpx->qp_base);
	fk.lib_v56 = 0;

	/* Without SEND_OPS_FLAGS: an ordinary QP, no qp_ex. */
	qp = make_qp_ex(cq, IBV_QPT_RC, IBV_QP_INIT_ATTR_PD |
			IBV_QP_INIT_ATTR_CREATE_FLAGS, 0, 2, 1, 0, 0);
	CHECK(qp && !ibv_qp_to_qp_ex(qp), "no SEND_OPS_FLAGS: no qp_ex");
	if (qp)
		vrdma_destroy_qp(qp);
	errno = 0;
	qp = make_qp_ex(cq, IBV_QPT_RC, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			IBV_QP_EX_WITH_SEND, 2, 1, 0, 0);
	CHECK(!qp && errno == EINVAL, "no PD: errno %d", errno);
	errno = 0;
	qp = make_qp_ex(cq, IBV_QPT_RC, IBV_QP_INIT_ATTR_PD |
			IBV_QP_INIT_ATTR_XRCD, 0, 2, 1, 0, 0);
	CHECK(!qp && errno == EOPNOTSUPP, "XRCD: errno %d", errno);
}

/*
 * check_wr_ops builds one WQE of each kind with the ibv_wr_* API, and the
 * same work requests with ibv_post_send on a twin QP: the slots must be
 * byte for byte the same (one encoder), published by one wr_complete.
 */
static void check_wr_ops(struct ibv_cq *cq)
{
	uint8_t payload[64], pay2[16];
	struct ibv_sge sgl[3] = {
		{ .addr = 0x1000, .length = 10, .lkey = 0xa1 },
		{ .addr = 0x2000, .length = 20, .lkey = 0xa2 },
		{ .addr = 0x3000, .length = 30, .lkey = 0xa3 },
	};
	struct ibv_sge isge[2], one = { .addr = 0x4000, .length = 8, .lkey = 0xb4 };
	struct ibv_data_buf bufs[2];
	struct ibv_send_wr wr[8], *bad;
	struct ibv_qp_ex *qpx;
	struct vrdma_qp *qp, *twin;
	int ret, i;

	for (i = 0; i < (int)sizeof(payload); i++)
		payload[i] = 0xc0 + i;
	for (i = 0; i < (int)sizeof(pay2); i++)
		pay2[i] = 0x10 + i;

	/* 3 SGEs: 64 + 48 = 112; inline 64: a 128-byte stride (4 SGEs). */
	qpx = make_wr_qp(cq, 8, 3, 64);
	twin = make_qp(cq, 8, 1, 3, 1, 64, 0);
	if (!qpx || !twin) {
		CHECK(0, "create: %s", strerror(errno));
		return;
	}
	qp = to_vqp(&qpx->qp_base);
	CHECK(qp->max_inline_data == 64 && qp->sq.max_sge == 4,
	      "layout: inline %u, sge %u", qp->max_inline_data, qp->sq.max_sge);

	*flags = 0;
	*notify = 0;
	ibv_wr_start(qpx);
	qpx->wr_id = 101;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, 0xa1, 0x1000, 10);

	qpx->wr_id = 102;
	qpx->wr_flags = IBV_SEND_SOLICITED;
	ibv_wr_send_imm(qpx, htobe32(0x01020304));
	ibv_wr_set_sge_list(qpx, 3, sgl);

	qpx->wr_id = 103;
	qpx->wr_flags = IBV_SEND_INLINE;	/* ignored: the setter decides */
	ibv_wr_rdma_write(qpx, 0x77, 0x123456789aULL);
	ibv_wr_set_inline_data(qpx, payload, 64);

	qpx->wr_id = 104;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
	ibv_wr_rdma_write_imm(qpx, 0x78, 0x5000, htobe32(0xdeadbeef));
	bufs[0] = (struct ibv_data_buf){ .addr = pay2, .length = 5 };
	bufs[1] = (struct ibv_data_buf){ .addr = payload, .length = 7 };
	ibv_wr_set_inline_data_list(qpx, 2, bufs);

	qpx->wr_id = 105;
	qpx->wr_flags = 0;
	ibv_wr_rdma_read(qpx, 0x79, 0x6000);
	ibv_wr_set_sge_list(qpx, 2, sgl);

	qpx->wr_id = 106;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(qpx, 0x7a, 0x8000, 5, 6);
	ibv_wr_set_sge(qpx, one.lkey, one.addr, one.length);

	qpx->wr_id = 107;
	qpx->wr_flags = IBV_SEND_FENCE;
	ibv_wr_atomic_fetch_add(qpx, 0x7b, 0x8008, 9);
	ibv_wr_set_sge(qpx, one.lkey, one.addr, one.length);

	/* Built, not published: the device sees nothing yet. */
	CHECK(qp->rec->sq_pi == 0 && *notify == 0,
	      "before wr_complete: sq_pi %u, notify %#x", qp->rec->sq_pi, *notify);
	ret = ibv_wr_complete(qpx);
	CHECK(ret == 0, "wr_complete: %d", ret);
	CHECK(qp->rec->sq_pi == 7 && qp->sq.pi == 7 && *notify == NOTIFY_VALUE,
	      "one publish of 7: sq_pi %u, notify %#x", qp->rec->sq_pi, *notify);

	/* The same seven through ibv_post_send. */
	memset(wr, 0, sizeof(wr));
	for (i = 0; i < 7; i++) {
		wr[i].wr_id = 101 + i;
		wr[i].next = i < 6 ? &wr[i + 1] : NULL;
	}
	wr[0].opcode = IBV_WR_SEND;
	wr[0].send_flags = IBV_SEND_SIGNALED;
	wr[0].sg_list = sgl;
	wr[0].num_sge = 1;
	wr[1].opcode = IBV_WR_SEND_WITH_IMM;
	wr[1].send_flags = IBV_SEND_SOLICITED;
	wr[1].imm_data = htobe32(0x01020304);
	wr[1].sg_list = sgl;
	wr[1].num_sge = 3;
	isge[0] = (struct ibv_sge){ .addr = (uintptr_t)payload, .length = 64 };
	wr[2].opcode = IBV_WR_RDMA_WRITE;
	wr[2].send_flags = IBV_SEND_INLINE;
	wr[2].sg_list = isge;
	wr[2].num_sge = 1;
	wr[2].wr.rdma.rkey = 0x77;
	wr[2].wr.rdma.remote_addr = 0x123456789aULL;
	{
		static struct ibv_sge isge2[2];

		isge2[0] = (struct ibv_sge){ .addr = (uintptr_t)pay2, .length = 5 };
		isge2[1] = (struct ibv_sge){ .addr = (uintptr_t)payload, .length = 7 };
		wr[3].sg_list = isge2;
	}
	wr[3].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr[3].send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE | IBV_SEND_INLINE;
	wr[3].imm_data = htobe32(0xdeadbeef);
	wr[3].num_sge = 2;
	wr[3].wr.rdma.rkey = 0x78;
	wr[3].wr.rdma.remote_addr = 0x5000;
	wr[4].opcode = IBV_WR_RDMA_READ;
	wr[4].sg_list = sgl;
	wr[4].num_sge = 2;
	wr[4].wr.rdma.rkey = 0x79;
	wr[4].wr.rdma.remote_addr = 0x6000;
	wr[5].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr[5].send_flags = IBV_SEND_SIGNALED;
	wr[5].sg_list = &one;
	wr[5].num_sge = 1;
	wr[5].wr.atomic.rkey = 0x7a;
	wr[5].wr.atomic.remote_addr = 0x8000;
	wr[5].wr.atomic.compare_add = 5;
	wr[5].wr.atomic.swap = 6;
	wr[6].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr[6].send_flags = IBV_SEND_FENCE;
	wr[6].sg_list = &one;
	wr[6].num_sge = 1;
	wr[6].wr.atomic.rkey = 0x7b;
	wr[6].wr.atomic.remote_addr = 0x8008;
	wr[6].wr.atomic.compare_add = 9;
	ret = vrdma_post_send(&twin->vqp.qp, wr, &bad);
	CHECK(ret == 0 && twin->rec->sq_pi == 7, "twin post_send: %d", ret);
	CHECK(twin->sq.shift == qp->sq.shift, "twin stride %u vs %u",
	      twin->sq.shift, qp->sq.shift);
	for (i = 0; i < 7; i++)
		CHECK(memcmp(sq_wqe(qp, i), sq_wqe(twin, i),
			     1u << qp->sq.shift) == 0,
		      "WQE %d: ibv_wr_* and ibv_post_send differ", i);

	/* And the bytes themselves, against the spec. */
	{
		struct vrdma_send_wqe *w;
		struct vrdma_sge *s;

		w = sq_wqe(qp, 0);
		s = (struct vrdma_sge *)(w + 1);
		CHECK(w->wr_id == 101 && w->opcode == VRDMA_WR_SEND &&
		      w->flags == VRDMA_WQE_SIGNALED && w->num_sge == 1 &&
		      s[0].addr == 0x1000 && s[0].length == 10 &&
		      s[0].lkey == 0xa1 && w->ah == 0 && w->remote_qpn == 0 &&
		      w->remote_qkey == 0 && w->reserved == 0, "wr_send");
		w = sq_wqe(qp, 1);
		s = (struct vrdma_sge *)(w + 1);
		CHECK(w->opcode == VRDMA_WR_SEND_WITH_IMM &&
		      w->flags == VRDMA_WQE_SOLICITED && w->num_sge == 3 &&
		      s[2].addr == 0x3000 && s[2].lkey == 0xa3 &&
		      w->imm_data == htobe32(0x01020304), "wr_send_imm");
		w = sq_wqe(qp, 2);
		CHECK(w->opcode == VRDMA_WR_RDMA_WRITE &&
		      w->flags == VRDMA_WQE_INLINE && w->num_sge == 0 &&
		      w->inline_len == 64 && w->rkey == 0x77 &&
		      w->remote_addr == 0x123456789aULL &&
		      memcmp(w + 1, payload, 64) == 0,
		      "wr_rdma_write + inline data, 64 bytes (the QP's max)");
		w = sq_wqe(qp, 3);
		CHECK(w->opcode == VRDMA_WR_RDMA_WRITE_WITH_IMM &&
		      w->flags == (VRDMA_WQE_SIGNALED | VRDMA_WQE_FENCE |
				   VRDMA_WQE_INLINE) &&
		      w->inline_len == 12 && w->imm_data == htobe32(0xdeadbeef) &&
		      memcmp(w + 1, pay2, 5) == 0 &&
		      memcmp((uint8_t *)(w + 1) + 5, payload, 7) == 0,
		      "wr_rdma_write_imm + inline list");
		w = sq_wqe(qp, 4);
		CHECK(w->opcode == VRDMA_WR_RDMA_READ && w->flags == 0 &&
		      w->num_sge == 2 && w->rkey == 0x79 && w->remote_addr == 0x6000,
		      "wr_rdma_read");
		w = sq_wqe(qp, 5);
		CHECK(w->opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP &&
		      w->compare_add == 5 && w->swap == 6 && w->rkey == 0x7a &&
		      w->num_sge == 1, "wr_atomic_cmp_swp");
		w = sq_wqe(qp, 6);
		CHECK(w->opcode == VRDMA_WR_ATOMIC_FETCH_AND_ADD &&
		      w->flags == VRDMA_WQE_FENCE && w->compare_add == 9 &&
		      w->swap == 0 && w->remote_addr == 0x8008, "wr_atomic_fetch_add");
	}

	/* A later setter replaces the data an earlier one gave. */
	atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, 7);
	ibv_wr_start(qpx);
	qpx->wr_id = 108;
	qpx->wr_flags = 0;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, payload, 3);
	ibv_wr_set_sge(qpx, 0xa2, 0x2000, 20);
	ret = ibv_wr_complete(qpx);
	CHECK(ret == 0 && sq_wqe(qp, 7)->num_sge == 1 &&
	      sq_wqe(qp, 7)->flags == 0 && sq_wqe(qp, 7)->inline_len == 0,
	      "set_sge after set_inline_data: SGE data only");

	vrdma_destroy_qp(&qpx->qp_base);
	vrdma_destroy_qp(&twin->vqp.qp);
}

/* check_wr_errors: abort, a full ring, and each setter's error. */
static void check_wr_errors(struct ibv_cq *cq)
{
	struct ibv_sge sgl[5] = {
		{ .addr = 0x1000, .length = 1, .lkey = 1 },
		{ .addr = 0x2000, .length = 1, .lkey = 2 },
		{ .addr = 0x3000, .length = 1, .lkey = 3 },
		{ .addr = 0x4000, .length = 1, .lkey = 4 },
		{ .addr = 0x5000, .length = 1, .lkey = 5 },
	};
	/* Never read: the lengths are checked before any byte is copied. */
	struct ibv_data_buf far[2] = { { .addr = (void *)0x1000, .length = 40 },
				       { .addr = (void *)0x2000, .length = 40 } };
	uint8_t big[65] = { 0 };
	struct ibv_ah ah = { 0 };
	struct ibv_qp_ex *qpx;
	struct vrdma_qp *qp;
	int ret, i;
	static const struct {
		const char *name;
		int step;
	} bad[] = {
		{ "5 SGEs where the QP holds 4", 0 },
		{ "65 inline bytes where the QP holds 64", 1 },
		{ "an inline list of 80 bytes", 2 },
		{ "inline data on RDMA_READ", 3 },
		{ "a setter before any builder", 4 },
		{ "a UD address on an RC QP", 5 },
		{ "inline data on an atomic", 6 },
	};

	/* Depth 4, 4 SGEs and 64 inline bytes in a 128-byte stride. */
	qpx = make_wr_qp(cq, 4, 4, 64);
	if (!qpx) {
		CHECK(0, "create: %s", strerror(errno));
		return;
	}
	qp = to_vqp(&qpx->qp_base);

	/* wr_abort discards: nothing published, the slot is reused. */
	*flags = 0;
	*notify = 0;
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = 0;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, 1, 0x1000, 1);
	ibv_wr_abort(qpx);
	CHECK(qp->rec->sq_pi == 0 && qp->sq.pi == 0 && *notify == 0,
	      "wr_abort: sq_pi %u, notify %#x", qp->rec->sq_pi, *notify);
	CHECK(pthread_spin_trylock(&qp->sq.lock) == 0, "wr_abort dropped the lock");
	pthread_spin_unlock(&qp->sq.lock);

	/* Five builders on a ring of four: ENOMEM, the batch discarded. */
	ibv_wr_start(qpx);
	for (i = 0; i < 5; i++) {
		qpx->wr_id = 10 + i;
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, 1, 0x1000, 1);
	}
	ret = ibv_wr_complete(qpx);
	CHECK(ret == ENOMEM && qp->rec->sq_pi == 0 && *notify == 0,
	      "overflow: ret %d, sq_pi %u", ret, qp->rec->sq_pi);
	CHECK(pthread_spin_trylock(&qp->sq.lock) == 0,
	      "a failed wr_complete dropped the lock");
	pthread_spin_unlock(&qp->sq.lock);

	/* Four fit; after the device consumes two, two more. */
	ibv_wr_start(qpx);
	for (i = 0; i < 4; i++) {
		qpx->wr_id = 20 + i;
		ibv_wr_send(qpx);
	}
	ret = ibv_wr_complete(qpx);
	CHECK(ret == 0 && qp->rec->sq_pi == 4 && *notify == NOTIFY_VALUE &&
	      sq_wqe(qp, 0)->wr_id == 20 && sq_wqe(qp, 3)->wr_id == 23,
	      "a full ring in one batch: ret %d, sq_pi %u", ret, qp->rec->sq_pi);
	atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, 2);
	*flags = VRDMA_DOORBELL_NO_NOTIFY;
	*notify = 0;
	ibv_wr_start(qpx);
	qpx->wr_id = 24;
	ibv_wr_send(qpx);
	qpx->wr_id = 25;
	ibv_wr_send(qpx);
	ret = ibv_wr_complete(qpx);
	CHECK(ret == 0 && qp->rec->sq_pi == 6 && *notify == 0 &&
	      sq_wqe(qp, 5)->wr_id == 25,
	      "wrapped batch, engine polling (no doorbell): ret %d, sq_pi %u",
	      ret, qp->rec->sq_pi);
	*flags = 0;
	atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, 6);

	/* Each setter error fails the whole batch, good WQEs before it too. */
	for (i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
		*notify = 0;
		ibv_wr_start(qpx);
		if (bad[i].step != 4) {
			qpx->wr_id = 30;
			ibv_wr_send(qpx);
			ibv_wr_set_sge(qpx, 1, 0x1000, 1);
		}
		switch (bad[i].step) {
		case 0:
			ibv_wr_send(qpx);
			ibv_wr_set_sge_list(qpx, 5, sgl);
			break;
		case 1:
			ibv_wr_rdma_write(qpx, 1, 0x1000);
			ibv_wr_set_inline_data(qpx, big, sizeof(big));
			break;
		case 2:
			ibv_wr_send(qpx);
			ibv_wr_set_inline_data_list(qpx, 2, far);
			break;
		case 3:
			ibv_wr_rdma_read(qpx, 1, 0x1000);
			ibv_wr_set_inline_data(qpx, big, 8);
			break;
		case 4:
			ibv_wr_set_sge(qpx, 1, 0x1000, 1);
			ibv_wr_send(qpx);
			break;
		case 5:
			ibv_wr_send(qpx);
			ibv_wr_set_ud_addr(qpx, &ah, 5, 0x11111111);
			break;
		case 6:
			ibv_wr_atomic_fetch_add(qpx, 1, 0x1000, 1);
			ibv_wr_set_inline_data(qpx, big, 8);
			break;
		}
		/* After the error, further calls change nothing. */
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, 1, 0x1000, 1);
		ret = ibv_wr_complete(qpx);
		CHECK(ret == EINVAL && qp->rec->sq_pi == 6 && qp->sq.pi == 6 &&
		      *notify == 0, "%s: ret %d, sq_pi %u", bad[i].name, ret,
		      qp->rec->sq_pi);
	}
	/* The QP still works. */
	ibv_wr_start(qpx);
	qpx->wr_id = 40;
	ibv_wr_send(qpx);
	ret = ibv_wr_complete(qpx);
	CHECK(ret == 0 && qp->rec->sq_pi == 7 && sq_wqe(qp, 6)->wr_id == 40,
	      "after the errors: ret %d, sq_pi %u", ret, qp->rec->sq_pi);
	vrdma_destroy_qp(&qpx->qp_base);

	/* sq_sig_all: every WQE SIGNALED whatever wr_flags say. */
	{
		struct ibv_qp *q = make_qp_ex(cq, IBV_QPT_RC,
					      IBV_QP_INIT_ATTR_PD |
						      IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					      IBV_QP_EX_WITH_SEND, 2, 1, 0, 1);

		qpx = q ? ibv_qp_to_qp_ex(q) : NULL;
		if (qpx) {
			ibv_wr_start(qpx);
			qpx->wr_flags = 0;
			ibv_wr_send(qpx);
			ret = ibv_wr_complete(qpx);
			CHECK(ret == 0 && sq_wqe(to_vqp(q), 0)->flags ==
						   VRDMA_WQE_SIGNALED,
			      "sq_sig_all with ibv_wr_send");
			vrdma_destroy_qp(q);
		} else {
			CHECK(0, "sq_sig_all qp_ex");
		}
	}
}

/* UD through ibv_wr_*: the destination bytes as ibv_post_send writes them. */
static void check_wr_ud(struct ibv_cq *cq)
{
	struct ibv_ah_attr ah_attr = { .port_num = 1 };
	struct ibv_sge sge = { .addr = 0x1000, .length = 100, .lkey = 0xa1 };
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_qp_ex *qpx;
	struct vrdma_qp *twin;
	struct ibv_qp *q;
	struct ibv_ah *ah;
	int ret;

	q = make_qp_ex(cq, IBV_QPT_UD,
		       IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		       IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 4, 1,
		       0, 0);
	qpx = q ? ibv_qp_to_qp_ex(q) : NULL;
	twin = make_qp_on(cq, IBV_QPT_UD, NULL, 4, 1, 0);
	ah = vrdma_create_ah(&pd, &ah_attr);
	if (!qpx || !twin || !ah) {
		CHECK(0, "UD qp_ex, twin, ah: %s", strerror(errno));
		return;
	}
	CHECK(!qpx->wr_rdma_write && qpx->wr_send_imm, "UD builders");
	ibv_wr_start(qpx);
	qpx->wr_id = 31;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qpx, htobe32(0x0a0b0c0d));
	ibv_wr_set_ud_addr(qpx, ah, 0xfedcba, VRDMA_QKEY_USE_QP | 5);
	ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
	ret = ibv_wr_complete(qpx);
	wr.wr_id = 31;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(0x0a0b0c0d);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xfedcba;
	wr.wr.ud.remote_qkey = VRDMA_QKEY_USE_QP | 5;
	CHECK(ret == 0 && vrdma_post_send(&twin->vqp.qp, &wr, &bad) == 0,
	      "UD wr_complete %d", ret);
	CHECK(sq_wqe(to_vqp(q), 0)->ah == FAKE_AHN &&
	      sq_wqe(to_vqp(q), 0)->remote_qpn == 0xfedcba &&
	      sq_wqe(to_vqp(q), 0)->remote_qkey == (VRDMA_QKEY_USE_QP | 5) &&
	      memcmp(sq_wqe(to_vqp(q), 0), sq_wqe(twin, 0),
		     1u << twin->sq.shift) == 0,
	      "UD WQE: ibv_wr_* and ibv_post_send write the same bytes");

	/* What ibv_post_send refuses on UD, wr_complete refuses too. */
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_ud_addr(qpx, ah, 0x1000000, 1);
	CHECK(ibv_wr_complete(qpx) == EINVAL, "a QP number past 24 bits");
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_ud_addr(qpx, NULL, 1, 1);
	CHECK(ibv_wr_complete(qpx) == EINVAL, "no AH");
	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_FENCE;
	ibv_wr_send(qpx);
	CHECK(ibv_wr_complete(qpx) == EINVAL && to_vqp(q)->rec->sq_pi == 1,
	      "FENCE on UD");
	vrdma_destroy_ah(ah);
	vrdma_destroy_qp(q);
	vrdma_destroy_qp(&twin->vqp.qp);
}

static void check_cq_ex(void)
{
	static const struct {
		const char *name;
		uint64_t wc_flags;
		uint32_t comp_mask, flags;
		int err;
	} cases[] = {
		{ "standard wc_flags", IBV_WC_STANDARD_FLAGS, 0, 0, 0 },
		{ "SINGLE_THREADED", IBV_WC_EX_WITH_BYTE_LEN,
		  IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_SINGLE_THREADED, 0 },
		{ "completion timestamp", IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, 0, 0, EOPNOTSUPP },
		{ "wallclock timestamp", IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, 0, 0, EOPNOTSUPP },
		{ "CVLAN", IBV_WC_EX_WITH_CVLAN, 0, 0, EOPNOTSUPP },
		{ "FLOW_TAG", IBV_WC_EX_WITH_FLOW_TAG, 0, 0, EOPNOTSUPP },
		{ "TM_INFO", IBV_WC_EX_WITH_TM_INFO, 0, 0, EOPNOTSUPP },
		{ "IGNORE_OVERRUN", 0, IBV_CQ_INIT_ATTR_MASK_FLAGS,
		  IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, EOPNOTSUPP },
		{ "parent domain", 0, IBV_CQ_INIT_ATTR_MASK_PD, 0, EOPNOTSUPP },
	};
	struct ibv_poll_cq_attr pattr = {};
	struct ibv_cq_init_attr_ex attr;
	struct ibv_cq_ex *cqx;
	struct vrdma_cq *cq;
	struct ibv_wc wc[4];
	size_t i;
	int ret, n;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		attr = (struct ibv_cq_init_attr_ex){
			.cqe = 16, .wc_flags = cases[i].wc_flags,
			.comp_mask = cases[i].comp_mask, .flags = cases[i].flags,
		};
		errno = 0;
		cqx = vrdma_create_cq_ex(&ctx->ibv_ctx.context, &attr);
		CHECK(cases[i].err ? (!cqx && errno == cases[i].err) : !!cqx,
		      "%s: cq %p errno %d, want %d", cases[i].name, (void *)cqx,
		      errno, cases[i].err);
		if (cqx)
			vrdma_destroy_cq(ibv_cq_ex_to_cq(cqx));
	}

	attr = (struct ibv_cq_init_attr_ex){ .cqe = 8,
					     .wc_flags = IBV_WC_STANDARD_FLAGS };
	cqx = vrdma_create_cq_ex(&ctx->ibv_ctx.context, &attr);
	if (!cqx) {
		CHECK(0, "create_cq_ex: %s", strerror(errno));
		return;
	}
	cq = to_vcq(ibv_cq_ex_to_cq(cqx));
	CHECK(cq->depth == VRDMA_MIN_CQE, "depth %u", cq->depth);

	ret = ibv_start_poll(cqx, &pattr);
	CHECK(ret == ENOENT, "empty: start_poll %d", ret);
	CHECK(pthread_spin_trylock(&cq->lock) == 0,
	      "a start_poll that found nothing dropped the lock");
	pthread_spin_unlock(&cq->lock);

	device_complete(cq, 501, IBV_WC_SUCCESS, VRDMA_WC_RECV_RDMA_WITH_IMM,
			VRDMA_WC_F_WITH_IMM, htobe32(0xcafe));
	device_complete(cq, 502, IBV_WC_SUCCESS, VRDMA_WC_RDMA_READ, 0, 0);
	ret = ibv_start_poll(cqx, &pattr);
	CHECK(ret == 0 && cqx->wr_id == 501 && cqx->status == IBV_WC_SUCCESS,
	      "start_poll: %d wr_id %llu", ret, (unsigned long long)cqx->wr_id);
	if (ret)
		goto out;
	CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_RECV_RDMA_WITH_IMM &&
	      ibv_wc_read_wc_flags(cqx) == IBV_WC_WITH_IMM &&
	      ibv_wc_read_imm_data(cqx) == htobe32(0xcafe) &&
	      ibv_wc_read_byte_len(cqx) == 100 && ibv_wc_read_qp_num(cqx) == 7 &&
	      ibv_wc_read_src_qp(cqx) == 9 && ibv_wc_read_vendor_err(cqx) == 0 &&
	      ibv_wc_read_slid(cqx) == 0 && ibv_wc_read_sl(cqx) == 0 &&
	      ibv_wc_read_dlid_path_bits(cqx) == 0,
	      "first completion's fields");
	/* The device adds one while we poll: next_poll finds it. */
	device_complete(cq, 503, IBV_WC_REM_ACCESS_ERR, VRDMA_WC_RDMA_WRITE, 0, 0);
	ret = ibv_next_poll(cqx);
	CHECK(ret == 0 && cqx->wr_id == 502 &&
	      ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_READ &&
	      ibv_wc_read_wc_flags(cqx) == 0, "next_poll: %d", ret);
	ret = ibv_next_poll(cqx);
	CHECK(ret == 0 && cqx->wr_id == 503 &&
	      cqx->status == IBV_WC_REM_ACCESS_ERR &&
	      ibv_wc_read_vendor_err(cqx) == 0x55,
	      "a completion written during the poll: %d", ret);
	CHECK(cq->rec->ci == 0, "ci published only by end_poll (%u)", cq->rec->ci);
	ret = ibv_next_poll(cqx);
	CHECK(ret == ENOENT, "drained: next_poll %d", ret);
	ibv_end_poll(cqx);
	CHECK(cq->rec->ci == 3 && cq->ci == 3, "end_poll: record ci %u",
	      cq->rec->ci);
	CHECK(pthread_spin_trylock(&cq->lock) == 0, "end_poll dropped the lock");
	pthread_spin_unlock(&cq->lock);

	/* ibv_poll_cq on the same CQ, before and after an ex poll. */
	device_complete(cq, 504, 0, VRDMA_WC_SEND, 0, 0);
	device_complete(cq, 505, 0, VRDMA_WC_SEND, 0, 0);
	n = vrdma_poll_cq(ibv_cq_ex_to_cq(cqx), 1, wc);
	CHECK(n == 1 && wc[0].wr_id == 504, "poll_cq on a cq_ex: %d", n);
	ret = ibv_start_poll(cqx, &pattr);
	CHECK(ret == 0 && cqx->wr_id == 505, "start_poll after poll_cq: %d", ret);
	if (!ret)
		ibv_end_poll(cqx);
	CHECK(cq->rec->ci == 5, "ci %u", cq->rec->ci);

	pattr.comp_mask = 1;
	CHECK(ibv_start_poll(cqx, &pattr) == EINVAL, "poll attr comp_mask");
	pattr.comp_mask = 0;

	/* A producer index past the ring: EIO, the lock dropped. */
	cq->rec->pi = cq->rec->ci + cq->depth + 1;
	ret = ibv_start_poll(cqx, &pattr);
	CHECK(ret == EIO, "overrun pi: start_poll %d", ret);
	CHECK(pthread_spin_trylock(&cq->lock) == 0, "EIO dropped the lock");
	pthread_spin_unlock(&cq->lock);
	cq->rec->pi = cq->rec->ci;
out:
	vrdma_destroy_cq(ibv_cq_ex_to_cq(cqx));
}

/*
 * check_no_syscalls posts (ibv_post_send and ibv_wr_*), polls (ibv_poll_cq
 * and ibv_start_poll) and arms in a child under
 * SECCOMP_MODE_STRICT: a system call other than read/write/_exit/sigreturn
 * kills it with SIGKILL.
 */
static void check_no_syscalls(struct ibv_cq *ibcq)
{
	struct ibv_sge sge = { .addr = 0x1000, .length = 8, .lkey = 1 };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct ibv_cq_init_attr_ex cattr = { .cqe = 64,
					     .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cqx;
	struct ibv_qp_ex *qpx;
	struct vrdma_qp *qp;
	int status;
	pid_t pid;

	qp = make_qp(ibcq, 64, 64, 1, 1, 0, 0);
	qpx = make_wr_qp(ibcq, 64, 1, 16);
	cqx = vrdma_create_cq_ex(&ctx->ibv_ctx.context, &cattr);
	if (!qp || !qpx || !cqx) {
		CHECK(0, "create_qp");
		return;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct ibv_send_wr *bad;
		struct ibv_recv_wr *rbad;
		struct ibv_wc wc[4];
		int i, n = 0;

		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT))
			_exit(3);
		for (i = 0; i < 1000; i++) {
			*flags = (i & 1) ? VRDMA_DOORBELL_NO_NOTIFY : 0;
			if (vrdma_post_send(&qp->vqp.qp, &wr, &bad) ||
			    vrdma_post_recv(&qp->vqp.qp, &rwr, &rbad))
				syscall(SYS_exit, 4);
			atomic_store((_Atomic uint32_t *)&qp->rec->sq_ci, i + 1);
			atomic_store((_Atomic uint32_t *)&qp->rec->rq_ci, i + 1);
			device_complete(cq, i, 0, VRDMA_WC_SEND, 0, 0);
			n += vrdma_poll_cq(ibcq, 4, wc);
			vrdma_req_notify_cq(ibcq, i & 1);

			/* The same through ibv_wr_* and ibv_cq_ex. */
			ibv_wr_start(qpx);
			qpx->wr_id = i;
			qpx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send(qpx);
			ibv_wr_set_inline_data(qpx, &sge, sizeof(sge));
			if (ibv_wr_complete(qpx))
				syscall(SYS_exit, 6);
			atomic_store((_Atomic uint32_t *)&to_vqp(&qpx->qp_base)->rec->sq_ci,
				     i + 1);
			device_complete(to_vcq(ibv_cq_ex_to_cq(cqx)), i, 0,
					VRDMA_WC_SEND, 0, 0);
			if (ibv_start_poll(cqx, &(struct ibv_poll_cq_attr){}) == 0) {
				n++;
				while (ibv_next_poll(cqx) == 0)
					n++;
				ibv_end_poll(cqx);
			}
		}
		syscall(SYS_exit, n == 2000 ? 0 : 5);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "post/poll/arm under SECCOMP_MODE_STRICT: %s %d",
	      WIFSIGNALED(status) ? "killed by signal (a system call)" : "exit",
	      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	vrdma_destroy_qp(&qp->vqp.qp);
	vrdma_destroy_qp(&qpx->qp_base);
	vrdma_destroy_cq(ibv_cq_ex_to_cq(cqx));
}

int main(void)
{
	struct ibv_cq *cq;

	setup();
	check_cq();
	cq = vrdma_create_cq(&ctx->ibv_ctx.context, 256, NULL, 0);
	if (!cq) {
		fprintf(stderr, "create_cq failed\n");
		return 1;
	}
	check_qp_layout(cq);
	check_post(cq);
	check_doorbell_sharing(cq);
	check_ud(cq);
	check_srq(cq);
	check_poll_grh();
	check_mw(cq);
	check_srq_ud_no_syscalls(cq);
	check_qp_ex_create(cq);
	check_wr_ops(cq);
	check_wr_errors(cq);
	check_wr_ud(cq);
	check_cq_ex();
	check_no_syscalls(cq);
	vrdma_destroy_cq(cq);

	if (failed)
		printf("datapath_check: %d of %d checks FAILED\n", failed,
		       passed + failed);
	else
		printf("datapath_check: all %d checks passed\n", passed);
	return failed ? 1 : 0;
}
