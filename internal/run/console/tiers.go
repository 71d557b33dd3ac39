package console

import (
	"fmt"
	"time"

	"github.com/dustin/go-humanize"
)

// Tiers is where the cluster keeps its intents, as the overview shows it:
// etcd, which holds every live intent and the final ones not moved yet,
// and the archive (PostgreSQL), when one is configured, which keeps the
// finished ones for their retention. The daemon fills it from the figures
// /metrics shows; zero means not measured yet.
type Tiers struct {
	// EtcdFinal counts the final intents etcd holds, across tenants.
	EtcdFinal int64
	// EtcdSize, EtcdInUse and EtcdQuota are the fullest member's database
	// file, the bytes of it in use, and its quota.
	EtcdSize, EtcdInUse, EtcdQuota int64
	// Archive is nil without one.
	Archive *ArchiveTier
}

// ArchiveTier is the archive's part of Tiers.
type ArchiveTier struct {
	// Unavailable: PostgreSQL did not answer the last probe (calls that
	// need it get ARCHIVE_UNAVAILABLE; archiving waits).
	Unavailable bool
	// Intents and Tombstones are its rows, Bytes its tables' total size,
	// at the last size check.
	Intents, Tombstones, Bytes int64
	// Moved counts the intents this replica moved since it started; Lag
	// how far the oldest final intent etcd holds is past --archive-after.
	Moved int64
	Lag   time.Duration
	// FilterReady: this replica's filter of archived keys is loaded, so
	// new keys register without asking PostgreSQL; FilterKeys its keys.
	FilterReady bool
	FilterKeys  int64
}

// tiersView is Tiers as the template prints it.
type tiersView struct {
	EtcdFinal, EtcdDB string
	Archive           *archiveView
}

type archiveView struct {
	Unavailable                       bool
	Intents, Tombstones, Bytes, Moved string
	Lag, Filter                       string
}

func newTiersView(t Tiers) *tiersView {
	v := &tiersView{EtcdFinal: humanize.Comma(t.EtcdFinal), EtcdDB: "not measured yet"}
	if t.EtcdSize > 0 {
		v.EtcdDB = fmt.Sprintf("%s in use of a %s file", sizeWord(t.EtcdInUse), sizeWord(t.EtcdSize))
		if t.EtcdQuota > 0 {
			v.EtcdDB += fmt.Sprintf(", quota %s (%.0f %% used)", sizeWord(t.EtcdQuota), 100*float64(t.EtcdSize)/float64(t.EtcdQuota))
		}
	}
	if a := t.Archive; a != nil {
		v.Archive = &archiveView{Unavailable: a.Unavailable, Intents: humanize.Comma(a.Intents), Tombstones: humanize.Comma(a.Tombstones),
			Bytes: sizeWord(a.Bytes), Moved: humanize.Comma(a.Moved), Lag: "none overdue", Filter: "loading: new keys ask PostgreSQL"}
		if a.Lag > 0 {
			v.Archive.Lag = a.Lag.Round(time.Second).String() + " behind --archive-after"
		}
		if a.FilterReady {
			v.Archive.Filter = "ready, " + humanize.Comma(a.FilterKeys) + " keys: new keys register without asking PostgreSQL"
		}
	}
	return v
}

// sizeWord prints b in binary units.
func sizeWord(b int64) string { return humanize.IBytes(uint64(max(b, 0))) }
