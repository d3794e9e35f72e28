package tests

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestQEMUOrder replays QEMU 10's sequence for the generic device: realize,
// DRIVER_OK start (queues the guest never set up are skipped), stop,
// restart, RESET_DEVICE and start again, checking the device answers on
// its control queue each time.
func TestQEMUOrder(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 1)
	f := dial(t, socks[0], frontendCfg())

	if f.NumQueues != 3 {
		t.Fatalf("GET_QUEUE_NUM: got %d, want 3 (control, event, one doorbell)", f.NumQueues)
	}
	if f.MaxMemSlots < 8 {
		t.Fatalf("GET_MAX_MEM_SLOTS: got %d, want at least 8", f.MaxMemSlots)
	}
	// VHOST_F_LOG_ALL: a soft-RNIC device logs its writes for a migration.
	wantFeat := virtio.FeatureVersion1 | virtio.FeatureIndirectDesc | virtio.FeatureEventIdx |
		vu.FeatureProtocolFeatures | virtio.FeatureLogAll
	if f.DeviceFeatures != wantFeat {
		t.Fatalf("GET_FEATURES: got %#x, want %#x", f.DeviceFeatures, wantFeat)
	}
	// Config space before DRIVER_OK, as a guest driver reads it.
	cfgb, err := f.ReadConfig(0, abi.ConfigSize)
	if err != nil {
		t.Fatal(err)
	}
	var conf abi.Config
	if err := abi.Unmarshal(cfgb, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.ABIVersion != abi.ABIVersion || conf.NumDoorbellQueues != 1 || conf.PortState != abi.PortActive {
		t.Fatalf("config space: %+v", conf)
	}
	if _, err := f.ReadConfig(abi.ConfigSize-4, 8); err == nil {
		t.Fatal("GET_CONFIG past the end of config space succeeded")
	}

	// Only the control queue is set up: QEMU skips the others.
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	attr, st, err := queryDevice(f)
	if err != nil || st != abi.StatusOK {
		t.Fatalf("QUERY_DEVICE: status %v, err %v", st, err)
	}
	if attr.NodeGUID != conf.NodeGUID || attr.VendorPartID != 0x106a || attr.MaxQP != conf.MaxQP {
		t.Fatalf("QUERY_DEVICE answered %+v (config %+v)", attr, conf)
	}

	// Stop: GET_VRING_BASE returns the next avail index (one command done).
	bases, err := f.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if bases[abi.ControlQueue] != 1 {
		t.Fatalf("GET_VRING_BASE: got %d, want 1", bases[abi.ControlQueue])
	}
	// Restart with the base QEMU got back; the ring carries on.
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
			t.Fatalf("QUERY_DEVICE %d after restart: status %v, err %v", i, st, err)
		}
	}
	// An unknown command gets UNSUPPORTED, and the ring goes on.
	resp, err := f.Exec(abi.ControlQueue, abi.Marshal(&abi.CmdHeader{Opcode: 999}), 64, cmdTimeout)
	if err != nil || len(resp) != abi.RespHeaderSize || abi.Status(resp[0]) != abi.StatusUnsupported {
		t.Fatalf("unknown opcode: resp %x, err %v", resp, err)
	}

	// RESET_DEVICE, then the guest sets the device up again from scratch.
	if err := f.ResetDevice(); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(abi.ControlQueue, abi.EventQueue, abi.FirstDoorbellQueue); err != nil {
		t.Fatal(err)
	}
	if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
		t.Fatalf("QUERY_DEVICE after reset: status %v, err %v", st, err)
	}
	dv, _ := d.Device("dev0")
	if info := dv.Info(); !info.Connected || info.Commands != 6 || info.RingErrors != 0 {
		t.Fatalf("control API view: %+v", info)
	}
	if _, err := f.Stop(); err != nil {
		t.Fatal(err)
	}
}

func frontendCfg() frontend.Config {
	return frontend.Config{MemorySize: 16 << 20, QueueSize: 64}
}

// TestReconnect: when a front-end goes away everything it owned is
// released and the socket accepts the next one.
func TestReconnect(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 1)
	for i := range 3 {
		f := dial(t, socks[0], frontendCfg())
		if err := f.Start(abi.ControlQueue); err != nil {
			t.Fatal(err)
		}
		if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
			t.Fatalf("round %d: QUERY_DEVICE status %v err %v", i, st, err)
		}
		f.Close()
		dv, _ := d.Device("dev0")
		deadline := time.Now().Add(5 * time.Second)
		for dv.Server.Connected() {
			if time.Now().After(deadline) {
				t.Fatal("device still connected after the front-end closed")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
