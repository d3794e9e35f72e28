/*
 * shim.h: the C half of package ibv (see doc.go).
 *
 * libibverbs is opened with dlopen and every exported function the package
 * uses is called through a pointer resolved with dlsym, so nothing here may
 * call an exported ibv_* function by name: the link would then need
 * -libverbs. The data-path verbs of verbs.h (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq, ibv_req_notify_cq) are static inlines through
 * context->ops and reference no symbol, so they are called as they are.
 */
#ifndef VRDMA_IBV_SHIM_H
#define VRDMA_IBV_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* Go's SendWR (types.go); TestLayouts checks the two agree. */
struct vibv_send_wr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t rkey;
	uint32_t imm_data; /* __be32, stored as given */
	uint32_t first_sge;
	uint16_t num_sge;
	uint8_t opcode;
	uint8_t send_flags;
};

/* Go's RecvWR. */
struct vibv_recv_wr {
	uint64_t wr_id;
	uint32_t first_sge;
	uint32_t num_sge;
};

/*
 * A QP and its work-request scratch: the chains PostSend and PostRecv
 * build, allocated once at create time (C memory, so the provider never
 * sees a Go pointer). swr[i].sg_list is ssge + i * max_send_sge.
 */
struct vibv_qp {
	struct ibv_qp *qp;
	struct ibv_send_wr *swr;
	struct ibv_sge *ssge;
	uint32_t nswr;
	uint32_t max_send_sge;
	struct ibv_recv_wr *rwr;
	struct ibv_sge *rsge;
	uint32_t nrwr;
	uint32_t max_recv_sge;
};

/* What an async event names, copied out before it is acked. */
struct vibv_async_event {
	int32_t type;
	uint32_t qp_num;
	uintptr_t cq_context;
	int32_t port_num;
	int32_t has_qp;
	int32_t has_cq;
};

/* Codes vibv_post_send/vibv_post_recv return besides errno values. */
enum {
	VIBV_POST_BAD_SGE_RANGE = -1, /* first_sge + num_sge beyond the SGE slice */
	VIBV_POST_TOO_MANY_SGE = -2,  /* num_sge above the QP's max SGE */
};

int vibv_load(const char *path, char *err, size_t errlen);
int vibv_have_query_gid_ex(void);

struct ibv_device **vibv_get_device_list(int *n);
void vibv_free_device_list(struct ibv_device **l);
const char *vibv_get_device_name(struct ibv_device *d);
uint64_t vibv_get_device_guid(struct ibv_device *d);
struct ibv_context *vibv_open_device(struct ibv_device *d);
int vibv_close_device(struct ibv_context *c);
const char *vibv_context_name(struct ibv_context *c);
int vibv_async_fd(struct ibv_context *c);
int vibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int vibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
int vibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid);
int vibv_query_gid_type(struct ibv_context *c, uint32_t port, uint32_t index, uint32_t *type);
int vibv_get_async_event(struct ibv_context *c, struct vibv_async_event *e);

struct ibv_pd *vibv_alloc_pd(struct ibv_context *c);
int vibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *vibv_reg_mr_iova2(struct ibv_pd *pd, uintptr_t addr, size_t length, uint64_t iova, unsigned int access);
int vibv_dereg_mr(struct ibv_mr *mr);

struct ibv_comp_channel *vibv_create_comp_channel(struct ibv_context *c);
int vibv_destroy_comp_channel(struct ibv_comp_channel *ch);
int vibv_comp_channel_fd(struct ibv_comp_channel *ch);
struct ibv_cq *vibv_create_cq(struct ibv_context *c, int cqe, uintptr_t cq_context, struct ibv_comp_channel *ch);
int vibv_destroy_cq(struct ibv_cq *cq);
int vibv_cq_cqe(struct ibv_cq *cq);
int vibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, uintptr_t *cq_context);
void vibv_ack_cq_events(struct ibv_cq *cq, unsigned int n);
int vibv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int vibv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

struct vibv_qp *vibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init);
int vibv_destroy_qp(struct vibv_qp *q);
uint32_t vibv_qp_num(struct vibv_qp *q);
int vibv_modify_qp(struct vibv_qp *q, struct ibv_qp_attr *a, int mask);
int vibv_query_qp(struct vibv_qp *q, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init);
int64_t vibv_post_send(struct vibv_qp *q, const struct vibv_send_wr *w, uint32_t n, const struct ibv_sge *sge, uint32_t nsge);
int64_t vibv_post_recv(struct vibv_qp *q, const struct vibv_recv_wr *w, uint32_t n, const struct ibv_sge *sge, uint32_t nsge);

/* Layout facts for TestLayouts (cgo is not allowed in _test.go files). */
enum {
	VIBV_L_SEND_WR_SIZE,
	VIBV_L_SEND_WR_REMOTE_ADDR,
	VIBV_L_SEND_WR_COMPARE_ADD,
	VIBV_L_SEND_WR_SWAP,
	VIBV_L_SEND_WR_RKEY,
	VIBV_L_SEND_WR_IMM,
	VIBV_L_SEND_WR_FIRST_SGE,
	VIBV_L_SEND_WR_NUM_SGE,
	VIBV_L_SEND_WR_OPCODE,
	VIBV_L_SEND_WR_FLAGS,
	VIBV_L_RECV_WR_SIZE,
	VIBV_L_RECV_WR_FIRST_SGE,
	VIBV_L_RECV_WR_NUM_SGE,
	VIBV_L_SGE_SIZE,
	VIBV_L_SGE_LENGTH,
	VIBV_L_SGE_LKEY,
	VIBV_L_WC_SIZE,
	VIBV_L_WC_STATUS,
	VIBV_L_WC_OPCODE,
	VIBV_L_WC_VENDOR_ERR,
	VIBV_L_WC_BYTE_LEN,
	VIBV_L_WC_IMM,
	VIBV_L_WC_QP_NUM,
	VIBV_L_WC_SRC_QP,
	VIBV_L_WC_FLAGS,
	VIBV_L_WC_PKEY_INDEX,
	VIBV_L_WC_SLID,
	VIBV_L_WC_SL,
	VIBV_L_WC_DLID_PATH_BITS,
	VIBV_L_WC_STATUS_SIZE,
};
size_t vibv_layout(int what);

/* A fake provider for tests without a device (fake.c). */
struct vibv_qp *vibv_fake_qp(uint32_t nswr, uint32_t max_send_sge, uint32_t nrwr, uint32_t max_recv_sge);
void vibv_fake_free(struct vibv_qp *q);
void vibv_fake_fail_at(int index, int err);
uint32_t vibv_fake_count(void);
void vibv_fake_get(uint32_t i, struct ibv_send_wr *wr, struct ibv_sge *last_sge);
struct ibv_cq *vibv_fake_cq(uint64_t pending);

/* Shared by shim.c and fake.c. */
int vibv_alloc_scratch(struct vibv_qp *q, uint32_t max_send_wr, uint32_t max_send_sge,
		       uint32_t max_recv_wr, uint32_t max_recv_sge);
void vibv_free_scratch(struct vibv_qp *q);

#endif
