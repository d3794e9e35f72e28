// Package qemu runs QEMU with vrdma's vhost-user devices attached and
// drives it over QMP.
//
// It builds the command line of a q35 machine whose RAM is a shared memfd
// (memory-backend-memfd,share=on: vhost-user back-ends map guest RAM from
// the fds QEMU sends) with vrdma's device, vhost-user-rdma-pci (num_vqs,
// vq_size, config_size; virtio ID 42), or where a QEMU lacks it, QEMU's
// generic vhost-user front-end, vhost-user-device-pci (virtio-id=42 too;
// named vhost-user-test-device-pci from QEMU 10.2); starts QEMU so that it
// dies with its parent (Pdeathsig); connects the QMP monitor through
// github.com/digitalocean/go-qemu/qmp; and offers what tests and vrdmactl
// need: query-pci flattened over bridges, hot-plug of a vhost-user device
// on a free pcie-root-port (chardev-add, then a raw device_add) and
// hot-unplug (device_del, DEVICE_DELETED, chardev-remove).
//
// The device's name is asked of QEMU, never assumed: DeviceName runs
// `-device help` once per binary file (the command line of Start, the VM's
// hot-plug) and DeviceNameQMP asks qom-list-types (hot-plug into a QEMU
// someone else started). vhost-user-rdma-pci comes first, then the generic
// devices; a QEMU with none of them (Debian's 7.2, upstream 10.0 whose
// generic device is hidden) gets an error matching ErrNoRDMADevice that
// names the QEMU to use instead. Config.DeviceName picks the generic device
// on a QEMU that has both.
//
// A QEMU that libvirt runs is reached through libvirt, which owns its QMP
// socket: LibvirtMonitor (DialLibvirt) is a qmp.Monitor over
// `virsh qemu-monitor-command`, one process per command, so the same
// AttachVhostUserQMP and DetachVhostUserQMP serve both; without QMP events
// there, detach polls QOM until the device is gone (libvirt.go says why
// virsh rather than go-qemu's libvirt RPC monitor). Package qemutest has a
// fake virsh and a fake QMP server for tests.
//
// Upstream QEMU 10.0 hides the generic device (not user-creatable) and has
// no virtio name for ID 42; scripts/qemu-build.sh (`make qemu`) builds
// Debian's QEMU 10.0.2 with patches/0001-vhost-user-device-user-creatable.patch
// and patches/0003-vhost-user-rdma-device.patch (the named device, whose
// realize refuses a num_vqs other than the back-end's queue count) and
// leaves bin/qemu-system-x86_64, which scripts/deb-qemu.sh packages as
// vrdma-qemu (InstalledBinary); FindBinary finds either. Upstream's
// generic device also cannot live through a back-end restart (a
// reconnect-ms chardev fails realize; a reconnect aborts QEMU in
// vhost_dev_start): patches/0002-vhost-user-base-reconnect.patch makes
// realize wait for the back-end and re-initialises vhost on reconnect, so
// VhostUserDevice.ReconnectMs works (docs/spec.md, "Reset and disconnect").
//
// Live migration (migrate.go): Config.Incoming starts a destination
// (-incoming defer) with the source's machine and back-ends of its own;
// VM.MigrateIncoming makes it listen on a unix socket, VM.Migrate sends
// the source there (the events capability, MigrationParams' max-bandwidth
// and downtime-limit), VM.WaitMigration follows query-migrate to a final
// status (bounded; QEMU's downtime, total time and RAM sent in
// MigrationInfo), VM.CancelMigration stops one in flight (migrate_cancel,
// until "cancelled") and VM.WaitRunning waits for the destination's vCPUs.
// The same functions take any qmp.Monitor (MigrateQMP, ...). The device's
// state travels with QEMU's: patches/0004-vhost-user-rdma-migration.patch
// makes vhost-user-rdma-pci migratable through the vhost-user
// device-state protocol (and delivers the device status, DRIVER_OK and
// 0, which vhost-user-base withheld, so the back-end can tell a
// switch-over from a reset).
//
// Non-goals: this package does not speak vhost-user (the back-end is
// vrdmad, the front-end here is QEMU), does not build guest images, does
// not manage KVM (guests run under TCG unless ExtraArgs asks for
// "-accel kvm"), and does not support machines other than q35 (microvm
// hangs under TCG).
//
// Naming: Args creates the ids "mem" (RAM backend), "qmp", "serial0", and
// for every device D: chardev D-chr and, on the command line, its own
// pcie-root-port D-port (so boot-time devices can be hot-unplugged, which
// pcie.0 does not allow); free root ports are vrdma-rp0, vrdma-rp1, ...
// AttachVhostUser uses the same D-chr chardev name, so DetachVhostUser works
// for both kinds of device. A NIC N (virtio-net-pci on pcie.0) has the
// netdev N-net: a unix-datagram-socket pair that joins two VMs on a private
// link (no privileges, nothing leaves the machine), or a hub port of its
// own.
//
// Invariants:
//   - Every Config is validated before use; errors are *ConfigError
//     (errors.Is ErrInvalidConfig) naming the field. Values that QEMU would
//     abort on (vq_size > 1024, num_vqs > 1024) never reach it.
//   - A VM's QMP connection is owned by the VM. One goroutine pumps QMP
//     events to subscribers with bounded buffers, so command replies are
//     never stuck behind unread events.
//   - QEMU never outlives the process that started it, and Start kills it
//     on any start-up failure.
//
// Lock order: VM.mu (event subscribers) and VM.devMu (cached device name)
// are leaves, never held together and never held while a QMP command runs. go-qemu's SocketMonitor serialises commands itself.
package qemu
