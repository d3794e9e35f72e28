// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vrdma-mw-check: memory windows between two hosts, through libibverbs
 * only (no vrdma-specific call), as the verbs specification defines them:
 *
 *   vrdma-mw-check [-d DEV] [-g GID_INDEX] server
 *   vrdma-mw-check [-d DEV] [-g GID_INDEX] client SERVER_ADDR
 *
 * The server (the responder) registers a 64 KiB MR with MW_BIND, binds a
 * type 1 window with ibv_bind_mw and two type 2 windows with
 * IBV_WR_BIND_MW, each to a 4 KiB range of its own, on RC QPs 0 and 1 of
 * five connected pairs; the client then:
 *
 *   1. writes a pattern through the type 1 window (QP 0) and reads it back;
 *   2. writes through the type 2 window bound to server QP 0, on QP 0;
 *   3. sends SEND_WITH_INV naming the type 2 window of server QP 1: the
 *      server's receive completes with IBV_WC_WITH_INV and that key;
 *   4. writes through the type 2 window of QP 0 on QP 2, which that window
 *      is not bound to: REM_ACCESS_ERR;
 *   5. writes past the type 1 window's end on QP 3: REM_ACCESS_ERR;
 * the server checks that its MR changed exactly where 1 and 2 wrote, then
 * invalidates its QP 0 window (IBV_WR_LOCAL_INV) and unbinds the type 1
 * window (length 0), and the client finds both keys dead (REM_ACCESS_ERR
 * on QPs 0 and 4) and the window SEND_WITH_INV freed dead too (QP 1).
 *
 * Every step prints "MW-CHECK ok <what>"; the last line is "MW-CHECK
 * PASSED" (exit 0) or the first failure, "MW-CHECK FAILED <what>" (exit 1).
 * The two sides meet over TCP port 18800 (the QP numbers, PSNs, GID and the
 * windows' keys and addresses); everything else is RDMA.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>

#define NQP		5
#define BUF_SIZE	(64 * 1024)
#define WIN_SIZE	4096
#define WIN1_OFF	4096	/* type 1 window */
#define WIN2A_OFF	8192	/* type 2, server QP 0 */
#define WIN2B_OFF	12288	/* type 2, server QP 1 (SEND_WITH_INV) */
#define TCP_PORT	18800
#define POLL_SECONDS	30

struct peer {
	uint32_t qpn[NQP];
	uint32_t psn[NQP];
	uint8_t gid[16];
	uint64_t win1, win2a, win2b;	/* addresses */
	uint32_t rkey1, rkey2a, rkey2b;
	uint32_t pad;
};

static const char *dev_name = "vrdma0";
static int gid_index = 1;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_qp *qp[NQP];
static uint8_t *buf;
static int sock = -1;

static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("MW-CHECK FAILED ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	exit(1);
}

static void ok(const char *what)
{
	printf("MW-CHECK ok %s\n", what);
	fflush(stdout);
}

/* The next completion, whatever its QP; bounded by POLL_SECONDS. */
static struct ibv_wc wait_wc(const char *what)
{
	time_t end = time(NULL) + POLL_SECONDS;
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("%s: ibv_poll_cq: %d", what, n);
		if (n == 1)
			return wc;
		if (time(NULL) > end)
			fail("%s: no completion in %d s", what, POLL_SECONDS);
		usleep(100);
	}
}

static void expect_wc(const char *what, enum ibv_wc_status status,
		      enum ibv_wc_opcode opcode)
{
	struct ibv_wc wc = wait_wc(what);

	if (wc.status != status)
		fail("%s: status %s, want %s", what,
		     ibv_wc_status_str(wc.status), ibv_wc_status_str(status));
	if (status == IBV_WC_SUCCESS && wc.opcode != opcode)
		fail("%s: opcode %d, want %d", what, wc.opcode, opcode);
	ok(what);
}

static void xfer(void *p, size_t n, int out)
{
	uint8_t *b = p;
	ssize_t r;

	while (n) {
		r = out ? write(sock, b, n) : read(sock, b, n);
		if (r <= 0)
			fail("exchange: %s", r ? strerror(errno) : "peer closed");
		b += r;
		n -= r;
	}
}

/* One byte over TCP: the two sides' steps stay in order. */
static void sync_peer(void)
{
	uint8_t c = 1;

	xfer(&c, 1, 1);
	xfer(&c, 1, 0);
}

static void tcp_connect(const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons(TCP_PORT) };
	int i, one = 1, l;

	if (!host) {
		l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) ||
		    listen(l, 1))
			fail("listen: %s", strerror(errno));
		sock = accept(l, NULL, NULL);
		close(l);
		if (sock < 0)
			fail("accept: %s", strerror(errno));
		return;
	}
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
		struct hostent *h = gethostbyname(host);

		if (!h)
			fail("cannot resolve %s", host);
		memcpy(&a.sin_addr, h->h_addr_list[0], 4);
	}
	for (i = 0; i < 300; i++) {
		sock = socket(AF_INET, SOCK_STREAM, 0);
		if (!connect(sock, (struct sockaddr *)&a, sizeof(a)))
			return;
		close(sock);
		usleep(100000);
	}
	fail("connect %s: %s", host, strerror(errno));
}

static void setup(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	int i;

	for (i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		fail("no device %s", dev_name);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = aligned_alloc(4096, BUF_SIZE);
	if (!pd || !cq || !buf)
		fail("pd/cq/buf: %s", strerror(errno));
	memset(buf, 0x5a, BUF_SIZE);
	mr = ibv_reg_mr(pd, buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_MW_BIND);
	if (!mr)
		fail("ibv_reg_mr with MW_BIND: %s", strerror(errno));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	for (i = 0; i < NQP; i++) {
		qp[i] = ibv_create_qp(pd, &qa);
		if (!qp[i])
			fail("ibv_create_qp: %s", strerror(errno));
	}
}

static void connect_qps(const struct peer *me, const struct peer *them)
{
	struct ibv_qp_attr a;
	int i;

	for (i = 0; i < NQP; i++) {
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ;
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			fail("QP %d to INIT: %s", i, strerror(errno));
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = them->qpn[i];
		a.rq_psn = them->psn[i];
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.ah_attr.is_global = 1;
		a.ah_attr.port_num = 1;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.sgid_index = gid_index;
		memcpy(a.ah_attr.grh.dgid.raw, them->gid, 16);
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_AV |
				  IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
			fail("QP %d to RTR: %s", i, strerror(errno));
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = me->psn[i];
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
				  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
			fail("QP %d to RTS: %s", i, strerror(errno));
	}
}

static void post(struct ibv_qp *q, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad;
	int err;

	wr->send_flags |= IBV_SEND_SIGNALED;
	err = ibv_post_send(q, wr, &bad);
	if (err)
		fail("%s: ibv_post_send: %s", what, strerror(err));
}

static void bind2(int i, struct ibv_mw *mw, uint64_t off, unsigned int acc)
{
	struct ibv_send_wr wr = { .opcode = IBV_WR_BIND_MW };

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
		.addr = (uintptr_t)buf + off, .length = WIN_SIZE,
		.mw_access_flags = acc };
	post(qp[i], &wr, "IBV_WR_BIND_MW");
	expect_wc("type 2 bind (IBV_WR_BIND_MW)", IBV_WC_SUCCESS,
		  IBV_WC_BIND_MW);
	if (mw->rkey != wr.bind_mw.rkey)
		fail("type 2 window's rkey %#x, bound as %#x", mw->rkey,
		     wr.bind_mw.rkey);
}

/* An RDMA WRITE or READ of len bytes at local offset loff. */
static void rdma(int i, enum ibv_wr_opcode op, uint64_t raddr, uint32_t rkey,
		 uint64_t loff, uint32_t len, enum ibv_wc_status want,
		 const char *what)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf + loff, .length = len,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = { .opcode = op, .sg_list = &sge,
				  .num_sge = 1 };

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	post(qp[i], &wr, what);
	expect_wc(what, want, op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ :
						       IBV_WC_RDMA_WRITE);
}

static void server(void)
{
	struct peer me = {}, them;
	struct ibv_mw *mw1, *mw2a, *mw2b;
	struct ibv_mw_bind b1 = {};
	struct ibv_sge rsge = { .addr = (uintptr_t)buf + 60000, .length = 64 };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 };
	struct ibv_send_wr inv = { .opcode = IBV_WR_LOCAL_INV }, *bad;
	struct ibv_recv_wr *rbad;
	struct ibv_wc wc;
	uint32_t old1, old2a;
	size_t i;
	int err;

	mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	mw2a = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	mw2b = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!mw1 || !mw2a || !mw2b)
		fail("ibv_alloc_mw: %s", strerror(errno));
	ok("ibv_alloc_mw types 1 and 2");

	tcp_connect(NULL);
	for (i = 0; i < NQP; i++) {
		me.qpn[i] = qp[i]->qp_num;
		me.psn[i] = (lrand48() & 0xffffff);
	}
	if (ibv_query_gid(ctx, 1, gid_index, (union ibv_gid *)me.gid))
		fail("ibv_query_gid %d", gid_index);
	xfer(&me, sizeof(me), 1);
	xfer(&them, sizeof(them), 0);
	connect_qps(&me, &them);

	rsge.lkey = mr->lkey;
	if (ibv_post_recv(qp[1], &rwr, &rbad))
		fail("ibv_post_recv");
	b1.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
		.addr = (uintptr_t)buf + WIN1_OFF, .length = WIN_SIZE,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ };
	b1.send_flags = IBV_SEND_SIGNALED;
	old1 = mw1->rkey;
	err = ibv_bind_mw(qp[0], mw1, &b1);
	if (err)
		fail("ibv_bind_mw: %s", strerror(err));
	expect_wc("type 1 bind (ibv_bind_mw)", IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	if ((mw1->rkey & 0xff) != ((old1 + 1) & 0xff) ||
	    (mw1->rkey >> 8) != (old1 >> 8))
		fail("type 1 rkey %#x after bind, was %#x", mw1->rkey, old1);
	bind2(0, mw2a, WIN2A_OFF, IBV_ACCESS_REMOTE_WRITE |
		  IBV_ACCESS_REMOTE_READ);
	bind2(1, mw2b, WIN2B_OFF, IBV_ACCESS_REMOTE_WRITE);

	me.win1 = (uintptr_t)buf + WIN1_OFF;
	me.win2a = (uintptr_t)buf + WIN2A_OFF;
	me.win2b = (uintptr_t)buf + WIN2B_OFF;
	me.rkey1 = mw1->rkey;
	me.rkey2a = mw2a->rkey;
	me.rkey2b = mw2b->rkey;
	xfer(&me, sizeof(me), 1);

	/* The client's steps 1-5. */
	wc = wait_wc("SEND_WITH_INV receive");
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
	    !(wc.wc_flags & IBV_WC_WITH_INV) ||
	    wc.invalidated_rkey != mw2b->rkey)
		fail("SEND_WITH_INV receive: status %s opcode %d flags %#x key %#x, want key %#x",
		     ibv_wc_status_str(wc.status), wc.opcode, wc.wc_flags,
		     wc.invalidated_rkey, mw2b->rkey);
	ok("SEND_WITH_INV received with IBV_WC_WITH_INV and the window's key");
	sync_peer();
	for (i = 0; i < BUF_SIZE; i++) {
		uint8_t want = 0x5a;

		if (i >= WIN1_OFF && i < WIN1_OFF + WIN_SIZE)
			want = (uint8_t)(i * 7 + 1);
		else if (i >= WIN2A_OFF && i < WIN2A_OFF + WIN_SIZE)
			want = (uint8_t)(i * 13 + 3);
		else if (i >= 60000 && i < 60000 + 64)
			want = 0x77;	/* the SEND_WITH_INV's payload */
		if (buf[i] != want)
			fail("server byte %zu = %#x, want %#x", i, buf[i],
			     want);
	}
	ok("the MR changed exactly where the windows were written");

	/* Invalidate the QP 0 window and unbind the type 1 window. */
	old2a = mw2a->rkey;
	inv.invalidate_rkey = old2a;
	inv.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(qp[0], &inv, &bad))
		fail("LOCAL_INV post");
	expect_wc("IBV_WR_LOCAL_INV of a type 2 window", IBV_WC_SUCCESS,
		  IBV_WC_LOCAL_INV);
	/* An unbind names no MR and no range (libibverbs checks that). */
	b1.bind_info = (struct ibv_mw_bind_info){};
	err = ibv_bind_mw(qp[0], mw1, &b1);
	if (err)
		fail("ibv_bind_mw (unbind): %s", strerror(err));
	expect_wc("type 1 unbind (length 0)", IBV_WC_SUCCESS, IBV_WC_BIND_MW);
	sync_peer();
	/* The client's last steps; then everything goes. */
	sync_peer();
	if (ibv_dealloc_mw(mw1) || ibv_dealloc_mw(mw2a) || ibv_dealloc_mw(mw2b))
		fail("ibv_dealloc_mw: %s", strerror(errno));
	ok("ibv_dealloc_mw");
}

static void client(const char *host)
{
	struct peer me = {}, them;
	struct ibv_sge sge = { .length = 64 };
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND_WITH_INV,
				  .sg_list = &sge, .num_sge = 1 };
	size_t i;

	tcp_connect(host);
	for (i = 0; i < NQP; i++) {
		me.qpn[i] = qp[i]->qp_num;
		me.psn[i] = (lrand48() & 0xffffff);
	}
	if (ibv_query_gid(ctx, 1, gid_index, (union ibv_gid *)me.gid))
		fail("ibv_query_gid %d", gid_index);
	xfer(&them, sizeof(them), 0);
	xfer(&me, sizeof(me), 1);
	connect_qps(&me, &them);
	xfer(&them, sizeof(them), 0);

	for (i = 0; i < WIN_SIZE; i++) {
		buf[i] = (uint8_t)((i + WIN1_OFF) * 7 + 1);
		buf[WIN_SIZE + i] = (uint8_t)((i + WIN2A_OFF) * 13 + 3);
	}
	memset(buf + 3 * WIN_SIZE, 0x77, 64);
	rdma(0, IBV_WR_RDMA_WRITE, them.win1, them.rkey1, 0, WIN_SIZE,
	     IBV_WC_SUCCESS, "RDMA WRITE through the type 1 window");
	rdma(0, IBV_WR_RDMA_READ, them.win1, them.rkey1, 2 * WIN_SIZE,
	     WIN_SIZE, IBV_WC_SUCCESS, "RDMA READ through the type 1 window");
	if (memcmp(buf, buf + 2 * WIN_SIZE, WIN_SIZE))
		fail("READ through the window returned other bytes");
	ok("READ returned what WRITE wrote");
	rdma(0, IBV_WR_RDMA_WRITE, them.win2a, them.rkey2a, WIN_SIZE, WIN_SIZE,
	     IBV_WC_SUCCESS, "RDMA WRITE through the type 2 window of its QP");
	sge.addr = (uintptr_t)buf + 3 * WIN_SIZE;
	sge.lkey = mr->lkey;
	wr.invalidate_rkey = them.rkey2b;
	post(qp[1], &wr, "SEND_WITH_INV");
	expect_wc("SEND_WITH_INV of the QP 1 window", IBV_WC_SUCCESS,
		  IBV_WC_SEND);
	rdma(2, IBV_WR_RDMA_WRITE, them.win2a, them.rkey2a, WIN_SIZE, 64,
	     IBV_WC_REM_ACCESS_ERR,
	     "a type 2 window refuses another QP (REM_ACCESS_ERR)");
	rdma(3, IBV_WR_RDMA_WRITE, them.win1 + WIN_SIZE - 8, them.rkey1, 0, 16,
	     IBV_WC_REM_ACCESS_ERR,
	     "a write past the window's end (REM_ACCESS_ERR)");
	sync_peer();
	/* The server invalidated and unbound its windows. */
	sync_peer();
	rdma(1, IBV_WR_RDMA_WRITE, them.win2b, them.rkey2b, 0, 64,
	     IBV_WC_REM_ACCESS_ERR,
	     "the window SEND_WITH_INV freed is dead (REM_ACCESS_ERR)");
	rdma(0, IBV_WR_RDMA_WRITE, them.win2a, them.rkey2a, 0, 64,
	     IBV_WC_REM_ACCESS_ERR,
	     "the window LOCAL_INV freed is dead (REM_ACCESS_ERR)");
	rdma(4, IBV_WR_RDMA_READ, them.win1, them.rkey1, 0, 64,
	     IBV_WC_REM_ACCESS_ERR,
	     "the unbound type 1 window is dead (REM_ACCESS_ERR)");
	sync_peer();
}

int main(int argc, char **argv)
{
	int opt;

	setvbuf(stdout, NULL, _IOLBF, 0);
	srand48(getpid() ^ time(NULL));
	while ((opt = getopt(argc, argv, "d:g:")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'g':
			gid_index = atoi(optarg);
			break;
		default:
			goto usage;
		}
	}
	if (optind < argc && !strcmp(argv[optind], "server") &&
	    optind + 1 == argc) {
		setup();
		server();
	} else if (optind + 1 < argc && !strcmp(argv[optind], "client") &&
		   optind + 2 == argc) {
		setup();
		client(argv[optind + 1]);
	} else {
		goto usage;
	}
	printf("MW-CHECK PASSED\n");
	return 0;
usage:
	fprintf(stderr, "usage: vrdma-mw-check [-d DEV] [-g GID_INDEX] server | client SERVER\n");
	return 2;
}
