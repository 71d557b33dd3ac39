package daemon

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// warnFullAt is the share of etcd's backend quota at which intentd starts
// warning, and warns again every further warnFullStep: early enough to
// raise the quota or defragment before writes are refused.
const (
	warnFullAt   = 0.80
	warnFullStep = 0.05
)

// dbSizeEvery is how many health intervals pass between two size checks
// (10 s by default): each check dials every endpoint anew (etcd's Status
// call does), and a database does not fill up in seconds.
const dbSizeEvery = 5

// dbStatus is the fullest member's database, as etcd's maintenance Status
// reports it.
type dbStatus struct {
	endpoint string
	// size is the bbolt file's size, which is what etcd holds against the
	// quota; inUse is what compaction has left of it (the rest are free
	// pages, reused before the file grows, returned by a defragmentation).
	size, inUse, quota int64
	alarms             []string
}

// ratio is size / quota, or 0 when etcd does not say its quota (before
// etcd 3.6).
func (s dbStatus) ratio() float64 {
	if s.quota <= 0 {
		return 0
	}
	return float64(s.size) / float64(s.quota)
}

// fullStep is how many warning steps above warnFullAt a ratio is: -1 below
// it, 0 from 80 %, 1 from 85 %, and so on.
func fullStep(ratio float64) int {
	if ratio < warnFullAt {
		return -1
	}
	return int(math.Floor((ratio-warnFullAt)/warnFullStep + 1e-9))
}

// watchDBSize asks each of endpoints, through cli, for its database size every
// interval, exports the fullest member's in the metrics, and logs a warning
// when it crosses 80 % of its quota and every 5 % beyond, and an error
// while etcd has an alarm raised (NOSPACE: it only reads and deletes).
// Exits when ctx ends.
func watchDBSize(ctx context.Context, cli *clientv3.Client, endpoints []string, every, timeout time.Duration, m *metrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	warned := -1
	var alarmed []string
	for {
		if st, ok := fullest(ctx, cli, endpoints, timeout); ok {
			m.db(st)
			step := fullStep(st.ratio())
			switch {
			case step > warned:
				hint := "raise --embed-quota-bytes (or the cluster's --quota-backend-bytes), or shorten --retention"
				if st.inUse < st.size/2 {
					// The embedded etcd serves no TCP port unless asked: name
					// the endpoint that was measured, a unix socket included.
					hint = "most of the file is free pages: defragment (etcdctl --endpoints " + st.endpoint + " defrag) to return them"
				}
				log.Warn("etcd's database is filling up: at its quota etcd only reads and deletes, and every write fails STORE_FULL; "+hint,
					"used_percent", math.Round(100*st.ratio()), "size_bytes", st.size, "in_use_bytes", st.inUse, "quota_bytes", st.quota, "endpoint", st.endpoint)
			case step < 0 && warned >= 0:
				log.Info("etcd's database is below 80% of its quota again", "size_bytes", st.size, "quota_bytes", st.quota)
			}
			warned = step
			if !slices.Equal(st.alarms, alarmed) && len(st.alarms) > 0 {
				log.Error("etcd has an alarm raised", "alarms", strings.Join(st.alarms, "; "), "endpoint", st.endpoint)
			}
			alarmed = st.alarms
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fullest asks each endpoint for its status and returns the member nearest
// its quota (the largest, when no quota is known); false when none answered.
func fullest(ctx context.Context, cli *clientv3.Client, endpoints []string, timeout time.Duration) (dbStatus, bool) {
	var best dbStatus
	found := false
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			continue
		}
		st := dbStatus{endpoint: ep, size: resp.DbSize, inUse: resp.DbSizeInUse, quota: resp.DbSizeQuota, alarms: resp.Errors}
		if !found || st.ratio() > best.ratio() || (st.ratio() == best.ratio() && st.size > best.size) {
			best, found = st, true
		}
	}
	return best, found
}
