package etcdstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// keys builds the etcd keys of the layout in the package doc.
type keys struct{ prefix string }

func (k keys) tenant(tenant string) string      { return k.prefix + "t/" + tenant + "/" }
func (k keys) intents(tenant string) string     { return k.tenant(tenant) + "i/" }
func (k keys) intent(tenant, key string) string { return k.intents(tenant) + key }
func (k keys) session(tenant, id string) string { return k.tenant(tenant) + "s/" + id }

// tombstone is where earlier versions kept a key's tombstone; this one packs
// them into chunks (chunk, packed.go) and reads these alongside.
func (k keys) tombstone(tenant, key string) string { return k.tenant(tenant) + "z/" + key }

// chunks is the prefix of the packed tombstones' chunks, and chunksEnd the
// end of its range; chunk is the key of the chunk whose upper bound is hi:
// Z/ and 32 lowercase hex digits, which sort as the bounds do.
func (k keys) chunks() string                  { return k.prefix + "Z/" }
func (k keys) chunksEnd() string               { return clientv3.GetPrefixRangeEnd(k.chunks()) }
func (k keys) chunk(hi tombstones.Hash) string { return k.chunks() + hi.String() }

// Index layouts. A record's tenant-scoped state, label and parent entries
// end in its order (registration time, then key), its cluster-wide
// retention entry in its end of retention, tenant and key; every value is
// empty (see indexedKey). Two layouts spell them:
//
//   - layoutCompact, written by this version: one-letter tags, the state as
//     one digit, and times as 8 big-endian bytes, e.g.
//     t/<tenant>/Xs4<8 bytes><key> and Xr<8 bytes><tenant>/<key>;
//   - layoutDecimal, of earlier versions: x/s/<STATE>/<20-digit ns>/<key>,
//     x/r/<20-digit ns>/<tenant>/<key>, which existing data dirs hold.
//
// Both sort by the same (time, key), so List, children and the janitor
// read both and merge; a record's next write moves its entries to the
// compact layout (the decimal ones are deleted in the same transaction), and
// its stored form says which layout its entries are in (IndexLayout). The
// holder, unfinished, review-queue and tombstone-retention indexes keep one
// layout.
const (
	layoutDecimal = 0
	layoutCompact = 1
)

func (k keys) stateIndexIn(layout int, tenant string, st intent.State) string {
	if layout == layoutCompact {
		return k.tenant(tenant) + "Xs" + string([]byte{'0' + byte(st)})
	}
	return k.tenant(tenant) + "x/s/" + st.String() + "/"
}

func (k keys) labelIndexIn(layout int, tenant string, l intent.Label) string {
	tag := "x/l/"
	if layout == layoutCompact {
		tag = "Xl"
	}
	return k.tenant(tenant) + tag + url.QueryEscape(l.Name) + "=" + url.QueryEscape(l.Value) + "/"
}

func (k keys) parentIndexIn(layout int, tenant, parent string) string {
	tag := "x/p/"
	if layout == layoutCompact {
		tag = "Xp"
	}
	return k.tenant(tenant) + tag + url.QueryEscape(parent) + "/"
}

func (k keys) retentionsIn(layout int) string {
	if layout == layoutCompact {
		return k.prefix + "Xr"
	}
	return k.prefix + "x/r/"
}

// indexRange is an index prefix in one layout.
type indexRange struct {
	prefix string
	layout int
}

// inBothLayouts is the ranges of one index: the compact layout's and the
// decimal one's.
func inBothLayouts(at func(layout int) string) []indexRange {
	return []indexRange{{at(layoutCompact), layoutCompact}, {at(layoutDecimal), layoutDecimal}}
}

// The cluster-wide indexes the janitor scans: intents held per session,
// final intents by end of retention, tombstones by end of retention, and
// intents not final yet by registration time.
func (k keys) unfinished() string { return k.prefix + "x/o/" }
func (k keys) holders() string    { return k.prefix + "x/h/" }
func (k keys) holder(tenant, session string) string {
	return k.holders() + tenant + "/" + session + "/"
}

// reviewQueue indexes, across tenants, the intents in a state that waits
// for a reviewer (UNKNOWN, NEEDS_REVIEW), so that the queue's depth is one
// count-only range; openSessions does the same for sessions (each entry
// lives on its session's lease).
func (k keys) reviewQueue(st intent.State) string { return k.prefix + "x/q/" + st.String() + "/" }
func (k keys) openSessions() string               { return k.prefix + "x/ss/" }
func (k keys) openSession(tenant, id string) string {
	return k.openSessions() + tenant + "/" + id
}

// tombRetentionsIn is the index by end of retention, in layout, of the
// tombstones of earlier versions (a key each), which the janitor removes
// by it. Its compact layout's entries have empty values (the key names the
// tombstone); the decimal one's held the intent key. This version writes
// none: it packs tombstones (packed.go).
func (k keys) tombRetentionsIn(layout int) string {
	if layout == layoutCompact {
		return k.prefix + "Zr"
	}
	return k.prefix + "x/zr/"
}

// dueOrder is where an entry of an end-of-retention index (records' Xr,
// tombstones' Zr) sorts in the compact layout: its end of retention, then
// tenant and key, as sweepDue reads them back.
func dueOrder(until time.Time, tenant, key string) string {
	return timeBytes(until) + tenant + "/" + key
}

func (k keys) election() string { return k.prefix + "janitor/" }

// installation is the key of the installation's identity (see
// Store.Installation).
func (k keys) installation() string { return k.prefix + "installation" }

// timeKey is a fixed-width, byte-ordered decimal spelling of t (the
// decimal layout, and the indexes with one layout).
func timeKey(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }

// timeBytes is the compact layout's spelling of t: 8 big-endian bytes of
// its nanoseconds, the sign bit flipped so that they sort as the times do.
func timeBytes(t time.Time) string { return timeBytesOf(t.UnixNano()) }

func timeBytesOf(ns int64) string {
	return string(binary.BigEndian.AppendUint64(nil, uint64(ns)^(1<<63)))
}

// position is where an entry sorts in a tenant-scoped index, the same in
// either layout: its registration time (compact spelling), then its key.
// List's page tokens carry one.
func position(created time.Time, key string) string { return timeBytes(created) + key }

// positionIn is the order an entry at position pos (at least 8 bytes) has
// in layout's keys: the position itself, or the decimal "<20 digits>/<key>".
func positionIn(layout int, pos string) string {
	if layout == layoutCompact {
		return pos
	}
	ns := int64(binary.BigEndian.Uint64([]byte(pos[:8])) ^ (1 << 63))
	return fmt.Sprintf("%020d", ns) + "/" + pos[8:]
}

// scannedEntry is the position and intent key of an index entry of range r
// whose key ends in order (the part after r's prefix).
func scannedEntry(r indexRange, order string, value []byte) (scanned, bool) {
	if r.layout == layoutCompact {
		if len(order) < 8 {
			return scanned{}, false
		}
		return scanned{order: order, key: order[8:]}, true
	}
	digits, key, ok := strings.Cut(order, "/")
	ns, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil {
		return scanned{}, false
	}
	return scanned{order: timeBytesOf(ns) + indexedKey(key, value), key: indexedKey(key, value)}, true
}

// indexKeys lists every index key a record version needs in layout.
// Transitions put the keys the new version gains and delete the ones it
// loses, in the same transaction as the record, so the indexes cannot
// drift from the records.
func (k keys) indexKeys(r *machine.Record, layout int) []string {
	if r == nil {
		return nil
	}
	var o, retention string
	if layout == layoutCompact {
		o, retention = position(r.CreatedAt, r.Key), dueOrder(r.RetainUntil, r.Tenant, r.Key)
	} else {
		o, retention = timeKey(r.CreatedAt)+"/"+r.Key, timeKey(r.RetainUntil)+"/"+r.Tenant+"/"+r.Key
	}
	out := []string{k.stateIndexIn(layout, r.Tenant, r.State) + o}
	for name, value := range r.Labels {
		out = append(out, k.labelIndexIn(layout, r.Tenant, intent.Label{Name: name, Value: value})+o)
	}
	if r.ParentKey != "" {
		out = append(out, k.parentIndexIn(layout, r.Tenant, r.ParentKey)+o)
	}
	if r.State == intent.StateInProgress && r.Lease != nil && r.Lease.SessionID != "" {
		out = append(out, k.holder(r.Tenant, r.Lease.SessionID)+r.Key)
	}
	if r.State.Final() && !r.RetainUntil.IsZero() {
		out = append(out, k.retentionsIn(layout)+retention)
	}
	if !r.State.Final() {
		out = append(out, k.unfinished()+timeKey(r.CreatedAt)+"/"+r.Tenant+"/"+r.Key)
	}
	if r.State == intent.StateUnknown || r.State == intent.StateNeedsReview {
		out = append(out, k.reviewQueue(r.State)+r.Tenant+"/"+timeKey(r.CreatedAt)+"/"+r.Key)
	}
	return out
}

// indexedKey is the intent key a decimal-layout entry names: the key its
// order ends in, or, in entries of earlier versions that held it as their
// value, the value.
func indexedKey(key string, value []byte) string {
	if len(value) > 0 {
		return string(value)
	}
	return key
}

// appendIndexOps appends to ops the index difference between two versions
// as etcd ops: from's entries are in the layout it was read in, to's in the
// compact one (so a record's first write by this version moves its
// entries). An entry's value is empty: its key already ends in the intent
// key, and bbolt is charged for every byte of both.
func (k keys) appendIndexOps(ops []clientv3.Op, from, to *machine.Record) []clientv3.Op {
	var old []string
	if from != nil {
		old = k.indexKeys(from, from.IndexLayout)
	}
	next := k.indexKeys(to, layoutCompact)
	// An op is a large struct: growing the slice an op at a time
	// allocated several times what the ops themselves take.
	ops = slices.Grow(ops, len(old)+len(next))
	for _, key := range old {
		if !slices.Contains(next, key) {
			ops = append(ops, clientv3.OpDelete(key))
		}
	}
	for _, key := range next {
		if !slices.Contains(old, key) {
			ops = append(ops, clientv3.OpPut(key, ""))
		}
	}
	return ops
}

// errCorrupt marks a stored value that does not decode. Retrying cannot
// help, so operations stop at once.
var errCorrupt = errors.New("etcdstore: corrupt record")
