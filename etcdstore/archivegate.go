package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Moving records to an archive is safe only while every replica serving
// the cluster asks the archive about a key etcd does not hold: one that
// does not would take a moved key for a new one and act on it again. Two
// rules keep it so.
//
//   - The archiver moves nothing until the cluster's format version is
//     FormatArchive (every announced replica's build reads the archive
//     tier, and no replica of a release before announcements runs), and,
//     at each pass, every live replica announced that it has an archive
//     (Replica.Archive) and none is unannounced (archiveMayMove).
//   - Before its first move, the archiver marks the cluster
//     (cluster/archive, never removed); a replica without an archive that
//     finds the mark refuses to start (ArchiveInUseError).
//
// The archiver writes the mark, then reads the announcements; a replica
// announces itself, then reads the mark. Both are linearizable etcd
// operations, so either the archiver's read sees the announcement (and
// moves nothing) or the replica's read sees the mark (and it refuses).

// archiveMark is the value of cluster/archive.
type archiveMark struct {
	Since time.Time `json:"since"`
}

func (k keys) archiveInUse() string { return k.prefix + "cluster/archive" }

// ArchiveInUseError is JoinFormats' refusal of a replica without an
// archive on a cluster whose final records have been moved to one.
type ArchiveInUseError struct{ Since time.Time }

func (e *ArchiveInUseError) Error() string {
	return fmt.Sprintf("this cluster's final intents have been moved to an archive since %s, and this intentd has none: it would take an archived key for a new one; start it with --archive-dsn naming the cluster's archive (docs/OPERATIONS.md, \"The archive\")",
		e.Since.UTC().Format(time.RFC3339))
}

// archiveCheck refuses a replica without an archive on a marked cluster;
// called once its announcement is written.
func (s *Store) archiveCheck(ctx context.Context) error {
	if s.archive.on() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Get(ctx, s.keys.archiveInUse())
	if err != nil {
		return fmt.Errorf("etcdstore: reading whether the cluster uses an archive: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var m archiveMark
	_ = json.Unmarshal(resp.Kvs[0].Value, &m) // a mark is a mark, whatever it says
	return &ArchiveInUseError{Since: m.Since}
}

// archiveMayMove reports whether the archiver may move records now (see
// above): the cluster at FormatArchive, the cluster marked, every live
// replica announced with an archive.
func (s *Store) archiveMayMove(ctx context.Context) (bool, error) {
	if !s.formats.allows(FormatArchive) {
		return false, nil
	}
	if !s.archive.marked.Load() {
		v, err := json.Marshal(archiveMark{Since: s.cfg.Now().UTC()})
		if err != nil {
			return false, err
		}
		k := s.keys.archiveInUse()
		mctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		_, err = s.kv.Txn(mctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, string(v))).Commit()
		cancel()
		if err != nil {
			return false, fmt.Errorf("etcdstore: marking the cluster as using an archive: %w", err)
		}
		s.archive.marked.Store(true)
	}
	st, err := s.Formats(ctx)
	if err != nil {
		return false, err
	}
	if len(st.Unannounced) > 0 {
		return false, nil
	}
	for _, r := range st.Replicas {
		if !r.Archive {
			return false, nil
		}
	}
	return true, nil
}
