package daemon

import (
	"encoding/json"
	"net/http"
)

// DeviceInfo is a device as the control API shows it.
type DeviceInfo struct {
	ID          string `json:"id"`
	Socket      string `json:"socket"`
	UUID        string `json:"uuid"`
	Connected   bool   `json:"connected"`
	PinnedBytes uint64 `json:"pinned_bytes"`
	PDs         int    `json:"pds"`
	MRs         int    `json:"mrs"`
	CQs         int    `json:"cqs"`
	QPs         int    `json:"qps"`
	BytesMoved  uint64 `json:"bytes_moved"`
	Errors      uint64 `json:"errors"`
	Commands    uint64 `json:"commands"`
	Sessions    uint64 `json:"sessions"`
	RingErrors  uint64 `json:"ring_errors"`
	AHs         int    `json:"ahs"`
	CachedBytes uint64 `json:"map_cache_bytes"`
	CacheHits   uint64 `json:"map_cache_hits"`
	CacheMisses uint64 `json:"map_cache_misses"`
	EventsLost  uint64 `json:"events_lost"`
}

// Info describes a device now.
func (dv *Device) Info() DeviceInfo {
	st := dv.Server.Stats()
	ds := dv.Dev.Stats()
	var wcErrors uint64
	for _, n := range ds.Engine.CompletionErrors {
		wcErrors += n
	}
	return DeviceInfo{
		ID:          dv.ID,
		Socket:      dv.Server.Socket(),
		UUID:        dv.Dev.UUID().String(),
		Connected:   dv.Server.Connected(),
		PinnedBytes: ds.Pin.PinnedBytes,
		PDs:         ds.PDs,
		MRs:         ds.MRs,
		CQs:         ds.CQs,
		QPs:         ds.QPs,
		AHs:         ds.AHs,
		BytesMoved:  ds.Engine.BytesMoved,
		Errors:      ds.Errors + st.ProtocolErrors + st.RingErrors + wcErrors,
		Commands:    ds.Commands,
		Sessions:    st.Sessions,
		RingErrors:  st.RingErrors,
		CachedBytes: ds.Pin.CachedBytes,
		CacheHits:   ds.Pin.CacheHits,
		CacheMisses: ds.Pin.CacheMisses,
		EventsLost:  ds.EventsLost,
	}
}

// Handler is the control API.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/devices", func(w http.ResponseWriter, r *http.Request) {
		devs := d.Devices()
		out := make([]DeviceInfo, 0, len(devs))
		for _, dv := range devs {
			out = append(out, dv.Info())
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /v1/devices/{id}", func(w http.ResponseWriter, r *http.Request) {
		dv, ok := d.Device(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no such device: "+r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, dv.Info())
	})
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "devices": len(d.Devices()), "pinned_bytes": d.PinnedBytes()})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
