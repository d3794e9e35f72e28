// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma: the control queue.
 *
 * One command is in flight at a time (cmd_mutex). Each command has its own
 * kmalloc'd buffers: the device-readable part (header and request) and the
 * device-writable part (header and response). A command that does not
 * complete within cmd_timeout marks the device dead; its buffers (and the
 * aux memory the device may still read, such as a page list) then belong to
 * the virtqueue: the callback frees them if the device returns them late,
 * or vrdma_cmd_cleanup() does after the device has been reset. A buffer the
 * device may own is never freed before one of those.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "vrdma.h"

#define VRDMA_CMD_MAX_REQ	128
#define VRDMA_CMD_MAX_RESP	128

struct vrdma_cmd {
	struct completion done;
	void *aux;		/* freed with the command */
	u32 used_len;
	bool completed;		/* the device returned it */
	bool abandoned;		/* the waiter gave up: whoever sees it frees */
	struct {
		struct vrdma_cmd_hdr hdr;
		u8 req[VRDMA_CMD_MAX_REQ];
	} out;
	struct {
		struct vrdma_resp_hdr hdr;
		u8 resp[VRDMA_CMD_MAX_RESP];
	} in;
};

static void vrdma_cmd_free(struct vrdma_cmd *cmd)
{
	kfree(cmd->aux);
	kfree(cmd);
}

/* Called in interrupt context for controlq's interrupts. */
void vrdma_ctrlq_cb(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_cmd *cmd;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	/* Bounded: every buffer returned was one we added. */
	while ((cmd = virtqueue_get_buf(vq, &len))) {
		if (cmd == dev->cmd_inflight) {
			dev->cmd_inflight = NULL;
			cmd->used_len = len;
			cmd->completed = true;
			complete(&cmd->done);
		} else if (cmd->abandoned) {
			vrdma_cmd_free(cmd);
		}
	}
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
}

static int vrdma_status_errno(u32 status)
{
	switch (status) {
	case VRDMA_STATUS_INVALID:
	case VRDMA_STATUS_STATE:
		return -EINVAL;
	case VRDMA_STATUS_NO_RESOURCES:
		return -ENOMEM;
	case VRDMA_STATUS_NOT_FOUND:
		return -ENOENT;
	case VRDMA_STATUS_BUSY:
		return -EBUSY;
	case VRDMA_STATUS_ACCESS:
		return -EACCES;
	case VRDMA_STATUS_FAULT:
		return -EFAULT;
	case VRDMA_STATUS_UNSUPPORTED:
		return -EOPNOTSUPP;
	case VRDMA_STATUS_QUOTA:
		return -EDQUOT;
	default:
		return -EIO;
	}
}

/**
 * vrdma_exec - run one control command and wait for its answer
 * @dev: the device
 * @opcode: VRDMA_CMD_*
 * @req: request structure (may be NULL when @req_len is 0)
 * @req_len: its size, exactly as the spec gives it
 * @resp: where the response goes on success (NULL when @resp_len is 0)
 * @resp_len: the response structure's size
 * @aux: memory the device reads during the command (a page list), or NULL;
 *       always consumed: freed when the device is done with it
 *
 * Sleeps. Returns 0 or a negative errno: the device's status mapped, -EIO
 * for a dead device, a timeout or a malformed answer.
 */
int vrdma_exec(struct vrdma_dev *dev, u16 opcode, const void *req,
	       size_t req_len, void *resp, size_t resp_len, void *aux)
{
	struct scatterlist out, in, *sgs[2];
	struct vrdma_cmd *cmd;
	unsigned int len;
	u32 status;
	int err;

	if (req_len > VRDMA_CMD_MAX_REQ || resp_len > VRDMA_CMD_MAX_RESP) {
		kfree(aux);
		return -EINVAL;
	}
	if (vrdma_dead(dev)) {
		kfree(aux);
		return -EIO;
	}
	cmd = kzalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd) {
		kfree(aux);
		return -ENOMEM;
	}
	init_completion(&cmd->done);
	cmd->aux = aux;
	cmd->out.hdr.opcode = cpu_to_le16(opcode);
	if (req_len)
		memcpy(cmd->out.req, req, req_len);
	sg_init_one(&out, &cmd->out, sizeof(cmd->out.hdr) + req_len);
	sg_init_one(&in, &cmd->in, sizeof(cmd->in.hdr) + resp_len);
	sgs[0] = &out;
	sgs[1] = &in;

	mutex_lock(&dev->cmd_mutex);
	spin_lock_irq(&dev->ctrl_lock);
	if (vrdma_dead(dev)) {
		err = -EIO;
		goto err_unlock;
	}
	err = virtqueue_add_sgs(dev->ctrlq, sgs, 1, 1, cmd, GFP_ATOMIC);
	if (err) {
		if (err != -ENOMEM) {
			spin_unlock_irq(&dev->ctrl_lock);
			mutex_unlock(&dev->cmd_mutex);
			vrdma_set_dead(dev, "control queue unusable");
			vrdma_cmd_free(cmd);
			return -EIO;
		}
		goto err_unlock;
	}
	dev->cmd_inflight = cmd;
	virtqueue_kick(dev->ctrlq);
	spin_unlock_irq(&dev->ctrl_lock);

	wait_for_completion_timeout(&cmd->done, dev->cmd_timeout);

	spin_lock_irq(&dev->ctrl_lock);
	if (!cmd->completed) {
		/* The device may still own the buffers: abandon them. */
		cmd->abandoned = true;
		if (dev->cmd_inflight == cmd)
			dev->cmd_inflight = NULL;
		spin_unlock_irq(&dev->ctrl_lock);
		mutex_unlock(&dev->cmd_mutex);
		vrdma_set_dead(dev, "control command timed out");
		return -EIO;
	}
	spin_unlock_irq(&dev->ctrl_lock);
	mutex_unlock(&dev->cmd_mutex);

	len = cmd->used_len;
	if (len < sizeof(cmd->in.hdr)) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "command %u: answer of %u bytes\n",
				    opcode, len);
		err = -EIO;
		goto out_free;
	}
	status = le32_to_cpu(cmd->in.hdr.status);
	if (status != VRDMA_STATUS_OK) {
		err = vrdma_status_errno(status);
		dev_dbg(&dev->vdev->dev, "command %u: status %u\n", opcode,
			status);
		goto out_free;
	}
	if (len != sizeof(cmd->in.hdr) + resp_len) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "command %u: answer of %u bytes, want %zu\n",
				    opcode, len, sizeof(cmd->in.hdr) + resp_len);
		err = -EIO;
		goto out_free;
	}
	if (resp_len)
		memcpy(resp, cmd->in.resp, resp_len);
	err = 0;
out_free:
	vrdma_cmd_free(cmd);
	return err;

err_unlock:
	spin_unlock_irq(&dev->ctrl_lock);
	mutex_unlock(&dev->cmd_mutex);
	vrdma_cmd_free(cmd);
	return err;
}

/**
 * vrdma_exec_destroy - a DESTROY_* or DEREG_MR command, for teardown
 * @dev: the device
 * @opcode: the command
 * @handle: the object's handle (an MR's lkey)
 *
 * Never fails: a dead device has no objects left to destroy. A device that
 * refuses to let go of an object the driver owns is broken: NOT_FOUND means
 * it lost its objects (a restarted back-end, which the spec asks to treat
 * as DEVICE_FATAL), anything else that it may still use memory the caller
 * is about to free. Either way the device is marked dead, and the caller's
 * vrdma_quiesce() resets it before that memory is released.
 */
void vrdma_exec_destroy(struct vrdma_dev *dev, u16 opcode, u32 handle)
{
	struct vrdma_handle req = { .handle = cpu_to_le32(handle) };
	int err;

	err = vrdma_exec(dev, opcode, &req, sizeof(req), NULL, 0, NULL);
	if (!err || vrdma_dead(dev))
		return;
	dev_warn(&dev->vdev->dev, "command %u of handle %#x failed: %d\n",
		 opcode, handle, err);
	vrdma_set_dead(dev, err == -ENOENT ? "device lost its objects" :
					     "device kept an object");
}

/*
 * After the device was reset: wake the waiter of the command in flight, if
 * any; it abandons the command, which vrdma_cmd_cleanup() frees.
 */
void vrdma_cmd_abort(struct vrdma_dev *dev)
{
	spin_lock_irq(&dev->ctrl_lock);
	if (dev->cmd_inflight)
		complete(&dev->cmd_inflight->done);
	spin_unlock_irq(&dev->ctrl_lock);
}

/*
 * After the device was reset and no waiter is left: free the commands the
 * virtqueue still holds (the abandoned ones).
 */
void vrdma_cmd_cleanup(struct vrdma_dev *dev)
{
	struct vrdma_cmd *cmd;

	while ((cmd = virtqueue_detach_unused_buf(dev->ctrlq)))
		vrdma_cmd_free(cmd);
}
