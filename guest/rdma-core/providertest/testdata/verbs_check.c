// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * verbs_check: the vrdma provider through libibverbs' public API, in a
 * guest with the kernel driver (provider_test.go packs it into the stack
 * image and runs it with vrdma-vmtest exec). Two RC QPs of one device are
 * connected to each other (the device's own GID), and every operation is
 * checked for its data and its completion: RDMA WRITE and READ with
 * gather/scatter lists, SEND/RECV, the two *_WITH_IMM opcodes (imm_data
 * comes back as the 32 bits posted), both atomics, inline data, unsignaled
 * WRs and sq_sig_all, a ring wrapped many times, a full receive queue,
 * completion events (and solicited-only arming), an error completion
 * followed by flushes, and the extended API: a QP from ibv_create_qp_ex
 * posting with ibv_wr_* (each operation, SGE lists, inline data, abort, the
 * errors wr_complete returns) and an ibv_cq_ex read with ibv_start_poll.
 *
 * Usage: verbs_check [DEVICE [GID_INDEX]]   (default: the first device, 1)
 * Prints "ok NAME" / "FAIL ..." lines, then "verbs_check: all N checks
 * passed" or "verbs_check: M of N checks FAILED"; exits 1 on a failure.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static int passed, failed;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
		} else {                                                       \
			failed++;                                              \
			printf("FAIL %s:%d: %s: ", __func__, __LINE__, #cond); \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
		}                                                              \
	} while (0)

#define BUF_SIZE (1 << 20)
#define DEPTH 16

struct end {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	uint8_t *buf;
	struct ibv_mr *mr;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *channel;
static union ibv_gid gid;
static int gid_index = 1;
static enum ibv_mtu mtu;

static void die(const char *what)
{
	printf("FAIL setup: %s: %s\n", what, strerror(errno));
	printf("verbs_check: setup FAILED\n");
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* poll_n waits up to 10 s for n completions on cq. Returns how many came. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	double end = now() + 10;
	int got = 0, r;

	while (got < n && now() < end) {
		r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return r;
		got += r;
	}
	return got;
}

static int empty_for(struct ibv_cq *cq, double seconds)
{
	double end = now() + seconds;
	struct ibv_wc wc;

	while (now() < end)
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
	return 1;
}

static void make_end(struct end *e, struct ibv_comp_channel *ch, int sig_all)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = sig_all,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 3, .max_recv_sge = 3,
			 .max_inline_data = 64 },
	};
	struct ibv_qp_init_attr got;
	struct ibv_qp_attr qattr;

	e->cq = ibv_create_cq(ctx, 4 * DEPTH, NULL, ch, 0);
	if (!e->cq)
		die("ibv_create_cq");
	attr.send_cq = attr.recv_cq = e->cq;
	e->qp = ibv_create_qp(pd, &attr);
	if (!e->qp)
		die("ibv_create_qp");
	CHECK(attr.cap.max_send_wr >= DEPTH && attr.cap.max_recv_wr >= DEPTH &&
	      attr.cap.max_send_sge >= 3 && attr.cap.max_recv_sge >= 3 &&
	      attr.cap.max_inline_data >= 64,
	      "caps granted: wr %u/%u sge %u/%u inline %u", attr.cap.max_send_wr,
	      attr.cap.max_recv_wr, attr.cap.max_send_sge,
	      attr.cap.max_recv_sge, attr.cap.max_inline_data);
	CHECK(ibv_query_qp(e->qp, &qattr, IBV_QP_CAP, &got) == 0 &&
	      got.cap.max_send_wr == attr.cap.max_send_wr &&
	      got.cap.max_inline_data == attr.cap.max_inline_data,
	      "query_qp caps %u/%u", got.cap.max_send_wr,
	      got.cap.max_inline_data);
	if (posix_memalign((void **)&e->buf, 4096, BUF_SIZE))
		die("posix_memalign");
	memset(e->buf, 0, BUF_SIZE);
	e->mr = ibv_reg_mr(pd, e->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!e->mr)
		die("ibv_reg_mr");
}

static void connect_to(struct end *e, const struct end *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};

	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC |
					     IBV_QP_MIN_RNR_TIMER))
		die("modify_qp RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
					     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify_qp RTS");
}

static int post_send1(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id,
		      struct ibv_sge *sge, int nsge, unsigned int flags,
		      const struct end *peer, uint64_t roff)
{
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = sge,
				  .num_sge = nsge, .opcode = op,
				  .send_flags = flags }, *bad;

	if (peer) {
		wr.wr.rdma.remote_addr = (uintptr_t)peer->buf + roff;
		wr.wr.rdma.rkey = peer->mr->rkey;
	}
	return ibv_post_send(e->qp, &wr, &bad);
}

static int post_recv1(struct end *e, uint64_t wr_id, struct ibv_sge *sge,
		      int nsge)
{
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = sge,
				  .num_sge = nsge }, *bad;

	return ibv_post_recv(e->qp, &wr, &bad);
}

static struct ibv_sge sge_of(struct end *e, uint64_t off, uint32_t len)
{
	return (struct ibv_sge){ .addr = (uintptr_t)e->buf + off,
				 .length = len, .lkey = e->mr->lkey };
}

static void fill(uint8_t *p, size_t n, unsigned int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7 + seed);
}

static void check_write_read(struct end *a, struct end *b)
{
	struct ibv_sge sge[3] = { sge_of(a, 0, 100), sge_of(a, 4096, 1000),
				  sge_of(a, 8192 + 3, 5000) };
	struct ibv_wc wc;
	uint8_t want[6100];

	fill(a->buf, 16384, 1);
	memcpy(want, a->buf, 100);
	memcpy(want + 100, a->buf + 4096, 1000);
	memcpy(want + 1100, a->buf + 8192 + 3, 5000);
	CHECK(post_send1(a, IBV_WR_RDMA_WRITE, 11, sge, 3, IBV_SEND_SIGNALED,
			 b, 65536 + 1) == 0, "post WRITE");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 11 &&
	      wc.qp_num == a->qp->qp_num,
	      "WRITE completion: status %s opcode %d wr_id %" PRIu64,
	      ibv_wc_status_str(wc.status), wc.opcode, wc.wr_id);
	CHECK(memcmp(b->buf + 65536 + 1, want, sizeof(want)) == 0,
	      "WRITE data (3-SGE gather)");

	/* READ it back into two pieces of a's buffer. */
	sge[0] = sge_of(a, 200000, 3000);
	sge[1] = sge_of(a, 300001, 3100);
	CHECK(post_send1(a, IBV_WR_RDMA_READ, 12, sge, 2, IBV_SEND_SIGNALED, b,
			 65536 + 1) == 0, "post READ");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 12 &&
	      wc.byte_len == 6100,
	      "READ completion: status %s opcode %d byte_len %u",
	      ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len);
	CHECK(memcmp(a->buf + 200000, want, 3000) == 0 &&
	      memcmp(a->buf + 300001, want + 3000, 3100) == 0,
	      "READ data (2-SGE scatter)");
	printf("ok write/read\n");
}

static void check_send_imm(struct end *a, struct end *b)
{
	struct ibv_sge rs[2] = { sge_of(b, 400000, 10), sge_of(b, 500000, 4000) };
	struct ibv_sge ss = sge_of(a, 0, 3000);
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	fill(a->buf, 3000, 9);
	CHECK(post_recv1(b, 21, rs, 2) == 0, "post_recv");
	CHECK(post_send1(a, IBV_WR_SEND, 22, &ss, 1, IBV_SEND_SIGNALED, NULL,
			 0) == 0, "post SEND");
	CHECK(poll_n(b->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RECV && wc.wr_id == 21 &&
	      wc.byte_len == 3000 && !(wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.qp_num == b->qp->qp_num && wc.src_qp == a->qp->qp_num,
	      "RECV completion: status %s opcode %d byte_len %u qp %u src %u",
	      ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len, wc.qp_num,
	      wc.src_qp);
	CHECK(memcmp(b->buf + 400000, a->buf, 10) == 0 &&
	      memcmp(b->buf + 500000, a->buf + 10, 2990) == 0, "SEND data");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.opcode == IBV_WC_SEND &&
	      wc.wr_id == 22, "SEND completion");

	/* SEND_WITH_IMM: the 32 bits come back exactly as posted. */
	CHECK(post_recv1(b, 23, rs, 2) == 0, "post_recv");
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 24;
	wr.sg_list = &ss;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(0x01020304);
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post SEND_WITH_IMM");
	CHECK(poll_n(b->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.imm_data == htobe32(0x01020304),
	      "SEND_WITH_IMM at the receiver: opcode %d flags %#x imm %#x",
	      wc.opcode, wc.wc_flags, be32toh(wc.imm_data));
	poll_n(a->cq, &wc, 1);

	/* RDMA_WRITE_WITH_IMM: data in place, a receive consumed with the imm. */
	CHECK(post_recv1(b, 25, rs, 0) == 0, "post_recv with no SGE");
	wr.wr_id = 26;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(0xa0b0c0d0);
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf + 600000;
	wr.wr.rdma.rkey = b->mr->rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post WRITE_WITH_IMM");
	CHECK(poll_n(b->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.wr_id == 25 &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.imm_data == htobe32(0xa0b0c0d0) && wc.byte_len == 3000,
	      "WRITE_WITH_IMM at the receiver: status %s opcode %d imm %#x len %u",
	      ibv_wc_status_str(wc.status), wc.opcode, be32toh(wc.imm_data),
	      wc.byte_len);
	CHECK(memcmp(b->buf + 600000, a->buf, 3000) == 0, "WRITE_WITH_IMM data");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.opcode == IBV_WC_RDMA_WRITE &&
	      wc.wr_id == 26, "WRITE_WITH_IMM completion");
	printf("ok send/imm\n");
}

static void check_atomics(struct end *a, struct end *b)
{
	volatile uint64_t *remote = (uint64_t *)(b->buf + 700000);
	uint64_t *result = (uint64_t *)(a->buf + 700000);
	struct ibv_sge s = sge_of(a, 700000, 8);
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	*remote = 100;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 31;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.atomic.remote_addr = (uintptr_t)remote;
	wr.wr.atomic.rkey = b->mr->rkey;
	wr.wr.atomic.compare_add = 5;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post FETCH_ADD");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_FETCH_ADD && *result == 100 && *remote == 105,
	      "FETCH_ADD: status %s opcode %d old %" PRIu64 " now %" PRIu64,
	      ibv_wc_status_str(wc.status), wc.opcode, *result, *remote);

	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 105;
	wr.wr.atomic.swap = 7;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post CMP_AND_SWP");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_COMP_SWAP && *result == 105 && *remote == 7,
	      "CMP_AND_SWP hit: old %" PRIu64 " now %" PRIu64, *result, *remote);
	wr.wr.atomic.compare_add = 1;
	wr.wr.atomic.swap = 9;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post CMP_AND_SWP");
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      *result == 7 && *remote == 7,
	      "CMP_AND_SWP miss: old %" PRIu64 " now %" PRIu64, *result, *remote);
	printf("ok atomics\n");
}

static void check_inline(struct end *a, struct end *b)
{
	struct ibv_sge rs = sge_of(b, 800000, 64);
	uint8_t src[60];
	struct ibv_sge ss[2] = { { .addr = (uintptr_t)src, .length = 20 },
				 { .addr = (uintptr_t)src + 20, .length = 40 } };
	uint8_t want[60];
	struct ibv_wc wc;

	fill(src, sizeof(src), 33);
	memcpy(want, src, sizeof(src));
	CHECK(post_recv1(b, 41, &rs, 1) == 0, "post_recv");
	/* Inline: no lkey, and the bytes are taken at post time. */
	CHECK(post_send1(a, IBV_WR_SEND, 42, ss, 2,
			 IBV_SEND_INLINE | IBV_SEND_SIGNALED, NULL, 0) == 0,
	      "post inline SEND");
	memset(src, 0xee, sizeof(src));
	CHECK(poll_n(b->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.byte_len == 60 && memcmp(b->buf + 800000, want, 60) == 0,
	      "inline SEND data: status %s len %u",
	      ibv_wc_status_str(wc.status), wc.byte_len);
	poll_n(a->cq, &wc, 1);

	fill(src, sizeof(src), 44);
	memcpy(want, src, sizeof(src));
	CHECK(post_send1(a, IBV_WR_RDMA_WRITE, 43, ss, 2,
			 IBV_SEND_INLINE | IBV_SEND_SIGNALED, b, 810000) == 0,
	      "post inline WRITE");
	memset(src, 0xdd, sizeof(src));
	CHECK(poll_n(a->cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      memcmp(b->buf + 810000, want, 60) == 0, "inline WRITE data");
	printf("ok inline\n");
}

static void check_wrap_and_unsignaled(struct end *a, struct end *b)
{
	struct ibv_send_wr wr[8], *bad;
	struct ibv_sge sge[8];
	struct ibv_wc wc[8];
	int i, k, done = 0, bad_n = 0;

	/* 4000 WRITEs through a 16-deep SQ, 8 per post, the 8th signaled. */
	for (i = 0; i < 500; i++) {
		for (k = 0; k < 8; k++) {
			uint32_t n = i * 8 + k;

			*(uint32_t *)(a->buf + 4 * (n % 1024)) = n;
			sge[k] = sge_of(a, 4 * (n % 1024), 4);
			memset(&wr[k], 0, sizeof(wr[k]));
			wr[k].wr_id = n;
			wr[k].sg_list = &sge[k];
			wr[k].num_sge = 1;
			wr[k].opcode = IBV_WR_RDMA_WRITE;
			wr[k].send_flags = k == 7 ? IBV_SEND_SIGNALED : 0;
			wr[k].wr.rdma.remote_addr =
				(uintptr_t)b->buf + 900000 + 4 * (n % 1024);
			wr[k].wr.rdma.rkey = b->mr->rkey;
			wr[k].next = k < 7 ? &wr[k + 1] : NULL;
		}
		if (ibv_post_send(a->qp, wr, &bad)) {
			bad_n++;
			break;
		}
		if (poll_n(a->cq, wc, 1) != 1 || wc[0].status != IBV_WC_SUCCESS ||
		    wc[0].wr_id != (uint64_t)i * 8 + 7) {
			bad_n++;
			break;
		}
		done++;
	}
	CHECK(done == 500 && bad_n == 0,
	      "4000 WRITEs, one completion per 8: %d rounds", done);
	/* Each of the 1024 slots holds the last WRITE that went to it. */
	CHECK(memcmp(b->buf + 900000, a->buf, 4 * 1024) == 0,
	      "data of the last writes");
	CHECK(empty_for(a->cq, 0.2), "no completions for unsignaled WRs");
	printf("ok wrap\n");
}

static void check_sig_all(void)
{
	struct end c, d;
	struct ibv_sge s;
	struct ibv_wc wc;

	make_end(&c, NULL, 1);
	make_end(&d, NULL, 0);
	connect_to(&c, &d);
	connect_to(&d, &c);
	s = sge_of(&c, 0, 8);
	CHECK(post_send1(&c, IBV_WR_RDMA_WRITE, 51, &s, 1, 0, &d, 0) == 0,
	      "post unsignaled WRITE on an sq_sig_all QP");
	CHECK(poll_n(c.cq, &wc, 1) == 1 && wc.wr_id == 51 &&
	      wc.status == IBV_WC_SUCCESS, "sq_sig_all: a completion anyway");
	ibv_destroy_qp(c.qp);
	ibv_destroy_qp(d.qp);
	ibv_destroy_cq(c.cq);
	ibv_destroy_cq(d.cq);
	ibv_dereg_mr(c.mr);
	ibv_dereg_mr(d.mr);
	free(c.buf);
	free(d.buf);
	printf("ok sq_sig_all\n");
}

static void check_full_rq(struct end *b)
{
	struct ibv_recv_wr wr[DEPTH * 4 + 1], *bad = NULL;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_sge s = sge_of(b, 0, 8);
	int i, n, ret;

	/* b's receive queue: nothing arrives while this runs. */
	ibv_query_qp(b->qp, &qa, IBV_QP_CAP, &qi);
	n = qi.cap.max_recv_wr;
	for (i = 0; i <= n && i < DEPTH * 4; i++) {
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = 1000 + i;
		wr[i].sg_list = &s;
		wr[i].num_sge = 1;
		wr[i].next = i < n ? &wr[i + 1] : NULL;
	}
	ret = ibv_post_recv(b->qp, wr, &bad);
	CHECK(n < DEPTH * 4 && ret == ENOMEM && bad == &wr[n],
	      "posting %d receives on a %d-deep RQ: ret %d bad %ld", n + 1, n,
	      ret, bad ? (long)(bad - wr) : -1L);
	printf("ok full rq\n");
}

static int wait_event(struct ibv_cq *want, int ms)
{
	struct pollfd p = { .fd = channel->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *cq_ctx;

	if (poll(&p, 1, ms) != 1)
		return 0;
	if (ibv_get_cq_event(channel, &cq, &cq_ctx))
		return -1;
	ibv_ack_cq_events(cq, 1);
	return cq == want ? 1 : -1;
}

static void check_events(void)
{
	struct end e, f;
	struct ibv_sge rs, ss;
	struct ibv_wc wc;
	int i;

	make_end(&e, NULL, 0);
	make_end(&f, channel, 0);
	connect_to(&e, &f);
	connect_to(&f, &e);
	rs = sge_of(&f, 0, 64);
	ss = sge_of(&e, 0, 64);
	for (i = 0; i < 4; i++)
		post_recv1(&f, 60 + i, &rs, 1);

	CHECK(ibv_req_notify_cq(f.cq, 0) == 0, "req_notify_cq");
	CHECK(wait_event(f.cq, 300) == 0, "no event before a completion");
	post_send1(&e, IBV_WR_SEND, 70, &ss, 1, 0, NULL, 0);
	CHECK(wait_event(f.cq, 10000) == 1, "an event for the next completion");
	CHECK(poll_n(f.cq, &wc, 1) == 1 && wc.wr_id == 60, "its completion");

	/* Solicited-only: an unsolicited SEND completes without an event. */
	CHECK(ibv_req_notify_cq(f.cq, 1) == 0, "req_notify_cq(solicited)");
	post_send1(&e, IBV_WR_SEND, 71, &ss, 1, 0, NULL, 0);
	CHECK(poll_n(f.cq, &wc, 1) == 1 && wc.wr_id == 61, "unsolicited completion");
	CHECK(wait_event(f.cq, 500) == 0, "no event for an unsolicited completion");
	post_send1(&e, IBV_WR_SEND, 72, &ss, 1, IBV_SEND_SOLICITED, NULL, 0);
	CHECK(wait_event(f.cq, 10000) == 1, "an event for a solicited completion");
	CHECK(poll_n(f.cq, &wc, 1) == 1 && wc.wr_id == 62, "solicited completion");

	/* Armed once: no second event without re-arming. */
	post_send1(&e, IBV_WR_SEND, 73, &ss, 1, IBV_SEND_SOLICITED, NULL, 0);
	CHECK(poll_n(f.cq, &wc, 1) == 1 && wc.wr_id == 63, "completion");
	CHECK(wait_event(f.cq, 500) == 0, "no event once disarmed");

	ibv_destroy_qp(e.qp);
	ibv_destroy_qp(f.qp);
	ibv_destroy_cq(e.cq);
	ibv_destroy_cq(f.cq);
	ibv_dereg_mr(e.mr);
	ibv_dereg_mr(f.mr);
	free(e.buf);
	free(f.buf);
	printf("ok events\n");
}

/*
 * poll_ex collects n completions from an ibv_cq_ex (start/next/end_poll),
 * waiting up to 10 s. Returns how many came.
 */
struct exwc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num;
	unsigned int wc_flags;
};

static int poll_ex(struct ibv_cq_ex *cq, struct exwc *wc, int n)
{
	struct ibv_poll_cq_attr attr = {};
	double end = now() + 10;
	int got = 0, r;

	while (got < n && now() < end) {
		r = ibv_start_poll(cq, &attr);
		if (r == ENOENT)
			continue;
		if (r)
			return -r;
		do {
			wc[got] = (struct exwc){
				.wr_id = cq->wr_id, .status = cq->status,
				.opcode = ibv_wc_read_opcode(cq),
				.byte_len = ibv_wc_read_byte_len(cq),
				.qp_num = ibv_wc_read_qp_num(cq),
				.wc_flags = ibv_wc_read_wc_flags(cq),
			};
			got++;
		} while (got < n && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	return got;
}

/*
 * check_qp_ex: a QP made with ibv_create_qp_ex and send_ops_flags, posting
 * with ibv_wr_*, its completions read from an ibv_cq_ex, to an ordinary
 * QP: every operation in one batch with its data checked, inline data
 * (the source overwritten right after wr_complete), wr_abort, the errors
 * wr_complete reports, and what the device refuses.
 */
static void check_qp_ex(void)
{
	struct ibv_cq_init_attr_ex cattr = { .cqe = 4 * DEPTH,
					     .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_qp_init_attr_ex qattr = {
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_READ |
				  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 3, .max_recv_sge = 3,
			 .max_inline_data = 64 },
	};
	struct ibv_device_attr_ex dattr;
	struct ibv_comp_channel *ch;
	struct ibv_cq_ex *cqx, *bad_cq;
	struct ibv_qp_ex *qpx;
	struct ibv_qp *bad_qp;
	struct end x, y;
	struct exwc ew[2 * DEPTH];
	struct ibv_wc wc[4];
	struct ibv_data_buf bufs[2];
	uint8_t inl[64], want[64];
	volatile uint64_t *ctr;
	struct ibv_sge sg[2];
	int ret, i, n;

	/* The device has no completion clock. */
	memset(&dattr, 0, sizeof(dattr));
	CHECK(ibv_query_device_ex(ctx, NULL, &dattr) == 0 &&
	      dattr.completion_timestamp_mask == 0 && dattr.hca_core_clock == 0,
	      "query_device_ex: timestamp mask %#" PRIx64 ", clock %" PRIu64,
	      dattr.completion_timestamp_mask, dattr.hca_core_clock);
	for (i = 0; i < 3; i++) {
		static const uint64_t refused[] = {
			IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
			IBV_WC_EX_WITH_CVLAN, IBV_WC_EX_WITH_FLOW_TAG,
		};
		struct ibv_cq_init_attr_ex a = { .cqe = 8,
						 .wc_flags = refused[i] };

		errno = 0;
		bad_cq = ibv_create_cq_ex(ctx, &a);
		CHECK(!bad_cq && errno == EOPNOTSUPP,
		      "cq_ex with wc_flags %#" PRIx64 ": errno %d", refused[i],
		      errno);
		if (bad_cq)
			ibv_destroy_cq(ibv_cq_ex_to_cq(bad_cq));
	}

	/* A completion channel is counted once per CQ, as ibv_create_cq does. */
	ch = ibv_create_comp_channel(ctx);
	cattr.channel = ch;
	cqx = ch ? ibv_create_cq_ex(ctx, &cattr) : NULL;
	if (!cqx)
		die("ibv_create_cq_ex");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel in use by a cq_ex");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "destroy cq_ex");
	CHECK(ibv_destroy_comp_channel(ch) == 0,
	      "channel free again after the cq_ex");

	cattr.channel = NULL;
	cqx = ibv_create_cq_ex(ctx, &cattr);
	if (!cqx)
		die("ibv_create_cq_ex");
	qattr.pd = pd;
	qattr.send_cq = qattr.recv_cq = ibv_cq_ex_to_cq(cqx);
	x.qp = ibv_create_qp_ex(ctx, &qattr);
	if (!x.qp)
		die("ibv_create_qp_ex");
	qpx = ibv_qp_to_qp_ex(x.qp);
	CHECK(qpx != NULL, "ibv_qp_to_qp_ex of a QP with send_ops_flags");
	if (!qpx)
		return;
	CHECK(qattr.cap.max_inline_data >= 64 && qattr.cap.max_send_wr >= DEPTH,
	      "qp_ex caps: inline %u, wr %u", qattr.cap.max_inline_data,
	      qattr.cap.max_send_wr);
	x.cq = ibv_cq_ex_to_cq(cqx);
	if (posix_memalign((void **)&x.buf, 4096, BUF_SIZE))
		die("posix_memalign");
	memset(x.buf, 0, BUF_SIZE);
	x.mr = ibv_reg_mr(pd, x.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!x.mr)
		die("ibv_reg_mr");
	make_end(&y, NULL, 0);
	connect_to(&x, &y);
	connect_to(&y, &x);

	/* TSO is an operation the device does not have. */
	qattr.send_ops_flags = IBV_QP_EX_WITH_TSO;
	errno = 0;
	bad_qp = ibv_create_qp_ex(ctx, &qattr);
	CHECK(!bad_qp && errno == EOPNOTSUPP, "TSO refused: errno %d",
	      errno);
	if (bad_qp)
		ibv_destroy_qp(bad_qp);

	/* Three receives: WRITE_WITH_IMM, SEND, SEND_WITH_IMM. */
	for (i = 0; i < 3; i++) {
		sg[0] = sge_of(&y, 100000 + i * 10000, 5000);
		CHECK(post_recv1(&y, 60 + i, sg, 1) == 0, "post_recv %d", i);
	}
	fill(x.buf, 8192, 3);
	fill(inl, sizeof(inl), 77);
	memcpy(want, inl, sizeof(want));
	ctr = (volatile uint64_t *)(y.buf + 800000);
	*ctr = 1000;

	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	qpx->wr_id = 51;		/* WRITE, a 2-SGE gather */
	ibv_wr_rdma_write(qpx, y.mr->rkey, (uintptr_t)y.buf + 10000);
	sg[0] = sge_of(&x, 0, 1000);
	sg[1] = sge_of(&x, 4096, 2000);
	ibv_wr_set_sge_list(qpx, 2, sg);
	qpx->wr_id = 52;		/* WRITE_WITH_IMM, inline from two buffers */
	ibv_wr_rdma_write_imm(qpx, y.mr->rkey, (uintptr_t)y.buf + 20000,
			      htobe32(0x0badcafe));
	bufs[0] = (struct ibv_data_buf){ .addr = inl, .length = 24 };
	bufs[1] = (struct ibv_data_buf){ .addr = inl + 24, .length = 40 };
	ibv_wr_set_inline_data_list(qpx, 2, bufs);
	qpx->wr_id = 53;		/* SEND, one SGE */
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf + 100, 3000);
	qpx->wr_id = 54;		/* SEND_WITH_IMM, inline */
	ibv_wr_send_imm(qpx, htobe32(0x11223344));
	ibv_wr_set_inline_data(qpx, inl, 33);
	qpx->wr_id = 55;		/* READ back what 51 wrote */
	ibv_wr_rdma_read(qpx, y.mr->rkey, (uintptr_t)y.buf + 10000);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf + 200000, 3000);
	qpx->wr_id = 56;
	ibv_wr_atomic_fetch_add(qpx, y.mr->rkey, (uintptr_t)ctr, 5);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf + 300000, 8);
	qpx->wr_id = 57;
	ibv_wr_atomic_cmp_swp(qpx, y.mr->rkey, (uintptr_t)ctr, 1005, 42);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf + 300008, 8);
	ret = ibv_wr_complete(qpx);
	/* Inline data is copied at posting: the source may change at once. */
	memset(inl, 0xee, sizeof(inl));
	CHECK(ret == 0, "wr_complete of 7 WRs: %d", ret);

	n = poll_ex(cqx, ew, 7);
	CHECK(n == 7, "7 completions from the cq_ex, got %d", n);
	for (i = 0; i < n; i++) {
		static const enum ibv_wc_opcode op[7] = {
			IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE, IBV_WC_SEND,
			IBV_WC_SEND, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD,
			IBV_WC_COMP_SWAP,
		};

		CHECK(ew[i].wr_id == 51 + (uint64_t)i &&
		      ew[i].status == IBV_WC_SUCCESS && ew[i].opcode == op[i] &&
		      ew[i].qp_num == x.qp->qp_num,
		      "completion %d: wr_id %" PRIu64 " status %s opcode %d", i,
		      ew[i].wr_id, ibv_wc_status_str(ew[i].status),
		      ew[i].opcode);
	}
	if (n == 7)
		CHECK(ew[4].byte_len == 3000, "READ byte_len %u", ew[4].byte_len);
	CHECK(memcmp(y.buf + 10000, x.buf, 1000) == 0 &&
	      memcmp(y.buf + 11000, x.buf + 4096, 2000) == 0,
	      "wr_rdma_write data (gather)");
	CHECK(memcmp(y.buf + 20000, want, 64) == 0,
	      "wr_rdma_write_imm inline data");
	CHECK(memcmp(x.buf + 200000, y.buf + 10000, 3000) == 0,
	      "wr_rdma_read data");
	CHECK(*(uint64_t *)(x.buf + 300000) == 1000 &&
	      *(uint64_t *)(x.buf + 300008) == 1005 && *ctr == 42,
	      "atomics: fetched %" PRIu64 ", compared %" PRIu64 ", now %" PRIu64,
	      *(uint64_t *)(x.buf + 300000), *(uint64_t *)(x.buf + 300008),
	      (uint64_t)*ctr);
	n = poll_n(y.cq, wc, 3);
	CHECK(n == 3, "3 receive completions, got %d", n);
	if (n == 3) {
		CHECK(wc[0].wr_id == 60 && wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      (wc[0].wc_flags & IBV_WC_WITH_IMM) &&
		      wc[0].imm_data == htobe32(0x0badcafe) && wc[0].byte_len == 64,
		      "WRITE_WITH_IMM received: opcode %d imm %#x len %u",
		      wc[0].opcode, be32toh(wc[0].imm_data), wc[0].byte_len);
		CHECK(wc[1].wr_id == 61 && wc[1].opcode == IBV_WC_RECV &&
		      wc[1].byte_len == 3000 &&
		      memcmp(y.buf + 110000, x.buf + 100, 3000) == 0,
		      "SEND received: len %u", wc[1].byte_len);
		CHECK(wc[2].wr_id == 62 && (wc[2].wc_flags & IBV_WC_WITH_IMM) &&
		      wc[2].imm_data == htobe32(0x11223344) &&
		      wc[2].byte_len == 33 &&
		      memcmp(y.buf + 120000, want, 33) == 0,
		      "SEND_WITH_IMM inline received: len %u imm %#x",
		      wc[2].byte_len, be32toh(wc[2].imm_data));
	}

	/* wr_abort: nothing reaches the peer. */
	memset(y.buf + 30000, 0, 64);
	ibv_wr_start(qpx);
	qpx->wr_id = 70;
	ibv_wr_rdma_write(qpx, y.mr->rkey, (uintptr_t)y.buf + 30000);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf, 64);
	ibv_wr_abort(qpx);
	CHECK(empty_for(x.cq, 0.2) && y.buf[30000] == 0 && y.buf[30063] == 0,
	      "wr_abort: no completion, no data");

	/* Errors: the whole batch is refused, nothing posted. */
	ibv_wr_start(qpx);
	qpx->wr_id = 71;
	ibv_wr_rdma_write(qpx, y.mr->rkey, (uintptr_t)y.buf + 30000);
	ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf, 64);
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, x.buf, qattr.cap.max_inline_data + 1);
	ret = ibv_wr_complete(qpx);
	CHECK(ret == EINVAL, "inline past max_inline_data: wr_complete %d", ret);
	ibv_wr_start(qpx);
	for (i = 0; i <= (int)qattr.cap.max_send_wr; i++) {
		qpx->wr_id = 72;
		ibv_wr_rdma_write(qpx, y.mr->rkey, (uintptr_t)y.buf + 30000);
		ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf, 64);
	}
	ret = ibv_wr_complete(qpx);
	CHECK(ret == ENOMEM, "max_send_wr + 1 in one batch: wr_complete %d",
	      ret);
	CHECK(empty_for(x.cq, 0.2) && y.buf[30000] == 0,
	      "refused batches post nothing");

	/* A full ring in one batch works, unsignaled but the last. */
	ibv_wr_start(qpx);
	for (i = 0; i < (int)qattr.cap.max_send_wr; i++) {
		qpx->wr_id = 80 + i;
		qpx->wr_flags = i == (int)qattr.cap.max_send_wr - 1 ?
					IBV_SEND_SIGNALED : 0;
		ibv_wr_rdma_write(qpx, y.mr->rkey,
				  (uintptr_t)y.buf + 40000 + i * 64);
		ibv_wr_set_sge(qpx, x.mr->lkey, (uintptr_t)x.buf + i * 64, 64);
	}
	ret = ibv_wr_complete(qpx);
	/* ibv_poll_cq reads a cq_ex too. */
	CHECK(ret == 0 && poll_n(x.cq, wc, 1) == 1 &&
	      wc[0].status == IBV_WC_SUCCESS &&
	      wc[0].wr_id == 80 + qattr.cap.max_send_wr - 1 &&
	      memcmp(y.buf + 40000, x.buf, 64 * qattr.cap.max_send_wr) == 0,
	      "a full ring in one batch: ret %d, wr_id %" PRIu64, ret,
	      wc[0].wr_id);

	ibv_destroy_qp(x.qp);
	ibv_destroy_qp(y.qp);
	ibv_dereg_mr(x.mr);
	ibv_dereg_mr(y.mr);
	CHECK(ibv_destroy_cq(x.cq) == 0 && ibv_destroy_cq(y.cq) == 0,
	      "destroy the CQs");
	free(x.buf);
	free(y.buf);
	printf("ok qp_ex/cq_ex\n");
}

/* ---- shared receive queues and UD ------------------------------------- */

/* wait_async waits up to ms for an async event; 1 with *ev filled, else 0. */
static int wait_async(struct ibv_async_event *ev, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

	if (poll(&p, 1, ms) != 1)
		return 0;
	return ibv_get_async_event(ctx, ev) == 0;
}

static void make_srq_end(struct end *e, struct ibv_srq *srq,
			 struct ibv_cq *shared_cq)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC, .srq = srq,
		.cap = { .max_send_wr = DEPTH, .max_send_sge = 1,
			 .max_recv_wr = DEPTH, .max_recv_sge = 1 },
	};

	e->cq = shared_cq;
	attr.send_cq = attr.recv_cq = e->cq;
	e->qp = ibv_create_qp(pd, &attr);
	if (!e->qp)
		die("ibv_create_qp with an SRQ");
	CHECK(attr.cap.max_recv_wr == 0 && attr.cap.max_recv_sge == 0,
	      "a QP on an SRQ has no receive queue: wr %u sge %u",
	      attr.cap.max_recv_wr, attr.cap.max_recv_sge);
	if (posix_memalign((void **)&e->buf, 4096, BUF_SIZE))
		die("posix_memalign");
	memset(e->buf, 0, BUF_SIZE);
	e->mr = ibv_reg_mr(pd, e->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!e->mr)
		die("ibv_reg_mr");
}

static void free_end(struct end *e, int own_cq)
{
	ibv_destroy_qp(e->qp);
	if (own_cq)
		ibv_destroy_cq(e->cq);
	ibv_dereg_mr(e->mr);
	free(e->buf);
}

static int post_srq1(struct ibv_srq *srq, uint64_t wr_id, struct ibv_sge *sge)
{
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = sge,
				  .num_sge = 1 }, *bad;

	return ibv_post_srq_recv(srq, &wr, &bad);
}

/*
 * Two RC QPs (r1, r2) take their receives from one SRQ, in the SRQ's
 * order, whichever QP a message arrives on; the limit event; an empty SRQ
 * is receiver-not-ready until a receive is posted (the record's notify
 * word asks for the doorbell); destroy refuses while QPs use the SRQ.
 */
static void check_srq(void)
{
	struct ibv_srq_init_attr sattr = {
		.attr = { .max_wr = 64, .max_sge = 2, .srq_limit = 0 },
	};
	struct ibv_srq_attr qa;
	struct ibv_qp_attr ea;
	struct ibv_device_attr da;
	struct ibv_async_event ev;
	struct end s1, s2, r1, r2, *src;
	struct ibv_cq *rcq;
	struct ibv_srq *srq;
	struct ibv_wc wc[8];
	struct ibv_sge sge;
	unsigned int seen = 0;
	int i, n, got, bad = 0;

	CHECK(ibv_query_device(ctx, &da) == 0 && da.max_srq > 0 &&
	      da.max_srq_wr >= 64 && da.max_srq_sge >= 2,
	      "device SRQ limits: max_srq %d wr %d sge %d", da.max_srq,
	      da.max_srq_wr, da.max_srq_sge);
	srq = ibv_create_srq(pd, &sattr);
	if (!srq) {
		CHECK(0, "ibv_create_srq: %s", strerror(errno));
		return;
	}
	CHECK(sattr.attr.max_wr >= 64 && sattr.attr.max_sge >= 2,
	      "SRQ caps granted: wr %u sge %u", sattr.attr.max_wr,
	      sattr.attr.max_sge);
	rcq = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
	if (!rcq)
		die("ibv_create_cq");
	make_end(&s1, NULL, 0);
	make_end(&s2, NULL, 0);
	make_srq_end(&r1, srq, rcq);
	make_srq_end(&r2, srq, rcq);
	connect_to(&s1, &r1);
	connect_to(&r1, &s1);
	connect_to(&s2, &r2);
	connect_to(&r2, &s2);

	sge = sge_of(&r1, 0, 64);
	CHECK(post_recv1(&r1, 1, &sge, 1) != 0,
	      "ibv_post_recv on a QP with an SRQ fails");

	/* 8 receives, 64 bytes each at offset 64 × i of r1's buffer. */
	for (i = 0; i < 8; i++) {
		sge = sge_of(&r1, 64 * i, 64);
		CHECK(post_srq1(srq, 100 + i, &sge) == 0, "post_srq_recv %d", i);
	}
	/* 4 SENDs from each sender, interleaved. */
	for (i = 0; i < 8; i++) {
		struct end *s = (i & 1) ? &s2 : &s1;

		fill(s->buf + 4096 + 64 * i, 48, 0x40 + i);
		sge = sge_of(s, 4096 + 64 * i, 48);
		CHECK(post_send1(s, IBV_WR_SEND, 200 + i, &sge, 1,
				 IBV_SEND_SIGNALED, NULL, 0) == 0, "send %d", i);
		CHECK(poll_n(s->cq, wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS,
		      "send %d completes: %s", i, ibv_wc_status_str(wc[0].status));
		CHECK(poll_n(rcq, wc, 1) == 1, "receive %d", i);
		if (wc[0].status != IBV_WC_SUCCESS || wc[0].wr_id < 100 ||
		    wc[0].wr_id >= 108) {
			bad++;
			continue;
		}
		/* The SRQ's order: the i-th message takes the i-th WQE. */
		CHECK(wc[0].wr_id == 100 + (uint64_t)i &&
		      wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 48,
		      "receive %d: wr_id %" PRIu64 " byte_len %u", i,
		      wc[0].wr_id, wc[0].byte_len);
		src = (i & 1) ? &r2 : &r1;
		CHECK(wc[0].qp_num == src->qp->qp_num,
		      "receive %d on QP %#x, want %#x", i, wc[0].qp_num,
		      src->qp->qp_num);
		seen |= 1u << (wc[0].wr_id - 100);
		CHECK(memcmp(r1.buf + 64 * (wc[0].wr_id - 100),
			     ((i & 1) ? s2.buf : s1.buf) + 4096 + 64 * i, 48) == 0,
		      "receive %d data", i);
	}
	CHECK(!bad && seen == 0xff, "8 SRQ WQEs consumed once each (%#x)", seen);

	/* The limit: 5 posted, armed at 4; fires when fewer than 4 remain. */
	for (i = 0; i < 5; i++) {
		sge = sge_of(&r1, 64 * i, 64);
		post_srq1(srq, 300 + i, &sge);
	}
	memset(&qa, 0, sizeof(qa));
	qa.srq_limit = 4;
	CHECK(ibv_modify_srq(srq, &qa, IBV_SRQ_LIMIT) == 0, "arm the limit");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 4 &&
	      qa.max_wr == sattr.attr.max_wr, "query_srq: limit %u, max_wr %u",
	      qa.srq_limit, qa.max_wr);
	qa.max_wr = 2 * sattr.attr.max_wr;
	CHECK(ibv_modify_srq(srq, &qa, IBV_SRQ_MAX_WR) != 0,
	      "resizing an SRQ is refused");
	CHECK(!wait_async(&ev, 300), "no limit event with 5 receives");
	sge = sge_of(&s1, 0, 8);
	post_send1(&s1, IBV_WR_SEND, 400, &sge, 1, IBV_SEND_SIGNALED, NULL, 0);
	post_send1(&s1, IBV_WR_SEND, 401, &sge, 1, IBV_SEND_SIGNALED, NULL, 0);
	n = poll_n(rcq, wc, 2);
	CHECK(n == 2 && wc[0].wr_id == 300 && wc[1].wr_id == 301,
	      "two receives from the armed SRQ: %d", n);
	poll_n(s1.cq, wc, 2);
	got = wait_async(&ev, 10000);
	CHECK(got && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      ev.element.srq == srq, "IBV_EVENT_SRQ_LIMIT_REACHED (got %s)",
	      got ? ibv_event_type_str(ev.event_type) : "none");
	if (got)
		ibv_ack_async_event(&ev);
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 0,
	      "the limit is disarmed once it fired: %u", qa.srq_limit);
	/* Drain the three still posted. */
	for (i = 0; i < 3; i++)
		post_send1(&s2, IBV_WR_SEND, 410 + i, &sge, 1,
			   IBV_SEND_SIGNALED, NULL, 0);
	CHECK(poll_n(rcq, wc, 3) == 3 && wc[2].wr_id == 304, "drained");
	poll_n(s2.cq, wc, 3);

	/* Empty SRQ: the SEND waits (RNR) until a receive is posted. */
	fill(s1.buf, 32, 0x77);
	sge = sge_of(&s1, 0, 32);
	post_send1(&s1, IBV_WR_SEND, 500, &sge, 1, IBV_SEND_SIGNALED, NULL, 0);
	CHECK(empty_for(rcq, 0.3), "no receive while the SRQ is empty");
	sge = sge_of(&r1, 8192, 64);
	post_srq1(srq, 501, &sge);
	CHECK(poll_n(rcq, wc, 1) == 1 && wc[0].wr_id == 501 &&
	      wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == 32 &&
	      memcmp(r1.buf + 8192, s1.buf, 32) == 0,
	      "the receive posted to an empty SRQ ends the wait");
	CHECK(poll_n(s1.cq, wc, 1) == 1 && wc[0].wr_id == 500 &&
	      wc[0].status == IBV_WC_SUCCESS, "the waiting SEND completes: %s",
	      ibv_wc_status_str(wc[0].status));

	/* A QP on the SRQ in ERR consumes no more: the last-WQE event. */
	memset(&ea, 0, sizeof(ea));
	ea.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(r2.qp, &ea, IBV_QP_STATE) == 0, "r2 to ERR");
	got = wait_async(&ev, 10000);
	CHECK(got && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
	      ev.element.qp == r2.qp, "IBV_EVENT_QP_LAST_WQE_REACHED (got %s)",
	      got ? ibv_event_type_str(ev.event_type) : "none");
	if (got)
		ibv_ack_async_event(&ev);

	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroy_srq with QPs on it: EBUSY");
	free_end(&r1, 0);
	free_end(&r2, 0);
	free_end(&s1, 1);
	free_end(&s2, 1);
	ibv_destroy_cq(rcq);
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	printf("ok srq\n");
}

static struct ibv_qp *make_ud(struct ibv_cq *cq, uint32_t qkey)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_UD, .send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = qkey };
	struct ibv_qp *qp;

	qp = ibv_create_qp(pd, &attr);
	if (!qp) {
		CHECK(0, "ibv_create_qp(UD): %s", strerror(errno));
		return NULL;
	}
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				      IBV_QP_PORT | IBV_QP_QKEY))
		die("modify_qp UD INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("modify_qp UD RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify_qp UD RTS");
	return qp;
}

static int post_ud(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn,
		   uint32_t qkey, uint64_t wr_id, struct ibv_sge *sge,
		   enum ibv_wr_opcode op, unsigned int flags)
{
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = sge,
				  .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED | flags,
				  .imm_data = htobe32(0xa1b2c3d4) }, *bad;

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(qp, &wr, &bad);
}

/*
 * The network header a UD receive starts with (docs/spec.md, Semantics
 * (UD)): an IPv6 header for IPv6 GIDs, 20 zero bytes and an IPv4 header
 * for IPv4-mapped ones; sender and receiver are the same GID here.
 */
static int grh_ok(const uint8_t *g, uint32_t payload)
{
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	static const uint8_t zero[20];

	if (!memcmp(gid.raw, v4mapped, 12))
		return !memcmp(g, zero, 20) && g[20] == 0x45 && g[29] == 17 &&
		       ((g[22] << 8) | g[23]) == 20 + 8 + 12 + 8 + payload + 4 &&
		       !memcmp(g + 32, gid.raw + 12, 4) &&
		       !memcmp(g + 36, gid.raw + 12, 4);
	return (g[0] >> 4) == 6 && g[6] == 17 &&
	       ((g[4] << 8) | g[5]) == 8 + 12 + 8 + payload + 4 &&
	       !memcmp(g + 8, gid.raw, 16) && !memcmp(g + 24, gid.raw, 16);
}

/*
 * Two UD QPs of the device: datagrams with and without immediate data,
 * inline, the GRH in the first 40 bytes, src_qp; a wrong Q_Key is
 * dropped; bit 31 of remote_qkey sends the QP's own; a UD QP refuses RDMA
 * opcodes at post; a datagram above the MTU is LOC_LEN_ERR.
 */
static void check_ud(void)
{
	const uint32_t qkey = 0x11111111;
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	struct ibv_qp_init_attr qi;
	struct ibv_qp *u1, *u2;
	struct ibv_qp_attr qa;
	struct ibv_cq *c1, *c2;
	struct ibv_sge rs, ss;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	struct ibv_ah *ah;
	struct end m;
	uint32_t mtu_bytes = 128u << mtu;
	int i;

	c1 = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
	c2 = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
	if (!c1 || !c2)
		die("ibv_create_cq");
	u1 = make_ud(c1, qkey);
	u2 = make_ud(c2, qkey);
	if (!u1 || !u2)
		return;
	CHECK(ibv_query_qp(u2, &qa, IBV_QP_QKEY | IBV_QP_STATE, &qi) == 0 &&
	      qa.qkey == qkey && qa.qp_state == IBV_QPS_RTS &&
	      qi.qp_type == IBV_QPT_UD, "query_qp UD: qkey %#x state %d",
	      qa.qkey, qa.qp_state);
	aa.grh.dgid = gid;
	aa.grh.sgid_index = gid_index;
	aa.grh.hop_limit = 1;
	ah = ibv_create_ah(pd, &aa);
	if (!ah) {
		CHECK(0, "ibv_create_ah: %s", strerror(errno));
		return;
	}
	if (posix_memalign((void **)&m.buf, 4096, BUF_SIZE))
		die("posix_memalign");
	memset(m.buf, 0, BUF_SIZE);
	m.mr = ibv_reg_mr(pd, m.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!m.mr)
		die("ibv_reg_mr");

	/* Receives of 40 + 256 bytes at 512 × i from offset 64 KiB. */
	for (i = 0; i < 6; i++) {
		rs = sge_of(&m, 65536 + 512 * i, 40 + 256);
		rwr = (struct ibv_recv_wr){ .wr_id = 600 + i, .sg_list = &rs,
					    .num_sge = 1 };
		CHECK(ibv_post_recv(u2, &rwr, &rbad) == 0, "post_recv %d", i);
	}

	fill(m.buf, 200, 0x31);
	ss = sge_of(&m, 0, 200);
	CHECK(post_ud(u1, ah, u2->qp_num, qkey, 700, &ss, IBV_WR_SEND, 0) == 0,
	      "UD SEND");
	CHECK(poll_n(c1, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.wr_id == 700, "UD SEND completes: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(poll_n(c2, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.wr_id == 600 && wc.opcode == IBV_WC_RECV &&
	      (wc.wc_flags & IBV_WC_GRH) && !(wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.byte_len == 40 + 200 && wc.src_qp == u1->qp_num &&
	      wc.qp_num == u2->qp_num,
	      "UD receive: %s flags %#x len %u src_qp %#x",
	      ibv_wc_status_str(wc.status), wc.wc_flags, wc.byte_len, wc.src_qp);
	CHECK(grh_ok(m.buf + 65536, 200), "the GRH names both GIDs");
	CHECK(memcmp(m.buf + 65536 + 40, m.buf, 200) == 0, "UD payload");

	/* SEND_WITH_IMM, inline; the source is overwritten after posting. */
	fill(m.buf + 1024, 60, 0x52);
	memcpy(m.buf + 2048, m.buf + 1024, 60);
	ss = sge_of(&m, 1024, 60);
	CHECK(post_ud(u1, ah, u2->qp_num, qkey, 701, &ss, IBV_WR_SEND_WITH_IMM,
		      IBV_SEND_INLINE) == 0, "UD inline SEND_WITH_IMM");
	memset(m.buf + 1024, 0, 60);
	CHECK(poll_n(c1, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS, "sent");
	CHECK(poll_n(c2, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.wr_id == 601 && (wc.wc_flags & IBV_WC_GRH) &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) &&
	      wc.imm_data == htobe32(0xa1b2c3d4) && wc.byte_len == 40 + 60,
	      "UD receive with immediate: flags %#x imm %#x len %u",
	      wc.wc_flags, wc.imm_data, wc.byte_len);
	CHECK(memcmp(m.buf + 65536 + 512 + 40, m.buf + 2048, 60) == 0,
	      "UD inline payload");

	/* Another Q_Key: dropped; the sender learns nothing. */
	ss = sge_of(&m, 0, 16);
	post_ud(u1, ah, u2->qp_num, 0x22222222, 702, &ss, IBV_WR_SEND, 0);
	CHECK(poll_n(c1, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS,
	      "a datagram with a wrong Q_Key still completes at the sender");
	CHECK(empty_for(c2, 0.5), "and is not received");
	/* Bit 31: the sender's own Q_Key, which is the receiver's. */
	post_ud(u1, ah, u2->qp_num, 0x80000000, 703, &ss, IBV_WR_SEND, 0);
	CHECK(poll_n(c1, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS, "sent");
	CHECK(poll_n(c2, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.wr_id == 602 && wc.byte_len == 40 + 16,
	      "remote_qkey with bit 31 uses the QP's Q_Key: wr_id %" PRIu64,
	      wc.wr_id);

	/* RDMA on a UD QP is refused at post. */
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &ss;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)m.buf;
	wr.wr.rdma.rkey = m.mr->rkey;
	CHECK(ibv_post_send(u1, &wr, &bad) == EINVAL && bad == &wr,
	      "RDMA_WRITE on a UD QP: EINVAL");

	/* Above the MTU: LOC_LEN_ERR (the sender QP is in ERR after it). */
	ss = sge_of(&m, 0, mtu_bytes + 1);
	post_ud(u1, ah, u2->qp_num, qkey, 704, &ss, IBV_WR_SEND, 0);
	CHECK(poll_n(c1, &wc, 1) == 1 && wc.status == IBV_WC_LOC_LEN_ERR &&
	      wc.wr_id == 704, "a datagram of MTU + 1 bytes: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(empty_for(c2, 0.3), "nothing received");

	CHECK(ibv_destroy_qp(u1) == 0 && ibv_destroy_qp(u2) == 0, "destroy UD QPs");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");
	ibv_destroy_cq(c1);
	ibv_destroy_cq(c2);
	ibv_dereg_mr(m.mr);
	free(m.buf);
	printf("ok ud\n");
}

static void check_errors(struct end *a, struct end *b)
{
	struct ibv_sge s = sge_of(a, 0, 64);
	struct ibv_send_wr wr, *bad;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_wc wc[2];

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 81;
	wr.sg_list = &s;
	wr.num_sge = 4; /* more than the QP's max_send_sge: refused at post */
	wr.opcode = IBV_WR_RDMA_WRITE;
	ibv_query_qp(a->qp, &qa, IBV_QP_CAP, &qi);
	wr.num_sge = qi.cap.max_send_sge + 1;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == EINVAL && bad == &wr,
	      "too many SGEs: EINVAL");
	wr.num_sge = 1;
	wr.opcode = (enum ibv_wr_opcode)77;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == EINVAL, "unknown opcode: EINVAL");

	/* A bad rkey: REM_ACCESS_ERR, the QP goes to ERR, the next WR flushes. */
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
	wr.wr.rdma.rkey = b->mr->rkey ^ 0x5a5a00;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post with a bad rkey");
	CHECK(poll_n(a->cq, wc, 1) == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR &&
	      wc[0].wr_id == 81, "bad rkey: status %s",
	      ibv_wc_status_str(wc[0].status));
	wr.wr_id = 82;
	wr.wr.rdma.rkey = b->mr->rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post after the error");
	CHECK(poll_n(a->cq, wc, 1) == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR &&
	      wc[0].wr_id == 82, "flushed: status %s",
	      ibv_wc_status_str(wc[0].status));
	CHECK(ibv_query_qp(a->qp, &qa, IBV_QP_STATE, &qi) == 0 &&
	      qa.qp_state == IBV_QPS_ERR, "QP state %d, want ERR", qa.qp_state);
	printf("ok errors\n");
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_port_attr port;
	struct end a, b;
	int n, i;

	list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no RDMA device");
	for (i = 0; i < n; i++)
		if (argc < 2 || !strcmp(ibv_get_device_name(list[i]), argv[1]))
			break;
	if (i == n)
		die("no such device");
	if (argc > 2)
		gid_index = atoi(argv[2]);
	ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("ibv_open_device");
	if (ibv_query_port(ctx, 1, &port))
		die("ibv_query_port");
	mtu = port.active_mtu;
	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		die("ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd");
	channel = ibv_create_comp_channel(ctx);
	if (!channel)
		die("ibv_create_comp_channel");
	printf("device %s gid[%d] mtu %d\n", ibv_get_device_name(list[i]),
	       gid_index, 128 << mtu);

	make_end(&a, NULL, 0);
	make_end(&b, NULL, 0);
	connect_to(&a, &b);
	connect_to(&b, &a);

	check_write_read(&a, &b);
	check_send_imm(&a, &b);
	check_atomics(&a, &b);
	check_inline(&a, &b);
	check_wrap_and_unsignaled(&a, &b);
	check_sig_all();
	check_full_rq(&b);
	check_events();
	check_qp_ex();
	check_srq();
	check_ud();
	check_errors(&a, &b);

	if (failed)
		printf("verbs_check: %d of %d checks FAILED\n", failed,
		       passed + failed);
	else
		printf("verbs_check: all %d checks passed\n", passed);
	return failed ? 1 : 0;
}
