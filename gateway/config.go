package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/intentd/intentd/intent"
)

// Upstream is one configured upstream: the only places the gateway sends
// anything to.
type Upstream struct {
	// Name is how workers name it in /u/<name>/...: 1-64 bytes of a-z,
	// 0-9 and '-'.
	Name string
	// URL is its base: http or https, a host, an optional path the
	// worker's path is appended to; no query, fragment or user info.
	URL *url.URL
	// Timeout bounds one call, from sending the request to the end of the
	// answer's body. A call that runs out of it after the request may
	// have reached the upstream is lost: UNKNOWN, never resent.
	Timeout time.Duration
	// IdempotencyHeader, when set, is the request header the upstream
	// reads an idempotency key from: the gateway sends the operation key
	// (intent.OperationKey) there, whatever the worker sent.
	IdempotencyHeader string
	// KeepResponseBytes is how much of an answer's body the record keeps
	// and the gateway answers (first and on every replay); a longer body
	// is cut there, and the answer says so (HeaderTruncated).
	KeepResponseBytes int
	// KeepHeaders are the answer's headers kept and answered, in their
	// canonical form.
	KeepHeaders []string
	// RefusalStatuses are the statuses that mean the upstream did nothing
	// (a validation error, a rate limit): such an answer is recorded and
	// answered, and the operation may be submitted again.
	RefusalStatuses []int
	// MaxRequestBytes bounds a worker's request body.
	MaxRequestBytes int64
	// SetHeaders are sent with every request to it (the upstream's own
	// credentials, which workers never see), replacing the worker's.
	SetHeaders map[string]string
	// Lookup, when set, asks the upstream whether a submission took
	// effect (by the operation key or the intent's key): reconciliation
	// of a lost answer uses it.
	Lookup *Lookup
	// Transport sends its requests; nil is a clone of
	// http.DefaultTransport. (Tests cut replies with it.)
	Transport http.RoundTripper
}

// Lookup is an upstream's request by merchant reference.
type Lookup struct {
	// Method is GET (default), HEAD or POST.
	Method string
	// Path is the path and query after the upstream's URL, with
	// placeholders {key}, {operation}, {operation_key} and {tenant},
	// each replaced by its value, escaped as a path segment or query
	// value.
	Path string
	// Found are the statuses that mean the effect exists (default 200):
	// the answer is recorded as the submission's. Absent those that mean
	// it does not (default 404).
	Found  []int
	Absent []int
}

// The defaults of an upstream's settings.
const (
	DefaultTimeout         = 10 * time.Second
	DefaultMaxRequestBytes = 1 << 20
	maxTimeout             = 10 * time.Minute
	maxRequestBytesLimit   = 64 << 20
)

// DefaultKeepHeaders are the answer's headers kept when an upstream names
// none.
var DefaultKeepHeaders = []string{"Content-Type", "Content-Language", "Location", "Etag", "Last-Modified", "Retry-After"}

var (
	upstreamName = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
	headerName   = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
	placeholder  = regexp.MustCompile(`\{[^}]*\}`)
)

// placeholders are the names a lookup's path may hold.
var placeholders = []string{"{key}", "{operation}", "{operation_key}", "{tenant}"}

// ConfigError names the key of the config file that is wrong.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return e.Key + ": " + e.Reason }

func bad(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// ParseUpstreams reads the upstreams key of the gateway's config file (its
// value as JSON, from the YAML): a mapping of names to settings, keys named
// as in docs/GATEWAY.md. An unknown key, a missing url, or a bad value is
// a *ConfigError naming the key ("upstreams.courier.timeout").
func ParseUpstreams(raw json.RawMessage) (map[string]*Upstream, error) {
	var byName map[string]json.RawMessage
	if err := strictDecode(raw, &byName); err != nil || byName == nil {
		return nil, bad("upstreams", "want a mapping of upstream names to their settings")
	}
	out := map[string]*Upstream{}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range byName {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		u, err := parseUpstream("upstreams."+name, name, byName[name])
		if err != nil {
			return nil, err
		}
		out[name] = u
	}
	if len(out) == 0 {
		return nil, bad("upstreams", "names no upstream: the gateway forwards only to configured upstreams")
	}
	return out, nil
}

func parseUpstream(at, name string, raw json.RawMessage) (*Upstream, error) {
	if !upstreamName.MatchString(name) {
		return nil, bad(at, "an upstream's name must be 1-64 bytes of a-z, 0-9 and '-'")
	}
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return nil, bad(at, "want a mapping of settings (url, timeout, ...)")
	}
	u := &Upstream{Name: name}
	for _, k := range slices.Sorted(mapKeys(keys)) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "url":
			var s string
			if err = decodeAs(key, v, &s); err == nil {
				u.URL, err = parseBase(key, s)
			}
		case "timeout":
			u.Timeout, err = durationAt(key, v)
		case "idempotency-header":
			err = decodeAs(key, v, &u.IdempotencyHeader)
		case "keep-response-bytes":
			err = decodeAs(key, v, &u.KeepResponseBytes)
			if err == nil && (u.KeepResponseBytes < 0 || u.KeepResponseBytes > intent.MaxKeptResponseBody) {
				err = bad(key, "%d is outside [0, %d]", u.KeepResponseBytes, intent.MaxKeptResponseBody)
			}
			if err == nil && u.KeepResponseBytes == 0 {
				u.KeepResponseBytes = -1 // given as 0: keep no body
			}
		case "keep-headers":
			err = decodeAs(key, v, &u.KeepHeaders)
			if err == nil && u.KeepHeaders == nil {
				u.KeepHeaders = []string{}
			}
		case "refusal-statuses":
			err = decodeAs(key, v, &u.RefusalStatuses)
		case "max-request-bytes":
			err = decodeAs(key, v, &u.MaxRequestBytes)
		case "set-headers":
			err = decodeAs(key, v, &u.SetHeaders)
		case "lookup":
			u.Lookup, err = parseLookup(key, v)
		default:
			err = bad(key, "unknown key; an upstream's keys are url, timeout, idempotency-header, keep-response-bytes, keep-headers, refusal-statuses, max-request-bytes, set-headers, lookup")
		}
		if err != nil {
			return nil, err
		}
	}
	if u.URL == nil {
		return nil, bad(at+".url", "required: the upstream's base URL, such as https://api.courier.example")
	}
	if err := u.settle(at); err != nil {
		return nil, err
	}
	return u, nil
}

func parseLookup(at string, raw json.RawMessage) (*Lookup, error) {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return nil, bad(at, "want a mapping of settings (method, path, found, absent)")
	}
	l := &Lookup{}
	for _, k := range slices.Sorted(mapKeys(keys)) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "method":
			err = decodeAs(key, v, &l.Method)
		case "path":
			err = decodeAs(key, v, &l.Path)
		case "found":
			err = decodeAs(key, v, &l.Found)
		case "absent":
			err = decodeAs(key, v, &l.Absent)
		default:
			err = bad(key, "unknown key; a lookup's keys are method, path, found, absent")
		}
		if err != nil {
			return nil, err
		}
	}
	if l.Path == "" {
		return nil, bad(at+".path", "required: the lookup's path and query, such as /orders?reference={operation_key}")
	}
	return l, nil
}

// settle fills in the defaults of u and checks it whole; at names it in
// errors ("upstreams.courier").
func (u *Upstream) settle(at string) error {
	if !upstreamName.MatchString(u.Name) {
		return bad(at, "an upstream's name must be 1-64 bytes of a-z, 0-9 and '-'")
	}
	if u.URL == nil {
		return bad(at+".url", "required")
	}
	if _, err := parseBase(at+".url", u.URL.String()); err != nil {
		return err
	}
	if u.Timeout == 0 {
		u.Timeout = DefaultTimeout
	}
	if u.Timeout < 0 || u.Timeout > maxTimeout {
		return bad(at+".timeout", "%v is outside (0, %v]", u.Timeout, maxTimeout)
	}
	switch {
	case u.KeepResponseBytes == 0:
		u.KeepResponseBytes = intent.MaxKeptResponseBody
	case u.KeepResponseBytes < 0:
		u.KeepResponseBytes = 0
	case u.KeepResponseBytes > intent.MaxKeptResponseBody:
		return bad(at+".keep-response-bytes", "%d is more than the %d a record keeps", u.KeepResponseBytes, intent.MaxKeptResponseBody)
	}
	if u.KeepHeaders == nil {
		u.KeepHeaders = DefaultKeepHeaders
	}
	if len(u.KeepHeaders) > intent.MaxKeptHeaders {
		return bad(at+".keep-headers", "names %d headers, at most %d", len(u.KeepHeaders), intent.MaxKeptHeaders)
	}
	for i, h := range u.KeepHeaders {
		if !headerName.MatchString(h) {
			return bad(fmt.Sprintf("%s.keep-headers[%d]", at, i), "%q is no header name", h)
		}
		u.KeepHeaders[i] = http.CanonicalHeaderKey(h)
	}
	for i, s := range u.RefusalStatuses {
		if s < 400 || s > 599 {
			return bad(fmt.Sprintf("%s.refusal-statuses[%d]", at, i), "%d is no refusal: give statuses from 400 to 599", s)
		}
	}
	if u.MaxRequestBytes == 0 {
		u.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if u.MaxRequestBytes < 0 || u.MaxRequestBytes > maxRequestBytesLimit {
		return bad(at+".max-request-bytes", "%d is outside [1, %d]", u.MaxRequestBytes, maxRequestBytesLimit)
	}
	if h := u.IdempotencyHeader; h != "" {
		if err := sendable(at+".idempotency-header", h); err != nil {
			return err
		}
		u.IdempotencyHeader = http.CanonicalHeaderKey(h)
	}
	set := map[string]string{}
	for _, name := range slices.Sorted(mapKeys(u.SetHeaders)) {
		if err := sendable(at+".set-headers."+name, name); err != nil {
			return err
		}
		v := u.SetHeaders[name]
		if strings.ContainsAny(v, "\r\n\x00") {
			return bad(at+".set-headers."+name, "a header value must be one line")
		}
		set[http.CanonicalHeaderKey(name)] = v
	}
	u.SetHeaders = set
	if l := u.Lookup; l != nil {
		if err := l.settle(at + ".lookup"); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lookup) settle(at string) error {
	switch l.Method = strings.ToUpper(l.Method); l.Method {
	case "":
		l.Method = http.MethodGet
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return bad(at+".method", "%q: a lookup is GET, HEAD or POST", l.Method)
	}
	if !strings.HasPrefix(l.Path, "/") || strings.ContainsAny(l.Path, " \r\n\t#") {
		return bad(at+".path", "%q: want a path and query starting with /, such as /orders?reference={operation_key}", l.Path)
	}
	for _, p := range placeholder.FindAllString(l.Path, -1) {
		if !slices.Contains(placeholders, p) {
			return bad(at+".path", "%s is no placeholder; the placeholders are %s", p, strings.Join(placeholders, ", "))
		}
	}
	if len(l.Found) == 0 {
		l.Found = []int{http.StatusOK}
	}
	if len(l.Absent) == 0 {
		l.Absent = []int{http.StatusNotFound}
	}
	for i, s := range l.Found {
		if s < 200 || s > 299 {
			return bad(fmt.Sprintf("%s.found[%d]", at, i), "%d: a lookup finds with a 2xx status", s)
		}
	}
	for i, s := range l.Absent {
		if s < 200 || s > 499 || slices.Contains(l.Found, s) {
			return bad(fmt.Sprintf("%s.absent[%d]", at, i), "%d: an absence is a status from 200 to 499 that is not also in found", s)
		}
	}
	return nil
}

// parseBase checks an upstream's base URL.
func parseBase(key, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, bad(key, "%q: %v", s, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, bad(key, "%q: want an http:// or https:// URL", s)
	case u.Host == "":
		return nil, bad(key, "%q names no host", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, bad(key, "%q: a base URL has no user info, query or fragment (set-headers carries credentials)", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	return u, nil
}

// sendable checks a header name the gateway sets on its own.
func sendable(key, name string) error {
	c := http.CanonicalHeaderKey(name)
	switch {
	case !headerName.MatchString(name):
		return bad(key, "%q is no header name", name)
	case hopByHop[c] || c == "Host" || c == "Content-Length" || strings.HasPrefix(c, "Intentd-"):
		return bad(key, "%q is the gateway's to set", name)
	}
	return nil
}

func durationAt(key string, raw json.RawMessage) (time.Duration, error) {
	var s string
	if err := decodeAs(key, raw, &s); err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, bad(key, "%q is no duration (such as 10s, 1m30s)", s)
	}
	return d, nil
}

func decodeAs(key string, raw json.RawMessage, v any) error {
	if err := strictDecode(raw, v); err != nil {
		var what string
		switch v.(type) {
		case *string:
			what = "a string"
		case *int, *int64:
			what = "a whole number"
		case *[]string:
			what = "a list of strings"
		case *[]int:
			what = "a list of whole numbers"
		case *map[string]string:
			what = "a mapping of header names to values"
		default:
			what = "another kind of value"
		}
		return bad(key, "%s is not %s", strings.TrimSpace(string(raw)), what)
	}
	return nil
}

func strictDecode(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// lookupPath is l.Path with its placeholders filled in for an operation.
func (l *Lookup) lookupPath(tenant, key, operation string) string {
	path, query, hasQuery := strings.Cut(l.Path, "?")
	fill := func(s string, escape func(string) string) string {
		return strings.NewReplacer(
			"{key}", escape(key),
			"{operation}", escape(operation),
			"{operation_key}", escape(intent.OperationKey(key, operation)),
			"{tenant}", escape(tenant),
		).Replace(s)
	}
	out := fill(path, url.PathEscape)
	if hasQuery {
		out += "?" + fill(query, url.QueryEscape)
	}
	return out
}

// statusIn reports whether s is one of ss.
func statusIn(s int, ss []int) bool { return slices.Contains(ss, s) }

// itoa is strconv.Itoa, short.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
