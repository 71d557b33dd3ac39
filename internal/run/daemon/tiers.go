package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/internal/run/console"
)

// consoleTiers is the console overview's storage section: the figures
// /metrics shows of etcd and the archive (the same gauges, read back, so
// that the page and the dashboards never disagree). archived: intentd
// has --archive-dsn.
func consoleTiers(m *metrics, am *archiveMetrics, store *etcdstore.Store, archived bool) func() console.Tiers {
	return func() console.Tiers {
		t := console.Tiers{EtcdFinal: gauge(m.final), EtcdSize: gauge(m.dbSize), EtcdInUse: gauge(m.dbInUse), EtcdQuota: gauge(m.dbQuota)}
		if !archived {
			return t
		}
		st := store.ArchiveStats()
		t.Archive = &console.ArchiveTier{
			Unavailable: gauge(am.down) == 1,
			Intents:     gauge(am.rows.WithLabelValues("intents")),
			Tombstones:  gauge(am.rows.WithLabelValues("tombstones")),
			Bytes:       gauge(am.bytes.WithLabelValues("intents")) + gauge(am.bytes.WithLabelValues("tombstones")),
			Moved:       st.Moved, Lag: st.Lag,
			FilterReady: st.FilterReady, FilterKeys: st.FilterKeys,
		}
		return t
	}
}

// gauge reads g's value.
func gauge(g prometheus.Gauge) int64 {
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		return 0
	}
	return int64(d.GetGauge().GetValue())
}
