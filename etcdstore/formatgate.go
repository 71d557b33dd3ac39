package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Storage format versions (issue 31): replicas of two releases serve one
// cluster, and a value of a new format is written only once every live
// replica reads it.
//
// A format version names everything a release may write into etcd (record
// format bytes, tombstone layouts, token slots, the keys it adds). Format 1
// is everything the first release (RELEASES) writes; a later storage
// change is format 2, and so on, each release reading every format up to
// its newest. The cluster's format version, under cluster/format, is the
// newest format any replica may write; it is only ever advanced, by a
// compare-and-swap, and only when every live replica has announced that
// it reads the new one.
//
//	replicas/<id>     one live replica's announcement (JSON Replica), on an
//	                  etcd lease of its own: a replica that dies stops
//	                  counting when its lease lapses
//	cluster/format    the cluster's format version (JSON ClusterFormat);
//	                  absent: never advanced, format 1
const (
	// FormatFirst is the storage format of the first release: every value
	// it writes. Every release reads it, and writes it while the cluster's
	// format version is not higher.
	FormatFirst = 1
	// FormatArchive is the archive tier's (issue 26): final records move
	// out of etcd into the archive (Config.Archive), leaving no record and
	// no tombstone behind in etcd, so that only a replica that asks the
	// archive on a miss may serve the cluster: one of the first release
	// would register an archived key anew. Moving a record needs
	// allows(FormatArchive).
	FormatArchive = 2
	// FormatNewest is the newest storage format this build reads, and
	// writes once the cluster's format version reaches it.
	FormatNewest = FormatArchive
)

// formatGate decides which storage formats this store may write: the
// newest the whole cluster reads. A writer of anything a format after
// the first introduces asks allows(v) first and writes the earlier form
// while it says no; the daemon's FormatMember keeps the gate current.
type formatGate struct {
	// newest is the newest format this store reads; 0 means FormatNewest
	// (a test raises it to play a later release).
	newest int
	// cluster is the cluster's format version as last read; 0: not read
	// yet, or never advanced.
	cluster atomic.Int64
}

// reads is the newest format the store reads.
func (g *formatGate) reads() int {
	if g.newest > 0 {
		return g.newest
	}
	return FormatNewest
}

// allows reports whether the store may write values of format v: the
// first format always, a later one once the cluster's version reached it.
func (g *formatGate) allows(v int) bool {
	return v <= FormatFirst || int64(v) <= g.cluster.Load()
}

// writes is the newest format the store writes now.
func (g *formatGate) writes() int {
	return min(max(int(g.cluster.Load()), FormatFirst), g.reads())
}

// WritesFormat is the newest storage format this store writes now: the
// cluster's format version, as last read, capped at the newest this
// build reads.
func (s *Store) WritesFormat() int { return s.formats.writes() }

// ReadsFormat is the newest storage format this build reads.
func (s *Store) ReadsFormat() int { return s.formats.reads() }

func (k keys) clusterFormat() string    { return k.prefix + "cluster/format" }
func (k keys) replicas() string         { return k.prefix + "replicas/" }
func (k keys) replica(id string) string { return k.replicas() + id }

// Replica is what a replica announces about itself under replicas/<id>.
type Replica struct {
	// ID names the replica: unique among the live ones (the daemon uses
	// the host name and a random suffix). The janitor's election carries
	// the same id, which is how a replica of a release before announcements
	// is told apart (FormatStatus.Unannounced).
	ID string `json:"id"`
	// Version and Commit name its build.
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	// Reads is the newest format it reads (it reads every one from
	// FormatFirst); Writes the newest it writes now.
	Reads  int `json:"reads"`
	Writes int `json:"writes"`
	// Archive is whether it has an archive (the cold tier): records are
	// moved to one only while every live replica has it (archivegate.go).
	Archive bool `json:"archive,omitempty"`
	// Since is when it announced itself.
	Since time.Time `json:"since"`
}

// ClusterFormat is the value of cluster/format.
type ClusterFormat struct {
	// Version is the cluster's format version; 0: never advanced (the
	// first release's format, FormatFirst, is written).
	Version int `json:"version"`
	// By names the replica and build that advanced it, At when.
	By string    `json:"by,omitempty"`
	At time.Time `json:"at,omitzero"`
}

// FormatStatus is the cluster's format version and every live replica's
// announcement, read at one revision.
type FormatStatus struct {
	Cluster ClusterFormat
	// Replicas are the live announcements, by id.
	Replicas []Replica
	// Unannounced are the ids of replicas in the janitor's election with
	// no announcement: replicas of a release before announcements (the
	// first release), which read format 1 and nothing later. While there
	// is one, the version does not advance.
	Unannounced []string
	// Revision is the etcd revision it was read at.
	Revision int64

	clusterModRevision int64
}

// Effective is the format the cluster writes: its version, or
// FormatFirst while it was never advanced.
func (st FormatStatus) Effective() int { return max(st.Cluster.Version, FormatFirst) }

// Target is the newest format every live replica reads, the version the
// cluster may advance to: 0 with no replica announced, and never more
// than FormatFirst while a replica has not announced itself.
func (st FormatStatus) Target() int {
	if len(st.Replicas) == 0 {
		return 0
	}
	t := st.Replicas[0].Reads
	for _, r := range st.Replicas[1:] {
		t = min(t, r.Reads)
	}
	if len(st.Unannounced) > 0 {
		t = min(t, FormatFirst)
	}
	return t
}

// Settled reports whether the replicas agree: every one announced, every
// one reads the same newest format, and the cluster's version is it.
// A cluster that stays unsettled is stuck between versions: an upgrade
// (or a rollback) is half done.
func (st FormatStatus) Settled() bool {
	if len(st.Unannounced) > 0 || len(st.Replicas) == 0 {
		return len(st.Replicas) == 0 && len(st.Unannounced) == 0
	}
	for _, r := range st.Replicas {
		if r.Reads != st.Replicas[0].Reads {
			return false
		}
	}
	return st.Cluster.Version == st.Replicas[0].Reads
}

// FormatTooNewError is the refusal of a replica whose build does not read
// the cluster's format version: one of a release before the one that
// advanced it.
type FormatTooNewError struct {
	Cluster ClusterFormat
	// Reads and Version are this replica's newest format and its build.
	Reads   int
	Version string
}

func (e *FormatTooNewError) Error() string {
	by := e.Cluster.By
	if by == "" {
		by = "a later release"
	}
	return fmt.Sprintf("the cluster's storage format version is %d (advanced by %s), and this intentd (%s) reads formats up to %d: run a release that reads format %d or later; the cluster cannot go back to format %d (docs/OPERATIONS.md, \"Rolling upgrades\")",
		e.Cluster.Version, by, e.Version, e.Reads, e.Cluster.Version, e.Reads)
}

// Formats reads the cluster's format version and every live replica's
// announcement, at one revision (intentctl formats, metrics).
func (s *Store) Formats(ctx context.Context) (FormatStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(s.keys.clusterFormat()),
		clientv3.OpGet(s.keys.replicas(), clientv3.WithPrefix()),
		clientv3.OpGet(s.keys.election(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return FormatStatus{}, fmt.Errorf("etcdstore: reading the storage formats: %w", err)
	}
	st := FormatStatus{Revision: resp.Header.Revision}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if err := json.Unmarshal(kvs[0].Value, &st.Cluster); err != nil || st.Cluster.Version < FormatFirst {
			return FormatStatus{}, fmt.Errorf("etcdstore: %s holds %q, not a format version", kvs[0].Key, kvs[0].Value)
		}
		st.clusterModRevision = kvs[0].ModRevision
	}
	announced := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var r Replica
		if err := json.Unmarshal(kv.Value, &r); err != nil || r.Reads < FormatFirst {
			// An announcement this build cannot read is a replica that
			// reads nothing it knows of: it keeps the version where it is.
			r = Replica{ID: strings.TrimPrefix(string(kv.Key), s.keys.replicas()), Reads: FormatFirst, Writes: FormatFirst}
		}
		announced[r.ID] = true
		st.Replicas = append(st.Replicas, r)
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		if id := string(kv.Value); !announced[id] {
			st.Unannounced = append(st.Unannounced, id)
		}
	}
	slices.Sort(st.Unannounced)
	return st, nil
}

// FormatMember is this replica's part in the format protocol: its
// announcement, kept alive on its lease, and the advances it makes.
type FormatMember struct {
	s      *Store
	r      Replica
	ttl    int64
	settle time.Duration

	mu     sync.Mutex
	lease  clientv3.LeaseID
	alive  <-chan *clientv3.LeaseKeepAliveResponse
	cancel context.CancelFunc
	last   FormatStatus
	// ready is since when, and for which target, an advance was found
	// possible without interruption (settle).
	ready        time.Time
	readyTarget  int
	readyMembers string
	// behind is the unannounced replicas last warned of (warnBehind).
	behind string
}

// FormatConfig shapes a FormatMember.
type FormatConfig struct {
	// TTL is the announcement's lease, in seconds: how long after a
	// replica dies it stops holding the version back. Zero: 10.
	TTL int64
	// Settle is how long an advance must have been possible, without a
	// replica joining or leaving, before this replica makes it: a replica
	// of the first release that lost its election session for a moment is
	// back in the election within it. Zero: advance at once (tests).
	Settle time.Duration
}

// JoinFormats announces this replica and returns its member, or refuses
// with a *FormatTooNewError when the cluster's format version is newer
// than this build reads. The announcement is written only while the
// cluster's version is the one read, so that no advance slips between the
// check and the announcement. r.Reads, Writes and Since are filled in.
func (s *Store) JoinFormats(ctx context.Context, r Replica, cfg FormatConfig) (*FormatMember, error) {
	if r.ID == "" || strings.ContainsAny(r.ID, "/\x00") {
		return nil, fmt.Errorf("etcdstore: replica id %q: want a non-empty name without '/'", r.ID)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10
	}
	r.Reads = s.formats.reads()
	r.Archive = s.archive.on()
	r.Since = s.cfg.Now().UTC()
	m := &FormatMember{s: s, r: r, ttl: cfg.TTL, settle: cfg.Settle}
	if err := m.join(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// join grants a lease and writes the announcement under it, if the
// cluster's version is one this build reads.
func (m *FormatMember) join(ctx context.Context) error {
	s := m.s
	for attempt := 0; ; attempt++ {
		st, err := s.Formats(ctx)
		if err == nil {
			if err = m.refuses(st); err != nil {
				return err
			}
			var ok bool
			ok, err = m.announce(ctx, st)
			if ok {
				// Announced first, then the mark read: see archivegate.go.
				if err := s.archiveCheck(ctx); err != nil {
					m.leave()
					return err
				}
				return nil
			}
		}
		if attempt >= 20 || ctx.Err() != nil {
			if err == nil {
				err = errors.New("the cluster's format version kept changing")
			}
			return fmt.Errorf("etcdstore: announcing this replica's storage formats: %w", err)
		}
		if err := s.backoff(ctx, attempt, nil); err != nil {
			return err
		}
	}
}

// refuses returns the refusal when st's version is newer than this build
// reads, and keeps the gate current otherwise.
func (m *FormatMember) refuses(st FormatStatus) error {
	if st.Cluster.Version > m.s.formats.reads() {
		return &FormatTooNewError{Cluster: st.Cluster, Reads: m.s.formats.reads(), Version: m.r.Version}
	}
	m.s.formats.cluster.Store(int64(st.Cluster.Version))
	return nil
}

// clusterUnchanged compares cluster/format with what st read.
func (m *FormatMember) clusterUnchanged(st FormatStatus) clientv3.Cmp {
	k := m.s.keys.clusterFormat()
	if st.clusterModRevision == 0 {
		return clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(k), "=", st.clusterModRevision)
}

// announce grants a new lease and writes the announcement on it, if the
// cluster's version is still st's; false: it changed.
func (m *FormatMember) announce(ctx context.Context, st FormatStatus) (bool, error) {
	s := m.s
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	grant, err := s.leases.Grant(rctx, m.ttl)
	if err != nil {
		return false, err
	}
	r := m.r
	r.Writes = s.formats.writes()
	v, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	resp, err := s.kv.Txn(rctx).If(m.clusterUnchanged(st)).
		Then(clientv3.OpPut(s.keys.replica(r.ID), string(v), clientv3.WithLease(grant.ID))).Commit()
	if err != nil || !resp.Succeeded {
		_, _ = s.leases.Revoke(rctx, grant.ID)
		return false, err
	}
	kctx, kcancel := context.WithCancel(context.Background())
	alive, err := s.leases.KeepAlive(kctx, grant.ID)
	if err != nil {
		kcancel()
		_, _ = s.leases.Revoke(rctx, grant.ID)
		return false, err
	}
	m.mu.Lock()
	old := m.cancel
	m.lease, m.alive, m.cancel, m.r = grant.ID, alive, kcancel, r
	m.mu.Unlock()
	if old != nil {
		old()
	}
	return true, nil
}

// Replica is this replica's announcement as last written.
func (m *FormatMember) Replica() Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.r
}

// Status is the formats as the last pass read them.
func (m *FormatMember) Status() FormatStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// Run keeps the announcement alive (announcing again, on a new lease,
// when its lease was lost), and every interval reads the formats, keeps
// the store's gate current and advances the cluster's version when every
// live replica reads a newer one. It returns nil when ctx ends (the
// announcement revoked, so that the version does not wait for its lease),
// and a *FormatTooNewError when the cluster's version went past what
// this build reads: possible only after this replica's lease lapsed.
func (m *FormatMember) Run(ctx context.Context, interval time.Duration) error {
	defer m.leave()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		m.mu.Lock()
		alive := m.alive
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-alive:
			if ok {
				continue
			}
			// The lease is gone (lapsed, or etcd unreachable past its
			// TTL): announce again, unless the version moved past us.
			if err := m.join(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				var tooNew *FormatTooNewError
				if errors.As(err, &tooNew) {
					return err
				}
				m.s.cfg.Logger.Warn("storage formats: announcing again failed; retrying", "err", err)
			}
		case <-t.C:
			if err := m.Pass(ctx); err != nil {
				var tooNew *FormatTooNewError
				if errors.As(err, &tooNew) {
					return err
				}
				if ctx.Err() == nil {
					m.s.cfg.Logger.Warn("storage formats: pass failed", "err", err)
				}
			}
		}
	}
}

// leave revokes the announcement's lease.
func (m *FormatMember) leave() {
	m.mu.Lock()
	lease, cancel := m.lease, m.cancel
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	ctx, done := context.WithTimeout(context.Background(), m.s.cfg.RequestTimeout)
	defer done()
	_, _ = m.s.leases.Revoke(ctx, lease)
}

// Pass reads the formats once, keeps the gate and the announcement
// current, and advances the cluster's version if it can: Run does it
// every interval.
func (m *FormatMember) Pass(ctx context.Context) error {
	st, err := m.s.Formats(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.last = st
	m.mu.Unlock()
	if err := m.refuses(st); err != nil {
		return err
	}
	m.warnBehind(st)
	if err := m.rewrite(ctx); err != nil {
		return err
	}
	advanced, err := m.advance(ctx, st)
	if err != nil || !advanced {
		return err
	}
	// Read again, for the gate and Status.
	return m.Pass(ctx)
}

// warnBehind logs, once for each set of them, replicas that announce
// nothing while the cluster's version is past the first format: replicas
// of the first release, which cannot check the version and do not read
// what it allows (they were started after it advanced). Nothing stops
// them but the operator (deploy/RUNBOOK.md, "IntentdReplicaBehindFormat").
func (m *FormatMember) warnBehind(st FormatStatus) {
	behind := ""
	if st.Cluster.Version > FormatFirst {
		behind = strings.Join(st.Unannounced, ",")
	}
	if behind == m.behind {
		return
	}
	m.behind = behind
	if behind != "" {
		m.s.cfg.Logger.Error("replicas of the first release serve a cluster whose storage format version is past what they read: stop them",
			"cluster_format_version", st.Cluster.Version, "replicas", behind)
	}
}

// rewrite puts the announcement again when what it writes changed.
func (m *FormatMember) rewrite(ctx context.Context) error {
	m.mu.Lock()
	r, lease := m.r, m.lease
	m.mu.Unlock()
	if r.Writes == m.s.formats.writes() {
		return nil
	}
	r.Writes = m.s.formats.writes()
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, m.s.cfg.RequestTimeout)
	defer cancel()
	if _, err := m.s.kv.Put(rctx, m.s.keys.replica(r.ID), string(v), clientv3.WithLease(lease)); err != nil {
		return err
	}
	m.mu.Lock()
	m.r = r
	m.mu.Unlock()
	return nil
}

// advance writes Target as the cluster's version when it is newer than
// the version, has been for the settle time, and nothing changed since
// st was read: no announcement and no election candidate added or
// rewritten, the version the same. Of concurrent advancers one succeeds.
func (m *FormatMember) advance(ctx context.Context, st FormatStatus) (bool, error) {
	target := st.Target()
	// The settling time on the monotonic clock: a store's clock (Config.Now)
	// may be moved, which must neither skip nor stretch it.
	now := time.Now()
	if target <= st.Cluster.Version || len(st.Unannounced) > 0 {
		m.ready, m.readyTarget, m.readyMembers = time.Time{}, 0, ""
		return false, nil
	}
	ids := make([]string, 0, len(st.Replicas))
	for _, r := range st.Replicas {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	members := strings.Join(ids, "\x00")
	if m.ready.IsZero() || m.readyTarget != target || m.readyMembers != members {
		m.ready, m.readyTarget, m.readyMembers = now, target, members
	}
	if now.Sub(m.ready) < m.settle {
		return false, nil
	}
	m.mu.Lock()
	r := m.r
	m.mu.Unlock()
	v, err := json.Marshal(ClusterFormat{Version: target, By: r.ID + " (" + r.Version + ")", At: m.s.cfg.Now().UTC()})
	if err != nil {
		return false, err
	}
	k := m.s.keys
	unchanged := func(prefix string) clientv3.Cmp {
		return clientv3.Compare(clientv3.ModRevision(prefix), "<", st.Revision+1).WithPrefix()
	}
	rctx, cancel := context.WithTimeout(ctx, m.s.cfg.RequestTimeout)
	defer cancel()
	resp, err := m.s.kv.Txn(rctx).
		If(m.clusterUnchanged(st), unchanged(k.replicas()), unchanged(k.election())).
		Then(clientv3.OpPut(k.clusterFormat(), string(v))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: advancing the storage format version to %d: %w", target, err)
	}
	if resp.Succeeded {
		m.s.cfg.Logger.Info("advanced the cluster's storage format version", "from", st.Cluster.Version, "to", target, "replicas", len(st.Replicas))
	}
	return resp.Succeeded, nil
}
