package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/internal/run/version"
)

// formatSettle is how long an advance of the cluster's storage format
// version must have been possible, with no replica joining or leaving,
// before a replica makes it: longer than the janitor election's session
// (10s), so that a replica of the first release, which announces nothing
// and is seen only in that election, is seen again after losing its
// session for a moment.
const formatSettle = 15 * time.Second

// formatTTL is the lease of a replica's announcement, in seconds: how long
// a replica that died without revoking it holds the version back.
const formatTTL = 10

// replicaID names this replica among the live ones: the host name (a pod's
// name under Kubernetes) and a random suffix, so that two processes on one
// host, or a restart before the old lease lapsed, never share an id; then
// "@" and the gRPC address it listens on, which the janitor's election
// named before (tests find the sweeping replica by it).
func replicaID(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "intentd"
	}
	host = strings.NewReplacer("/", "-", "\x00", "").Replace(host)
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:]) + "@" + strings.ReplaceAll(listen, "/", "-")
}

// commit is the VCS revision Go recorded in the binary, if any.
func commit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// joinFormats announces this replica's storage formats, or refuses to
// start when the cluster's format version is newer than this build reads
// (one line: both versions, and what to do).
func joinFormats(ctx context.Context, store *etcdstore.Store, id string, cfg Config) (*etcdstore.FormatMember, error) {
	jctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout+cfg.Store.OperationTimeout)
	defer cancel()
	m, err := store.JoinFormats(jctx, etcdstore.Replica{ID: id, Version: version.String(), Commit: commit()},
		etcdstore.FormatConfig{TTL: formatTTL, Settle: formatSettle})
	_, tooNew := errors.AsType[*etcdstore.FormatTooNewError](err)
	_, needsArchive := errors.AsType[*etcdstore.ArchiveInUseError](err)
	if tooNew || needsArchive {
		return nil, fmt.Errorf("intentd: refusing to start: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("intentd: %w", err)
	}
	// A first pass, so that the metrics and /formats have a status from
	// the start; one that fails is done again by Run.
	_ = m.Pass(jctx)
	return m, nil
}

// formatsComponent keeps this replica's announcement alive and advances
// the cluster's format version when every replica reads a newer one
// (etcdstore.FormatMember.Run). It stops the daemon when the version went
// past what this build reads, which only a lapse of its announcement
// makes possible: from then on its reads could meet values it cannot
// decode.
func formatsComponent(member *etcdstore.FormatMember, serving *readiness, cfg Config, log *slog.Logger) component {
	return func(ctx context.Context) error {
		err := member.Run(ctx, cfg.HealthInterval)
		if err == nil {
			return nil
		}
		serving.set(err, cfg.Store.RequestTimeout)
		err = fmt.Errorf("intentd: stopped serving: %w", err)
		log.Error("the cluster's storage format version went past this build", "err", err)
		return err
	}
}

// exportFormats exports the storage format versions as this replica's
// last pass read them: the cluster's (0: never advanced), the newest this
// replica reads and the one it writes, and the live replicas by the newest
// format each reads (reads="none": replicas of the first release, seen in
// the janitor's election only). See deploy/RUNBOOK.md,
// "IntentdFormatsUnsettled".
func (m *metrics) exportFormats(store *etcdstore.Store, member *etcdstore.FormatMember) {
	replicas := prometheus.NewDesc("intentd_storage_format_replicas",
		"Live intentd replicas by the newest storage format each reads, as this replica last read their announcements; reads=\"none\": replicas that announce nothing (a release before format versions).",
		[]string{"reads"}, nil)
	m.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_cluster_format_version", Help: "The cluster's storage format version as this replica last read it (0: never advanced: the first release's format).",
		}, func() float64 { return float64(member.Status().Cluster.Version) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_storage_format_readable", Help: "The newest storage format this replica's build reads.",
		}, func() float64 { return float64(store.ReadsFormat()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_storage_format_written", Help: "The newest storage format this replica writes now: the cluster's version, capped at what it reads.",
		}, func() float64 { return float64(store.WritesFormat()) }),
		collectFunc{desc: replicas, collect: func(ch chan<- prometheus.Metric) {
			st := member.Status()
			by := map[string]int{}
			for _, r := range st.Replicas {
				by[strconv.Itoa(r.Reads)]++
			}
			if len(st.Unannounced) > 0 {
				by["none"] = len(st.Unannounced)
			}
			for reads, n := range by {
				ch <- prometheus.MustNewConstMetric(replicas, prometheus.GaugeValue, float64(n), reads)
			}
		}},
	)
}

// formatsHandler answers GET /formats on the metrics listener with the
// cluster's storage format version and every live replica's announcement,
// read from etcd now (intentctl formats).
func formatsHandler(store *etcdstore.Store, self func() etcdstore.Replica) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := store.Formats(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(FormatsAnswer{
			Cluster: st.Cluster, Effective: st.Effective(), Target: st.Target(), Settled: st.Settled(),
			Self: self(), Replicas: st.Replicas, Unannounced: st.Unannounced, Revision: st.Revision,
		})
	})
}

// FormatsAnswer is the JSON of GET /formats.
type FormatsAnswer struct {
	// Cluster is the cluster's format version (version 0: never
	// advanced); Effective the format written (at least the first).
	Cluster   etcdstore.ClusterFormat `json:"cluster"`
	Effective int                     `json:"effective"`
	// Target is the newest format every live replica reads: the version
	// the cluster advances to when it is higher.
	Target int `json:"target"`
	// Settled is false while replicas disagree or the version has not
	// reached what they all read.
	Settled bool `json:"settled"`
	// Self is the answering replica; Replicas every live one.
	Self     etcdstore.Replica   `json:"self"`
	Replicas []etcdstore.Replica `json:"replicas"`
	// Unannounced are janitor candidates with no announcement: replicas
	// of a release before format versions.
	Unannounced []string `json:"unannounced,omitempty"`
	Revision    int64    `json:"revision"`
}
