// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma: the verbs of the guest kernel's own RDMA consumers.
 *
 * User space posts and polls in its own memory (the provider); the
 * kernel's consumers - ib_mad's GSI QP, and through it ib_cm and rdma_cm -
 * need the same data path in the kernel. This file is that data path, on
 * the device's rings exactly as the provider uses them (docs/spec.md
 * § Doorbell queues and the data path), and the three things the device
 * offers for it when config space's device_caps has GSI (§ Kernel verbs
 * and the GSI QP):
 *
 *  - the GSI QP (QP1): a UD QP the device addresses as QP number 1. Its
 *    device handle names it in commands and CQEs; ibqp.qp_num is 1, as
 *    ib_mad requires.
 *  - a DMA MR for a kernel PD's local_dma_lkey: SGEs carry the DMA
 *    addresses ib_dma_map_*() returns, which are guest-physical (the DMA
 *    device is the PCI function, dma-direct, no vIOMMU: vrdma_main.c).
 *  - address vectors in UD send WQEs: ib_cm creates AHs under a spinlock
 *    and ib_mad answers from its completion handler, so a kernel AH is
 *    the driver's alone (no command, nothing that sleeps) and each WQE
 *    carries its destination.
 *
 * Rings and records of kernel CQs and QPs are one physically contiguous,
 * zeroed allocation each (alloc_pages_exact), handed to the device by a
 * page list like a user buffer's; they are freed only after DESTROY and
 * vrdma_quiesce(), when the device can no longer reach them.
 *
 * A kernel CQ is armed through its record (VRDMA_CQ_F_ARM_RECORD), never
 * by a command: ib_req_notify_cq() is called from completion handlers.
 * Arming, a full barrier, then reading pi is what lets
 * IB_CQ_REPORT_MISSED_EVENTS tell the caller to poll again: the device
 * advances pi, issues a full barrier and then reads the arm word, so one of
 * the two sees the other.
 *
 * Posting: WQEs are written into the ring under the queue's spinlock, the
 * producer index published with release ordering, and the doorbell step
 * taken (full barrier, read the doorbell queue's used-ring flags, notify
 * unless VRING_USED_F_NO_NOTIFY). Free slots are counted from the device's
 * consumer index in the record, which it stores before the completions it
 * covers are visible. A device that lies in its record or CQ can make a
 * kernel consumer see wrong completions, never make this code read or write
 * outside the rings: indices are masked, CQEs copied once and checked.
 *
 * Kernel QPs: GSI and UD (SEND, SEND_WITH_IMM, inline data), and RC with
 * every operation the device has for the kernel's ULPs (NVMe over RDMA,
 * NFS/RDMA, iSER): SEND with immediate or invalidate, RDMA WRITE and READ,
 * atomics, LOCAL_INV and fast registration (IB_WR_REG_MR of an ib_alloc_mr
 * MR: the driver keeps the page list ib_map_mr_sg() built, in memory the
 * device reads when it executes the WQE). Kernel SRQs and memory windows
 * for kernel consumers are not supported (EOPNOTSUPP).
 */
#include <linux/gfp.h>
#include <linux/log2.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>
#include <rdma/ib_mad.h>

#include "vrdma.h"

/* ---- memory the device reads and writes -------------------------------- */

static int vrdma_kbuf_alloc(struct vrdma_kbuf *kb, size_t size)
{
	kb->size = PAGE_ALIGN(size);
	kb->va = alloc_pages_exact(kb->size, GFP_KERNEL | __GFP_ZERO |
				   __GFP_NOWARN);
	return kb->va ? 0 : -ENOMEM;
}

static void vrdma_kbuf_free(struct vrdma_kbuf *kb)
{
	if (kb->va)
		free_pages_exact(kb->va, kb->size);
	kb->va = NULL;
}

/* The page list of the first @npages 4 KiB pages of @kb, for a command. */
static __le64 *vrdma_kbuf_pages(const struct vrdma_kbuf *kb, size_t npages)
{
	__le64 *list;
	size_t i;

	list = kmalloc_array(npages, sizeof(*list), GFP_KERNEL);
	if (!list)
		return NULL;
	for (i = 0; i < npages; i++)
		list[i] = cpu_to_le64(virt_to_phys(kb->va) +
				      i * VRDMA_PAGE_SIZE);
	return list;
}

/* The doorbell step of docs/spec.md after a producer index was published. */
static void vrdma_kdoorbell(struct vrdma_dev *dev, unsigned int dbq)
{
	const struct vrdma_doorbell *db = &dev->dbq[dbq];

	/* The producer index before the flags: the device's sleep check. */
	smp_mb();
	if (!(virtio16_to_cpu(dev->vdev, READ_ONCE(*db->used_flags)) &
	      VRING_USED_F_NO_NOTIFY))
		virtqueue_notify(db->vq);
}

/* ---- DMA MR ---------------------------------------------------------------- */

/*
 * The local_dma_lkey of a kernel PD (ib_alloc_pd) and ib_get_dma_mr(): the
 * guest-physical address space for local access. The core calls this only
 * for PDs of the kernel, and no uverbs command reaches it.
 */
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_reg_mr req = {};
	struct vrdma_mr_keys resp;
	struct vrdma_mr *mr;
	int err;

	if (!dev->gsi)
		return ERR_PTR(-EOPNOTSUPP);
	/* Remote access to all of guest memory is never granted. */
	if (access & ~IB_ACCESS_LOCAL_WRITE)
		return ERR_PTR(-EOPNOTSUPP);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(access & IB_ACCESS_LOCAL_WRITE);
	req.flags = cpu_to_le32(VRDMA_REG_MR_F_DMA);
	err = vrdma_exec(dev, VRDMA_CMD_REG_MR, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err) {
		kfree(mr);
		return ERR_PTR(err);
	}
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = 0;	/* not a remote key */
	return &mr->ibmr;
}

/*
 * An MR for fast registration (ib_alloc_mr): the device's ALLOC_MR, and a
 * page list ib_map_mr_sg() fills that the REG_MR WQE hands the device.
 */
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_alloc_mr req = {};
	struct vrdma_mr_keys resp;
	struct vrdma_mr *mr;
	int err;

	if (!(dev->dev_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS) ||
	    type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_num_sg || max_num_sg > VRDMA_MAX_FAST_REG_PAGES)
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	/* Physically contiguous: the device reads it by its address. */
	mr->pages = kcalloc(max_num_sg, sizeof(*mr->pages), GFP_KERNEL);
	if (!mr->pages) {
		err = -ENOMEM;
		goto err_free;
	}
	mr->max_pages = max_num_sg;
	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.max_pages = cpu_to_le32(max_num_sg);
	err = vrdma_exec(dev, VRDMA_CMD_ALLOC_MR, &req, sizeof(req), &resp,
			 sizeof(resp), NULL);
	if (err)
		goto err_pages;
	mr->dev_key = le32_to_cpu(resp.lkey);
	mr->ibmr.lkey = mr->dev_key;
	mr->ibmr.rkey = mr->dev_key;
	return &mr->ibmr;

err_pages:
	kfree(mr->pages);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = to_vmr(ibmr);

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	mr->pages[mr->npages++] = cpu_to_le64(addr);
	return 0;
}

int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset)
{
	to_vmr(ibmr)->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
}

/* ---- CQ ------------------------------------------------------------------ */

int vrdma_create_kcq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_create_cq req = {};
	struct vrdma_handle resp;
	size_t ring_bytes, ring_pages;
	__le64 *pages;
	u32 cqe;
	int err;

	if (attr->flags)
		return -EOPNOTSUPP;
	if (!attr->cqe || attr->cqe > dev->max_cqe)
		return -EINVAL;
	cqe = roundup_pow_of_two(attr->cqe);
	if (cqe > dev->max_cqe)
		return -EINVAL;
	ring_bytes = (size_t)cqe * sizeof(struct vrdma_cqe);
	ring_pages = DIV_ROUND_UP(ring_bytes, VRDMA_PAGE_SIZE);
	/*
	 * The record right after the ring: ring_bytes is a multiple of 32, so
	 * the 16-byte record never straddles a page.
	 */
	err = vrdma_kbuf_alloc(&cq->kbuf, ring_bytes +
			       sizeof(struct vrdma_cq_arm_record));
	if (err)
		return err;
	cq->ring = cq->kbuf.va;
	cq->rec = cq->kbuf.va + ring_bytes;
	spin_lock_init(&cq->lock);

	pages = vrdma_kbuf_pages(&cq->kbuf, ring_pages);
	if (!pages) {
		err = -ENOMEM;
		goto err_free;
	}
	req.cqe = cpu_to_le32(cqe);
	req.npages = cpu_to_le32(ring_pages);
	req.record = cpu_to_le64(virt_to_phys(cq->rec));
	req.page_list = cpu_to_le64(virt_to_phys(pages));
	req.flags = cpu_to_le32(VRDMA_CQ_F_ARM_RECORD);
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_CQ, &req, sizeof(req), &resp,
			 sizeof(resp), pages);
	if (err)
		goto err_free;
	cq->cqn = le32_to_cpu(resp.handle);
	err = xa_insert_irq(&dev->cq_xa, cq->cqn, cq, GFP_KERNEL);
	if (err) {
		err = err == -EBUSY ? -EIO : err;	/* a reused handle */
		vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_CQ, cq->cqn);
		vrdma_quiesce(dev);
		goto err_free;
	}
	ibcq->cqe = cqe;
	return 0;

err_free:
	vrdma_kbuf_free(&cq->kbuf);
	return err;
}

/* After DESTROY_CQ and vrdma_quiesce(). */
void vrdma_free_kcq(struct vrdma_cq *cq)
{
	vrdma_kbuf_free(&cq->kbuf);
}

int vrdma_kcq_notify(struct vrdma_cq *cq, enum ib_cq_notify_flags flags)
{
	unsigned long irqflags;
	u32 arm, pi;
	int missed;

	spin_lock_irqsave(&cq->lock, irqflags);
	/* A new sequence (bits 1-31) is what arms; bit 0 solicited-only. */
	cq->arm_seq++;
	arm = cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT;
	if ((flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED)
		arm |= VRDMA_CQ_ARM_SOLICITED;
	WRITE_ONCE(cq->rec->arm, cpu_to_le32(arm));
	/* The arm before pi, as the device's pi before its arm read. */
	smp_mb();
	pi = le32_to_cpu(READ_ONCE(cq->rec->pi));
	missed = (flags & IB_CQ_REPORT_MISSED_EVENTS) && pi != cq->ci;
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return missed;
}

static enum ib_wc_opcode vrdma_wc_opcode(u8 op, bool *ok)
{
	*ok = true;
	switch (op) {
	case VRDMA_WC_SEND:
		return IB_WC_SEND;
	case VRDMA_WC_RDMA_WRITE:
		return IB_WC_RDMA_WRITE;
	case VRDMA_WC_RDMA_READ:
		return IB_WC_RDMA_READ;
	case VRDMA_WC_COMP_SWAP:
		return IB_WC_COMP_SWAP;
	case VRDMA_WC_FETCH_ADD:
		return IB_WC_FETCH_ADD;
	case VRDMA_WC_LOCAL_INV:
		return IB_WC_LOCAL_INV;
	case VRDMA_WC_REG_MR:
		return IB_WC_REG_MR;
	case VRDMA_WC_RECV:
		return IB_WC_RECV;
	case VRDMA_WC_RECV_RDMA_WITH_IMM:
		return IB_WC_RECV_RDMA_WITH_IMM;
	}
	*ok = false;
	return IB_WC_SEND;
}

/*
 * One CQE (a copy) into @wc. False for an entry that names no QP of this
 * CQ (the QP was destroyed with entries left, or the device is wrong): it
 * is skipped, as a completion nobody can own.
 */
static bool vrdma_kcqe_to_wc(struct vrdma_dev *dev, struct vrdma_cq *cq,
			     const struct vrdma_cqe *c, struct ib_wc *wc)
{
	u32 qpn = le32_to_cpu(c->qp_num);
	u16 flags = le16_to_cpu(c->wc_flags);
	unsigned long irqflags;
	struct vrdma_qp *qp;
	bool ok, mine;

	memset(wc, 0, sizeof(*wc));
	wc->opcode = vrdma_wc_opcode(c->opcode, &ok);
	/*
	 * Under the xarray's lock, which destroy_qp takes to erase the QP
	 * before the core frees it: the QP is looked at only while it lives.
	 */
	xa_lock_irqsave(&dev->qp_xa, irqflags);
	qp = xa_load(&dev->qp_xa, qpn);
	mine = qp && (wc->opcode & IB_WC_RECV ?
		      qp->ibqp.recv_cq == &cq->ibcq :
		      qp->ibqp.send_cq == &cq->ibcq);
	xa_unlock_irqrestore(&dev->qp_xa, irqflags);
	if (!qp || !ok) {
		ibdev_dbg(&dev->ibdev, "CQ %#x: entry for QP %#x opcode %u skipped\n",
			  cq->cqn, qpn, c->opcode);
		return false;
	}
	if (!mine) {
		ibdev_err_ratelimited(&dev->ibdev,
				      "CQ %#x: entry of QP %#x, which does not use it\n",
				      cq->cqn, qpn);
		return false;
	}
	wc->wr_id = le64_to_cpu(c->wr_id);
	wc->status = c->status <= IB_WC_GENERAL_ERR ? c->status :
						      IB_WC_GENERAL_ERR;
	wc->vendor_err = le32_to_cpu(c->vendor_err);
	wc->byte_len = le32_to_cpu(c->byte_len);
	wc->qp = &qp->ibqp;
	wc->src_qp = le32_to_cpu(c->src_qp) & 0xffffff;
	if (flags & VRDMA_WC_F_GRH)
		wc->wc_flags |= IB_WC_GRH;
	if (flags & VRDMA_WC_F_WITH_IMM) {
		wc->wc_flags |= IB_WC_WITH_IMM;
		/* The 32 bits as the sender posted them: already big-endian. */
		wc->ex.imm_data = (__force __be32)c->imm_data;
	} else if (flags & VRDMA_WC_F_WITH_INV) {
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = le32_to_cpu(c->imm_data);
	}
	wc->port_num = VRDMA_PORT;
	wc->pkey_index = 0;
	return true;
}

int vrdma_kcq_poll(struct vrdma_cq *cq, int num_entries, struct ib_wc *wc)
{
	struct vrdma_dev *dev = to_vdev(cq->ibcq.device);
	u32 mask = cq->ibcq.cqe - 1, pi, todo, n = 0;
	unsigned long flags;
	struct vrdma_cqe c;

	spin_lock_irqsave(&cq->lock, flags);
	/* The device writes CQEs before pi (release): read them after. */
	pi = le32_to_cpu(smp_load_acquire(&cq->rec->pi));
	todo = pi - cq->ci;
	if (todo > cq->ibcq.cqe) {
		/* The device never gets more than cqe ahead; ignore it. */
		ibdev_err_ratelimited(&dev->ibdev,
				      "CQ %#x: producer index %u is %u ahead\n",
				      cq->cqn, pi, todo);
		todo = 0;
	}
	while (todo && n < num_entries) {
		memcpy(&c, &cq->ring[cq->ci & mask], sizeof(c));
		cq->ci++;
		todo--;
		if (vrdma_kcqe_to_wc(dev, cq, &c, &wc[n]))
			n++;
	}
	/* The entries are copied before the device may reuse their slots. */
	smp_store_release(&cq->rec->ci, cpu_to_le32(cq->ci));
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

/* ---- QP ------------------------------------------------------------------ */

static u8 vrdma_wqe_shift(u32 bytes, u8 min)
{
	return max_t(u8, order_base_2(bytes), min);
}

int vrdma_create_kqp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_create_qp req = {};
	struct vrdma_handle resp;
	u32 send_sge, recv_sge, inl, mtu, sq_bytes, rq_bytes, sq_pages, rq_pages;
	bool gsi = attr->qp_type == IB_QPT_GSI;
	bool rc = attr->qp_type == IB_QPT_RC;
	u32 av = rc ? 0 : VRDMA_AV_SIZE;
	size_t rec_off;
	__le64 *pages;
	int err;

	if (!dev->gsi)
		return -EOPNOTSUPP;
	if (!gsi && !rc && attr->qp_type != IB_QPT_UD)
		return -EOPNOTSUPP;
	if (attr->create_flags || attr->srq || attr->xrcd)
		return -EOPNOTSUPP;
	if (!attr->send_cq || !attr->recv_cq ||
	    to_vcq(attr->send_cq)->umem || to_vcq(attr->recv_cq)->umem)
		return -EINVAL;
	if (gsi && attr->port_num != VRDMA_PORT)
		return -EINVAL;

	send_sge = max_t(u32, attr->cap.max_send_sge, 1);
	recv_sge = max_t(u32, attr->cap.max_recv_sge, 1);
	mtu = ib_mtu_enum_to_int(dev->active_mtu);
	inl = attr->cap.max_inline_data;
	/* A datagram, inline data included, fits the port's MTU. */
	if (send_sge > dev->max_sge || recv_sge > dev->max_sge ||
	    inl > dev->max_inline || (!rc && inl > mtu))
		return -EINVAL;
	if (attr->cap.max_send_wr > dev->max_qp_wr ||
	    attr->cap.max_recv_wr > dev->max_qp_wr)
		return -EINVAL;
	qp->sq_depth = roundup_pow_of_two(max_t(u32, attr->cap.max_send_wr, 1));
	qp->rq_depth = roundup_pow_of_two(max_t(u32, attr->cap.max_recv_wr, 1));
	/* Every UD send WQE carries its address vector (VRDMA_WQE_AV). */
	qp->sq_shift = vrdma_wqe_shift(max_t(u32,
		sizeof(struct vrdma_send_wqe) + av +
		send_sge * sizeof(struct vrdma_sge),
		sizeof(struct vrdma_send_wqe) + av + inl),
		VRDMA_MIN_SQ_WQE_SHIFT);
	qp->rq_shift = vrdma_wqe_shift(sizeof(struct vrdma_recv_wqe) +
				       recv_sge * sizeof(struct vrdma_sge),
				       VRDMA_MIN_RQ_WQE_SHIFT);
	if (qp->sq_shift > VRDMA_MAX_WQE_SHIFT ||
	    qp->rq_shift > VRDMA_MAX_WQE_SHIFT)
		return -EINVAL;
	/* What the strides hold, at least what was asked. */
	send_sge = min_t(u32, dev->max_sge,
			 ((1U << qp->sq_shift) - sizeof(struct vrdma_send_wqe) -
			  av) / sizeof(struct vrdma_sge));
	recv_sge = min_t(u32, dev->max_sge,
			 ((1U << qp->rq_shift) - sizeof(struct vrdma_recv_wqe)) /
			 sizeof(struct vrdma_sge));

	sq_bytes = qp->sq_depth << qp->sq_shift;
	rq_bytes = qp->rq_depth << qp->rq_shift;
	sq_pages = DIV_ROUND_UP(sq_bytes, VRDMA_PAGE_SIZE);
	rq_pages = DIV_ROUND_UP(rq_bytes, VRDMA_PAGE_SIZE);
	/*
	 * SQ pages, RQ pages, the record after the RQ's last byte: rq_bytes
	 * is a multiple of 32, so the record never straddles a page.
	 */
	rec_off = (size_t)sq_pages * VRDMA_PAGE_SIZE + rq_bytes;
	err = vrdma_kbuf_alloc(&qp->kbuf, rec_off +
			       sizeof(struct vrdma_qp_record));
	if (err)
		return err;
	qp->sq = qp->kbuf.va;
	qp->rq = qp->kbuf.va + (size_t)sq_pages * VRDMA_PAGE_SIZE;
	qp->rec = qp->kbuf.va + rec_off;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	qp->sq_pi = 0;
	qp->rq_pi = 0;

	pages = vrdma_kbuf_pages(&qp->kbuf, sq_pages + rq_pages);
	if (!pages) {
		err = -ENOMEM;
		goto err_free;
	}
	qp->dbq = (unsigned int)atomic_inc_return(&dev->next_dbq) %
		  dev->num_dbq;
	req.pdn = cpu_to_le32(to_vpd(ibqp->pd)->pdn);
	req.send_cqn = cpu_to_le32(to_vcq(attr->send_cq)->cqn);
	req.recv_cqn = cpu_to_le32(to_vcq(attr->recv_cq)->cqn);
	req.qp_type = cpu_to_le32(gsi ? VRDMA_QPT_GSI :
				  rc ? VRDMA_QPT_RC : VRDMA_QPT_UD);
	req.max_send_wr = cpu_to_le32(qp->sq_depth);
	req.max_recv_wr = cpu_to_le32(qp->rq_depth);
	req.max_send_sge = cpu_to_le32(send_sge);
	req.max_recv_sge = cpu_to_le32(recv_sge);
	req.max_inline_data = cpu_to_le32(inl);
	req.sq_wqe_shift = cpu_to_le32(qp->sq_shift);
	req.rq_wqe_shift = cpu_to_le32(qp->rq_shift);
	req.doorbell_queue = cpu_to_le32(qp->dbq);
	req.record = cpu_to_le64(virt_to_phys(qp->rec));
	req.sq_npages = cpu_to_le32(sq_pages);
	req.rq_npages = cpu_to_le32(rq_pages);
	req.page_list = cpu_to_le64(virt_to_phys(pages));
	req.sq_sig_all = cpu_to_le32(attr->sq_sig_type == IB_SIGNAL_ALL_WR);
	err = vrdma_exec(dev, VRDMA_CMD_CREATE_QP, &req,
			 offsetof(struct vrdma_create_qp, srqn), &resp,
			 sizeof(resp), pages);
	if (err)
		goto err_free;
	qp->qpn = le32_to_cpu(resp.handle);
	if (!vrdma_valid_qpn(qp->qpn)) {
		ibdev_err_ratelimited(&dev->ibdev,
				      "device answered QP number %#x\n", qp->qpn);
		err = -EIO;
		goto err_destroy;
	}
	/* ib_mad tells QP0 from QP1 by number; peers address QP1 as 1. */
	ibqp->qp_num = gsi ? VRDMA_GSI_QPN : qp->qpn;
	err = xa_insert_irq(&dev->qp_xa, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		err = err == -EBUSY ? -EIO : err;
		goto err_destroy;
	}
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	attr->cap.max_send_sge = send_sge;
	attr->cap.max_recv_sge = recv_sge;
	attr->cap.max_inline_data = inl;
	qp->cap = attr->cap;
	qp->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	return 0;

err_destroy:
	vrdma_exec_destroy(dev, VRDMA_CMD_DESTROY_QP, qp->qpn);
	vrdma_quiesce(dev);
err_free:
	vrdma_kbuf_free(&qp->kbuf);
	return err;
}

/* After DESTROY_QP and vrdma_quiesce(). */
void vrdma_free_kqp(struct vrdma_qp *qp)
{
	vrdma_kbuf_free(&qp->kbuf);
}

static void vrdma_put_sges(struct vrdma_sge *dst, const struct ib_sge *sg,
			   int n)
{
	int i;

	for (i = 0; i < n; i++) {
		dst[i].addr = cpu_to_le64(sg[i].addr);
		dst[i].length = cpu_to_le32(sg[i].length);
		dst[i].lkey = cpu_to_le32(sg[i].lkey);
	}
}

/* IB access flags as the device's (REG_MR); -1 for one it does not have. */
static int vrdma_kaccess(int access)
{
	int ok = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		 IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC |
		 IB_ACCESS_MW_BIND;

	/* Relaxed ordering is a hint the device needs not. */
	access &= ~IB_ACCESS_RELAXED_ORDERING;
	return access & ~ok ? -1 : access;
}

/* IB_WR_REG_MR: fast registration of an ib_alloc_mr() MR (docs/spec.md). */
static int vrdma_kwqe_reg_mr(const struct ib_send_wr *wr, void *w)
{
	const struct ib_reg_wr *reg = reg_wr(wr);
	struct vrdma_reg_mr_wqe *r = w;
	struct vrdma_mr *mr;
	int access;

	if (!reg->mr)
		return -EINVAL;
	mr = to_vmr(reg->mr);
	access = vrdma_kaccess(reg->access);
	if (!mr->pages || access < 0 || !mr->npages ||
	    !is_power_of_2(mr->ibmr.page_size) ||
	    ((reg->key ^ mr->dev_key) & ~VRDMA_KEY_BYTE_MASK))
		return -EINVAL;
	r->opcode = VRDMA_WR_REG_MR;
	r->mr = cpu_to_le32(mr->dev_key);
	r->new_key = cpu_to_le32(reg->key);
	r->iova = cpu_to_le64(mr->ibmr.iova);
	r->length = cpu_to_le64(mr->ibmr.length);
	r->access = cpu_to_le32(access);
	r->page_list = cpu_to_le64(virt_to_phys(mr->pages));
	r->npages = cpu_to_le32(mr->npages);
	r->page_shift = cpu_to_le32(ilog2(mr->ibmr.page_size));
	/* The device names the MR by this key from the WQE on. */
	mr->dev_key = reg->key;
	return 0;
}

/* The operation's fields of a kernel send WR; its WQE opcode or -EINVAL. */
static int vrdma_kwqe_op(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			 struct vrdma_send_wqe *h, bool *data)
{
	bool ud = qp->ibqp.qp_type != IB_QPT_RC;

	*data = true;
	switch (wr->opcode) {
	case IB_WR_SEND:
		return VRDMA_WR_SEND;
	case IB_WR_SEND_WITH_IMM:
		h->imm_data = (__force __le32)wr->ex.imm_data;
		return VRDMA_WR_SEND_WITH_IMM;
	default:
		break;
	}
	if (ud)
		return -EINVAL;
	switch (wr->opcode) {
	case IB_WR_SEND_WITH_INV:
		h->imm_data = cpu_to_le32(wr->ex.invalidate_rkey);
		return VRDMA_WR_SEND_WITH_INV;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		h->imm_data = (__force __le32)wr->ex.imm_data;
		fallthrough;
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_READ:
		h->remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		h->rkey = cpu_to_le32(rdma_wr(wr)->rkey);
		return wr->opcode == IB_WR_RDMA_READ ? VRDMA_WR_RDMA_READ :
		       wr->opcode == IB_WR_RDMA_WRITE ? VRDMA_WR_RDMA_WRITE :
							VRDMA_WR_RDMA_WRITE_WITH_IMM;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		h->remote_addr = cpu_to_le64(atomic_wr(wr)->remote_addr);
		h->rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		h->compare_add = cpu_to_le64(atomic_wr(wr)->compare_add);
		if (wr->opcode == IB_WR_ATOMIC_FETCH_AND_ADD)
			return VRDMA_WR_ATOMIC_FETCH_AND_ADD;
		h->swap = cpu_to_le64(atomic_wr(wr)->swap);
		return VRDMA_WR_ATOMIC_CMP_AND_SWP;
	case IB_WR_LOCAL_INV:
		*data = false;
		h->imm_data = cpu_to_le32(wr->ex.invalidate_rkey);
		return VRDMA_WR_LOCAL_INV;
	default:
		return -EINVAL;
	}
}

/*
 * One send WR into the send WQE slot @w (its stride zeroed here): a UD or
 * GSI WQE carries its AH's address vector and its data after it.
 */
static int vrdma_kwqe_send(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			   void *w)
{
	bool ud = qp->ibqp.qp_type != IB_QPT_RC, data;
	struct vrdma_send_wqe *h = w;
	void *p = w + sizeof(*h) + (ud ? VRDMA_AV_SIZE : 0);
	struct vrdma_ah *ah = NULL;
	u8 flags = 0;
	u32 len = 0;
	int op, i;

	if (wr->num_sge < 0)
		return -EINVAL;
	if (ud) {
		if (!ud_wr(wr)->ah)
			return -EINVAL;
		ah = to_vah(ud_wr(wr)->ah);
		if (!ah->kernel)
			return -EINVAL;
	}
	/*
	 * The header (and AV) are what must hold zeros the WR leaves unset;
	 * SGEs and inline bytes are written whole below.
	 */
	memset(w, 0, sizeof(*h) + (ud ? VRDMA_AV_SIZE : 0));
	if (qp->sq_sig_all || (wr->send_flags & IB_SEND_SIGNALED))
		flags |= VRDMA_WQE_SIGNALED;
	if (wr->send_flags & IB_SEND_SOLICITED)
		flags |= VRDMA_WQE_SOLICITED;
	if (wr->send_flags & IB_SEND_FENCE) {
		if (ud)
			return -EINVAL;
		flags |= VRDMA_WQE_FENCE;
	}
	h->wr_id = cpu_to_le64(wr->wr_id);
	if (wr->opcode == IB_WR_REG_MR && !ud) {
		h->flags = flags;
		return vrdma_kwqe_reg_mr(wr, w);
	}
	op = vrdma_kwqe_op(qp, wr, h, &data);
	if (op < 0)
		return op;
	h->opcode = op;

	if (!data) {
		/* Nothing to move. */
	} else if ((wr->send_flags & IB_SEND_INLINE) &&
		   op != VRDMA_WR_RDMA_READ &&
		   op != VRDMA_WR_ATOMIC_CMP_AND_SWP &&
		   op != VRDMA_WR_ATOMIC_FETCH_AND_ADD) {
		for (i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > qp->cap.max_inline_data - len)
				return -EINVAL;
			/* Inline SGEs of kernel consumers are kernel addresses. */
			memcpy(p + len, (void *)(uintptr_t)wr->sg_list[i].addr,
			       wr->sg_list[i].length);
			len += wr->sg_list[i].length;
		}
		flags |= VRDMA_WQE_INLINE;
		h->inline_len = cpu_to_le32(len);
	} else {
		if (wr->num_sge > qp->cap.max_send_sge)
			return -EINVAL;
		vrdma_put_sges(p, wr->sg_list, wr->num_sge);
		h->num_sge = cpu_to_le16(wr->num_sge);
	}
	h->flags = flags;
	if (ud) {
		struct vrdma_av *av = w + sizeof(*h);

		h->flags |= VRDMA_WQE_AV;
		h->remote_qpn = cpu_to_le32(ud_wr(wr)->remote_qpn & 0xffffff);
		h->remote_qkey = cpu_to_le32(ud_wr(wr)->remote_qkey);
		memcpy(av->dgid, ah->dgid, sizeof(av->dgid));
		av->sgid_index = cpu_to_le32(ah->sgid_index);
	}
	return 0;
}

/*
 * The slot of producer index @pi in a ring of @depth WQEs of 1 << @shift
 * bytes, or NULL when the ring is full. *@ci is the caller's copy of the
 * consumer index, read again from the record (@ci_p) only when the copy
 * says full; an index the device moved past @pi reads as full, never as
 * room to overwrite.
 */
static void *vrdma_kslot(void *ring, u32 depth, u8 shift, u32 pi, u32 *ci,
			 const __le32 *ci_p)
{
	if (pi - *ci >= depth) {
		*ci = le32_to_cpu(READ_ONCE(*ci_p));
		if (pi - *ci >= depth)
			return NULL;
	}
	return ring + ((size_t)(pi & (depth - 1)) << shift);
}

/* Publish a queue's producer index, then the doorbell step. */
static void vrdma_kpublish(struct vrdma_dev *dev, struct vrdma_qp *qp,
			   __le32 *pi_p, u32 pi)
{
	/* The WQEs before the index that makes them the device's. */
	smp_store_release(pi_p, cpu_to_le32(pi));
	vrdma_kdoorbell(dev, qp->dbq);
}

int vrdma_kqp_post_send(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			const struct ib_send_wr **bad_wr)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	unsigned long flags;
	u32 ci, pi;
	void *w;
	int err = 0;

	if (vrdma_dead(dev)) {
		*bad_wr = wr;
		return -EIO;
	}
	spin_lock_irqsave(&qp->sq_lock, flags);
	ci = le32_to_cpu(READ_ONCE(qp->rec->sq_ci));
	for (pi = qp->sq_pi; wr; wr = wr->next, pi++) {
		w = vrdma_kslot(qp->sq, qp->sq_depth, qp->sq_shift, pi, &ci,
				&qp->rec->sq_ci);
		err = w ? vrdma_kwqe_send(qp, wr, w) : -ENOMEM;
		if (err)
			break;
	}
	if (pi != qp->sq_pi) {
		qp->sq_pi = pi;
		vrdma_kpublish(dev, qp, &qp->rec->sq_pi, pi);
	}
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

int vrdma_kqp_post_recv(struct vrdma_qp *qp, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct vrdma_recv_wqe *h;
	unsigned long flags;
	u32 ci, pi;
	int err = 0;

	if (vrdma_dead(dev)) {
		*bad_wr = wr;
		return -EIO;
	}
	spin_lock_irqsave(&qp->rq_lock, flags);
	ci = le32_to_cpu(READ_ONCE(qp->rec->rq_ci));
	for (pi = qp->rq_pi; wr; wr = wr->next, pi++) {
		if (wr->num_sge < 0 || wr->num_sge > qp->cap.max_recv_sge) {
			err = -EINVAL;
			break;
		}
		h = vrdma_kslot(qp->rq, qp->rq_depth, qp->rq_shift, pi, &ci,
				&qp->rec->rq_ci);
		if (!h) {
			err = -ENOMEM;
			break;
		}
		memset(h, 0, sizeof(*h));
		h->wr_id = cpu_to_le64(wr->wr_id);
		h->num_sge = cpu_to_le16(wr->num_sge);
		vrdma_put_sges((void *)(h + 1), wr->sg_list, wr->num_sge);
	}
	if (pi != qp->rq_pi) {
		qp->rq_pi = pi;
		vrdma_kpublish(dev, qp, &qp->rec->rq_pi, pi);
	}
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

/* ---- AH ------------------------------------------------------------------ */

/* May be called in atomic context: no command, no allocation. */
int vrdma_create_kah(struct vrdma_ah *ah, const struct rdma_ah_attr *ah_attr)
{
	struct vrdma_dev *dev = to_vdev(ah->ibah.device);
	const struct ib_global_route *grh;

	if (!dev->gsi)
		return -EOPNOTSUPP;
	if (!(rdma_ah_get_ah_flags(ah_attr) & IB_AH_GRH))
		return -EINVAL;
	grh = rdma_ah_read_grh(ah_attr);
	if (grh->sgid_index >= dev->gid_tbl_len)
		return -EINVAL;
	ah->kernel = true;
	ah->ahn = 0;
	memcpy(ah->dgid, grh->dgid.raw, sizeof(ah->dgid));
	ah->sgid_index = grh->sgid_index;
	return 0;
}
