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
 * completion events (and solicited-only arming), and an error completion
 * followed by flushes.
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
	check_errors(&a, &b);

	if (failed)
		printf("verbs_check: %d of %d checks FAILED\n", failed,
		       passed + failed);
	else
		printf("verbs_check: all %d checks passed\n", passed);
	return failed ? 1 : 0;
}
