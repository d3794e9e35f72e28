//go:build cgo && linux

/*
 * shim.c: libibverbs through dlopen/dlsym, and the data-path helpers.
 * See shim.h and doc.go. Nothing here names an exported ibv_* function
 * except inside __typeof__, which emits no reference.
 */
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* The exported functions the package needs; load fails without any. */
#define VIBV_REQUIRED(X)                                                       \
	X(ibv_get_device_list)                                                 \
	X(ibv_free_device_list)                                                \
	X(ibv_get_device_name)                                                 \
	X(ibv_get_device_guid)                                                 \
	X(ibv_open_device)                                                     \
	X(ibv_close_device)                                                    \
	X(ibv_query_device)                                                    \
	X(ibv_query_port) /* the compat symbol ___ibv_query_port falls back to */ \
	X(ibv_query_gid)                                                       \
	X(ibv_alloc_pd)                                                        \
	X(ibv_dealloc_pd)                                                      \
	X(ibv_reg_mr_iova2)                                                    \
	X(ibv_dereg_mr)                                                        \
	X(ibv_create_comp_channel)                                             \
	X(ibv_destroy_comp_channel)                                            \
	X(ibv_create_cq)                                                       \
	X(ibv_destroy_cq)                                                      \
	X(ibv_get_cq_event)                                                    \
	X(ibv_ack_cq_events)                                                   \
	X(ibv_create_qp)                                                       \
	X(ibv_modify_qp)                                                       \
	X(ibv_query_qp)                                                        \
	X(ibv_destroy_qp)                                                      \
	X(ibv_get_async_event)                                                 \
	X(ibv_ack_async_event)

/* Optional: rdma-core >= 32 (IBVERBS_1.11); GIDType falls back to sysfs. */
#define VIBV_OPTIONAL(X) X(_ibv_query_gid_ex)

/* The resolved functions; set once, whole, by a successful vibv_load. */
#define VIBV_FIELD(name) __typeof__(name) *p_##name;
static struct vibv_fns {
	VIBV_REQUIRED(VIBV_FIELD)
	VIBV_OPTIONAL(VIBV_FIELD)
} F;

int vibv_load(const char *path, char *err, size_t errlen)
{
	struct vibv_fns f;
	void *h;
	const char *e;

	memset(&f, 0, sizeof(f));
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
#define VIBV_SYM(name)                                                         \
	f.p_##name = (__typeof__(name) *)dlsym(h, #name);                      \
	if (!f.p_##name) {                                                     \
		e = dlerror();                                                 \
		snprintf(err, errlen, "symbol %s: %s", #name,                  \
			 e ? e : "not found");                                 \
		dlclose(h);                                                    \
		return -1;                                                     \
	}
	VIBV_REQUIRED(VIBV_SYM)
#define VIBV_OPT(name) f.p_##name = (__typeof__(name) *)dlsym(h, #name);
	VIBV_OPTIONAL(VIBV_OPT)
	/* The handle stays open for the life of the process. */
	F = f;
	return 0;
}

int vibv_have_query_gid_ex(void) { return F.p__ibv_query_gid_ex != NULL; }

struct ibv_device **vibv_get_device_list(int *n) { return F.p_ibv_get_device_list(n); }
void vibv_free_device_list(struct ibv_device **l) { F.p_ibv_free_device_list(l); }
const char *vibv_get_device_name(struct ibv_device *d) { return F.p_ibv_get_device_name(d); }
uint64_t vibv_get_device_guid(struct ibv_device *d) { return be64toh(F.p_ibv_get_device_guid(d)); }
struct ibv_context *vibv_open_device(struct ibv_device *d) { return F.p_ibv_open_device(d); }
int vibv_close_device(struct ibv_context *c) { return F.p_ibv_close_device(c); }
const char *vibv_context_name(struct ibv_context *c) { return F.p_ibv_get_device_name(c->device); }
int vibv_async_fd(struct ibv_context *c) { return c->async_fd; }
int vibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) { return F.p_ibv_query_device(c, a); }

/* ___ibv_query_port of verbs.h, with the compat call through the pointer. */
int vibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);

	memset(a, 0, sizeof(*a));
	if (!vctx)
		return F.p_ibv_query_port(c, port, (struct _compat_ibv_port_attr *)a);
	return vctx->query_port(c, port, a, sizeof(*a));
}

int vibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	return F.p_ibv_query_gid(c, port, index, gid);
}

/* 0 and *type, an errno value, or -1 when the library lacks the call. */
int vibv_query_gid_type(struct ibv_context *c, uint32_t port, uint32_t index, uint32_t *type)
{
	struct ibv_gid_entry e;
	int ret;

	if (!F.p__ibv_query_gid_ex)
		return -1;
	memset(&e, 0, sizeof(e));
	ret = F.p__ibv_query_gid_ex(c, port, index, &e, 0, sizeof(e));
	if (ret)
		return ret < 0 ? -ret : ret;
	*type = e.gid_type;
	return 0;
}

/* -1 with errno (EAGAIN on a non-blocking fd without an event), or 0. */
int vibv_get_async_event(struct ibv_context *c, struct vibv_async_event *out)
{
	struct ibv_async_event ev;

	if (F.p_ibv_get_async_event(c, &ev))
		return -1;
	memset(out, 0, sizeof(*out));
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		out->has_cq = 1;
		out->cq_context = (uintptr_t)ev.element.cq->cq_context;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->has_qp = 1;
		out->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port_num = ev.element.port_num;
		break;
	default:
		break;
	}
	F.p_ibv_ack_async_event(&ev);
	return 0;
}

struct ibv_pd *vibv_alloc_pd(struct ibv_context *c) { return F.p_ibv_alloc_pd(c); }
int vibv_dealloc_pd(struct ibv_pd *pd) { return F.p_ibv_dealloc_pd(pd); }

struct ibv_mr *vibv_reg_mr_iova2(struct ibv_pd *pd, uintptr_t addr, size_t length, uint64_t iova, unsigned int access)
{
	return F.p_ibv_reg_mr_iova2(pd, (void *)addr, length, iova, access);
}

int vibv_dereg_mr(struct ibv_mr *mr) { return F.p_ibv_dereg_mr(mr); }

struct ibv_comp_channel *vibv_create_comp_channel(struct ibv_context *c) { return F.p_ibv_create_comp_channel(c); }
int vibv_destroy_comp_channel(struct ibv_comp_channel *ch) { return F.p_ibv_destroy_comp_channel(ch); }
int vibv_comp_channel_fd(struct ibv_comp_channel *ch) { return ch->fd; }

struct ibv_cq *vibv_create_cq(struct ibv_context *c, int cqe, uintptr_t cq_context, struct ibv_comp_channel *ch)
{
	return F.p_ibv_create_cq(c, cqe, (void *)cq_context, ch, 0);
}

int vibv_destroy_cq(struct ibv_cq *cq) { return F.p_ibv_destroy_cq(cq); }
int vibv_cq_cqe(struct ibv_cq *cq) { return cq->cqe; }

/* -1 with errno (EAGAIN on a non-blocking channel without an event), or 0. */
int vibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, uintptr_t *cq_context)
{
	void *ctx;

	if (F.p_ibv_get_cq_event(ch, cq, &ctx))
		return -1;
	*cq_context = (uintptr_t)ctx;
	return 0;
}

void vibv_ack_cq_events(struct ibv_cq *cq, unsigned int n) { F.p_ibv_ack_cq_events(cq, n); }
int vibv_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }
int vibv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }

/* Most WRs a scratch chain holds; a bigger batch is posted in chunks. */
#define VIBV_MAX_CHAIN 4096u

int vibv_alloc_scratch(struct vibv_qp *q, uint32_t max_send_wr, uint32_t max_send_sge,
		       uint32_t max_recv_wr, uint32_t max_recv_sge)
{
	uint32_t i;

	q->nswr = max_send_wr < VIBV_MAX_CHAIN ? max_send_wr : VIBV_MAX_CHAIN;
	q->nrwr = max_recv_wr < VIBV_MAX_CHAIN ? max_recv_wr : VIBV_MAX_CHAIN;
	if (q->nswr == 0)
		q->nswr = 1;
	if (q->nrwr == 0)
		q->nrwr = 1;
	q->max_send_sge = max_send_sge;
	q->max_recv_sge = max_recv_sge;
	q->swr = calloc(q->nswr, sizeof(*q->swr));
	q->ssge = calloc((size_t)q->nswr * (max_send_sge ? max_send_sge : 1), sizeof(*q->ssge));
	q->rwr = calloc(q->nrwr, sizeof(*q->rwr));
	q->rsge = calloc((size_t)q->nrwr * (max_recv_sge ? max_recv_sge : 1), sizeof(*q->rsge));
	if (!q->swr || !q->ssge || !q->rwr || !q->rsge)
		return ENOMEM;
	for (i = 0; i < q->nswr; i++)
		q->swr[i].sg_list = q->ssge + (size_t)i * max_send_sge;
	for (i = 0; i < q->nrwr; i++)
		q->rwr[i].sg_list = q->rsge + (size_t)i * max_recv_sge;
	return 0;
}

void vibv_free_scratch(struct vibv_qp *q)
{
	free(q->swr);
	free(q->ssge);
	free(q->rwr);
	free(q->rsge);
	free(q);
}

/* NULL with errno on failure; init->cap holds the actual capacities. */
struct vibv_qp *vibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	struct vibv_qp *q;
	int err;

	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	q->qp = F.p_ibv_create_qp(pd, init);
	if (!q->qp) {
		err = errno ? errno : EINVAL;
		free(q);
		errno = err;
		return NULL;
	}
	err = vibv_alloc_scratch(q, init->cap.max_send_wr, init->cap.max_send_sge,
				 init->cap.max_recv_wr, init->cap.max_recv_sge);
	if (err) {
		F.p_ibv_destroy_qp(q->qp);
		vibv_free_scratch(q);
		errno = err;
		return NULL;
	}
	return q;
}

/* The scratch is freed only when the QP is gone. */
int vibv_destroy_qp(struct vibv_qp *q)
{
	int ret = F.p_ibv_destroy_qp(q->qp);

	if (ret)
		return ret;
	vibv_free_scratch(q);
	return 0;
}

uint32_t vibv_qp_num(struct vibv_qp *q) { return q->qp->qp_num; }
int vibv_modify_qp(struct vibv_qp *q, struct ibv_qp_attr *a, int mask) { return F.p_ibv_modify_qp(q->qp, a, mask); }

int vibv_query_qp(struct vibv_qp *q, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init)
{
	return F.p_ibv_query_qp(q->qp, a, mask, init);
}

static inline int64_t vibv_post_result(uint32_t posted, int code)
{
	return ((int64_t)posted << 32) | (uint32_t)code;
}

/*
 * vibv_post_send converts n compact WRs into the QP's scratch chain and
 * posts it, in chunks of q->nswr. It returns (posted << 32) | code: code 0,
 * an errno value from the provider (posted: the index of bad_wr), or a
 * VIBV_POST_* code (posted: the index of the invalid WR; nothing of the
 * batch is posted, as every WR is checked before the first post).
 */
int64_t vibv_post_send(struct vibv_qp *q, const struct vibv_send_wr *w, uint32_t n,
		       const struct ibv_sge *sge, uint32_t nsge)
{
	uint32_t done = 0, i, m;
	struct ibv_send_wr *bad;
	int ret;

	for (i = 0; i < n; i++) {
		if (w[i].num_sge > q->max_send_sge)
			return vibv_post_result(i, VIBV_POST_TOO_MANY_SGE);
		if ((uint64_t)w[i].first_sge + w[i].num_sge > nsge)
			return vibv_post_result(i, VIBV_POST_BAD_SGE_RANGE);
	}
	while (done < n) {
		m = n - done;
		if (m > q->nswr)
			m = q->nswr;
		for (i = 0; i < m; i++) {
			const struct vibv_send_wr *g = &w[done + i];
			struct ibv_send_wr *d = &q->swr[i];

			d->wr_id = g->wr_id;
			d->next = i + 1 < m ? &q->swr[i + 1] : NULL;
			if (g->num_sge)
				memcpy(d->sg_list, &sge[g->first_sge], g->num_sge * sizeof(*sge));
			d->num_sge = g->num_sge;
			d->opcode = (enum ibv_wr_opcode)g->opcode;
			d->send_flags = g->send_flags;
			d->imm_data = g->imm_data;
			switch (g->opcode) {
			case IBV_WR_ATOMIC_CMP_AND_SWP:
			case IBV_WR_ATOMIC_FETCH_AND_ADD:
				d->wr.atomic.remote_addr = g->remote_addr;
				d->wr.atomic.compare_add = g->compare_add;
				d->wr.atomic.swap = g->swap;
				d->wr.atomic.rkey = g->rkey;
				break;
			default:
				d->wr.rdma.remote_addr = g->remote_addr;
				d->wr.rdma.rkey = g->rkey;
				break;
			}
		}
		bad = NULL;
		ret = ibv_post_send(q->qp, q->swr, &bad);
		if (ret) {
			if (ret < 0)
				ret = -ret;
			if (bad >= q->swr && bad < q->swr + m)
				done += (uint32_t)(bad - q->swr);
			return vibv_post_result(done, ret);
		}
		done += m;
	}
	return vibv_post_result(done, 0);
}

int64_t vibv_post_recv(struct vibv_qp *q, const struct vibv_recv_wr *w, uint32_t n,
		       const struct ibv_sge *sge, uint32_t nsge)
{
	uint32_t done = 0, i, m;
	struct ibv_recv_wr *bad;
	int ret;

	for (i = 0; i < n; i++) {
		if (w[i].num_sge > q->max_recv_sge)
			return vibv_post_result(i, VIBV_POST_TOO_MANY_SGE);
		if ((uint64_t)w[i].first_sge + w[i].num_sge > nsge)
			return vibv_post_result(i, VIBV_POST_BAD_SGE_RANGE);
	}
	while (done < n) {
		m = n - done;
		if (m > q->nrwr)
			m = q->nrwr;
		for (i = 0; i < m; i++) {
			const struct vibv_recv_wr *g = &w[done + i];
			struct ibv_recv_wr *d = &q->rwr[i];

			d->wr_id = g->wr_id;
			d->next = i + 1 < m ? &q->rwr[i + 1] : NULL;
			if (g->num_sge)
				memcpy(d->sg_list, &sge[g->first_sge], g->num_sge * sizeof(*sge));
			d->num_sge = g->num_sge;
		}
		bad = NULL;
		ret = ibv_post_recv(q->qp, q->rwr, &bad);
		if (ret) {
			if (ret < 0)
				ret = -ret;
			if (bad >= q->rwr && bad < q->rwr + m)
				done += (uint32_t)(bad - q->rwr);
			return vibv_post_result(done, ret);
		}
		done += m;
	}
	return vibv_post_result(done, 0);
}


size_t vibv_layout(int what)
{
	switch (what) {
	case VIBV_L_SEND_WR_SIZE: return sizeof(struct vibv_send_wr);
	case VIBV_L_SEND_WR_REMOTE_ADDR: return offsetof(struct vibv_send_wr, remote_addr);
	case VIBV_L_SEND_WR_COMPARE_ADD: return offsetof(struct vibv_send_wr, compare_add);
	case VIBV_L_SEND_WR_SWAP: return offsetof(struct vibv_send_wr, swap);
	case VIBV_L_SEND_WR_RKEY: return offsetof(struct vibv_send_wr, rkey);
	case VIBV_L_SEND_WR_IMM: return offsetof(struct vibv_send_wr, imm_data);
	case VIBV_L_SEND_WR_FIRST_SGE: return offsetof(struct vibv_send_wr, first_sge);
	case VIBV_L_SEND_WR_NUM_SGE: return offsetof(struct vibv_send_wr, num_sge);
	case VIBV_L_SEND_WR_OPCODE: return offsetof(struct vibv_send_wr, opcode);
	case VIBV_L_SEND_WR_FLAGS: return offsetof(struct vibv_send_wr, send_flags);
	case VIBV_L_RECV_WR_SIZE: return sizeof(struct vibv_recv_wr);
	case VIBV_L_RECV_WR_FIRST_SGE: return offsetof(struct vibv_recv_wr, first_sge);
	case VIBV_L_RECV_WR_NUM_SGE: return offsetof(struct vibv_recv_wr, num_sge);
	case VIBV_L_SGE_SIZE: return sizeof(struct ibv_sge);
	case VIBV_L_SGE_LENGTH: return offsetof(struct ibv_sge, length);
	case VIBV_L_SGE_LKEY: return offsetof(struct ibv_sge, lkey);
	case VIBV_L_WC_SIZE: return sizeof(struct ibv_wc);
	case VIBV_L_WC_STATUS: return offsetof(struct ibv_wc, status);
	case VIBV_L_WC_OPCODE: return offsetof(struct ibv_wc, opcode);
	case VIBV_L_WC_VENDOR_ERR: return offsetof(struct ibv_wc, vendor_err);
	case VIBV_L_WC_BYTE_LEN: return offsetof(struct ibv_wc, byte_len);
	case VIBV_L_WC_IMM: return offsetof(struct ibv_wc, imm_data);
	case VIBV_L_WC_QP_NUM: return offsetof(struct ibv_wc, qp_num);
	case VIBV_L_WC_SRC_QP: return offsetof(struct ibv_wc, src_qp);
	case VIBV_L_WC_FLAGS: return offsetof(struct ibv_wc, wc_flags);
	case VIBV_L_WC_PKEY_INDEX: return offsetof(struct ibv_wc, pkey_index);
	case VIBV_L_WC_SLID: return offsetof(struct ibv_wc, slid);
	case VIBV_L_WC_SL: return offsetof(struct ibv_wc, sl);
	case VIBV_L_WC_DLID_PATH_BITS: return offsetof(struct ibv_wc, dlid_path_bits);
	case VIBV_L_WC_STATUS_SIZE: return sizeof(enum ibv_wc_status);
	}
	return (size_t)-1;
}

/* Compile-time guards for the layouts the Go side mirrors. */
_Static_assert(sizeof(struct vibv_send_wr) == 48, "vibv_send_wr is 48 bytes");
_Static_assert(sizeof(struct vibv_recv_wr) == 16, "vibv_recv_wr is 16 bytes");
_Static_assert(sizeof(struct ibv_sge) == 16, "ibv_sge is 16 bytes");
_Static_assert(sizeof(struct ibv_wc) == 48, "ibv_wc is 48 bytes");
