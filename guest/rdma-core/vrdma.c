// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vrdma provider: device matching, context and the verbs operation table.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "vrdma.h"
#include "vrdma_abi.h"

static void vrdma_free_context(struct ibv_context *ibctx);

static const struct verbs_context_ops vrdma_ctx_ops = {
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.bind_mw = vrdma_bind_mw,
	.cq_event = vrdma_cq_event,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_cq_ex = vrdma_create_cq_ex,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.create_srq = vrdma_create_srq,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.free_context = vrdma_free_context,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device_ex = vrdma_query_device,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_mr = vrdma_reg_mr,
	.req_notify_cq = vrdma_req_notify_cq,
	/*
	 * Not set, so libibverbs answers EOPNOTSUPP: resize_cq, XRC
	 * (and create_srq_ex), flows, DM. create_qp refuses QP types other
	 * than RC and UD.
	 */
};

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);
	struct vrdma_db_map *m, *next;

	/* Every QP has been destroyed by now; this only covers leaks. */
	list_for_each_safe(&ctx->db_maps, m, next, entry) {
		list_del(&m->entry);
		munmap(m->notify_page, VRDMA_MMAP_SIZE);
		munmap(m->flags_page, VRDMA_MMAP_SIZE);
		free(m);
	}
	pthread_mutex_destroy(&ctx->db_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev,
						 int cmd_fd,
						 void *private_data)
{
	struct vrdma_ucmd_alloc_context_resp resp = {};
	struct ibv_get_context cmd = {};
	struct vrdma_context *ctx;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;

	pthread_mutex_init(&ctx->db_lock, NULL);
	list_head_init(&ctx->db_maps);

	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp)))
		goto err;

	ctx->num_doorbell_queues = resp.num_doorbell_queues;
	ctx->max_qp_wr = resp.max_qp_wr;
	ctx->max_sge = resp.max_sge;
	ctx->max_cqe = resp.max_cqe;
	ctx->max_inline_data = resp.max_inline_data;
	if (!ctx->num_doorbell_queues || !ctx->max_qp_wr || !ctx->max_sge ||
	    !ctx->max_cqe) {
		verbs_err(&ctx->ibv_ctx,
			  "the kernel reported a zero limit (doorbell queues %u, qp wr %u, sge %u, cqe %u)\n",
			  ctx->num_doorbell_queues, ctx->max_qp_wr,
			  ctx->max_sge, ctx->max_cqe);
		errno = EPROTO;
		goto err;
	}

	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err:
	pthread_mutex_destroy(&ctx->db_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

static struct verbs_device *
vrdma_alloc_device(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vrdma_uninit_device(struct verbs_device *vdev)
{
	free(container_of(vdev, struct vrdma_device, ibv_dev));
}

/*
 * The kernel driver names its devices vrdma0, vrdma1, ...; the modalias
 * entry matches a device by its virtio parent (device ID 42) whatever its
 * name.
 */
static const struct verbs_match_ent vrdma_match_table[] = {
	VERBS_NAME_MATCH("vrdma", NULL),
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	{},
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	.match_min_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_max_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_table = vrdma_match_table,
	.alloc_device = vrdma_alloc_device,
	.uninit_device = vrdma_uninit_device,
	.alloc_context = vrdma_alloc_context,
};

PROVIDER_DRIVER(vrdma, vrdma_dev_ops);
