/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * vrdma: the para-virtual RDMA device (virtio device ID 42).
 *
 * The one header the guest's C parts share:
 *
 *  1. The device ABI, as docs/spec.md defines it normatively: config space,
 *     control commands, data-path structures (WQEs, CQEs, doorbell records)
 *     and events. All fields are little-endian. tests in virtio/rdma/abi
 *     (TestCHeaderMatchesSpec) compile this header and check every struct's
 *     size and every field's offset and size against the spec's tables.
 *
 *  2. The uverbs ABI between the kernel driver (guest/kernel) and the
 *     rdma-core provider (guest/rdma-core): the driver-specific parts of the
 *     uverbs commands (udata) and the mmap offsets they return.
 *
 * Included by the kernel (with <linux/types.h> from the kernel) and by user
 * space (<linux/types.h> from linux-libc-dev); nothing else is needed.
 */
#ifndef VRDMA_ABI_H
#define VRDMA_ABI_H

#include <linux/types.h>

/* ---------------------------------------------------------------------- */
/* 1. The device ABI (docs/spec.md)                                       */
/* ---------------------------------------------------------------------- */

#define VIRTIO_ID_VRDMA			42
#define VRDMA_ABI_VERSION		1

/* Virtqueues. */
#define VRDMA_CONTROLQ			0
#define VRDMA_EVENTQ			1
#define VRDMA_FIRST_DOORBELLQ		2

/* Bit 0 of a doorbell queue's used-ring flags: the engine is polling. */
#define VRDMA_DOORBELL_NO_NOTIFY	1

struct vrdma_config {
	__le32 abi_version;
	__le32 num_doorbell_queues;
	__le64 node_guid;
	__u8 port_gid[16];
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 max_sge;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le32 max_ah;
	__le64 max_mr_size;
	__le32 max_inline_data;
	__le32 active_mtu;
	__le32 port_state;
	__le32 max_qp_rd_atom;
	__le32 max_srq;
	__le32 device_caps;	/* VRDMA_DEVICE_CAP_* */
};

/* The device serves a GSI QP (QP1), DMA MRs and send WQEs with an AV. */
#define VRDMA_DEVICE_CAP_GSI		1
#define VRDMA_GSI_QPN			1
#define VRDMA_GSI_QKEY			0x80010000u

enum vrdma_cmd_opcode {
	VRDMA_CMD_QUERY_DEVICE	= 1,
	VRDMA_CMD_QUERY_PORT	= 2,
	VRDMA_CMD_QUERY_GID	= 3,
	VRDMA_CMD_CREATE_PD	= 4,
	VRDMA_CMD_DESTROY_PD	= 5,
	VRDMA_CMD_REG_MR	= 6,
	VRDMA_CMD_DEREG_MR	= 7,
	VRDMA_CMD_CREATE_CQ	= 8,
	VRDMA_CMD_DESTROY_CQ	= 9,
	VRDMA_CMD_CREATE_QP	= 10,
	VRDMA_CMD_MODIFY_QP	= 11,
	VRDMA_CMD_QUERY_QP	= 12,
	VRDMA_CMD_DESTROY_QP	= 13,
	VRDMA_CMD_CREATE_AH	= 14,
	VRDMA_CMD_DESTROY_AH	= 15,
	VRDMA_CMD_REQ_NOTIFY_CQ	= 16,
	VRDMA_CMD_ADD_GID	= 17,
	VRDMA_CMD_DEL_GID	= 18,
	VRDMA_CMD_CREATE_SRQ	= 19,
	VRDMA_CMD_MODIFY_SRQ	= 20,
	VRDMA_CMD_QUERY_SRQ	= 21,
	VRDMA_CMD_DESTROY_SRQ	= 22,
	VRDMA_CMD_ALLOC_MW	= 23,
	VRDMA_CMD_DEALLOC_MW	= 24,
	VRDMA_CMD_ALLOC_MR	= 25,
};

enum vrdma_status {
	VRDMA_STATUS_OK			= 0,
	VRDMA_STATUS_INVALID		= 1,
	VRDMA_STATUS_NO_RESOURCES	= 2,
	VRDMA_STATUS_NOT_FOUND		= 3,
	VRDMA_STATUS_BUSY		= 4,
	VRDMA_STATUS_ACCESS		= 5,
	VRDMA_STATUS_FAULT		= 6,
	VRDMA_STATUS_UNSUPPORTED	= 7,
	VRDMA_STATUS_QUOTA		= 8,
	VRDMA_STATUS_STATE		= 9,
};

struct vrdma_cmd_hdr {
	__le16 opcode;
	__le16 flags;
	__le32 reserved;
};

struct vrdma_resp_hdr {
	__le32 status;
	__le32 reserved;
};

struct vrdma_device_attr {
	__le64 fw_ver;
	__le64 node_guid;
	__le64 sys_image_guid;
	__le64 max_mr_size;
	__le64 page_size_cap;
	__le32 vendor_id;
	__le32 vendor_part_id;
	__le32 hw_ver;
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 device_cap_flags;
	__le32 max_sge;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le32 max_qp_rd_atom;
	__le32 max_qp_init_rd_atom;
	__le32 atomic_cap;
	__le32 max_ah;
	__le32 phys_port_cnt;
	__le32 max_inline_data;
	__le32 max_srq;
};

struct vrdma_port_req {
	__le32 port_num;
	__le32 reserved;
};

struct vrdma_port_attr {
	__le32 state;
	__le32 max_mtu;
	__le32 active_mtu;
	__le32 gid_tbl_len;
	__le32 port_cap_flags;
	__le32 max_msg_sz;
	__le32 link_layer;
	__le32 lid;
	__le32 active_speed;
	__le32 active_width;
};

struct vrdma_gid_req {
	__le32 port_num;
	__le32 index;
};

struct vrdma_gid {
	__u8 raw[16];
};

/* ADD_GID's request. gid_type: 0 IB/RoCE v1, 1 RoCE v2 (informational). */
#define VRDMA_GID_TYPE_ROCE_V1		0
#define VRDMA_GID_TYPE_ROCE_V2		1

struct vrdma_gid_entry {
	__le32 port_num;
	__le32 index;
	__u8 gid[16];
	__le32 gid_type;
	__le32 reserved;
};

struct vrdma_handle {
	__le32 handle;
	__le32 reserved;
};

/* ibv_access_flags as REG_MR and qp_access_flags take them. */
#define VRDMA_ACCESS_LOCAL_WRITE	1
#define VRDMA_ACCESS_REMOTE_WRITE	2
#define VRDMA_ACCESS_REMOTE_READ	4
#define VRDMA_ACCESS_REMOTE_ATOMIC	8
#define VRDMA_ACCESS_MW_BIND		16

/*
 * Memory windows and fast registration: QUERY_DEVICE's device_cap_flags
 * offer them; keys are an index (bits 8-31) and a key byte (bits 0-7).
 */
#define VRDMA_DEV_CAP_MEM_WINDOW		0x20000
#define VRDMA_DEV_CAP_MEM_MGT_EXTENSIONS	0x200000
#define VRDMA_DEV_CAP_MEM_WINDOW_TYPE_2B	0x1000000
#define VRDMA_MW_TYPE_1			1
#define VRDMA_MW_TYPE_2			2
#define VRDMA_MAX_FAST_REG_PAGES	4096
#define VRDMA_KEY_BYTE_MASK		0xff

struct vrdma_alloc_mw {
	__le32 pdn;
	__le32 type;
};

struct vrdma_alloc_mr {
	__le32 pdn;
	__le32 max_pages;
};

#define VRDMA_PAGE_SHIFT		12
#define VRDMA_PAGE_SIZE			(1UL << VRDMA_PAGE_SHIFT)
#define VRDMA_MAX_PAGE_SHIFT		30

struct vrdma_reg_mr {
	__le32 pdn;
	__le32 access;
	__le64 iova;
	__le64 length;
	__le32 page_shift;
	__le32 npages;
	__le64 page_list;
	__le32 flags;		/* VRDMA_REG_MR_F_DMA */
	__le32 reserved;
};

/* A DMA MR: the guest-physical address space, local access only. */
#define VRDMA_REG_MR_F_DMA		1

struct vrdma_mr_keys {
	__le32 lkey;
	__le32 rkey;
};

/* CREATE_CQ flags. */
#define VRDMA_CQ_F_ARM_RECORD		1 /* 16-byte record with an arm word */

struct vrdma_create_cq {
	__le32 cqe;
	__le32 npages;
	__le64 record;
	__le64 page_list;
	__le32 flags;
	__le32 reserved;
};

struct vrdma_cq_record {
	__le32 pi;
	__le32 ci;
};

/*
 * The record of a CQ created with VRDMA_CQ_F_ARM_RECORD. The driver arms
 * the CQ by writing arm = (sequence << 1) | solicited_only with a sequence
 * different from the last one it wrote, then a full barrier.
 */
struct vrdma_cq_arm_record {
	__le32 pi;
	__le32 ci;
	__le32 arm;
	__le32 reserved;
};

#define VRDMA_CQ_ARM_SOLICITED		1
#define VRDMA_CQ_ARM_SEQ_SHIFT		1

#define VRDMA_QPT_GSI			1
#define VRDMA_QPT_RC			2
#define VRDMA_QPT_UD			4

struct vrdma_create_qp {
	__le32 pdn;
	__le32 send_cqn;
	__le32 recv_cqn;
	__le32 qp_type;
	__le32 max_send_wr;
	__le32 max_recv_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 sq_wqe_shift;
	__le32 rq_wqe_shift;
	__le32 doorbell_queue;
	__le64 record;
	__le32 sq_npages;
	__le32 rq_npages;
	__le64 page_list;
	__le32 sq_sig_all;
	__le32 flags;
	__le32 srqn;
	__le32 reserved;
};

/* CREATE_QP flags. */
#define VRDMA_QP_F_RQ_NOTIFY		1 /* 24-byte record with rq_notify */
#define VRDMA_QP_F_SRQ			2 /* receive WQEs come from srqn */

struct vrdma_qp_record {
	__le32 sq_pi;
	__le32 rq_pi;
	__le32 sq_ci;
	__le32 rq_ci;
};

/*
 * The record of a QP created with VRDMA_QP_F_RQ_NOTIFY. Receives are posted
 * without a notification unless the device has set rq_notify (the QP is in
 * ERR): after advancing rq_pi the driver issues a full barrier and reads it.
 */
struct vrdma_qp_notify_record {
	__le32 sq_pi;
	__le32 rq_pi;
	__le32 sq_ci;
	__le32 rq_ci;
	__le32 rq_notify;
	__le32 reserved;
};

#define VRDMA_MIN_SQ_WQE_SHIFT		6
#define VRDMA_MIN_RQ_WQE_SHIFT		5
#define VRDMA_MAX_WQE_SHIFT		12

/* ibv_qp_state */
enum vrdma_qp_state {
	VRDMA_QPS_RESET	= 0,
	VRDMA_QPS_INIT	= 1,
	VRDMA_QPS_RTR	= 2,
	VRDMA_QPS_RTS	= 3,
	VRDMA_QPS_ERR	= 6,
};

/* ibv_qp_attr_mask bits MODIFY_QP accepts. */
#define VRDMA_QP_STATE			0x1
#define VRDMA_QP_ACCESS_FLAGS		0x8
#define VRDMA_QP_PKEY_INDEX		0x10
#define VRDMA_QP_PORT			0x20
#define VRDMA_QP_QKEY			0x40	/* UD only */
#define VRDMA_QP_AV			0x80
#define VRDMA_QP_PATH_MTU		0x100
#define VRDMA_QP_TIMEOUT		0x200
#define VRDMA_QP_RETRY_CNT		0x400
#define VRDMA_QP_RNR_RETRY		0x800
#define VRDMA_QP_RQ_PSN			0x1000
#define VRDMA_QP_MAX_QP_RD_ATOMIC	0x2000
#define VRDMA_QP_MIN_RNR_TIMER		0x8000
#define VRDMA_QP_SQ_PSN			0x10000
#define VRDMA_QP_MAX_DEST_RD_ATOMIC	0x20000
#define VRDMA_QP_DEST_QPN		0x100000
#define VRDMA_QP_PATHS			0x80000000	/* vrdma's: multipath spray */

struct vrdma_qp_attr {
	__le32 qpn;
	__le32 attr_mask;
	__le32 qp_state;
	__le32 qp_access_flags;
	__le32 pkey_index;
	__le32 port_num;
	__le32 path_mtu;
	__le32 dest_qp_num;
	__le32 rq_psn;
	__le32 sq_psn;
	__le32 max_rd_atomic;
	__le32 max_dest_rd_atomic;
	__le32 min_rnr_timer;
	__le32 timeout;
	__le32 retry_cnt;
	__le32 rnr_retry;
	__u8 dgid[16];
	__le32 sgid_index;
	__le32 hop_limit;
	__le32 paths;
	__le32 qkey;
};

struct vrdma_create_ah {
	__le32 pdn;
	__le32 port_num;
	__u8 dgid[16];
	__le32 sgid_index;
	__le32 reserved;
};

struct vrdma_create_srq {
	__le32 pdn;
	__le32 max_wr;
	__le32 max_sge;
	__le32 srq_limit;
	__le32 wqe_shift;
	__le32 doorbell_queue;
	__le64 record;
	__le32 npages;
	__le32 reserved;
	__le64 page_list;
};

struct vrdma_srq_record {
	__le32 pi;
	__le32 ci;
	__le32 notify;
	__le32 reserved;
};

/* vrdma_srq_attr.attr_mask (ibv_srq_attr_mask). */
#define VRDMA_SRQ_MAX_WR		1	/* resizing: UNSUPPORTED */
#define VRDMA_SRQ_LIMIT			2

struct vrdma_srq_attr {
	__le32 srqn;
	__le32 attr_mask;
	__le32 max_wr;
	__le32 srq_limit;
};

struct vrdma_notify_cq {
	__le32 cqn;
	__le32 solicited_only;
};

/* Data path. */

struct vrdma_sge {
	__le64 addr;
	__le32 length;
	__le32 lkey;
};

enum vrdma_wr_opcode {
	VRDMA_WR_SEND			= 0,
	VRDMA_WR_SEND_WITH_IMM		= 1,
	VRDMA_WR_RDMA_WRITE		= 2,
	VRDMA_WR_RDMA_WRITE_WITH_IMM	= 3,
	VRDMA_WR_RDMA_READ		= 4,
	VRDMA_WR_ATOMIC_CMP_AND_SWP	= 5,
	VRDMA_WR_ATOMIC_FETCH_AND_ADD	= 6,
	VRDMA_WR_LOCAL_INV		= 7,
	VRDMA_WR_SEND_WITH_INV		= 8,
	VRDMA_WR_BIND_MW		= 9,
	VRDMA_WR_REG_MR			= 10,
};

#define VRDMA_WQE_SIGNALED		1
#define VRDMA_WQE_INLINE		2
#define VRDMA_WQE_FENCE			4
#define VRDMA_WQE_SOLICITED		8
#define VRDMA_WQE_AV			16
#define VRDMA_AV_SIZE			32

struct vrdma_send_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 num_sge;
	__le32 imm_data;
	__le64 remote_addr;
	__le32 rkey;
	__le32 inline_len;
	__le64 compare_add;
	__le64 swap;
	__le32 ah;		/* UD */
	__le32 remote_qpn;	/* UD */
	__le32 remote_qkey;	/* UD; bit 31: the QP's own Q_Key */
	__le32 reserved;
};

/* With VRDMA_WQE_AV, at offset 64 of a UD or GSI send WQE. */
struct vrdma_av {
	__u8 dgid[16];
	__le32 sgid_index;
	__u8 reserved[12];
};

/* A send WQE with opcode VRDMA_WR_BIND_MW. */
struct vrdma_bind_mw_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 reserved;
	__le32 mw;
	__le64 addr;
	__le32 new_rkey;
	__le32 lkey;
	__le64 length;
	__le32 access;
	__u8 reserved2[20];
};

/* A send WQE with opcode VRDMA_WR_REG_MR: fast registration. */
struct vrdma_reg_mr_wqe {
	__le64 wr_id;
	__u8 opcode;
	__u8 flags;
	__le16 reserved;
	__le32 mr;
	__le64 iova;
	__le32 new_key;
	__le32 access;
	__le64 length;
	__le64 page_list;
	__le32 npages;
	__le32 page_shift;
	__le64 reserved2;
};

#define VRDMA_QKEY_USE_QP		0x80000000u
#define VRDMA_GRH_SIZE			40

struct vrdma_recv_wqe {
	__le64 wr_id;
	__le16 num_sge;
	__u8 reserved[6];
};

/* vrdma_cqe.opcode (ibv_wc_opcode) and wc_flags. */
#define VRDMA_WC_SEND			0
#define VRDMA_WC_RDMA_WRITE		1
#define VRDMA_WC_RDMA_READ		2
#define VRDMA_WC_COMP_SWAP		3
#define VRDMA_WC_FETCH_ADD		4
#define VRDMA_WC_BIND_MW		5
#define VRDMA_WC_LOCAL_INV		6
#define VRDMA_WC_REG_MR			10
#define VRDMA_WC_RECV			128
#define VRDMA_WC_RECV_RDMA_WITH_IMM	129
#define VRDMA_WC_F_GRH			1
#define VRDMA_WC_F_WITH_IMM		2
#define VRDMA_WC_F_WITH_INV		4

struct vrdma_cqe {
	__le64 wr_id;
	__u8 status;
	__u8 opcode;
	__le16 wc_flags;
	__le32 qp_num;
	__le32 byte_len;
	__le32 imm_data;
	__le32 src_qp;
	__le32 vendor_err;
};

enum vrdma_event_type {
	VRDMA_EVENT_CQ_COMPLETION	= 1,
	VRDMA_EVENT_CQ_ERROR		= 2,
	VRDMA_EVENT_QP_FATAL		= 3,
	VRDMA_EVENT_PORT_ACTIVE		= 4,
	VRDMA_EVENT_PORT_ERROR		= 5,
	VRDMA_EVENT_DEVICE_FATAL	= 6,
	VRDMA_EVENT_SRQ_LIMIT_REACHED	= 7,
	VRDMA_EVENT_QP_LAST_WQE_REACHED	= 8,
};

struct vrdma_event {
	__le32 type;
	__le32 handle;
	__le64 reserved;
};

/* ---------------------------------------------------------------------- */
/* 2. The uverbs ABI between guest/kernel and guest/rdma-core             */
/* ---------------------------------------------------------------------- */

/*
 * ib_device_ops.uverbs_abi_ver; the provider accepts exactly this one.
 * Every structure below is 8-byte aligned and has no implicit padding.
 */
#define VRDMA_UVERBS_ABI_VERSION	1

/* alloc_ucontext: no request; the response says what the provider sizes by. */
struct vrdma_alloc_ucontext_resp {
	__u32 num_doorbell_queues;
	__u32 max_qp_wr;
	__u32 max_sge;
	__u32 max_cqe;
	__u32 max_inline_data;
	__u32 reserved;
};

/*
 * create_cq. The provider allocates one page-aligned buffer: the ring
 * (cqe entries of struct vrdma_cqe, a whole number of 4 KiB pages) and,
 * at record_offset, a struct vrdma_cq_arm_record (16-byte aligned). The
 * kernel pins it (ib_umem) and hands the device its guest-physical pages.
 * cqe (in the uverbs command) must be a power of two.
 */
struct vrdma_create_cq_cmd {
	__aligned_u64 buf_addr;
	__aligned_u64 buf_len;
	__u32 record_offset;
	__u32 reserved;
};

struct vrdma_create_cq_resp {
	__u32 cqn;
	__u32 cqe;
};

/*
 * create_qp. One page-aligned buffer: the send queue (sq_depth WQEs of
 * 1 << sq_wqe_shift bytes, whole pages), then the receive queue (likewise),
 * then at record_offset a struct vrdma_qp_record (16-byte aligned), or a
 * struct vrdma_qp_notify_record with VRDMA_QP_F_RQ_NOTIFY in flags, which
 * the kernel passes to the device's CREATE_QP. Depths are powers of two
 * and at least the capabilities the application asked for; the kernel
 * passes them to the device as max_send_wr / max_recv_wr.
 */
struct vrdma_create_qp_cmd {
	__aligned_u64 buf_addr;
	__aligned_u64 buf_len;
	__u32 sq_depth;
	__u32 rq_depth;
	__u32 sq_wqe_shift;
	__u32 rq_wqe_shift;
	__u32 record_offset;
	__u32 flags;
};

/*
 * The doorbell: mmap(notify_mmap_key) maps, uncached and write-only, the
 * page of the virtio-pci notification region that holds the QP's doorbell
 * queue's notify register at notify_offset; a notification is a 16-bit
 * write of notify_value there. mmap(flags_mmap_key) maps, read-only, the
 * page holding that doorbell queue's used-ring flags word (16 bits) at
 * flags_offset. Both map exactly one page (4096 bytes).
 */
struct vrdma_create_qp_resp {
	__u32 qpn;
	__u32 doorbell_queue;
	__aligned_u64 notify_mmap_key;
	__aligned_u64 flags_mmap_key;
	__u32 notify_offset;
	__u32 flags_offset;
	__u16 notify_value;
	__u16 reserved0;
	__u32 reserved1;
};

/*
 * create_srq. One page-aligned buffer: the ring (depth WQEs of
 * 1 << wqe_shift bytes, whole pages), then at record_offset a struct
 * vrdma_srq_record (16-byte aligned). depth is a power of two, at least
 * what the application asked for; the kernel passes it as max_wr. The
 * response's doorbell fields are as in vrdma_create_qp_resp: a post takes
 * the doorbell step only while the record's notify word is 1.
 */
struct vrdma_create_srq_cmd {
	__aligned_u64 buf_addr;
	__aligned_u64 buf_len;
	__u32 depth;
	__u32 wqe_shift;
	__u32 record_offset;
	__u32 reserved;
};

struct vrdma_create_srq_resp {
	__u32 srqn;
	__u32 doorbell_queue;
	__aligned_u64 notify_mmap_key;
	__aligned_u64 flags_mmap_key;
	__u32 notify_offset;
	__u32 flags_offset;
	__u16 notify_value;
	__u16 reserved0;
	__u32 reserved1;
};

/* create_ah: the device's AH number, which UD send WQEs carry. */
struct vrdma_create_ah_resp {
	__u32 ahn;
	__u32 reserved;
};

#endif /* VRDMA_ABI_H */
