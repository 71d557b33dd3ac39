package etcdstore

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/machine"
)

// keys builds the etcd keys of the layout in the package doc.
type keys struct{ prefix string }

func (k keys) tenant(tenant string) string         { return k.prefix + "t/" + tenant + "/" }
func (k keys) intents(tenant string) string        { return k.tenant(tenant) + "i/" }
func (k keys) intent(tenant, key string) string    { return k.intents(tenant) + key }
func (k keys) session(tenant, id string) string    { return k.tenant(tenant) + "s/" + id }
func (k keys) tombstone(tenant, key string) string { return k.tenant(tenant) + "z/" + key }

// parseIntent is the tenant and intent key of a record's etcd key (a
// tenant holds no '/'; a key may).
func (k keys) parseIntent(etcdKey string) (tenant, key string, ok bool) {
	rest, ok := strings.CutPrefix(etcdKey, k.prefix+"t/")
	if !ok {
		return "", "", false
	}
	tenant, key, ok = strings.Cut(rest, "/i/")
	return tenant, key, ok && !strings.Contains(tenant, "/")
}

// Index prefixes. An index entry's key ends in the record's order (see
// order), which ends in the intent key; its value is empty (see
// indexedKey).
func (k keys) stateIndex(tenant string, st intent.State) string {
	return k.tenant(tenant) + "x/s/" + st.String() + "/"
}

func (k keys) labelIndex(tenant string, l intent.Label) string {
	return k.tenant(tenant) + "x/l/" + url.QueryEscape(l.Name) + "=" + url.QueryEscape(l.Value) + "/"
}

func (k keys) parentIndex(tenant, parent string) string {
	return k.tenant(tenant) + "x/p/" + url.QueryEscape(parent) + "/"
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

func (k keys) retentions() string     { return k.prefix + "x/r/" }
func (k keys) tombRetentions() string { return k.prefix + "x/zr/" }
func (k keys) election() string       { return k.prefix + "janitor/" }

// installation is the key of the installation's identity (see
// Store.Installation).
func (k keys) installation() string { return k.prefix + "installation" }

// timeKey is a fixed-width, byte-ordered spelling of t.
func timeKey(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }

// order is where a record sorts in the tenant-scoped indexes: by
// registration time, then key. It never changes over the record's life.
func order(r *machine.Record) string { return timeKey(r.CreatedAt) + "/" + r.Key }

// indexKeys lists every index key a record version needs. Transitions put
// the keys the new version gains and delete the ones it loses, in the same
// transaction as the record, so the indexes cannot drift from the records.
func (k keys) indexKeys(r *machine.Record) []string {
	if r == nil {
		return nil
	}
	o := order(r)
	out := []string{k.stateIndex(r.Tenant, r.State) + o}
	for name, value := range r.Labels {
		out = append(out, k.labelIndex(r.Tenant, intent.Label{Name: name, Value: value})+o)
	}
	if r.ParentKey != "" {
		out = append(out, k.parentIndex(r.Tenant, r.ParentKey)+o)
	}
	if r.State == intent.StateInProgress && r.Lease != nil && r.Lease.SessionID != "" {
		out = append(out, k.holder(r.Tenant, r.Lease.SessionID)+r.Key)
	}
	if r.State.Final() && !r.RetainUntil.IsZero() {
		out = append(out, k.retentions()+timeKey(r.RetainUntil)+"/"+r.Tenant+"/"+r.Key)
	}
	if !r.State.Final() {
		out = append(out, k.unfinished()+timeKey(r.CreatedAt)+"/"+r.Tenant+"/"+r.Key)
	}
	if r.State == intent.StateUnknown || r.State == intent.StateNeedsReview {
		out = append(out, k.reviewQueue(r.State)+r.Tenant+"/"+o)
	}
	return out
}

// indexedKey is the intent key a tenant-scoped index entry names, from
// the order its key ends in: the part after the registration time. Entries
// written by earlier versions hold the intent key as their value too,
// which is then taken as it is.
func indexedKey(order string, value []byte) string {
	if len(value) > 0 {
		return string(value)
	}
	_, key, _ := strings.Cut(order, "/")
	return key
}

// indexOps turns the index difference between two versions into etcd ops.
// An entry's value is empty: its key already ends in the intent key, and
// bbolt is charged for every byte of both.
func (k keys) indexOps(from, to *machine.Record) []clientv3.Op {
	old, next := k.indexKeys(from), k.indexKeys(to)
	var ops []clientv3.Op
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
