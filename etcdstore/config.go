package etcdstore

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/intent"
)

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	// Prefix is prepended to every key; it lets several intentd
	// installations share one etcd cluster.
	Prefix string
	// RequestTimeout bounds each single etcd call.
	RequestTimeout time.Duration
	// OperationTimeout bounds one store operation including its retries
	// after ambiguous outcomes; past it the store returns
	// intent.ErrUnavailable.
	OperationTimeout time.Duration
	// CacheBytes bounds the memory of what the store remembers, in bytes
	// of Go heap as estimated per entry (cache.go): records, of which
	// final ones are replayed from memory and others only seed an
	// optimistic write, and sessions (1/16 of it). The least recently
	// used go first.
	CacheBytes int64
	// DefaultRetention is how long a final record is kept when its
	// registration names no retention; MaxRetention is the most a
	// registration may ask for. TombstoneRetention is how long the
	// tombstone of a removed record is kept.
	DefaultRetention   time.Duration
	MaxRetention       time.Duration
	TombstoneRetention time.Duration
	// MaxAttempts is how many attempts of an intent may end without a
	// report (a lease lapsed, or MarkUnknown) before the intent goes to
	// NEEDS_REVIEW, unless its registration names its own limit (see
	// package machine).
	MaxAttempts int
	// Now tells the time written into history entries and used for
	// retention. Never used to decide lease expiry.
	Now func() time.Time
	// Logger receives the store's rare warnings.
	Logger *slog.Logger
	// TracerProvider receives a span per etcd transaction about an intent
	// (attributes: package traceattr); nil: no tracing.
	TracerProvider trace.TracerProvider
	// ObserveTxn, if set, is told how long each etcd transaction took
	// (reads and guarded writes alike; write is true when it puts or
	// deletes), failed ones included. It runs on the hot path: keep it
	// cheap.
	ObserveTxn func(write bool, d time.Duration)
	// ObserveBatch, if set, is told how many transitions each etcd
	// transaction of the group commit carried (1 when a write went alone;
	// see group.go). It runs on the hot path: keep it cheap.
	ObserveBatch func(transitions int)
	// Archive is the cold tier final intents move to (archive.go); nil:
	// none, and etcd keeps every intent for its whole retention and every
	// tombstone, as without one. Every replica of an installation must be
	// given the same archive, or none.
	Archive Archive
	// ArchiveAfter is how long a final intent stays in etcd after it
	// became final before the janitor moves it to the archive.
	ArchiveAfter time.Duration
	// LocalGet, if set, reads one key from a member of the etcd cluster
	// running in this very process, as that member answers a serializable
	// Get (from its own copy), without a call's handling around the read;
	// nil for a key it does not hold. A replay of a final record the cache
	// no longer holds reads the record with it (replayRead), held to the
	// revision floor as a serializable Get through the client is.
	// internal/run/embedetcd.LocalGet makes one for an embedded member.
	// nil: the client reads.
	LocalGet func(ctx context.Context, key string) (*mvccpb.KeyValue, error)
}

// DefaultArchiveAfter is the default of Config.ArchiveAfter: retries of a
// finished intent come within minutes, and are replayed from etcd (or
// from memory); an hour of final records is what etcd keeps besides the
// live ones.
const DefaultArchiveAfter = time.Hour

// DefaultCacheBytes is the default of Config.CacheBytes: thousands of
// completed intents of the benchmark's size, fewer once replayed (a
// replayed one also holds the server's converted answer), seconds to
// minutes of a busy installation's work, which is when retries come; an
// older one is replayed after one etcd read. Twice as much, with Go's
// collector's headroom, raised the main intentd's peak of the benchmark.
// The figures: see docs/PERFORMANCE.md, "intentd's memory, in short" and
// "What the heap held".
const DefaultCacheBytes = 32 << 20

// minCacheBytes leaves room for some records and sessions.
const minCacheBytes = 1 << 20

// DefaultMaxAttempts is the default of Config.MaxAttempts: enough for a
// downstream outage of a few minutes to pass through reconciliation (a
// failed lookup is a MarkUnknown, and counts), few enough that an intent
// which kills every worker reaches a human within minutes.
const DefaultMaxAttempts = 10

// DefaultConfig returns a Config with production defaults.
func DefaultConfig() Config {
	return Config{
		Prefix:             "/intentd/v1/",
		RequestTimeout:     3 * time.Second,
		OperationTimeout:   10 * time.Second,
		CacheBytes:         DefaultCacheBytes,
		DefaultRetention:   30 * 24 * time.Hour,
		MaxRetention:       365 * 24 * time.Hour,
		TombstoneRetention: 2 * 365 * 24 * time.Hour,
		MaxAttempts:        DefaultMaxAttempts,
		ArchiveAfter:       DefaultArchiveAfter,
		Now:                time.Now,
		Logger:             slog.Default(),
	}
}

// Validate checks the fields and how they relate. Its error is a
// ConfigError listing every field at fault, each named by its Go name; a
// program that sets the fields from flags renames them with Describe.
func (c Config) Validate() error {
	var errs ConfigError
	bad := func(field, value, reason string) {
		errs = append(errs, FieldError{Field: field, Value: value, Reason: reason})
	}
	badAgainst := func(field string, value any, reason, other string, otherValue any) {
		errs = append(errs, FieldError{Field: field, Value: fmt.Sprint(value), Reason: reason, Other: other, OtherValue: fmt.Sprint(otherValue)})
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		bad("Prefix", strconv.Quote(c.Prefix), "must end with /")
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"RequestTimeout", c.RequestTimeout}, {"OperationTimeout", c.OperationTimeout},
		{"DefaultRetention", c.DefaultRetention}, {"MaxRetention", c.MaxRetention},
		{"TombstoneRetention", c.TombstoneRetention},
	} {
		if d.value <= 0 {
			bad(d.field, d.value.String(), "must be positive")
		}
	}
	if c.OperationTimeout < c.RequestTimeout {
		badAgainst("OperationTimeout", c.OperationTimeout, "must be at least", "RequestTimeout", c.RequestTimeout)
	}
	if c.CacheBytes < minCacheBytes {
		bad("CacheBytes", strconv.FormatInt(c.CacheBytes, 10), fmt.Sprintf("must be at least %d (1 MiB)", minCacheBytes))
	}
	if c.DefaultRetention > c.MaxRetention {
		badAgainst("DefaultRetention", c.DefaultRetention, "must be at most", "MaxRetention", c.MaxRetention)
	}
	if c.TombstoneRetention < c.DefaultRetention {
		badAgainst("TombstoneRetention", c.TombstoneRetention, "must be at least", "DefaultRetention", c.DefaultRetention)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > intent.MaxAttemptsLimit {
		bad("MaxAttempts", strconv.Itoa(c.MaxAttempts), fmt.Sprintf("want 1 to %d", intent.MaxAttemptsLimit))
	}
	if c.Archive != nil && c.ArchiveAfter <= 0 {
		bad("ArchiveAfter", c.ArchiveAfter.String(), "must be positive")
	}
	if c.Now == nil {
		bad("Now", "", "must be set")
	}
	if c.Logger == nil {
		bad("Logger", "", "must be set")
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// FieldError is one Config field whose value Validate refuses, alone or
// against another field.
type FieldError struct {
	// Field is the field at fault, by its Go name ("DefaultRetention");
	// Value is its value as the message shows it ("" for an unset func).
	Field, Value string
	// Reason says what is wrong: "must be positive", "must be at most".
	Reason string
	// Other and OtherValue name the field Reason compares Field with, if
	// any ("MaxRetention", "8760h0m0s").
	Other, OtherValue string
}

// Describe spells e with each field named by name(field): a daemon passes
// a table from field to flag, so that the message names what the operator
// typed ("--retention 720h0m0s: must be at most --max-retention 1h0m0s").
func (e FieldError) Describe(name func(field string) string) string {
	s := name(e.Field)
	if e.Value != "" {
		s += " " + e.Value
	}
	s += ": " + e.Reason
	if e.Other != "" {
		s += " " + name(e.Other) + " " + e.OtherValue
	}
	return s
}

// ConfigError is the error of Config.Validate: every field at fault.
type ConfigError []FieldError

// Error lists the faults with the fields' Go names.
func (e ConfigError) Error() string {
	msgs := make([]string, len(e))
	for i, f := range e {
		msgs[i] = f.Describe(func(field string) string { return field })
	}
	return "etcdstore: config: " + strings.Join(msgs, "; ")
}
