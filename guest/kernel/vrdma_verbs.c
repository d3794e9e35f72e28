// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma: the verbs (ib_device_ops). Every object is a user object: the
 * provider in user space owns the rings; these functions create the device
 * objects, pin what the device reads and writes (ib_umem), and map the
 * doorbell pages. Kernel CQs, QPs, SRQs and AHs are not supported.
 */
#include <linux/log2.h>
#include <linux/slab.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

/* REG_MR page sizes: 4 KiB ... 1 GiB. */
#define VRDMA_PGSZ_BITMAP \
	GENMASK_ULL(VRDMA_MAX_PAGE_SHIFT, VRDMA_PAGE_SHIFT)

#define VRDMA_ACCESS_ALL (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | \
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC)

/* The attribute mask bits MODIFY_QP takes; ib and ibv share the values. */
#define VRDMA_QP_ATTR_MASK (IB_QP_STATE | IB_QP_ACCESS_FLAGS | \
			    IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY | \
			    IB_QP_AV | \
			    IB_QP_PATH_MTU | IB_QP_TIMEOUT | IB_QP_RETRY_CNT | \
			    IB_QP_RNR_RETRY | IB_QP_RQ_PSN | \
			    IB_QP_MAX_QP_RD_ATOMIC | IB_QP_MIN_RNR_TIMER | \
			    IB_QP_SQ_PSN | IB_QP_MAX_DEST_RD_ATOMIC | \
			    IB_QP_DEST_QPN)

static_assert(IB_QP_STATE == VRDMA_QP_STATE);
static_assert(IB_QP_ACCESS_FLAGS == VRDMA_QP_ACCESS_FLAGS);
static_assert(IB_QP_PKEY_INDEX == VRDMA_QP_PKEY_INDEX);
static_assert(IB_QP_PORT == VRDMA_QP_PORT);
static_assert(IB_QP_QKEY == VRDMA_QP_QKEY);
static_assert(IB_QP_AV == VRDMA_QP_AV);
static_assert(IB_QP_PATH_MTU == VRDMA_QP_PATH_MTU);
static_assert(IB_QP_TIMEOUT == VRDMA_QP_TIMEOUT);
static_assert(IB_QP_RETRY_CNT == VRDMA_QP_RETRY_CNT);
static_assert(IB_QP_RNR_RETRY == VRDMA_QP_RNR_RETRY);
static_assert(IB_QP_RQ_PSN == VRDMA_QP_RQ_PSN);
static_assert(IB_QP_MAX_QP_RD_ATOMIC == VRDMA_QP_MAX_QP_RD_ATOMIC);
static_assert(IB_QP_MIN_RNR_TIMER == VRDMA_QP_MIN_RNR_TIMER);
static_assert(IB_QP_SQ_PSN == VRDMA_QP_SQ_PSN);
static_assert(IB_QP_MAX_DEST_RD_ATOMIC == VRDMA_QP_MAX_DEST_RD_ATOMIC);
static_assert(IB_QP_DEST_QPN == VRDMA_QP_DEST_QPN);
static_assert(IB_ACCESS_LOCAL_WRITE == VRDMA_ACCESS_LOCAL_WRITE);
static_assert(IB_ACCESS_REMOTE_WRITE == VRDMA_ACCESS_REMOTE_WRITE);
static_assert(IB_ACCESS_REMOTE_READ == VRDMA_ACCESS_REMOTE_READ);
static_assert(IB_ACCESS_REMOTE_ATOMIC == VRDMA_ACCESS_REMOTE_ATOMIC);
static_assert(IB_SRQ_MAX_WR == VRDMA_SRQ_MAX_WR);
static_assert(IB_SRQ_LIMIT == VRDMA_SRQ_LIMIT);
/* ibv_qp_state as enum vrdma_qp_state spells it. */
static_assert(IB_QPS_RESET == 0 && IB_QPS_INIT == 1 && IB_QPS_RTR == 2 &&
	      IB_QPS_RTS == 3 && IB_QPS_ERR == 6);

/* The udata request must be at least @len bytes; more must be zero. */
static int vrdma_udata_in(struct ib_udata *udata, void *cmd, size_t len)
{
	if (!udata || udata->inlen < len)
		return -EINVAL;
	if (udata->inlen > len &&
	    !ib_is_udata_cleared(udata, len, udata->inlen - len))
		return -EOPNOTSUPP;
	return ib_copy_from_udata(cmd, udata, len);
}

static int vrdma_udata_out(struct ib_udata *udata, void *resp, size_t len)
{
	if (udata->outlen < len)
		return -EINVAL;
	return ib_copy_to_udata(udata, resp, len);
}

/* ---- device and port --------------------------------------------------- */

static int vrdma_query_device(struct ib_device *ibdev,
			      struct ib_device_attr *attr,
			      struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	const struct vrdma_device_attr *a = &dev->dattr;
	u32 atomic = le32_to_cpu(a->atomic_cap);

	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;

	attr->fw_ver = le64_to_cpu(a->fw_ver);
	attr->sys_image_guid = cpu_to_be64(le64_to_cpu(a->sys_image_guid));
	attr->max_mr_size = le64_to_cpu(a->max_mr_size);
	attr->page_size_cap = le64_to_cpu(a->page_size_cap) & VRDMA_PGSZ_BITMAP;
	attr->vendor_id = le32_to_cpu(a->vendor_id);
	attr->vendor_part_id = le32_to_cpu(a->vendor_part_id);
	attr->hw_ver = le32_to_cpu(a->hw_ver);
	attr->max_qp = min_t(u32, le32_to_cpu(a->max_qp), INT_MAX);
	attr->max_qp_wr = dev->max_qp_wr;
	attr->max_send_sge = dev->max_sge;
	attr->max_recv_sge = dev->max_sge;
	attr->max_sge_rd = dev->max_sge;
	attr->max_cq = min_t(u32, le32_to_cpu(a->max_cq), INT_MAX);
	attr->max_cqe = dev->max_cqe;
	attr->max_mr = min_t(u32, le32_to_cpu(a->max_mr), INT_MAX);
	attr->max_pd = min_t(u32, le32_to_cpu(a->max_pd), INT_MAX);
	attr->max_qp_rd_atom = dev->max_rd_atom;
	attr->max_qp_init_rd_atom = dev->max_rd_atom;
	attr->max_res_rd_atom = min_t(u64, (u64)dev->max_rd_atom * attr->max_qp,
				      INT_MAX);
	attr->atomic_cap = atomic <= IB_ATOMIC_GLOB ? atomic : IB_ATOMIC_NONE;
	attr->max_ah = min_t(u32, le32_to_cpu(a->max_ah), INT_MAX);
	attr->max_pkeys = 1;
	attr->device_cap_flags = dev->dev_cap_flags;
	if (dev->dev_cap_flags & IB_DEVICE_MEM_WINDOW)
		attr->max_mw = attr->max_mr;	/* MWs count against max_mr */
	if (dev->dev_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS)
		attr->max_fast_reg_page_list_len = VRDMA_MAX_FAST_REG_PAGES;
	/*
	 * docs/spec.md QUERY_DEVICE: "an SRQ holds up to max_qp_wr WQEs of up
	 * to max_sge SGEs".
	 */
	attr->max_srq = dev->max_srq;
	if (dev->max_srq) {
		attr->max_srq_wr = dev->max_qp_wr;
		attr->max_srq_sge = dev->max_sge;
	}
	return 0;
}

static int vrdma_query_port(struct ib_device *ibdev, u32 port,
			    struct ib_port_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibdev);

	attr->state = vrdma_port_state(dev);
	attr->phys_state = attr->state == IB_PORT_ACTIVE ?
			   IB_PORT_PHYS_STATE_LINK_UP :
			   IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = dev->max_mtu;
	attr->active_mtu = dev->active_mtu;
	attr->gid_tbl_len = dev->gid_tbl_len;
	attr->ip_gids = true;
	attr->max_msg_sz = dev->max_msg_sz;
	attr->pkey_tbl_len = 1;
	attr->max_vl_num = 1;
	attr->active_speed = dev->active_speed;
	attr->active_width = dev->active_width;
	return 0;
}

static int vrdma_get_port_immutable(struct ib_device *ibdev, u32 port,
				    struct ib_port_immutable *immutable)
{
	struct vrdma_dev *dev = to_vdev(ibdev);

	/*
	 * RoCE v1 and v2 GIDs and Ethernet address handles; MADs, ib_cm and
	 * so rdma_cm when the device serves a GSI QP (vrdma_kverbs.c). A
	 * device without one (an older daemon, a host-NIC device) gets
	 * neither, or ib_mad would log failures for every port.
	 */
	immutable->core_cap_flags = RDMA_CORE_CAP_PROT_ROCE |
				    RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP |
				    RDMA_CORE_CAP_ETH_AH;
	if (dev->gsi) {
		immutable->core_cap_flags |= RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
		immutable->max_mad_size = IB_MGMT_MAD_SIZE;
	}
	immutable->gid_tbl_len = dev->gid_tbl_len;
	immutable->pkey_tbl_len = 1;
	return 0;
}

static enum rdma_link_layer vrdma_get_link_layer(struct ib_device *ibdev,
						 u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			    u16 *pkey)
{
	if (index)
		return -EINVAL;
	*pkey = 0xffff;
	return 0;
}

static int vrdma_add_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_gid_entry req = {
		.port_num = cpu_to_le32(attr->port_num),
		.index = cpu_to_le32(attr->index),
		.gid_type = cpu_to_le32(attr->gid_type ==
					IB_GID_TYPE_ROCE_UDP_ENCAP ?
					VRDMA_GID_TYPE_ROCE_V2 :
					VRDMA_GID_TYPE_ROCE_V1),
	};
	int err;

	memcpy(req.gid, attr->gid.raw, sizeof(req.gid));
	err = vrdma_exec(dev, VRDMA_CMD_ADD_GID, &req, sizeof(req), NULL, 0,
			 NULL);
	/* A device without a GID table knows only its own GID 0. */
	if (err == -EOPNOTSUPP)
		return 0;
	return err;
}

static int vrdma_del_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_gid_req req = {
		.port_num = cpu_to_le32(attr->port_num),
		.index = cpu_to_le32(attr->index),
	};
	int err;

	err = vrdma_exec(dev, VRDMA_CMD_DEL_GID, &req, sizeof(req), NULL, 0,
			 NULL);
	/* Gone with a dead device, or never added (no GID table). */
	if (err == -EIO || err == -ENOENT || err == -EOPNOTSUPP)
		return 0;
	return err;
}

/* ---- user contexts and mmap -------------------------------------------- */

enum vrdma_mmap_type {
	VRDMA_MMAP_NOTIFY,	/* notify register page: MMIO, uncached */
	VRDMA_MMAP_FLAGS,	/* used-ring page: RAM, read-only */
};

struct vrdma_mmap_entry {
	struct rdma_user_mmap_entry rdma_entry;
	phys_addr_t address;	/* page aligned */
	enum vrdma_mmap_type type;
};

static struct vrdma_mmap_entry *
to_vmmap(struct rdma_user_mmap_entry *rdma_entry)
{
	return container_of(rdma_entry, struct vrdma_mmap_entry, rdma_entry);
}

static int vrdma_alloc_ucontext(struct ib_ucontext *ibuc,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibuc->device);
	struct vrdma_ucontext *uctx = to_vuctx(ibuc);
	struct vrdma_alloc_ucontext_resp resp = {
		.num_doorbell_queues = dev->num_dbq,
		.max_qp_wr = dev->max_qp_wr,
		.max_sge = dev->max_sge,
		.max_cqe = dev->max_cqe,
		.max_inline_data = dev->max_inline,
	};

	if (vrdma_dead(dev))
		return -EIO;
	mutex_init(&uctx->lock);
	return vrdma_udata_out(udata, &resp, sizeof(resp));
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *ibuc)
{
	struct vrdma_ucontext *uctx = to_vuctx(ibuc);
	unsigned int i;

	for (i = 0; i < VRDMA_MAX_DOORBELLQ; i++) {
		rdma_user_mmap_entry_remove(uctx->notify[i]);
		rdma_user_mmap_entry_remove(uctx->flags[i]);
	}
	mutex_destroy(&uctx->lock);
}

/*
 * Nothing to do: the core zaps the mappings made with rdma_user_mmap_io().
 * Having the op lets ib_unregister_device() proceed without waiting for
 * user space to close its contexts.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}

static struct rdma_user_mmap_entry *
vrdma_mmap_insert(struct vrdma_ucontext *uctx, phys_addr_t pa,
		  enum vrdma_mmap_type type)
{
	struct vrdma_mmap_entry *e;
	int err;

	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		return ERR_PTR(-ENOMEM);
	e->address = pa & PAGE_MASK;
	e->type = type;
	err = rdma_user_mmap_entry_insert(&uctx->ibuc, &e->rdma_entry,
					  PAGE_SIZE);
	if (err) {
		kfree(e);
		return ERR_PTR(err);
	}
	return &e->rdma_entry;
}

/* The mmap keys of doorbell queue @i, made on first use in this context. */
static int vrdma_uctx_doorbell(struct vrdma_dev *dev,
			       struct vrdma_ucontext *uctx, unsigned int i,
			       u64 *notify_key, u64 *flags_key)
{
	struct rdma_user_mmap_entry *e;
	int err = 0;

	mutex_lock(&uctx->lock);
	if (!uctx->notify[i]) {
		e = vrdma_mmap_insert(uctx, dev->dbq[i].notify_pa,
				      VRDMA_MMAP_NOTIFY);
		if (IS_ERR(e)) {
			err = PTR_ERR(e);
			goto out;
		}
		uctx->notify[i] = e;
	}
	if (!uctx->flags[i]) {
		e = vrdma_mmap_insert(uctx, dev->dbq[i].flags_pa,
				      VRDMA_MMAP_FLAGS);
		if (IS_ERR(e)) {
			err = PTR_ERR(e);
			goto out;
		}
		uctx->flags[i] = e;
	}
	*notify_key = rdma_user_mmap_get_offset(uctx->notify[i]);
	*flags_key = rdma_user_mmap_get_offset(uctx->flags[i]);
out:
	mutex_unlock(&uctx->lock);
	return err;
}

static int vrdma_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma_entry;
	struct vrdma_mmap_entry *e;
	pgprot_t prot;
	int err;

	rdma_entry = rdma_user_mmap_entry_get(ibuc, vma);
	if (!rdma_entry)
		return -EINVAL;
	e = to_vmmap(rdma_entry);

	switch (e->type) {
	case VRDMA_MMAP_NOTIFY:
		if (vma->vm_flags & VM_EXEC) {
			err = -EPERM;
			goto out;
		}
		vma->vm_flags &= ~VM_MAYEXEC;
		prot = pgprot_noncached(vma->vm_page_prot);
		break;
	case VRDMA_MMAP_FLAGS:
		if (vma->vm_flags & (VM_WRITE | VM_EXEC)) {
			err = -EPERM;
			goto out;
		}
		vma->vm_flags &= ~(VM_MAYWRITE | VM_MAYEXEC);
		prot = vma->vm_page_prot;
		break;
	default:
		err = -EINVAL;
		goto out;
	}
	err = rdma_user_mmap_io(ibuc, vma, PHYS_PFN(e->address), PAGE_SIZE,
				prot, rdma_entry);
out:
	rdma_user_mmap_entry_put(rdma_entry);
	return err;
}

static void vrdma_mmap_free(struct rdma_user_mmap_entry *rdma_entry)
{
	kfree(to_vmmap(rdma_entry));
}

/* ---- PD and MR --------------------------------------------------------- */

static int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_handle resp;
	int err;

	err = vrdma_exec(dev, VRDMA_CMD_CREATE_PD, NULL, 0, &resp,
			 sizeof(resp), NULL);
	if (err)
		return err;
	to_vpd(ibpd)->pdn = le32_to_cpu(resp.handle);
	return 0;
}

static int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	vrdma_exec_destroy(to_vdev(ibpd->device), VRDMA_CMD_DESTROY_PD,
			   to_vpd(ibpd)->pdn);
	return 0;
}

static struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start,
				       u64 length, u64 iova, int access,
				       struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_reg_mr req = {};
	struct vrdma_mr_keys resp;
	struct ib_block_iter biter;
	struct vrdma_mr *mr;
	unsigned long pgsz;
	size_t npages, i = 0;
	__le64 *list;
	int err;

	if (access & ~(VRDMA_ACCESS_ALL | IB_ACCESS_OPTIONAL |
		       IB_ACCESS_MW_BIND))
		return ERR_PTR(-EOPNOTSUPP);
	/* Windows may be bound only where the device has them. */
	if ((access & IB_ACCESS_MW_BIND) &&
	    !(dev->dev_cap_flags & IB_DEVICE_MEM_WINDOW))
		return ERR_PTR(-EOPNOTSUPP);
	if (!length || length > le64_to_cpu(dev->dattr.max_mr_size))
		return ERR_PTR(-EINVAL);

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->umem = ib_umem_get(ibpd->device, start, length, access);
	if (IS_ERR(mr->umem)) {
		err = PTR_ERR(mr->umem);
		goto err_free;
	}
	pgsz = ib_umem_find_best_pgsz(mr->umem,
				      le64_to_cpu(dev->dattr.page_size_cap) &
				      VRDMA_PGSZ_BITMAP, iova);
	if (!pgsz) {
		err = -EINVAL;
		goto err_umem;
	}
	/* ceil(((iova mod P) + length) / P), as REG_MR wants it. */
	npages = ib_umem_num_dma_blocks(mr->umem, pgsz);
	if (npages > U32_MAX) {
		err = -EINVAL;
		goto err_umem;
	}
	/* Physically contiguous: the device reads it by its address. */
	list = kmalloc_array(npages, sizeof(*list), GFP_KERNEL | __GFP_NOWARN);
	if (!list) {
		err = -ENOMEM;
		goto err_umem;
	}
	rdma_umem_for_each_dma_block(mr->umem, &biter, pgsz) {
		if (i == npages)
			break;
		list[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));
	}
	if (i != npages) {
		kfree(list);
		err = -EINVAL;
		goto err_umem;
	}

	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(access & (VRDMA_ACCESS_ALL |
					   VRDMA_ACCESS_MW_BIND));
	req.iova = cpu_to_le64(iova);
	req.length = cpu_to_le64(length);
	req.page_shift = cpu_to_le32(ilog2(pgsz));
	req.npages = cpu_to_le32(npages);
	req.page_list = cpu_to_le64(virt_to_phys(list));
	err = vrdma_exec(dev, VRDMA_CMD_REG_MR, &req, sizeof(req), &resp,
			 sizeof(resp), list);
	if (err)
		goto err_umem;
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

static int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibmr->device);
	struct vrdma_mr *mr = to_vmr(ibmr);

	/*
	 * A fast-registration MR is the device's by the key its last REG_MR
	 * set; its page list goes only once the device has let go of it.
	 */
	vrdma_exec_destroy(dev, VRDMA_CMD_DEREG_MR,
			   mr->pages ? mr->dev_key : ibmr->lkey);
	vrdma_quiesce(dev);
	ib_umem_release(mr->umem);
	kfree(mr->pages);
	kfree(mr);
	return 0;
}

/*
 * Memory windows of user space (docs/spec.md § Memory windows and fast
 * registration): the device allocates them; binding and invalidation are
 * send WQEs the provider posts.
 */
static int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibmw->device);
	struct vrdma_alloc_mw req = {};
	struct vrdma_handle resp;
	int err;

	if (!(dev->dev_cap_flags & IB_DEVICE_MEM_WINDOW))
		return -EOPNOTSUPP;
	if (ibmw->type != IB_MW_TYPE_1 && ibmw->type != IB_MW_TYPE_2)
		return -EINVAL;
	req.pdn = cpu_to_le32(to_vpd(ibmw->pd)->pdn);
	req.type = cpu_to_le32(ibmw->type == IB_MW_TYPE_1 ? VRDMA_MW_TYPE_1 :
							     VRDMA_MW_TYPE_2);
	err = vrdma_exec(dev, VRDMA_CMD_ALLOC_MW, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err)
		return err;
	ibmw->rkey = le32_to_cpu(resp.handle);
	return 0;
}

static int vrdma_dealloc_mw(struct ib_mw *ibmw)
{
	/* Any key byte names the window (the provider's rkey may be newer). */
	vrdma_exec_destroy(to_vdev(ibmw->device), VRDMA_CMD_DEALLOC_MW,
			   ibmw->rkey);
	return 0;
}

/* ---- rings: CQ and QP buffers ------------------------------------------ */

/*
 * A CQ's or QP's buffer: page aligned; the record (@rec_size bytes,
 * 16-aligned) at @rec_off after the rings' last byte @ring_end and within
 * the buffer; the buffer no longer than the rings' pages and one more page,
 * so a request cannot pin more than it uses.
 */
static int vrdma_check_buf(u64 addr, u64 len, u64 ring_end, u64 rec_off,
			   u64 rec_size)
{
	if (!PAGE_ALIGNED(addr) || !len)
		return -EINVAL;
	if (!IS_ALIGNED(rec_off, 16) || rec_off < ring_end ||
	    rec_off + rec_size > len)
		return -EINVAL;
	/* The device gets one guest-physical address: one page holds it. */
	if (offset_in_page(rec_off) + rec_size > VRDMA_PAGE_SIZE)
		return -EINVAL;
	if (len > round_up(ring_end, VRDMA_PAGE_SIZE) + VRDMA_PAGE_SIZE)
		return -EINVAL;
	return 0;
}

/*
 * The 4 KiB guest-physical pages of @umem, in order, in a physically
 * contiguous list the device can read; *@n is their number.
 */
static __le64 *vrdma_umem_pages(struct ib_umem *umem, size_t *n)
{
	struct ib_block_iter biter;
	size_t i = 0;
	__le64 *list;

	*n = ib_umem_num_dma_blocks(umem, VRDMA_PAGE_SIZE);
	list = kmalloc_array(*n, sizeof(*list), GFP_KERNEL | __GFP_NOWARN);
	if (!list)
		return ERR_PTR(-ENOMEM);
	rdma_umem_for_each_dma_block(umem, &biter, VRDMA_PAGE_SIZE) {
		if (i == *n)
			break;
		list[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));
	}
	if (i != *n) {
		kfree(list);
		return ERR_PTR(-EINVAL);
	}
	return list;
}

/* The guest-physical address of byte @off of the buffer. */
static u64 vrdma_buf_gpa(const __le64 *pages, u64 off)
{
	return le64_to_cpu(pages[off >> VRDMA_PAGE_SHIFT]) +
	       (off & (VRDMA_PAGE_SIZE - 1));
}

/* ---- CQ ---------------------------------------------------------------- */

static int vrdma_create_cq(struct ib_cq *ibcq,
			   const struct ib_cq_init_attr *attr,
			   struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_create_cq_resp uresp = {};
	struct vrdma_create_cq_cmd ucmd;
	struct vrdma_create_cq req = {};
	struct vrdma_handle resp;
	u64 ring_bytes, ring_pages;
	size_t npages;
	__le64 *pages;
	int err;

	if (!udata)
		return vrdma_create_kcq(ibcq, attr);
	if (attr->flags)
		return -EOPNOTSUPP;
	err = vrdma_udata_in(udata, &ucmd, sizeof(ucmd));
	if (err)
		return err;
	if (ucmd.reserved)
		return -EINVAL;
	if (!attr->cqe || attr->cqe > dev->max_cqe || !is_power_of_2(attr->cqe))
		return -EINVAL;
	ring_bytes = (u64)attr->cqe * sizeof(struct vrdma_cqe);
	ring_pages = DIV_ROUND_UP_ULL(ring_bytes, VRDMA_PAGE_SIZE);
	err = vrdma_check_buf(ucmd.buf_addr, ucmd.buf_len, ring_bytes,
			      ucmd.record_offset,
			      sizeof(struct vrdma_cq_arm_record));
	if (err)
		return err;

	cq->umem = ib_umem_get(ibcq->device, ucmd.buf_addr, ucmd.buf_len,
			       IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(cq->umem))
		return PTR_ERR(cq->umem);
	pages = vrdma_umem_pages(cq->umem, &npages);
	if (IS_ERR(pages)) {
		err = PTR_ERR(pages);
		goto err_umem;
	}
	req.cqe = cpu_to_le32(attr->cqe);
	req.npages = cpu_to_le32(ring_pages);
	req.record = cpu_to_le64(vrdma_buf_gpa(pages, ucmd.record_offset));
	req.page_list = cpu_to_le64(virt_to_phys(pages));
	req.flags = cpu_to_le32(VRDMA_CQ_F_ARM_RECORD);
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_CQ, &req, sizeof(req), &resp,
			 sizeof(resp), pages);
	if (err)
		goto err_umem;
	cq->cqn = le32_to_cpu(resp.handle);
	err = xa_insert_irq(&dev->cq_xa, cq->cqn, cq, GFP_KERNEL);
	if (err) {
		err = err == -EBUSY ? -EIO : err;	/* a reused handle */
		goto err_destroy;
	}
	ibcq->cqe = attr->cqe;
	uresp.cqn = cq->cqn;
	uresp.cqe = attr->cqe;
	err = vrdma_udata_out(udata, &uresp, sizeof(uresp));
	if (err)
		goto err_erase;
	return 0;

err_erase:
	xa_erase_irq(&dev->cq_xa, cq->cqn);
err_destroy:
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_CQ, cq->cqn);
	vrdma_quiesce(dev);
err_umem:
	ib_umem_release(cq->umem);
	return err;
}

static int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);

	/* After this, no event handler runs for the CQ. */
	xa_erase_irq(&dev->cq_xa, cq->cqn);
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_CQ, cq->cqn);
	vrdma_quiesce(dev);
	if (cq->umem)
		ib_umem_release(cq->umem);
	else
		vrdma_free_kcq(cq);
	return 0;
}

/*
 * User space arms its CQs through the record; for a user CQ this is the
 * uverbs REQ_NOTIFY_CQ command's path (process context: it sleeps). The
 * device posts the event at once when entries are pending, so no
 * completion is missed and IB_CQ_REPORT_MISSED_EVENTS has nothing to
 * report. Kernel CQs are armed through their record (vrdma_kverbs.c).
 */
static int vrdma_req_notify_cq(struct ib_cq *ibcq,
			       enum ib_cq_notify_flags flags)
{
	struct vrdma_notify_cq req = {
		.cqn = cpu_to_le32(to_vcq(ibcq)->cqn),
		.solicited_only = cpu_to_le32((flags & IB_CQ_SOLICITED_MASK) ==
					      IB_CQ_SOLICITED),
	};

	if (!to_vcq(ibcq)->umem)
		return vrdma_kcq_notify(to_vcq(ibcq), flags);
	return vrdma_exec(to_vdev(ibcq->device), VRDMA_CMD_REQ_NOTIFY_CQ, &req,
			  sizeof(req), NULL, 0, NULL);
}

static int vrdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc)
{
	if (!to_vcq(ibcq)->umem)
		return vrdma_kcq_poll(to_vcq(ibcq), num_entries, wc);
	return -EOPNOTSUPP;	/* user CQs are polled in user space */
}

/* ---- QP ---------------------------------------------------------------- */

/* QP numbers the device may hand out: 24 bits, not 0, 1 or 0xffffff. */
bool vrdma_valid_qpn(u32 qpn)
{
	return qpn >= 2 && qpn <= 0xfffffe;
}

static int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr,
			   struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_ucontext *uctx;
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_create_qp_resp uresp = {};
	struct vrdma_create_qp_cmd ucmd;
	struct vrdma_create_qp req = {};
	struct vrdma_handle resp;
	u32 sq_stride, send_sge, recv_sge = 0, inl, flags;
	u64 sq_bytes, rq_bytes = 0, sq_pages, rq_pages = 0;
	u64 notify_key, flags_key;
	struct vrdma_srq *srq = NULL;
	unsigned int dbq;
	size_t npages, req_len;
	__le64 *pages;
	int err;

	if (!udata)
		return vrdma_create_kqp(ibqp, attr);
	if (attr->qp_type != IB_QPT_RC && attr->qp_type != IB_QPT_UD)
		return -EOPNOTSUPP;
	if (attr->create_flags || attr->xrcd)
		return -EOPNOTSUPP;
	if (!attr->send_cq || !attr->recv_cq)
		return -EINVAL;
	if (attr->srq) {
		if (attr->srq->srq_type != IB_SRQT_BASIC)
			return -EOPNOTSUPP;
		srq = to_vsrq(attr->srq);
	}
	uctx = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	err = vrdma_udata_in(udata, &ucmd, sizeof(ucmd));
	if (err)
		return err;
	if (ucmd.flags & ~VRDMA_QP_F_RQ_NOTIFY)
		return -EINVAL;

	/* Depths: powers of two, within the device's limit and the ask. */
	if (!ucmd.sq_depth || !is_power_of_2(ucmd.sq_depth) ||
	    ucmd.sq_depth > dev->max_qp_wr ||
	    attr->cap.max_send_wr > ucmd.sq_depth)
		return -EINVAL;
	if (ucmd.sq_wqe_shift < VRDMA_MIN_SQ_WQE_SHIFT ||
	    ucmd.sq_wqe_shift > VRDMA_MAX_WQE_SHIFT)
		return -EINVAL;
	if (srq) {
		/*
		 * No receive queue of its own; the RQ capabilities the
		 * application asked for are ignored, as verbs defines it.
		 */
		if (ucmd.rq_depth || ucmd.rq_wqe_shift)
			return -EINVAL;
	} else {
		if (!ucmd.rq_depth || !is_power_of_2(ucmd.rq_depth) ||
		    ucmd.rq_depth > dev->max_qp_wr ||
		    attr->cap.max_recv_wr > ucmd.rq_depth)
			return -EINVAL;
		if (ucmd.rq_wqe_shift < VRDMA_MIN_RQ_WQE_SHIFT ||
		    ucmd.rq_wqe_shift > VRDMA_MAX_WQE_SHIFT)
			return -EINVAL;
	}

	/* What the strides hold, bounded by the device: at least the ask. */
	sq_stride = 1U << ucmd.sq_wqe_shift;
	send_sge = min_t(u32, dev->max_sge,
			 (sq_stride - sizeof(struct vrdma_send_wqe)) /
			 sizeof(struct vrdma_sge));
	inl = min_t(u32, dev->max_inline,
		    sq_stride - sizeof(struct vrdma_send_wqe));
	/* A datagram, inline data included, fits the port's MTU. */
	if (attr->qp_type == IB_QPT_UD)
		inl = min_t(u32, inl, ib_mtu_enum_to_int(dev->active_mtu));
	if (!send_sge || attr->cap.max_send_sge > send_sge ||
	    attr->cap.max_inline_data > inl)
		return -EINVAL;
	if (!srq) {
		recv_sge = min_t(u32, dev->max_sge,
				 ((1U << ucmd.rq_wqe_shift) -
				  sizeof(struct vrdma_recv_wqe)) /
				 sizeof(struct vrdma_sge));
		if (!recv_sge || attr->cap.max_recv_sge > recv_sge)
			return -EINVAL;
		rq_bytes = (u64)ucmd.rq_depth << ucmd.rq_wqe_shift;
		rq_pages = DIV_ROUND_UP_ULL(rq_bytes, VRDMA_PAGE_SIZE);
	}

	sq_bytes = (u64)ucmd.sq_depth << ucmd.sq_wqe_shift;
	sq_pages = DIV_ROUND_UP_ULL(sq_bytes, VRDMA_PAGE_SIZE);
	err = vrdma_check_buf(ucmd.buf_addr, ucmd.buf_len,
			      sq_pages * VRDMA_PAGE_SIZE + rq_bytes,
			      ucmd.record_offset,
			      ucmd.flags & VRDMA_QP_F_RQ_NOTIFY ?
			      sizeof(struct vrdma_qp_notify_record) :
			      sizeof(struct vrdma_qp_record));
	if (err)
		return err;

	dbq = (unsigned int)atomic_inc_return(&dev->next_dbq) % dev->num_dbq;
	err = vrdma_uctx_doorbell(dev, uctx, dbq, &notify_key, &flags_key);
	if (err)
		return err;

	qp->umem = ib_umem_get(ibqp->device, ucmd.buf_addr, ucmd.buf_len,
			       IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(qp->umem))
		return PTR_ERR(qp->umem);
	pages = vrdma_umem_pages(qp->umem, &npages);
	if (IS_ERR(pages)) {
		err = PTR_ERR(pages);
		goto err_umem;
	}

	flags = ucmd.flags & VRDMA_QP_F_RQ_NOTIFY;
	req.pdn = cpu_to_le32(to_vpd(ibqp->pd)->pdn);
	req.send_cqn = cpu_to_le32(to_vcq(attr->send_cq)->cqn);
	req.recv_cqn = cpu_to_le32(to_vcq(attr->recv_cq)->cqn);
	req.qp_type = cpu_to_le32(attr->qp_type == IB_QPT_UD ? VRDMA_QPT_UD :
							      VRDMA_QPT_RC);
	req.max_send_wr = cpu_to_le32(ucmd.sq_depth);
	req.max_recv_wr = cpu_to_le32(ucmd.rq_depth);
	req.max_send_sge = cpu_to_le32(send_sge);
	req.max_recv_sge = cpu_to_le32(recv_sge);
	req.max_inline_data = cpu_to_le32(inl);
	req.sq_wqe_shift = cpu_to_le32(ucmd.sq_wqe_shift);
	req.rq_wqe_shift = cpu_to_le32(ucmd.rq_wqe_shift);
	req.doorbell_queue = cpu_to_le32(dbq);
	req.record = cpu_to_le64(vrdma_buf_gpa(pages, ucmd.record_offset));
	req.sq_npages = cpu_to_le32(sq_pages);
	req.rq_npages = cpu_to_le32(rq_pages);
	req.page_list = cpu_to_le64(virt_to_phys(pages));
	req.sq_sig_all = cpu_to_le32(attr->sq_sig_type == IB_SIGNAL_ALL_WR);
	/*
	 * Without an SRQ, the 80-byte layout that every revision of the
	 * device takes (docs/spec.md CREATE_QP), so an RC QP still works
	 * with a daemon older than SRQs.
	 */
	req_len = offsetof(struct vrdma_create_qp, srqn);
	if (srq) {
		flags |= VRDMA_QP_F_SRQ;
		req.srqn = cpu_to_le32(srq->srqn);
		req_len = sizeof(req);
	}
	req.flags = cpu_to_le32(flags);
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_QP, &req, req_len, &resp,
			 sizeof(resp), pages);
	if (err)
		goto err_umem;
	qp->qpn = le32_to_cpu(resp.handle);
	if (!vrdma_valid_qpn(qp->qpn)) {
		ibdev_err_ratelimited(&dev->ibdev,
				      "device answered QP number %#x\n",
				      qp->qpn);
		err = -EIO;
		goto err_destroy;
	}
	ibqp->qp_num = qp->qpn;
	err = xa_insert_irq(&dev->qp_xa, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		err = err == -EBUSY ? -EIO : err;	/* a reused handle */
		goto err_destroy;
	}

	attr->cap.max_send_wr = ucmd.sq_depth;
	attr->cap.max_recv_wr = ucmd.rq_depth;
	attr->cap.max_send_sge = send_sge;
	attr->cap.max_recv_sge = recv_sge;
	attr->cap.max_inline_data = inl;
	qp->cap = attr->cap;
	qp->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;

	uresp.qpn = qp->qpn;
	uresp.doorbell_queue = dbq;
	uresp.notify_mmap_key = notify_key;
	uresp.flags_mmap_key = flags_key;
	uresp.notify_offset = offset_in_page(dev->dbq[dbq].notify_pa);
	uresp.flags_offset = offset_in_page(dev->dbq[dbq].flags_pa);
	uresp.notify_value = dev->dbq[dbq].notify_value;
	err = vrdma_udata_out(udata, &uresp, sizeof(uresp));
	if (err)
		goto err_erase;
	return 0;

err_erase:
	xa_erase_irq(&dev->qp_xa, qp->qpn);
err_destroy:
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	vrdma_quiesce(dev);
err_umem:
	ib_umem_release(qp->umem);
	return err;
}

static int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			   int mask, struct ib_udata *udata)
{
	struct vrdma_qp_attr req = {};

	if (udata && udata->inlen &&
	    !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EOPNOTSUPP;
	mask &= ~IB_QP_CUR_STATE;	/* a hint the device does not need */
	if (mask & ~VRDMA_QP_ATTR_MASK)
		return -EOPNOTSUPP;

	req.qpn = cpu_to_le32(to_vqp(ibqp)->qpn);
	req.attr_mask = cpu_to_le32(mask);
	if (mask & IB_QP_STATE) {
		switch (attr->qp_state) {
		case IB_QPS_RESET:
		case IB_QPS_INIT:
		case IB_QPS_RTR:
		case IB_QPS_RTS:
		case IB_QPS_ERR:
			req.qp_state = cpu_to_le32(attr->qp_state);
			break;
		default:
			return -EOPNOTSUPP;
		}
	}
	if (mask & IB_QP_ACCESS_FLAGS) {
		if (attr->qp_access_flags & ~VRDMA_ACCESS_ALL)
			return -EINVAL;
		req.qp_access_flags = cpu_to_le32(attr->qp_access_flags);
	}
	if (mask & IB_QP_PKEY_INDEX)
		req.pkey_index = cpu_to_le32(attr->pkey_index);
	if (mask & IB_QP_PORT)
		req.port_num = cpu_to_le32(attr->port_num);
	/*
	 * The device refuses a Q_Key on an RC QP (and AV etc. on UD). Q_Keys
	 * with bit 31 set are for privileged consumers (the GSI QP's is
	 * 0x80010000): the device cannot tell the kernel's QPs from user
	 * space's, so this is where the rule is kept.
	 */
	if (mask & IB_QP_QKEY) {
		if (udata && (attr->qkey & VRDMA_QKEY_USE_QP))
			return -EPERM;
		req.qkey = cpu_to_le32(attr->qkey);
	}
	/*
	 * ib_mad moves its GSI QP to INIT without a port, as special QPs
	 * have theirs from creation; the device's UD table wants it.
	 */
	if (ibqp->qp_type == IB_QPT_GSI && (mask & IB_QP_STATE) &&
	    attr->qp_state == IB_QPS_INIT && !(mask & IB_QP_PORT)) {
		mask |= IB_QP_PORT;
		req.attr_mask = cpu_to_le32(mask);
		req.port_num = cpu_to_le32(VRDMA_PORT);
	}
	if (mask & IB_QP_AV) {
		const struct ib_global_route *grh;

		/* RoCE addresses by GID: no GRH, no address. */
		if (!(rdma_ah_get_ah_flags(&attr->ah_attr) & IB_AH_GRH))
			return -EINVAL;
		grh = rdma_ah_read_grh(&attr->ah_attr);
		memcpy(req.dgid, grh->dgid.raw, sizeof(req.dgid));
		req.sgid_index = cpu_to_le32(grh->sgid_index);
		req.hop_limit = cpu_to_le32(grh->hop_limit);
	}
	if (mask & IB_QP_PATH_MTU)
		req.path_mtu = cpu_to_le32(attr->path_mtu);
	if (mask & IB_QP_TIMEOUT)
		req.timeout = cpu_to_le32(attr->timeout);
	if (mask & IB_QP_RETRY_CNT)
		req.retry_cnt = cpu_to_le32(attr->retry_cnt);
	if (mask & IB_QP_RNR_RETRY)
		req.rnr_retry = cpu_to_le32(attr->rnr_retry);
	if (mask & IB_QP_RQ_PSN)
		req.rq_psn = cpu_to_le32(attr->rq_psn);
	if (mask & IB_QP_MAX_QP_RD_ATOMIC)
		req.max_rd_atomic = cpu_to_le32(attr->max_rd_atomic);
	if (mask & IB_QP_MIN_RNR_TIMER)
		req.min_rnr_timer = cpu_to_le32(attr->min_rnr_timer);
	if (mask & IB_QP_SQ_PSN)
		req.sq_psn = cpu_to_le32(attr->sq_psn);
	if (mask & IB_QP_MAX_DEST_RD_ATOMIC)
		req.max_dest_rd_atomic = cpu_to_le32(attr->max_dest_rd_atomic);
	if (mask & IB_QP_DEST_QPN)
		req.dest_qp_num = cpu_to_le32(attr->dest_qp_num);

	return vrdma_exec(to_vdev(ibqp->device), VRDMA_CMD_MODIFY_QP, &req,
			  sizeof(req), NULL, 0, NULL);
}

static int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			  int mask, struct ib_qp_init_attr *init_attr)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_handle req = { .handle = cpu_to_le32(qp->qpn) };
	struct vrdma_qp_attr resp;
	union ib_gid dgid;
	u32 state;
	int err;

	err = vrdma_exec(dev, VRDMA_CMD_QUERY_QP, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err == -ENOENT)
		vrdma_set_dead(dev, "device lost its objects");
	if (err)
		return err;
	state = le32_to_cpu(resp.qp_state);
	if (state > IB_QPS_ERR)
		return -EIO;

	memset(attr, 0, sizeof(*attr));
	attr->qp_state = state;
	attr->cur_qp_state = state;
	attr->path_mtu = clamp_t(u32, le32_to_cpu(resp.path_mtu), IB_MTU_256,
				 IB_MTU_4096);
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qp_access_flags = le32_to_cpu(resp.qp_access_flags) &
				VRDMA_ACCESS_ALL;
	attr->pkey_index = min_t(u32, le32_to_cpu(resp.pkey_index), U16_MAX);
	attr->port_num = VRDMA_PORT;
	attr->dest_qp_num = le32_to_cpu(resp.dest_qp_num);
	attr->rq_psn = le32_to_cpu(resp.rq_psn) & 0xffffff;
	attr->sq_psn = le32_to_cpu(resp.sq_psn) & 0xffffff;
	attr->max_rd_atomic = min_t(u32, le32_to_cpu(resp.max_rd_atomic), U8_MAX);
	attr->max_dest_rd_atomic = min_t(u32,
					 le32_to_cpu(resp.max_dest_rd_atomic),
					 U8_MAX);
	attr->min_rnr_timer = min_t(u32, le32_to_cpu(resp.min_rnr_timer), 31);
	attr->timeout = min_t(u32, le32_to_cpu(resp.timeout), 31);
	attr->retry_cnt = min_t(u32, le32_to_cpu(resp.retry_cnt), 7);
	attr->rnr_retry = min_t(u32, le32_to_cpu(resp.rnr_retry), 7);
	attr->cap = qp->cap;
	if (ibqp->qp_type == IB_QPT_UD || ibqp->qp_type == IB_QPT_GSI) {
		attr->qkey = le32_to_cpu(resp.qkey);
	} else {
		attr->ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
		memcpy(dgid.raw, resp.dgid, sizeof(dgid.raw));
		rdma_ah_set_grh(&attr->ah_attr, &dgid, 0,
				min_t(u32, le32_to_cpu(resp.sgid_index), U8_MAX),
				min_t(u32, le32_to_cpu(resp.hop_limit), U8_MAX),
				0);
		rdma_ah_set_port_num(&attr->ah_attr, VRDMA_PORT);
	}

	memset(init_attr, 0, sizeof(*init_attr));
	init_attr->send_cq = ibqp->send_cq;
	init_attr->recv_cq = ibqp->recv_cq;
	init_attr->srq = ibqp->srq;
	init_attr->cap = qp->cap;
	init_attr->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR :
						  IB_SIGNAL_REQ_WR;
	init_attr->qp_type = ibqp->qp_type;
	init_attr->port_num = VRDMA_PORT;
	return 0;
}

static int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);

	/* After this, no event handler runs for the QP. */
	xa_erase_irq(&dev->qp_xa, qp->qpn);
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	vrdma_quiesce(dev);
	if (qp->umem)
		ib_umem_release(qp->umem);
	else
		vrdma_free_kqp(qp);
	return 0;
}

static int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
			   const struct ib_send_wr **bad_wr)
{
	if (!to_vqp(ibqp)->umem)
		return vrdma_kqp_post_send(to_vqp(ibqp), wr, bad_wr);
	*bad_wr = wr;	/* user QPs are posted to in user space */
	return -EOPNOTSUPP;
}

static int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad_wr)
{
	if (!to_vqp(ibqp)->umem)
		return vrdma_kqp_post_recv(to_vqp(ibqp), wr, bad_wr);
	*bad_wr = wr;
	return -EOPNOTSUPP;
}

/* ---- SRQ --------------------------------------------------------------- */

static int vrdma_create_srq(struct ib_srq *ibsrq,
			    struct ib_srq_init_attr *attr,
			    struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_create_srq_resp uresp = {};
	struct vrdma_create_srq_cmd ucmd;
	struct vrdma_create_srq req = {};
	struct vrdma_ucontext *uctx;
	struct vrdma_handle resp;
	u64 ring_bytes, ring_pages;
	u64 notify_key, flags_key;
	unsigned int dbq;
	u32 max_sge;
	size_t npages;
	__le64 *pages;
	int err;

	if (!udata)
		return -EOPNOTSUPP;
	/* A daemon that predates SRQs reports max_srq 0. */
	if (!dev->max_srq || attr->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	uctx = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	err = vrdma_udata_in(udata, &ucmd, sizeof(ucmd));
	if (err)
		return err;
	if (ucmd.reserved)
		return -EINVAL;
	if (!ucmd.depth || !is_power_of_2(ucmd.depth) ||
	    ucmd.depth > dev->max_qp_wr || attr->attr.max_wr > ucmd.depth)
		return -EINVAL;
	if (ucmd.wqe_shift < VRDMA_MIN_RQ_WQE_SHIFT ||
	    ucmd.wqe_shift > VRDMA_MAX_WQE_SHIFT)
		return -EINVAL;
	max_sge = min_t(u32, dev->max_sge,
			((1U << ucmd.wqe_shift) - sizeof(struct vrdma_recv_wqe)) /
			sizeof(struct vrdma_sge));
	if (!max_sge || attr->attr.max_sge > max_sge)
		return -EINVAL;
	ring_bytes = (u64)ucmd.depth << ucmd.wqe_shift;
	ring_pages = DIV_ROUND_UP_ULL(ring_bytes, VRDMA_PAGE_SIZE);
	err = vrdma_check_buf(ucmd.buf_addr, ucmd.buf_len, ring_bytes,
			      ucmd.record_offset,
			      sizeof(struct vrdma_srq_record));
	if (err)
		return err;

	dbq = (unsigned int)atomic_inc_return(&dev->next_dbq) % dev->num_dbq;
	err = vrdma_uctx_doorbell(dev, uctx, dbq, &notify_key, &flags_key);
	if (err)
		return err;

	srq->umem = ib_umem_get(ibsrq->device, ucmd.buf_addr, ucmd.buf_len,
				IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(srq->umem))
		return PTR_ERR(srq->umem);
	pages = vrdma_umem_pages(srq->umem, &npages);
	if (IS_ERR(pages)) {
		err = PTR_ERR(pages);
		goto err_umem;
	}

	req.pdn = cpu_to_le32(to_vpd(ibsrq->pd)->pdn);
	req.max_wr = cpu_to_le32(ucmd.depth);
	req.max_sge = cpu_to_le32(max_sge);
	/* ibv_create_srq(3): srq_limit is ignored on input; not armed. */
	req.srq_limit = 0;
	req.wqe_shift = cpu_to_le32(ucmd.wqe_shift);
	req.doorbell_queue = cpu_to_le32(dbq);
	req.record = cpu_to_le64(vrdma_buf_gpa(pages, ucmd.record_offset));
	req.npages = cpu_to_le32(ring_pages);
	req.page_list = cpu_to_le64(virt_to_phys(pages));
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_SRQ, &req, sizeof(req), &resp,
			 sizeof(resp), pages);
	if (err)
		goto err_umem;
	srq->srqn = le32_to_cpu(resp.handle);
	err = xa_insert_irq(&dev->srq_xa, srq->srqn, srq, GFP_KERNEL);
	if (err) {
		err = err == -EBUSY ? -EIO : err;	/* a reused handle */
		goto err_destroy;
	}
	srq->max_wr = ucmd.depth;
	srq->max_sge = max_sge;
	attr->attr.max_wr = ucmd.depth;
	attr->attr.max_sge = max_sge;
	attr->attr.srq_limit = 0;

	uresp.srqn = srq->srqn;
	uresp.doorbell_queue = dbq;
	uresp.notify_mmap_key = notify_key;
	uresp.flags_mmap_key = flags_key;
	uresp.notify_offset = offset_in_page(dev->dbq[dbq].notify_pa);
	uresp.flags_offset = offset_in_page(dev->dbq[dbq].flags_pa);
	uresp.notify_value = dev->dbq[dbq].notify_value;
	err = vrdma_udata_out(udata, &uresp, sizeof(uresp));
	if (err)
		goto err_erase;
	return 0;

err_erase:
	xa_erase_irq(&dev->srq_xa, srq->srqn);
err_destroy:
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_SRQ, srq->srqn);
	vrdma_quiesce(dev);
err_umem:
	ib_umem_release(srq->umem);
	return err;
}

static int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			    enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_srq_attr req = {};

	if (udata && udata->inlen &&
	    !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EOPNOTSUPP;
	/* The device does not resize SRQs (no IB_DEVICE_SRQ_RESIZE). */
	if (mask & IB_SRQ_MAX_WR)
		return -EOPNOTSUPP;
	if (mask & ~IB_SRQ_LIMIT)
		return -EINVAL;
	if (!mask)
		return 0;
	if (attr->srq_limit > srq->max_wr)
		return -EINVAL;
	req.srqn = cpu_to_le32(srq->srqn);
	req.attr_mask = cpu_to_le32(VRDMA_SRQ_LIMIT);
	req.srq_limit = cpu_to_le32(attr->srq_limit);
	return vrdma_exec(to_vdev(ibsrq->device), VRDMA_CMD_MODIFY_SRQ, &req,
			  sizeof(req), NULL, 0, NULL);
}

static int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_handle req = { .handle = cpu_to_le32(srq->srqn) };
	struct vrdma_srq_attr resp;
	u32 limit;
	int err;

	err = vrdma_exec(dev, VRDMA_CMD_QUERY_SRQ, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err == -ENOENT)
		vrdma_set_dead(dev, "device lost its objects");
	if (err)
		return err;
	limit = le32_to_cpu(resp.srq_limit);
	if (le32_to_cpu(resp.srqn) != srq->srqn ||
	    le32_to_cpu(resp.max_wr) != srq->max_wr || limit > srq->max_wr) {
		ibdev_err_ratelimited(&dev->ibdev,
				      "QUERY_SRQ of %#x answered SRQ %#x, max_wr %u, limit %u\n",
				      srq->srqn, le32_to_cpu(resp.srqn),
				      le32_to_cpu(resp.max_wr), limit);
		return -EIO;
	}
	attr->max_wr = srq->max_wr;
	attr->max_sge = srq->max_sge;
	attr->srq_limit = limit;
	return 0;
}

static int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);

	/*
	 * The core refuses while a QP uses the SRQ, so the device's BUSY
	 * cannot be a legitimate answer here. After the erase, no event
	 * handler runs for the SRQ.
	 */
	xa_erase_irq(&dev->srq_xa, srq->srqn);
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_SRQ, srq->srqn);
	vrdma_quiesce(dev);
	ib_umem_release(srq->umem);
	return 0;
}

static int vrdma_post_srq_recv(struct ib_srq *ibsrq,
			       const struct ib_recv_wr *wr,
			       const struct ib_recv_wr **bad_wr)
{
	*bad_wr = wr;	/* user SRQs are posted to in user space */
	return -EOPNOTSUPP;
}

/* ---- AH ---------------------------------------------------------------- */

static int vrdma_create_ah(struct ib_ah *ibah,
			   struct rdma_ah_init_attr *init_attr,
			   struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct rdma_ah_attr *ah_attr = init_attr->ah_attr;
	struct vrdma_create_ah_resp uresp = {};
	const struct ib_global_route *grh;
	struct vrdma_create_ah req = {};
	struct vrdma_handle resp;
	int err;

	/* Kernel AHs may be created where nothing may sleep: no command. */
	if (!udata)
		return vrdma_create_kah(to_vah(ibah), ah_attr);
	if (!(rdma_ah_get_ah_flags(ah_attr) & IB_AH_GRH))
		return -EINVAL;
	grh = rdma_ah_read_grh(ah_attr);
	req.pdn = cpu_to_le32(to_vpd(ibah->pd)->pdn);
	req.port_num = cpu_to_le32(VRDMA_PORT);
	memcpy(req.dgid, grh->dgid.raw, sizeof(req.dgid));
	req.sgid_index = cpu_to_le32(grh->sgid_index);
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_AH, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err)
		return err;
	to_vah(ibah)->ahn = le32_to_cpu(resp.handle);

	/*
	 * UD send WQEs name the device's AH: the provider needs its number.
	 * A provider without UD asks for no response.
	 */
	if (!udata->outlen)
		return 0;
	uresp.ahn = to_vah(ibah)->ahn;
	err = vrdma_udata_out(udata, &uresp, sizeof(uresp));
	if (err)
		vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_AH, uresp.ahn);
	return err;
}

/* uverbs destroys user AHs with RDMA_DESTROY_AH_SLEEPABLE. */
static int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	if (to_vah(ibah)->kernel)
		return 0;	/* the driver's alone */
	vrdma_exec_destroy(to_vdev(ibah->device), VRDMA_CMD_DESTROY_AH,
			   to_vah(ibah)->ahn);
	return 0;
}

const struct ib_device_ops vrdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION,

	.add_gid = vrdma_add_gid,
	.alloc_mr = vrdma_alloc_mr,
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.create_srq = vrdma_create_srq,
	.create_user_ah = vrdma_create_ah,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.del_gid = vrdma_del_gid,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.get_dma_mr = vrdma_get_dma_mr,
	.get_link_layer = vrdma_get_link_layer,
	.get_port_immutable = vrdma_get_port_immutable,
	.map_mr_sg = vrdma_map_mr_sg,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device = vrdma_query_device,
	.query_pkey = vrdma_query_pkey,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_user_mr = vrdma_reg_user_mr,
	.req_notify_cq = vrdma_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vrdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibuc),
};
