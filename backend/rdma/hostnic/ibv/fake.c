//go:build cgo && linux

/*
 * fake.c: a fake provider (a context whose ops record what is posted and
 * invent completions), so the conversion, chunking, bad_wr and poll paths
 * are tested on hosts without an RDMA device. Tests only; single-threaded.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define FAKE_MAX 64

static struct ibv_context fake_ctx;
static struct ibv_send_wr fake_swr[FAKE_MAX];
static struct ibv_sge fake_sge0[FAKE_MAX];
static uint32_t fake_n;
static int fake_fail_index = -1, fake_fail_err;
static uint64_t fake_cq_pending, fake_cq_seq;

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	(void)qp;
	for (; wr; wr = wr->next) {
		if (fake_fail_index >= 0 && fake_n == (uint32_t)fake_fail_index) {
			*bad = wr;
			return fake_fail_err;
		}
		if (fake_n < FAKE_MAX) {
			fake_swr[fake_n] = *wr;
			fake_swr[fake_n].next = NULL;
			fake_swr[fake_n].sg_list = NULL;
			memset(&fake_sge0[fake_n], 0, sizeof(fake_sge0[0]));
			if (wr->num_sge > 0)
				fake_sge0[fake_n] = wr->sg_list[wr->num_sge - 1];
		}
		fake_n++;
	}
	return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)qp;
	for (; wr; wr = wr->next) {
		if (fake_fail_index >= 0 && fake_n == (uint32_t)fake_fail_index) {
			*bad = wr;
			return -fake_fail_err; /* some providers return -errno */
		}
		if (fake_n < FAKE_MAX) {
			memset(&fake_swr[fake_n], 0, sizeof(fake_swr[0]));
			fake_swr[fake_n].wr_id = wr->wr_id;
			fake_swr[fake_n].num_sge = wr->num_sge;
			memset(&fake_sge0[fake_n], 0, sizeof(fake_sge0[0]));
			if (wr->num_sge > 0)
				fake_sge0[fake_n] = wr->sg_list[wr->num_sge - 1];
		}
		fake_n++;
	}
	return 0;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int i;

	(void)cq;
	for (i = 0; i < n && fake_cq_pending > 0; i++, fake_cq_pending--) {
		uint64_t s = ++fake_cq_seq;

		memset(&wc[i], 0, sizeof(wc[i]));
		wc[i].wr_id = s;
		wc[i].status = s % 7 == 0 ? IBV_WC_REM_ACCESS_ERR : IBV_WC_SUCCESS;
		wc[i].opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		wc[i].vendor_err = (uint32_t)s + 1;
		wc[i].byte_len = (uint32_t)s * 3;
		wc[i].imm_data = htobe32((uint32_t)s);
		wc[i].qp_num = 0x123;
		wc[i].src_qp = 0x456;
		wc[i].wc_flags = IBV_WC_WITH_IMM;
		wc[i].pkey_index = 7;
		wc[i].slid = 9;
		wc[i].sl = 5;
		wc[i].dlid_path_bits = 3;
	}
	return i;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	return solicited_only ? EOPNOTSUPP : 0;
}

static void fake_init(void)
{
	fake_ctx.ops.post_send = fake_post_send;
	fake_ctx.ops.post_recv = fake_post_recv;
	fake_ctx.ops.poll_cq = fake_poll_cq;
	fake_ctx.ops.req_notify_cq = fake_req_notify_cq;
}

struct vibv_qp *vibv_fake_qp(uint32_t nswr, uint32_t max_send_sge, uint32_t nrwr, uint32_t max_recv_sge)
{
	struct vibv_qp *q = calloc(1, sizeof(*q));

	fake_init();
	q->qp = calloc(1, sizeof(*q->qp));
	q->qp->context = &fake_ctx;
	q->qp->qp_num = 0x42;
	if (vibv_alloc_scratch(q, nswr, max_send_sge, nrwr, max_recv_sge)) {
		free(q->qp);
		vibv_free_scratch(q);
		return NULL;
	}
	fake_n = 0;
	fake_fail_index = -1;
	return q;
}

void vibv_fake_free(struct vibv_qp *q)
{
	free(q->qp);
	vibv_free_scratch(q);
}

void vibv_fake_fail_at(int index, int err)
{
	fake_n = 0;
	fake_fail_index = index;
	fake_fail_err = err;
}

uint32_t vibv_fake_count(void) { return fake_n; }

void vibv_fake_get(uint32_t i, struct ibv_send_wr *wr, struct ibv_sge *sge)
{
	*wr = fake_swr[i];
	*sge = fake_sge0[i];
}

struct ibv_cq *vibv_fake_cq(uint64_t pending)
{
	static struct ibv_cq cq;

	fake_init();
	cq.context = &fake_ctx;
	fake_cq_pending = pending;
	fake_cq_seq = 0;
	return &cq;
}
