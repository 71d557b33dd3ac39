package etcdstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
)

// RolledBackError is the one refusal of an etcd whose revision went back:
// it answered at a revision below one the store had already seen or been
// told of, most likely because the cluster was restored from an older
// snapshot without a revision bump (or a member was wiped). Fencing tokens
// are derived from etcd revisions, so such a store would hand out tokens
// equal to or lower than tokens workers already hold and gateways already
// saw. It matches intent.ErrStoreRolledBack, and intent.ErrUnavailable:
// nothing was decided (the gRPC layer answers UNAVAILABLE with reason
// STORE_ROLLED_BACK).
type RolledBackError struct {
	// Revision is the revision etcd answered at.
	Revision int64
	// Floor is a revision the store had already seen or been told of,
	// above Revision: the floor the call was held to when it was sent,
	// or, in the refusal of a Floor, the highest revision the store saw.
	Floor int64
	// Installation and File name the installation whose floor was kept
	// and the file that keeps it, in the refusal of a Floor (HoldFloor,
	// Floor.Run), which then tells the operator what to do; empty in the
	// refusal of one call.
	Installation, File string
}

func (e *RolledBackError) Error() string {
	if e.Installation == "" {
		return fmt.Sprintf("etcdstore: etcd answered at revision %d, below revision %d already seen: "+
			"it was probably restored from an older snapshot without a revision bump, and fencing tokens would go backwards", e.Revision, e.Floor)
	}
	return fmt.Sprintf("etcd's revision %d is behind the %d this replica already saw for installation %s: "+
		"the store was probably restored from an older snapshot without a revision bump, and fencing tokens would go backwards; "+
		"restore it again with `etcdutl snapshot restore --bump-revision <at least %d, e.g. 1000000000> --mark-compacted`; "+
		"delete %s only if no token handed out before is still held by a worker or a gateway",
		e.Revision, e.Floor, e.Installation, e.Floor-e.Revision+1, e.File)
}

// Is makes the refusal match intent.ErrStoreRolledBack and
// intent.ErrUnavailable, so that callers that only know the latter still
// treat it as "nothing was decided".
func (e *RolledBackError) Is(target error) bool {
	return target == intent.ErrStoreRolledBack || target == intent.ErrUnavailable
}

// revisionFloor is the lowest etcd revision the store still accepts: the
// highest it was told of (RaiseFloor) or saw in a response. Once it refuses
// a response it latches: every later call is refused before it reaches
// etcd, so that a store that found its etcd behind sends it no more
// writes (see flooredKV for the one write that may slip through).
type revisionFloor struct {
	max     atomic.Int64
	refused atomic.Pointer[RolledBackError]
	// wentBack is closed when refused is set.
	wentBack chan struct{}
}

func (f *revisionFloor) raise(rev int64) {
	for {
		cur := f.max.Load()
		if rev <= cur || f.max.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// admit returns the floor a call about to be sent must answer at or above,
// or the refusal if the store already found etcd behind.
func (f *revisionFloor) admit() (int64, error) {
	if e := f.refused.Load(); e != nil {
		return 0, e
	}
	return f.max.Load(), nil
}

// check holds the header of a response to a call sent while the floor was
// before. Comparing with the floor as it was when the call was sent, not
// as it is now, is what keeps concurrent calls from refusing each other: a
// read that etcd served at revision 99 may reach us after a write that
// committed at 100 raised the floor, and both are linearizable. A
// linearizable call sent after we saw revision R is answered at R or later
// by every member of a healthy cluster; an answer below R means the
// cluster's history went back.
func (f *revisionFloor) check(before int64, h *pb.ResponseHeader) error {
	if h == nil {
		return nil
	}
	if h.Revision < before {
		e := &RolledBackError{Revision: h.Revision, Floor: before}
		if f.refused.CompareAndSwap(nil, e) {
			close(f.wentBack)
		}
		return e
	}
	f.raise(h.Revision)
	return nil
}

// RaiseFloor tells the store the highest etcd revision known to have been
// seen before it started (by an earlier run of this replica, say): from
// then on it refuses every etcd response below rev with a
// *RolledBackError. The floor never goes down. HoldFloor raises it to the
// floor kept in a file.
func (s *Store) RaiseFloor(rev int64) { s.floor.raise(rev) }

// HighestRevision returns the highest etcd revision the store has seen or
// been told of: the floor (a Floor persists it across restarts).
func (s *Store) HighestRevision() int64 { return s.floor.max.Load() }

// confirmFloor holds to the floor the header of a response that did not
// come through the store's KV (a watch, a lease keep-alive). Those are not
// linearizable reads: a watch on a member that applies a little behind the
// leader, or a keep-alive the leader answers before it applied a write a
// follower already acknowledged, may carry a revision below the floor in a
// healthy cluster. So a low header is confirmed by a linearizable read,
// which is refused only if etcd's history really went back.
func (s *Store) confirmFloor(ctx context.Context, before int64, h *pb.ResponseHeader) error {
	if h == nil {
		return nil
	}
	if h.Revision >= before {
		s.floor.raise(h.Revision)
		return nil
	}
	return s.Ping(ctx)
}

// flooredKV is the store's only way to etcd's key space: it refuses every
// response whose header revision is below the floor, and raises the floor
// to every revision it accepts. It checks responses, not requests, because
// a request cannot know the revision it will be answered at: a refused
// transaction that wrote may therefore have been applied by the etcd that
// went back. That is safe: the store returns no record, no token and no
// outcome from it to anyone, so a lease it granted lapses like any
// Acquire whose answer was lost, and the latch in revisionFloor keeps any
// further call from reaching that etcd.
//
// It also times every transaction for Config.ObserveTxn: this is the one
// place all of them pass.
type flooredKV struct {
	kv clientv3.KV
	// local reads the member in this process, if any (Config.LocalGet).
	local   func(ctx context.Context, key string) (*mvccpb.KeyValue, error)
	floor   *revisionFloor
	observe func(write bool, d time.Duration)
}

func floored[R any](f *revisionFloor, call func() (R, error), header func(R) *pb.ResponseHeader) (R, error) {
	var zero R
	before, err := f.admit()
	if err != nil {
		return zero, err
	}
	resp, err := call()
	if err != nil {
		return resp, err
	}
	if err := f.check(before, header(resp)); err != nil {
		return zero, err
	}
	return resp, nil
}

func (k flooredKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return floored(k.floor, func() (*clientv3.PutResponse, error) { return k.kv.Put(ctx, key, val, opts...) },
		func(r *clientv3.PutResponse) *pb.ResponseHeader { return (*pb.PutResponse)(r).GetHeader() })
}

// Get holds a linearizable read to the floor. A serializable one is held
// to the latch alone: the member it reaches answers from its own copy,
// which in a healthy cluster may be some revisions behind what the store
// saw (check's argument is for linearizable calls), so its header neither
// refuses nor raises anything. Its callers use only what no lagging copy
// can get wrong (a final record, replayRead).
//
// The operation is built once and sent with Do, as clientv3's own Get
// does, rather than once to ask whether it is serializable and again by
// clientv3's Get (about 500 bytes a call).
func (k flooredKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	get := func() (*clientv3.GetResponse, error) {
		r, err := k.kv.Do(ctx, op)
		if err != nil {
			return nil, err
		}
		return r.Get(), nil
	}
	if op.IsSerializable() {
		if _, err := k.floor.admit(); err != nil {
			return nil, err
		}
		return get()
	}
	return floored(k.floor, get,
		func(r *clientv3.GetResponse) *pb.ResponseHeader { return (*pb.RangeResponse)(r).GetHeader() })
}

// getSerializable reads key alone as a serializable Get, held to the
// latch alone as Get holds one: from the etcd member in this process
// (Config.LocalGet), if there is one, else through the client within
// timeout (a read in process waits on no network). nil: no such key.
func (k flooredKV) getSerializable(ctx context.Context, key string, timeout time.Duration) (*mvccpb.KeyValue, error) {
	if k.local == nil {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		resp, err := k.Get(ctx, key, clientv3.WithSerializable())
		if err != nil || len(resp.Kvs) == 0 {
			return nil, err
		}
		return resp.Kvs[0], nil
	}
	if _, err := k.floor.admit(); err != nil {
		return nil, err
	}
	return k.local(ctx, key)
}

// errStreamUnchecked refuses GetStream: its header comes only on the last
// chunk, after the caller may have used the others, and a refusal cannot
// be put into the stream from outside clientv3. The store does not use it.
var errStreamUnchecked = errors.New("etcdstore: GetStream cannot be held to the revision floor; use Get")

func (k flooredKV) GetStream(context.Context, string, ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	return nil, errStreamUnchecked
}

func (k flooredKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return floored(k.floor, func() (*clientv3.DeleteResponse, error) { return k.kv.Delete(ctx, key, opts...) },
		func(r *clientv3.DeleteResponse) *pb.ResponseHeader { return (*pb.DeleteRangeResponse)(r).GetHeader() })
}

func (k flooredKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return floored(k.floor, func() (*clientv3.CompactResponse, error) { return k.kv.Compact(ctx, rev, opts...) },
		func(r *clientv3.CompactResponse) *pb.ResponseHeader { return (*pb.CompactionResponse)(r).GetHeader() })
}

func (k flooredKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	return floored(k.floor, func() (clientv3.OpResponse, error) { return k.kv.Do(ctx, op) }, opHeader)
}

func opHeader(r clientv3.OpResponse) *pb.ResponseHeader {
	switch {
	case r.Get() != nil:
		return (*pb.RangeResponse)(r.Get()).GetHeader()
	case r.Put() != nil:
		return (*pb.PutResponse)(r.Put()).GetHeader()
	case r.Del() != nil:
		return (*pb.DeleteRangeResponse)(r.Del()).GetHeader()
	case r.Txn() != nil:
		return (*pb.TxnResponse)(r.Txn()).GetHeader()
	}
	return nil
}

func (k flooredKV) Txn(ctx context.Context) clientv3.Txn {
	return &flooredTxn{txn: k.kv.Txn(ctx), floor: k.floor, observe: k.observe}
}

// flooredTxn checks the response of Commit; the floor a transaction must
// answer at is taken when it is sent, not when it is built.
type flooredTxn struct {
	txn     clientv3.Txn
	floor   *revisionFloor
	observe func(write bool, d time.Duration)
	write   bool // some operation puts or deletes
}

func writes(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() || op.IsTxn() {
			return true
		}
	}
	return false
}

func (t *flooredTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.txn = t.txn.If(cs...)
	return t
}

func (t *flooredTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.txn = t.txn.Then(ops...)
	t.write = t.write || writes(ops)
	return t
}

func (t *flooredTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.txn = t.txn.Else(ops...)
	t.write = t.write || writes(ops)
	return t
}

func (t *flooredTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.observe != nil {
		defer func(start time.Time) { t.observe(t.write, time.Since(start)) }(time.Now())
	}
	return floored(t.floor, t.txn.Commit, func(r *clientv3.TxnResponse) *pb.ResponseHeader { return (*pb.TxnResponse)(r).GetHeader() })
}

// Installation returns the random id of this intentd installation: the
// value of the key <prefix>installation, created by the first call on a
// new cluster and read by every later one. A snapshot restore keeps it and
// a brand-new cluster gets a new one, so a revision floor persisted per
// installation holds a restored store to the revisions its original
// reached, and does not hold a new store to an unrelated one's.
func (s *Store) Installation(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	k := s.keys.installation()
	// Read first: a transaction that could write is refused outright by an
	// etcd whose backend is full, and intentd must still start on one.
	if resp, err := s.get(ctx, k, 0); err != nil {
		return "", err
	} else if len(resp.Kvs) > 0 && len(resp.Kvs[0].Value) > 0 {
		return string(resp.Kvs[0].Value), nil
	}
	id := rand.Text()
	for attempt := 0; ; attempt++ {
		// Create-if-absent: a retry after an ambiguous commit, or a
		// replica racing us, reads the id that won.
		rctx, rcancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		resp, err := s.kv.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, id)).
			Else(clientv3.OpGet(k)).
			Commit()
		rcancel()
		if err != nil {
			if werr := s.again(ctx, attempt, classify(err, false)); werr != nil {
				return "", werr
			}
			continue
		}
		if resp.Succeeded {
			return id, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		switch {
		case len(kvs) == 0:
			// Deleted between compare and read (by hand): create it again.
			if werr := s.backoff(ctx, attempt, fmt.Errorf("%w: %s deleted while read", intent.ErrUnavailable, k)); werr != nil {
				return "", werr
			}
		case len(kvs[0].Value) == 0:
			return "", fmt.Errorf("%w: %s is empty", errCorrupt, k)
		default:
			return string(kvs[0].Value), nil
		}
	}
}

// Floor is the store's revision floor kept across restarts: for its etcd's
// installation (Installation), in FloorFileName in a directory (intentd's
// data directory). HoldFloor raises the store to it before the store
// serves, and Run writes the store's highest revision back as it grows, so
// that a replica restarted on an etcd restored from an older snapshot is
// refused before it hands out a token, not only one that was running when
// etcd went back.
type Floor struct {
	store        *Store
	file         string
	installation string
	saved        int64 // what the file holds for the installation, as far as this process knows
	failing      bool  // the last write failed; log again only once it works
}

// HoldFloor holds the store to the floor kept in dir for its etcd's
// installation, and refuses an etcd already below it: that refusal is a
// *RolledBackError naming the installation and the file. Its other errors
// say what failed: reading the installation id from etcd, reading the
// file (a file that does not parse is an error, never an empty floor:
// starting without the floor is what the file exists to prevent), or etcd
// not answering. It then writes the floor as etcd has it now.
func (s *Store) HoldFloor(ctx context.Context, dir string) (*Floor, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	id, err := s.Installation(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the installation id from etcd: %w", err)
	}
	f := &Floor{store: s, file: floorPath(dir), installation: id}
	saved, err := readFloors(f.file)
	if err != nil {
		return nil, err
	}
	f.saved = saved[id]
	s.RaiseFloor(f.saved)
	if err := s.Ping(ctx); err != nil {
		if back, ok := errors.AsType[*RolledBackError](err); ok {
			return nil, f.refusal(back)
		}
		return nil, fmt.Errorf("etcd does not answer: %w", err)
	}
	f.persist()
	return f, nil
}

// Installation is the id of the installation whose floor is kept.
func (f *Floor) Installation() string { return f.installation }

// Run keeps the floor while the store serves: it writes the store's
// highest revision to the file when it grew, every interval (so at most
// once per interval, not per call) and once more when ctx ends (end it
// after the last call was answered, so that the file holds every revision
// a client was told). As soon as any call finds etcd's revision went back
// it writes the file a last time and returns the refusal, naming the
// installation and the file: from then on the store refuses every call,
// and a restart meets the check of HoldFloor. It returns nil when ctx
// ends.
func (f *Floor) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			f.persist()
			return nil
		case <-f.store.floor.wentBack:
			f.persist()
			return f.refusal(f.store.floor.refused.Load())
		case <-t.C:
			f.persist()
		}
	}
}

// refusal is back as the floor's refusal: held to the highest revision
// the store saw (the floor a call was held to may be lower, if it was sent
// a while ago), naming the installation and the file.
func (f *Floor) refusal(back *RolledBackError) *RolledBackError {
	e := *back
	e.Floor = max(e.Floor, f.store.HighestRevision())
	e.Installation, e.File = f.installation, f.file
	return &e
}

// persist writes the store's highest revision if it grew since the last
// write. A failure is logged (once until it works again), not returned:
// the floor in memory still holds while this process runs. It is called
// from one goroutine at a time.
func (f *Floor) persist() {
	log := f.store.cfg.Logger
	err := f.write()
	switch {
	case err != nil && !f.failing:
		f.failing = true
		log.Warn("cannot persist the revision floor; a restart will not notice an etcd restored from an older snapshot until it works", "file", f.file, "err", err)
	case err == nil && f.failing:
		f.failing = false
		log.Info("revision floor persisted again", "file", f.file)
	}
}

// write writes the store's highest revision if it grew since the last
// write.
func (f *Floor) write() error {
	rev := f.store.HighestRevision()
	if rev <= f.saved {
		return nil
	}
	if err := writeFloor(f.file, f.installation, rev); err != nil {
		return err
	}
	f.saved = rev
	return nil
}
