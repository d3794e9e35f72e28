// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma: Linux driver for the para-virtual RDMA device (virtio device 42).
 *
 * NOTES
 *
 * The device (docs/spec.md) has a control queue, an event queue and N
 * doorbell queues that carry no descriptors. This driver owns the first two
 * and registers an ib_device "vrdma%d" whose user-space provider
 * (guest/rdma-core) posts and polls in user memory: the kernel creates the
 * objects (ucontext, PD, MR, CQ, RC and UD QP, SRQ, AH) through control
 * commands and maps for the provider, per QP and SRQ, the page of the
 * virtio-pci notify region
 * that holds its doorbell queue's notify register (uncached) and the page
 * holding that queue's used-ring flags word (read-only). Nothing on the
 * data path enters the kernel. The uverbs contract is part 2 of
 * guest/include/vrdma-abi.h and is summarised in README.md.
 *
 * Addresses: the device uses guest-physical addresses and there is no
 * vIOMMU. The ib_device's DMA device is the PCI function, so ib_umem's DMA
 * addresses are physical addresses (dma-direct); page lists the driver
 * kmallocs are passed by virt_to_phys(). probe() refuses a device behind
 * an IOMMU or with VIRTIO_F_ACCESS_PLATFORM, where neither would hold.
 *
 * Control queue (vrdma_cmd.c): one command in flight (cmd_mutex); a
 * timeout or a broken queue marks the device dead: later commands fail with
 * -EIO at once, DESTROY/DEREG succeed so that teardown always completes.
 * A dead device is reset (fatal_work, or vrdma_quiesce() before memory the
 * device could reach is released), user contexts get IB_EVENT_DEVICE_FATAL,
 * and the virtio device is re-probed a second later: the old ib_device is
 * unregistered (its contexts disassociated) and a new one registered if the
 * device answers again (vrdmad restarted, spec "Reset and disconnect").
 *
 * Event queue: 64 16-byte buffers kept posted; the callback validates each
 * and dispatches CQ completions and errors, QP fatal errors and last-WQE
 * events, SRQ limit events, port changes and DEVICE_FATAL. CQs, QPs and
 * SRQs are found by device handle in xarrays whose irq-safe lock the
 * handler holds while it calls the object's handler; destroy erases the
 * entry under that lock first, so no handler runs on a destroyed object.
 * An event for an unknown handle is counted and ignored.
 * The handler does at most 2 x 64 events per call, the rest in a work item.
 *
 * Port and netdev: RoCE needs a net_device for the GID table. The port is
 * bound to the net_device whose MAC is the one embedded in the node GUID
 * when that GUID has the EUI-64-from-MAC form (bytes 3 and 4 of the
 * big-endian GUID are ff:fe; the MAC is the other six bytes, unchanged), or
 * to the net_device named by the module parameter netdev=. A netdevice
 * notifier binds on REGISTER/CHANGEADDR/CHANGENAME and unbinds on
 * UNREGISTER; the virtio device's net/ directory holds a link named after
 * the bound netdev, so that /sys/class/infiniband/vrdmaN/device/net lists
 * it as a RoCE NIC's PCI function lists its netdev. The port is ACTIVE when the device says so and the bound
 * net_device is running with carrier, as rxe reports it.
 *
 * Lock order: cmd_mutex -> ctrl_lock; uctx->lock -> (mmap xarray);
 * event_lock -> cq_xa/qp_xa/srq_xa lock -> uverbs' event queue locks;
 * a kernel CQ's lock -> qp_xa lock (poll_cq finds a CQE's QP);
 * rtnl -> netdev_lock; lock (flags, reprobe) is a leaf taken in any
 * context. stop_mutex is taken alone.
 *
 * Kernel consumers (vrdma_kverbs.c): when the device serves a GSI QP
 * (config device_caps), kernel CQs, the GSI QP, kernel UD and RC QPs with
 * fast registration, kernel AHs and the DMA MR behind a kernel PD's
 * local_dma_lkey, so that ib_mad, ib_cm, rdma_cm and the kernel's ULPs
 * (NVMe over RDMA) run over the port. Memory windows for user space.
 *
 * Not supported: kernel SRQs, memory windows of kernel consumers, QP types
 * other than RC, UD and GSI, XRC and tag-matching SRQs, SRQ resizing, ODP,
 * resize_cq, virtio-mmio, vIOMMU, suspend/resume.
 */
#include <linux/etherdevice.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/rtnetlink.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_pci.h>
#include <linux/virtio_ring.h>
#include <asm/unaligned.h>

#include "vrdma.h"

MODULE_DESCRIPTION("vrdma: para-virtual RDMA device (virtio device 42)");
MODULE_LICENSE("GPL");

static char *bind_netdev;
module_param_named(netdev, bind_netdev, charp, 0444);
MODULE_PARM_DESC(netdev, "bind the RDMA port to this net_device instead of the one whose MAC the node GUID embeds");

static unsigned int cmd_timeout_ms = 10000;
module_param(cmd_timeout_ms, uint, 0444);
MODULE_PARM_DESC(cmd_timeout_ms, "control command timeout in ms before the device is declared dead (100..600000, default 10000)");

static struct workqueue_struct *vrdma_wq;

struct vrdma_reprobe {
	struct delayed_work dwork;
	struct device *dev;
};

/* Queues @work unless remove() has begun. */
static void vrdma_queue(struct vrdma_dev *dev, struct work_struct *work)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->lock, flags);
	if (!test_bit(VRDMA_REMOVING, &dev->flags))
		queue_work(vrdma_wq, work);
	spin_unlock_irqrestore(&dev->lock, flags);
}

/*
 * ib_dispatch_event() queues work on ib_core's workqueue, which
 * ib_unregister_device() flushes: dispatch only while registered.
 */
static void vrdma_dispatch(struct vrdma_dev *dev, enum ib_event_type type)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = type,
		.element.port_num = VRDMA_PORT,
	};
	unsigned long flags;

	spin_lock_irqsave(&dev->lock, flags);
	if (test_bit(VRDMA_REGISTERED, &dev->flags))
		ib_dispatch_event(&ev);
	spin_unlock_irqrestore(&dev->lock, flags);
}

void vrdma_dispatch_port_event(struct vrdma_dev *dev, enum ib_event_type type)
{
	vrdma_dispatch(dev, type);
}

/* Resets the device: it no longer touches guest memory or the queues. */
static void vrdma_stop(struct vrdma_dev *dev)
{
	mutex_lock(&dev->stop_mutex);
	if (!test_bit(VRDMA_STOPPED, &dev->flags)) {
		set_bit(VRDMA_DEAD, &dev->flags);
		virtio_reset_device(dev->vdev);
		set_bit(VRDMA_STOPPED, &dev->flags);
		vrdma_cmd_abort(dev);
	}
	mutex_unlock(&dev->stop_mutex);
}

/*
 * Before memory the device could reach (rings, MRs) goes back to the
 * kernel: a live device has been told to let go by its DESTROY command; a
 * dead one may not have been, so reset it first. Sleeps.
 */
void vrdma_quiesce(struct vrdma_dev *dev)
{
	if (vrdma_dead(dev) && !test_bit(VRDMA_STOPPED, &dev->flags))
		vrdma_stop(dev);
}

/**
 * vrdma_set_dead - the device stopped answering or reported a fatal error
 * @dev: the device
 * @why: for the log
 *
 * Any context. The first call tells user space (IB_EVENT_DEVICE_FATAL)
 * and queues fatal_work, which resets the device and schedules a re-probe.
 */
void vrdma_set_dead(struct vrdma_dev *dev, const char *why)
{
	unsigned long flags;

	if (test_and_set_bit(VRDMA_DEAD, &dev->flags))
		return;
	dev_err(&dev->vdev->dev, "device failed: %s\n", why);
	vrdma_dispatch(dev, IB_EVENT_DEVICE_FATAL);
	spin_lock_irqsave(&dev->lock, flags);
	if (test_bit(VRDMA_REGISTERED, &dev->flags) &&
	    !test_bit(VRDMA_REMOVING, &dev->flags))
		queue_work(vrdma_wq, &dev->fatal_work);
	spin_unlock_irqrestore(&dev->lock, flags);
}

static void vrdma_reprobe_fn(struct work_struct *work)
{
	struct vrdma_reprobe *rp =
		container_of(to_delayed_work(work), struct vrdma_reprobe, dwork);
	int err;

	err = device_reprobe(rp->dev);
	if (err)
		dev_warn(rp->dev, "re-probe failed: %d\n", err);
	put_device(rp->dev);
	kfree(rp);
}

static void vrdma_fatal_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev, fatal_work);
	struct vrdma_reprobe *rp;

	vrdma_stop(dev);

	/*
	 * Re-probe from a work item of its own: device_reprobe() calls
	 * remove(), which cancels fatal_work. The delay brakes a device that
	 * fails over and over.
	 */
	rp = kzalloc(sizeof(*rp), GFP_KERNEL);
	if (!rp)
		return;
	INIT_DELAYED_WORK(&rp->dwork, vrdma_reprobe_fn);
	rp->dev = get_device(&dev->vdev->dev);
	spin_lock_irq(&dev->lock);
	if (!test_bit(VRDMA_REMOVING, &dev->flags) && !dev->reprobe) {
		dev->reprobe = rp;
		queue_delayed_work(vrdma_wq, &rp->dwork, HZ);
		rp = NULL;
	}
	spin_unlock_irq(&dev->lock);
	if (rp) {
		put_device(rp->dev);
		kfree(rp);
	}
}

/* remove(): a pending re-probe is dropped; a running one frees itself. */
static void vrdma_cancel_reprobe(struct vrdma_dev *dev)
{
	struct vrdma_reprobe *rp;

	spin_lock_irq(&dev->lock);
	rp = dev->reprobe;
	dev->reprobe = NULL;
	spin_unlock_irq(&dev->lock);
	if (rp && cancel_delayed_work(&rp->dwork)) {
		put_device(rp->dev);
		kfree(rp);
	}
}

/* ---- events ------------------------------------------------------------ */

static void vrdma_cq_event(struct vrdma_dev *dev, u32 type, u32 cqn)
{
	struct ib_event ev = { .device = &dev->ibdev };
	struct vrdma_cq *cq;

	xa_lock(&dev->cq_xa);
	cq = xa_load(&dev->cq_xa, cqn);
	if (cq && type == VRDMA_EVENT_CQ_COMPLETION) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	} else if (cq && cq->ibcq.event_handler) {
		ev.event = IB_EVENT_CQ_ERR;
		ev.element.cq = &cq->ibcq;
		cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
	}
	xa_unlock(&dev->cq_xa);
	if (!cq)
		dev->events_unknown_handle++;
	if (type != VRDMA_EVENT_CQ_COMPLETION || !cq)
		dev_dbg(&dev->vdev->dev, "event %u for CQ %#x%s\n", type, cqn,
			cq ? "" : " (unknown)");
}

static void vrdma_qp_event(struct vrdma_dev *dev, enum ib_event_type type,
			   u32 qpn)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = type,
	};
	struct vrdma_qp *qp;
	bool bogus = false;

	xa_lock(&dev->qp_xa);
	qp = xa_load(&dev->qp_xa, qpn);
	/* Only a QP that takes its receives from an SRQ has a last WQE. */
	if (qp && type == IB_EVENT_QP_LAST_WQE_REACHED && !qp->ibqp.srq) {
		bogus = true;
	} else if (qp && qp->ibqp.event_handler) {
		ev.element.qp = &qp->ibqp;
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	}
	xa_unlock(&dev->qp_xa);
	if (!qp)
		dev->events_unknown_handle++;
	if (bogus)
		dev->events_malformed++;
	dev_dbg(&dev->vdev->dev, "%s for QP %#x%s\n", ib_event_msg(type), qpn,
		!qp ? " (unknown)" : bogus ? " (no SRQ: ignored)" : "");
}

static void vrdma_srq_event(struct vrdma_dev *dev, u32 srqn)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = IB_EVENT_SRQ_LIMIT_REACHED,
	};
	struct vrdma_srq *srq;

	xa_lock(&dev->srq_xa);
	srq = xa_load(&dev->srq_xa, srqn);
	if (srq && srq->ibsrq.event_handler) {
		ev.element.srq = &srq->ibsrq;
		srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
	}
	xa_unlock(&dev->srq_xa);
	if (!srq)
		dev->events_unknown_handle++;
	dev_dbg(&dev->vdev->dev, "SRQ_LIMIT_REACHED for SRQ %#x%s\n", srqn,
		srq ? "" : " (unknown)");
}

/* Called with event_lock held (interrupts off). */
static void vrdma_handle_event(struct vrdma_dev *dev,
			       const struct vrdma_event *ev)
{
	u32 type = le32_to_cpu(ev->type);
	u32 handle = le32_to_cpu(ev->handle);

	switch (type) {
	case VRDMA_EVENT_CQ_COMPLETION:
	case VRDMA_EVENT_CQ_ERROR:
		vrdma_cq_event(dev, type, handle);
		break;
	case VRDMA_EVENT_QP_FATAL:
		vrdma_qp_event(dev, IB_EVENT_QP_FATAL, handle);
		break;
	case VRDMA_EVENT_QP_LAST_WQE_REACHED:
		vrdma_qp_event(dev, IB_EVENT_QP_LAST_WQE_REACHED, handle);
		break;
	case VRDMA_EVENT_SRQ_LIMIT_REACHED:
		vrdma_srq_event(dev, handle);
		break;
	case VRDMA_EVENT_PORT_ACTIVE:
	case VRDMA_EVENT_PORT_ERROR:
		if (handle != VRDMA_PORT) {
			dev->events_malformed++;
			break;
		}
		WRITE_ONCE(dev->dev_port_active,
			   type == VRDMA_EVENT_PORT_ACTIVE);
		vrdma_queue(dev, &dev->port_work);
		break;
	case VRDMA_EVENT_DEVICE_FATAL:
		vrdma_set_dead(dev, "DEVICE_FATAL event");
		break;
	default:
		dev->events_malformed++;
		break;
	}
}

/*
 * Takes up to @budget events off the event queue, handles them and posts
 * their buffers again. Returns true when the budget ran out.
 */
static bool vrdma_eventq_drain(struct vrdma_dev *dev, unsigned int budget)
{
	struct virtqueue *vq = dev->eventq;
	struct vrdma_event *buf, ev;
	struct scatterlist sg;
	unsigned long flags;
	unsigned int len, n = 0;
	u64 bad, unknown;

	spin_lock_irqsave(&dev->event_lock, flags);
	bad = dev->events_malformed;
	unknown = dev->events_unknown_handle;
	while (n < budget && (buf = virtqueue_get_buf(vq, &len))) {
		n++;
		ev = *buf;
		sg_init_one(&sg, buf, sizeof(*buf));
		if (virtqueue_add_inbuf(vq, &sg, 1, buf, GFP_ATOMIC))
			dev_err_ratelimited(&dev->vdev->dev,
					    "cannot post an event buffer\n");
		if (len == sizeof(ev))
			vrdma_handle_event(dev, &ev);
		else
			dev->events_malformed++;
	}
	if (n)
		virtqueue_kick(vq);
	if (bad != dev->events_malformed)
		dev_warn_ratelimited(&dev->vdev->dev,
				     "%llu malformed events\n",
				     dev->events_malformed);
	if (unknown != dev->events_unknown_handle)
		dev_dbg(&dev->vdev->dev, "%llu events for unknown handles\n",
			dev->events_unknown_handle);
	spin_unlock_irqrestore(&dev->event_lock, flags);
	return n == budget;
}

static void vrdma_eventq_cb(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	if (vrdma_eventq_drain(dev, 2 * VRDMA_EVENT_BUFS))
		vrdma_queue(dev, &dev->event_work);
}

static void vrdma_event_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev, event_work);

	if (vrdma_eventq_drain(dev, 2 * VRDMA_EVENT_BUFS))
		vrdma_queue(dev, &dev->event_work);
}

static int vrdma_fill_eventq(struct vrdma_dev *dev)
{
	struct scatterlist sg;
	unsigned int i, n;
	int err;

	n = min_t(unsigned int, VRDMA_EVENT_BUFS,
		  virtqueue_get_vring_size(dev->eventq));
	dev->event_bufs = kcalloc(n, sizeof(*dev->event_bufs), GFP_KERNEL);
	if (!dev->event_bufs)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		sg_init_one(&sg, &dev->event_bufs[i], sizeof(struct vrdma_event));
		err = virtqueue_add_inbuf(dev->eventq, &sg, 1,
					  &dev->event_bufs[i], GFP_KERNEL);
		if (err)
			return err;	/* the caller tears the queues down */
	}
	dev->num_event_bufs = n;
	return 0;
}

/* ---- port and net_device ----------------------------------------------- */

enum ib_port_state vrdma_port_state(struct vrdma_dev *dev)
{
	bool up = false;

	if (vrdma_dead(dev) || !READ_ONCE(dev->dev_port_active))
		return IB_PORT_DOWN;
	spin_lock(&dev->netdev_lock);
	if (dev->netdev)
		up = netif_running(dev->netdev) &&
		     netif_carrier_ok(dev->netdev);
	spin_unlock(&dev->netdev_lock);
	return up ? IB_PORT_ACTIVE : IB_PORT_DOWN;
}

static void vrdma_port_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev, port_work);
	enum ib_port_state state = vrdma_port_state(dev);

	if (state == dev->port_state)
		return;
	dev->port_state = state;
	vrdma_dispatch(dev, state == IB_PORT_ACTIVE ? IB_EVENT_PORT_ACTIVE :
						       IB_EVENT_PORT_ERR);
}

static bool vrdma_netdev_matches(struct vrdma_dev *dev, struct net_device *ndev)
{
	if (bind_netdev && *bind_netdev)
		return !strcmp(ndev->name, bind_netdev);
	if (!dev->has_mac || ndev->addr_len != ETH_ALEN)
		return false;
	return ether_addr_equal(ndev->dev_addr, dev->mac) ||
	       ether_addr_equal(ndev->perm_addr, dev->mac);
}

/*
 * rtnl held. Points <virtio device>/net/ at ndev alone (NULL: empty). A
 * failure only costs the link: the binding itself is the RDMA core's.
 */
static void vrdma_link_netdev(struct vrdma_dev *dev, struct net_device *ndev)
{
	int err;

	if (!dev->net_kobj)
		return;
	if (dev->net_link[0]) {
		sysfs_remove_link(dev->net_kobj, dev->net_link);
		dev->net_link[0] = '\0';
	}
	if (!ndev)
		return;
	err = sysfs_create_link(dev->net_kobj, &ndev->dev.kobj, ndev->name);
	if (err) {
		dev_warn(&dev->vdev->dev, "cannot link device/net/%s: %d\n",
			 ndev->name, err);
		return;
	}
	strscpy(dev->net_link, ndev->name, sizeof(dev->net_link));
}

/* rtnl held. */
static void vrdma_set_netdev(struct vrdma_dev *dev, struct net_device *ndev)
{
	struct net_device *old;
	int err;

	err = ib_device_set_netdev(&dev->ibdev, ndev, VRDMA_PORT);
	if (err) {
		dev_warn(&dev->vdev->dev, "cannot bind to %s: %d\n",
			 ndev ? ndev->name : "(none)", err);
		return;
	}
	if (ndev)
		dev_hold(ndev);
	spin_lock(&dev->netdev_lock);
	old = dev->netdev;
	dev->netdev = ndev;
	spin_unlock(&dev->netdev_lock);
	if (old)
		dev_put(old);
	vrdma_link_netdev(dev, ndev);
	if (ndev)
		dev_info(&dev->vdev->dev, "port bound to %s\n", ndev->name);
}

static int vrdma_netdev_event(struct notifier_block *nb, unsigned long event,
			      void *ptr)
{
	struct vrdma_dev *dev = container_of(nb, struct vrdma_dev, netdev_nb);
	struct net_device *ndev = netdev_notifier_info_to_dev(ptr);
	struct net_device *bound = dev->netdev;	/* written under rtnl */

	switch (event) {
	case NETDEV_REGISTER:
	case NETDEV_CHANGEADDR:
	case NETDEV_CHANGENAME:
		if (event == NETDEV_CHANGENAME && ndev == bound)
			vrdma_link_netdev(dev, ndev);
		if (!bound && vrdma_netdev_matches(dev, ndev)) {
			vrdma_set_netdev(dev, ndev);
			vrdma_queue(dev, &dev->port_work);
		}
		break;
	case NETDEV_UNREGISTER:
		if (ndev == bound) {
			vrdma_set_netdev(dev, NULL);
			vrdma_queue(dev, &dev->port_work);
		}
		break;
	case NETDEV_UP:
	case NETDEV_DOWN:
	case NETDEV_CHANGE:
		if (ndev == bound)
			vrdma_queue(dev, &dev->port_work);
		break;
	}
	return NOTIFY_DONE;
}

/* The MAC embedded in an EUI-64-from-MAC GUID (xx:xx:xx:ff:fe:xx:xx:xx). */
static void vrdma_guid_mac(struct vrdma_dev *dev, u64 guid)
{
	u8 g[8];

	put_unaligned_be64(guid, g);
	if (g[3] != 0xff || g[4] != 0xfe)
		return;
	dev->mac[0] = g[0];
	dev->mac[1] = g[1];
	dev->mac[2] = g[2];
	dev->mac[3] = g[5];
	dev->mac[4] = g[6];
	dev->mac[5] = g[7];
	dev->has_mac = is_valid_ether_addr(dev->mac);
}

static void vrdma_config_changed(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;
	u32 state;

	virtio_cread_le(vdev, struct vrdma_config, port_state, &state);
	WRITE_ONCE(dev->dev_port_active, state == IB_PORT_ACTIVE);
	vrdma_queue(dev, &dev->port_work);
}

/* ---- doorbells --------------------------------------------------------- */

/* The first virtio-pci capability of @type in a usable memory BAR. */
static int vrdma_find_cap(struct pci_dev *pdev, u8 type, u8 *bar, u32 *offset,
			  u32 *length)
{
	int pos;
	u8 t, b;

	/* pci_find_next_capability() bounds the walk. */
	for (pos = pci_find_capability(pdev, PCI_CAP_ID_VNDR); pos > 0;
	     pos = pci_find_next_capability(pdev, pos, PCI_CAP_ID_VNDR)) {
		pci_read_config_byte(pdev, pos +
				     offsetof(struct virtio_pci_cap, cfg_type), &t);
		pci_read_config_byte(pdev, pos +
				     offsetof(struct virtio_pci_cap, bar), &b);
		if (t != type || b >= PCI_STD_NUM_BARS ||
		    !(pci_resource_flags(pdev, b) & IORESOURCE_MEM))
			continue;
		pci_read_config_dword(pdev, pos +
				      offsetof(struct virtio_pci_cap, offset),
				      offset);
		pci_read_config_dword(pdev, pos +
				      offsetof(struct virtio_pci_cap, length),
				      length);
		if ((u64)*offset + *length > pci_resource_len(pdev, b))
			return -EINVAL;
		*bar = b;
		return pos;
	}
	return -ENOENT;
}

/*
 * The physical address of each doorbell queue's notify register, for
 * mapping into user space. virtio_pci keeps queue_notify_off to itself, so
 * read it through our own mapping of the common configuration. Selecting
 * queues here is safe only in probe, after virtio_find_vqs() and before
 * DRIVER_OK: nothing else uses queue_select then (virtio_pci selects a
 * queue again only in its own setup and teardown, and always writes
 * queue_select before using it).
 */
static int vrdma_map_doorbells(struct vrdma_dev *dev)
{
	struct virtio_pci_common_cfg __iomem *cfg;
	struct pci_dev *pdev = dev->pdev;
	u32 coff, clen, noff, nlen, mult;
	u8 cbar, nbar;
	unsigned int i;
	int pos, err = 0;

	pos = vrdma_find_cap(pdev, VIRTIO_PCI_CAP_NOTIFY_CFG, &nbar, &noff,
			     &nlen);
	if (pos < 0) {
		dev_err(&dev->vdev->dev, "no usable notify capability\n");
		return -ENODEV;
	}
	pci_read_config_dword(pdev, pos +
			      offsetof(struct virtio_pci_notify_cap,
				       notify_off_multiplier), &mult);
	pos = vrdma_find_cap(pdev, VIRTIO_PCI_CAP_COMMON_CFG, &cbar, &coff,
			     &clen);
	if (pos < 0 || clen < sizeof(*cfg)) {
		dev_err(&dev->vdev->dev, "no usable common capability\n");
		return -ENODEV;
	}
	cfg = pci_iomap_range(pdev, cbar, coff, sizeof(*cfg));
	if (!cfg)
		return -ENOMEM;

	for (i = 0; i < dev->num_dbq; i++) {
		u16 index = VRDMA_FIRST_DOORBELLQ + i;
		u64 off;

		iowrite16(index, &cfg->queue_select);
		off = (u64)ioread16(&cfg->queue_notify_off) * mult;
		if (off + sizeof(u16) > nlen) {
			dev_err(&dev->vdev->dev,
				"doorbell queue %u: notify offset %llu outside the capability\n",
				i, off);
			err = -EINVAL;
			break;
		}
		dev->dbq[i].notify_pa = pci_resource_start(pdev, nbar) + noff +
					off;
		dev->dbq[i].notify_value = index;
	}
	pci_iounmap(pdev, cfg);
	return err;
}

static int vrdma_init_vqs(struct vrdma_dev *dev)
{
	unsigned int nvqs = VRDMA_FIRST_DOORBELLQ + dev->num_dbq, i;
	vq_callback_t **cbs;
	const char **names;
	struct virtqueue **vqs;
	int err = -ENOMEM;

	vqs = kcalloc(nvqs, sizeof(*vqs), GFP_KERNEL);
	cbs = kcalloc(nvqs, sizeof(*cbs), GFP_KERNEL);
	names = kcalloc(nvqs, sizeof(*names), GFP_KERNEL);
	if (!vqs || !cbs || !names)
		goto out;
	cbs[VRDMA_CONTROLQ] = vrdma_ctrlq_cb;
	names[VRDMA_CONTROLQ] = "control";
	cbs[VRDMA_EVENTQ] = vrdma_eventq_cb;
	names[VRDMA_EVENTQ] = "event";
	for (i = VRDMA_FIRST_DOORBELLQ; i < nvqs; i++)
		names[i] = "doorbell";	/* no callback: no descriptors */

	err = virtio_find_vqs(dev->vdev, nvqs, vqs, cbs, names, NULL);
	if (err)
		goto out;
	dev->ctrlq = vqs[VRDMA_CONTROLQ];
	dev->eventq = vqs[VRDMA_EVENTQ];
	for (i = 0; i < dev->num_dbq; i++) {
		struct virtqueue *vq = vqs[VRDMA_FIRST_DOORBELLQ + i];
		const struct vring *vring = virtqueue_get_vring(vq);

		/*
		 * Without the DMA API the ring is alloc_pages_exact() memory
		 * in the direct map: its page can be mapped to user space.
		 */
		if (!virt_addr_valid(vring->used) ||
		    virtqueue_get_used_addr(vq) != virt_to_phys(vring->used)) {
			dev_err(&dev->vdev->dev,
				"doorbell queue %u: used ring not in the direct map\n",
				i);
			dev->vdev->config->del_vqs(dev->vdev);
			err = -ENODEV;
			goto out;
		}
		dev->dbq[i].vq = vq;
		dev->dbq[i].flags_pa = virt_to_phys(&vring->used->flags);
		dev->dbq[i].used_flags = &vring->used->flags;
	}
out:
	kfree(names);
	kfree(cbs);
	kfree(vqs);
	return err;
}

/* ---- probe and remove -------------------------------------------------- */

/* QUERY_DEVICE and QUERY_PORT, validated and bounded. */
static int vrdma_query(struct vrdma_dev *dev)
{
	struct vrdma_port_req preq = { .port_num = cpu_to_le32(VRDMA_PORT) };
	struct vrdma_device_attr *a = &dev->dattr;
	struct vrdma_port_attr p;
	u32 caps;
	int err;

	err = vrdma_exec(dev, VRDMA_CMD_QUERY_DEVICE, NULL, 0, a, sizeof(*a),
			 NULL);
	if (err)
		return err;
	err = vrdma_exec(dev, VRDMA_CMD_QUERY_PORT, &preq, sizeof(preq), &p,
			 sizeof(p), NULL);
	if (err)
		return err;

	if (!(le64_to_cpu(a->page_size_cap) & VRDMA_PAGE_SIZE)) {
		dev_err(&dev->vdev->dev, "device takes no 4 KiB pages\n");
		return -EINVAL;
	}
	dev->max_qp_wr = min_t(u32, le32_to_cpu(a->max_qp_wr), VRDMA_MAX_QP_WR);
	/* SGEs beyond what a 4 KiB WQE holds cannot be used. */
	dev->max_sge = min_t(u32, le32_to_cpu(a->max_sge),
			     (VRDMA_PAGE_SIZE - sizeof(struct vrdma_recv_wqe)) /
			     sizeof(struct vrdma_sge));
	dev->max_cqe = min_t(u32, le32_to_cpu(a->max_cqe), VRDMA_MAX_CQE);
	dev->max_inline = min_t(u32, le32_to_cpu(a->max_inline_data),
				VRDMA_PAGE_SIZE - sizeof(struct vrdma_send_wqe));
	dev->max_rd_atom = min_t(u32, le32_to_cpu(a->max_qp_rd_atom), U8_MAX);
	/* Zero from a daemon older than SRQs: create_srq is -EOPNOTSUPP. */
	dev->max_srq = min_t(u32, le32_to_cpu(a->max_srq), INT_MAX);
	/*
	 * Zero from a daemon older than the GSI QP, or for a host-NIC
	 * device: no kernel verbs, so neither ib_mad nor rdma_cm.
	 */
	virtio_cread_le(dev->vdev, struct vrdma_config, device_caps, &caps);
	dev->gsi = caps & VRDMA_DEVICE_CAP_GSI;
	/* Memory windows and fast registration; 0 from an older daemon. */
	dev->dev_cap_flags = 0;
	if (le32_to_cpu(a->device_cap_flags) & VRDMA_DEV_CAP_MEM_WINDOW)
		dev->dev_cap_flags |= IB_DEVICE_MEM_WINDOW;
	if (le32_to_cpu(a->device_cap_flags) & VRDMA_DEV_CAP_MEM_WINDOW_TYPE_2B)
		dev->dev_cap_flags |= IB_DEVICE_MEM_WINDOW_TYPE_2B;
	/* Fast registration serves kernel RC QPs: only with kernel verbs. */
	if ((le32_to_cpu(a->device_cap_flags) &
	     VRDMA_DEV_CAP_MEM_MGT_EXTENSIONS) && dev->gsi)
		dev->dev_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;

	dev->gid_tbl_len = le32_to_cpu(p.gid_tbl_len);
	if (!dev->gid_tbl_len) {
		dev_err(&dev->vdev->dev, "port has no GID table\n");
		return -EINVAL;
	}
	dev->gid_tbl_len = min_t(u32, dev->gid_tbl_len, VRDMA_MAX_GID_TBL);
	dev->max_mtu = clamp_t(u32, le32_to_cpu(p.max_mtu), IB_MTU_256,
			       IB_MTU_4096);
	dev->active_mtu = clamp_t(u32, le32_to_cpu(p.active_mtu), IB_MTU_256,
				  dev->max_mtu);
	dev->max_msg_sz = le32_to_cpu(p.max_msg_sz);
	dev->active_speed = min_t(u32, le32_to_cpu(p.active_speed), U16_MAX);
	dev->active_width = min_t(u32, le32_to_cpu(p.active_width), U8_MAX);
	WRITE_ONCE(dev->dev_port_active,
		   le32_to_cpu(p.state) == IB_PORT_ACTIVE);
	return 0;
}

/* After the device was reset: give back what the queues hold, drop them. */
static void vrdma_del_vqs(struct vrdma_dev *dev)
{
	cancel_work_sync(&dev->event_work);
	vrdma_cmd_cleanup(dev);
	while (virtqueue_detach_unused_buf(dev->eventq))
		;
	dev->vdev->config->del_vqs(dev->vdev);
	kfree(dev->event_bufs);
	dev->event_bufs = NULL;
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct device *parent = vdev->dev.parent;
	struct vrdma_dev *dev;
	struct ib_device *ibdev;
	u32 abi, ndbq, pstate;
	u64 guid;
	int err;

	if (!vdev->config->get) {
		dev_err(&vdev->dev, "config access disabled\n");
		return -EINVAL;
	}
	if (!parent || !dev_is_pci(parent)) {
		dev_err(&vdev->dev, "only virtio-pci is supported\n");
		return -ENODEV;
	}
	if (virtio_has_feature(vdev, VIRTIO_F_ACCESS_PLATFORM) ||
	    device_iommu_mapped(parent)) {
		dev_err(&vdev->dev,
			"needs guest-physical addressing: no IOMMU, no VIRTIO_F_ACCESS_PLATFORM\n");
		return -ENODEV;
	}
	virtio_cread_le(vdev, struct vrdma_config, abi_version, &abi);
	if (abi != VRDMA_ABI_VERSION) {
		dev_err(&vdev->dev, "ABI version %u, want %u\n", abi,
			VRDMA_ABI_VERSION);
		return -ENODEV;
	}
	virtio_cread_le(vdev, struct vrdma_config, num_doorbell_queues, &ndbq);
	if (!ndbq || ndbq > VRDMA_MAX_DOORBELLQ) {
		dev_err(&vdev->dev, "%u doorbell queues, want 1..%u\n", ndbq,
			VRDMA_MAX_DOORBELLQ);
		return -EINVAL;
	}
	virtio_cread_le(vdev, struct vrdma_config, node_guid, &guid);
	virtio_cread_le(vdev, struct vrdma_config, port_state, &pstate);

	dev = ib_alloc_device(vrdma_dev, ibdev);
	if (!dev)
		return -ENOMEM;
	ibdev = &dev->ibdev;
	dev->vdev = vdev;
	dev->pdev = to_pci_dev(parent);
	vdev->priv = dev;
	spin_lock_init(&dev->lock);
	mutex_init(&dev->cmd_mutex);
	spin_lock_init(&dev->ctrl_lock);
	spin_lock_init(&dev->event_lock);
	spin_lock_init(&dev->netdev_lock);
	mutex_init(&dev->stop_mutex);
	INIT_WORK(&dev->event_work, vrdma_event_work);
	INIT_WORK(&dev->port_work, vrdma_port_work);
	INIT_WORK(&dev->fatal_work, vrdma_fatal_work);
	xa_init_flags(&dev->cq_xa, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->qp_xa, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->srq_xa, XA_FLAGS_LOCK_IRQ);
	dev->cmd_timeout = msecs_to_jiffies(clamp(cmd_timeout_ms, 100U,
						  600000U));
	dev->num_dbq = ndbq;
	dev->dev_port_active = pstate == IB_PORT_ACTIVE;
	dev->port_state = IB_PORT_DOWN;
	vrdma_guid_mac(dev, guid);

	err = vrdma_init_vqs(dev);
	if (err)
		goto err_dealloc;
	err = vrdma_fill_eventq(dev);
	if (err)
		goto err_vqs;
	err = vrdma_map_doorbells(dev);
	if (err)
		goto err_vqs;
	virtio_device_ready(vdev);
	virtqueue_kick(dev->eventq);

	err = vrdma_query(dev);
	if (err)
		goto err_vqs;

	ibdev->node_type = RDMA_NODE_IB_CA;
	strscpy(ibdev->node_desc, "vrdma", sizeof(ibdev->node_desc));
	ibdev->node_guid = cpu_to_be64(guid);
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = 1;
	ibdev->dev.parent = &vdev->dev;
	ib_set_device_ops(ibdev, &vrdma_dev_ops);

	dev->net_kobj = kobject_create_and_add("net", &vdev->dev.kobj);
	if (!dev->net_kobj)
		dev_warn(&vdev->dev, "no device/net directory\n");

	/* Registering replays NETDEV_REGISTER: binds an existing netdev. */
	dev->netdev_nb.notifier_call = vrdma_netdev_event;
	err = register_netdevice_notifier(&dev->netdev_nb);
	if (err)
		goto err_vqs;

	err = ib_register_device(ibdev, "vrdma%d", parent);
	if (err)
		goto err_notifier;
	spin_lock_irq(&dev->lock);
	set_bit(VRDMA_REGISTERED, &dev->flags);
	spin_unlock_irq(&dev->lock);
	/* A failure during registration had no fatal_work to run. */
	if (vrdma_dead(dev))
		vrdma_queue(dev, &dev->fatal_work);
	vrdma_queue(dev, &dev->port_work);
	dev_info(&vdev->dev, "%s: %u doorbell queues%s\n",
		 dev_name(&ibdev->dev), ndbq,
		 dev->netdev ? "" : ", no net_device bound yet");
	return 0;

err_notifier:
	/* Unregistering replays NETDEV_UNREGISTER: unbinds and unlinks. */
	unregister_netdevice_notifier(&dev->netdev_nb);
err_vqs:
	kobject_put(dev->net_kobj);
	spin_lock_irq(&dev->lock);
	set_bit(VRDMA_REMOVING, &dev->flags);
	spin_unlock_irq(&dev->lock);
	cancel_work_sync(&dev->port_work);
	vrdma_stop(dev);
	vrdma_del_vqs(dev);
err_dealloc:
	xa_destroy(&dev->cq_xa);
	xa_destroy(&dev->qp_xa);
	xa_destroy(&dev->srq_xa);
	mutex_destroy(&dev->stop_mutex);
	mutex_destroy(&dev->cmd_mutex);
	vdev->priv = NULL;
	ib_dealloc_device(ibdev);
	return err;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	spin_lock_irq(&dev->lock);
	set_bit(VRDMA_REMOVING, &dev->flags);
	spin_unlock_irq(&dev->lock);
	/* No work is queued from here on. */
	cancel_work_sync(&dev->fatal_work);
	vrdma_cancel_reprobe(dev);
	cancel_work_sync(&dev->port_work);
	/* A dead device must let go of user memory before it is unpinned. */
	vrdma_quiesce(dev);

	spin_lock_irq(&dev->lock);
	clear_bit(VRDMA_REGISTERED, &dev->flags);
	spin_unlock_irq(&dev->lock);
	/* Disassociates user contexts and destroys their objects. */
	ib_unregister_device(&dev->ibdev);
	unregister_netdevice_notifier(&dev->netdev_nb);
	kobject_put(dev->net_kobj);	/* the replayed UNREGISTER unlinked it */

	vrdma_stop(dev);
	vrdma_del_vqs(dev);
	WARN_ON(!xa_empty(&dev->cq_xa) || !xa_empty(&dev->qp_xa) ||
		!xa_empty(&dev->srq_xa));
	xa_destroy(&dev->cq_xa);
	xa_destroy(&dev->qp_xa);
	xa_destroy(&dev->srq_xa);
	mutex_destroy(&dev->stop_mutex);
	mutex_destroy(&dev->cmd_mutex);
	vdev->priv = NULL;
	ib_dealloc_device(&dev->ibdev);
}

static const struct virtio_device_id vrdma_id_table[] = {
	{ VIRTIO_ID_VRDMA, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vrdma_id_table);

static unsigned int vrdma_features[] = {
	VIRTIO_RING_F_INDIRECT_DESC,
	VIRTIO_RING_F_EVENT_IDX,
};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = vrdma_id_table,
	.feature_table = vrdma_features,
	.feature_table_size = ARRAY_SIZE(vrdma_features),
	.probe = vrdma_probe,
	.remove = vrdma_remove,
	.config_changed = vrdma_config_changed,
};

static int __init vrdma_init(void)
{
	int err;

	vrdma_wq = alloc_workqueue("vrdma", 0, 0);
	if (!vrdma_wq)
		return -ENOMEM;
	err = register_virtio_driver(&vrdma_driver);
	if (err)
		destroy_workqueue(vrdma_wq);
	return err;
}

static void __exit vrdma_exit(void)
{
	unregister_virtio_driver(&vrdma_driver);
	destroy_workqueue(vrdma_wq);
}

module_init(vrdma_init);
module_exit(vrdma_exit);
