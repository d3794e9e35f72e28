package abi

import (
	"bufio"
	"encoding/binary"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

type specField struct {
	off, size int
	name      string
}

// specTables parses docs/spec.md: a "### struct NAME (N bytes)" heading
// followed by a table whose rows are "| offset | size | field | …".
func specTables(t *testing.T) (map[string][]specField, map[string]int) {
	t.Helper()
	f, err := os.Open("../../../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := regexp.MustCompile(`^### struct (\w+) \((\d+) bytes\)`)
	row := regexp.MustCompile(`^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\w+)\s*\|`)
	tables, sizes := map[string][]specField{}, map[string]int{}
	cur := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := head.FindStringSubmatch(line); m != nil {
			cur = m[1]
			sizes[cur], _ = strconv.Atoi(m[2])
			continue
		}
		if strings.HasPrefix(line, "#") {
			cur = ""
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && cur != "" {
			off, _ := strconv.Atoi(m[1])
			size, _ := strconv.Atoi(m[2])
			tables[cur] = append(tables[cur], specField{off, size, m[3]})
		}
	}
	return tables, sizes
}

// goFields lays out a wire struct as encoding/binary does.
func goFields(v any) []specField {
	var out []specField
	rt := reflect.TypeOf(v).Elem()
	off := 0
	for i := range rt.NumField() {
		f := rt.Field(i)
		size := binary.Size(reflect.New(f.Type).Interface())
		out = append(out, specField{off, size, f.Tag.Get("spec")})
		off += size
	}
	return out
}

func TestWireStructsMatchSpec(t *testing.T) {
	tables, sizes := specTables(t)
	structs := map[string]any{
		"vrdma_config":           &Config{},
		"vrdma_cmd_hdr":          &CmdHeader{},
		"vrdma_resp_hdr":         &RespHeader{},
		"vrdma_device_attr":      &DeviceAttr{},
		"vrdma_port_req":         &PortReq{},
		"vrdma_port_attr":        &PortAttr{},
		"vrdma_gid_req":          &GIDReq{},
		"vrdma_gid":              &GID{},
		"vrdma_handle":           &Handle{},
		"vrdma_reg_mr":           &RegMR{},
		"vrdma_mr_keys":          &MRKeys{},
		"vrdma_create_cq":        &CreateCQ{},
		"vrdma_cq_record":        &CQRecord{},
		"vrdma_cq_arm_record":    &CQArmRecord{},
		"vrdma_qp_notify_record": &QPNotifyRecord{},
		"vrdma_gid_entry":        &GIDEntry{},
		"vrdma_create_qp":        &CreateQP{},
		"vrdma_qp_record":        &QPRecord{},
		"vrdma_qp_attr":          &QPAttr{},
		"vrdma_create_ah":        &CreateAH{},
		"vrdma_create_srq":       &CreateSRQ{},
		"vrdma_srq_record":       &SRQRecord{},
		"vrdma_srq_attr":         &SRQAttr{},
		"vrdma_notify_cq":        &NotifyCQ{},
		"vrdma_sge":              &SGE{},
		"vrdma_send_wqe":         &SendWQE{},
		"vrdma_av":               &AV{},
		"vrdma_bind_mw_wqe":      &BindMWWQE{},
		"vrdma_reg_mr_wqe":       &RegMRWQE{},
		"vrdma_alloc_mw":         &AllocMW{},
		"vrdma_alloc_mr":         &AllocMR{},
		"vrdma_recv_wqe":         &RecvWQE{},
		"vrdma_cqe":              &CQE{},
		"vrdma_event":            &Event{},
	}
	for name := range tables {
		if _, ok := structs[name]; !ok {
			t.Errorf("docs/spec.md defines struct %s, which has no Go wire structure", name)
		}
	}
	for name, v := range structs {
		t.Run(name, func(t *testing.T) {
			want, ok := tables[name]
			if !ok {
				t.Fatalf("docs/spec.md has no table for struct %s", name)
			}
			if got := binary.Size(v); got != sizes[name] {
				t.Errorf("size: got %d, spec says %d", got, sizes[name])
			}
			got := goFields(v)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("layout differs from spec:\n got  %v\n want %v", got, want)
			}
		})
	}
	if binary.Size(&SGE{}) != SGESize || binary.Size(&SendWQE{}) != SendWQEHdrSize ||
		binary.Size(&RecvWQE{}) != RecvWQEHdrSize || binary.Size(&CQE{}) != CQESize ||
		binary.Size(&Event{}) != EventSize || binary.Size(&QPRecord{}) != QPRecordSize ||
		binary.Size(&CQRecord{}) != CQRecordSize || binary.Size(&CQArmRecord{}) != CQArmRecordSize ||
		binary.Size(&QPNotifyRecord{}) != QPNotifyRecordSize {
		t.Error("data-path size constants disagree with the structures")
	}
	if binary.Size(&Config{}) != ConfigSize || binary.Size(&DeviceAttr{}) != DeviceAttrSize ||
		binary.Size(&CmdHeader{}) != CmdHeaderSize || binary.Size(&RespHeader{}) != RespHeaderSize {
		t.Error("size constants disagree with the structures")
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	in := DeviceAttr{FWVer: 1, NodeGUID: 0x0102030405060708, MaxQP: 7, MaxSRQ: 3}
	b := Marshal(&in)
	if len(b) != DeviceAttrSize {
		t.Fatalf("Marshal: got %d bytes, want %d", len(b), DeviceAttrSize)
	}
	if got := binary.LittleEndian.Uint64(b[8:]); got != in.NodeGUID {
		t.Fatalf("node_guid at offset 8: got %#x", got)
	}
	var out DeviceAttr
	if err := Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("Unmarshal = %+v, %v", out, err)
	}
	if err := Unmarshal(b[:10], &out); err == nil {
		t.Fatal("Unmarshal of a short buffer succeeded")
	}
}
