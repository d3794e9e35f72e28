/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * vrdma provider: the uverbs commands with their driver-specific parts.
 *
 * The driver-specific structures themselves live in the project's one shared
 * header, guest/include/vrdma-abi.h (section 2), which the kernel driver
 * includes too. <kernel-abi/vrdma-abi.h> is generated from it at build time
 * by rdma-core's buildlib/make_abi_structs.py, exactly as rdma-core does for
 * the uapi headers under kernel-headers/rdma/, so DECLARE_DRV_CMD can lay the
 * driver data out right after the standard command.
 */
#ifndef VRDMA_PROVIDER_ABI_H
#define VRDMA_PROVIDER_ABI_H

#include <infiniband/kern-abi.h>
#include <vrdma-abi.h>
#include <kernel-abi/vrdma-abi.h>

/*
 * The names carry "ucmd" because vrdma-abi.h already has struct
 * vrdma_create_cq, vrdma_create_qp and vrdma_create_srq (the device's
 * control commands).
 */
DECLARE_DRV_CMD(vrdma_ucmd_alloc_context, IB_USER_VERBS_CMD_GET_CONTEXT,
		empty, vrdma_alloc_ucontext_resp);
DECLARE_DRV_CMD(vrdma_ucmd_create_cq, IB_USER_VERBS_CMD_CREATE_CQ,
		vrdma_create_cq_cmd, vrdma_create_cq_resp);
DECLARE_DRV_CMD(vrdma_ucmd_create_qp, IB_USER_VERBS_CMD_CREATE_QP,
		vrdma_create_qp_cmd, vrdma_create_qp_resp);
DECLARE_DRV_CMD(vrdma_ucmd_create_srq, IB_USER_VERBS_CMD_CREATE_SRQ,
		vrdma_create_srq_cmd, vrdma_create_srq_resp);
DECLARE_DRV_CMD(vrdma_ucmd_create_ah, IB_USER_VERBS_CMD_CREATE_AH,
		empty, vrdma_create_ah_resp);

#endif /* VRDMA_PROVIDER_ABI_H */
