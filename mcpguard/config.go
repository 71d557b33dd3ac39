package mcpguard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Downstream is the MCP server the guard stands in front of: a command it
// starts and talks to over stdio, or a streamable HTTP endpoint.
type Downstream struct {
	// Command is the program and its arguments, started on the first call
	// and again after it exits (stdio).
	Command []string
	// Env are variables added to the guard's own environment for Command.
	Env map[string]string
	// Dir is Command's working directory (default: the guard's).
	Dir string
	// URL is a streamable HTTP endpoint (http or https), instead of Command.
	URL string
	// Headers are sent with every request to URL (the downstream's own
	// credentials, which the MCP client never sees).
	Headers map[string]string
	// ProtocolVersion, when set, is the MCP protocol version the guard asks
	// for; empty: the newest both the SDK and the downstream speak.
	ProtocolVersion string
}

// Tool is how one downstream tool is guarded.
type Tool struct {
	// Name is the downstream tool's name, as the model calls it.
	Name string
	// Action is the kind of business operation ("refund.create"), part of
	// the derived intent key.
	Action string
	// Identity names what makes two calls the same action.
	Identity Identity
	// Terms are the arguments that are the approved terms (fingerprinted:
	// other terms for the same identity are refused). Empty: every argument
	// but the operation key's.
	Terms []string
	// Operation names the downstream call in its operation key
	// (<intent key>:<operation>); default the tool's name.
	Operation string
	// OperationKey is where the downstream reads the operation key.
	OperationKey Destination
	// Approval is "call" (default: the call registers the intent, approved
	// by whatever approved the call in the host) or "host" (the host's
	// approval step registered it; a call whose terms were not registered
	// is refused, nothing sent).
	Approval string
	// Timeout bounds the downstream call; a call that runs out of it may
	// have taken effect: the intent goes UNKNOWN, never resent.
	Timeout time.Duration
	// OnToolError is what a downstream answer with isError means:
	// "release" (default: nothing happened, the model may call again),
	// "fail" (a definite failure, final) or "complete" (recorded and
	// replayed like any answer).
	OnToolError string
	// WaitInProgress is how long a call waits for another call of the same
	// intent to finish before it answers in_progress.
	WaitInProgress time.Duration
	// Lookup, when set, finds out whether a call whose answer was lost took
	// effect; without it such an intent goes to the review queue.
	Lookup *Lookup
	// MaxAttempts is the intent's RegisterRequest.max_attempts (0: intentd's).
	MaxAttempts int32
}

// Identity names the fields a call's intent key is derived from: some
// arguments the model gave, and at least one field the model cannot give —
// a key of the request's _meta or a header of its HTTP request, which the
// host sets, or a value of the guard's own configuration.
type Identity struct {
	Arguments []string
	Meta      []string
	// Headers are HTTP request headers (streamable HTTP only), each the
	// identity field of its name as written here.
	Headers []string
	Values  map[string]any
}

// Destination is where the operation key goes: an argument of the
// downstream tool, or a key of the request's _meta. Exactly one is set.
type Destination struct {
	Argument string
	Meta     string
}

// Lookup is a downstream tool that finds an effect by operation key.
type Lookup struct {
	// Tool is the lookup tool's name (downstream).
	Tool string
	// Argument is the argument that carries the operation key.
	Argument string
	// FoundField is the boolean field of the lookup's structuredContent
	// that tells found (true) from absent (false); default "found". An
	// answer without it, or with isError, tells nothing.
	FoundField string
}

// The defaults of a tool's settings.
const (
	DefaultTimeout        = 30 * time.Second
	DefaultWaitInProgress = 5 * time.Second
	maxTimeout            = 10 * time.Minute
)

// ConfigError names the key of the config file that is wrong.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return e.Key + ": " + e.Reason }

func bad(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

var (
	toolName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
	action   = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

// ParseDownstream reads the downstream key of the guard's config file (its
// value as JSON, from the YAML). An unknown key or a bad value is a
// *ConfigError naming the key ("downstream.url").
func ParseDownstream(raw json.RawMessage) (*Downstream, error) {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return nil, bad("downstream", "want a mapping: command (and env, dir), or url (and headers)")
	}
	d := &Downstream{}
	for _, k := range sortedKeys(keys) {
		v, key := keys[k], "downstream."+k
		var err error
		switch k {
		case "command":
			err = decodeAs(key, v, &d.Command)
		case "env":
			err = decodeAs(key, v, &d.Env)
		case "dir":
			err = decodeAs(key, v, &d.Dir)
		case "url":
			err = decodeAs(key, v, &d.URL)
		case "headers":
			err = decodeAs(key, v, &d.Headers)
		case "protocol-version":
			err = decodeAs(key, v, &d.ProtocolVersion)
		default:
			err = bad(key, "unknown key; the downstream's keys are command, env, dir, url, headers, protocol-version")
		}
		if err != nil {
			return nil, err
		}
	}
	return d, d.Validate()
}

// Validate checks d whole.
func (d *Downstream) Validate() error {
	switch {
	case len(d.Command) == 0 && d.URL == "":
		return bad("downstream", "names no server: give command (a program speaking MCP on stdio) or url (a streamable HTTP endpoint)")
	case len(d.Command) > 0 && d.URL != "":
		return bad("downstream", "gives both command and url: one downstream server per guard")
	case d.ProtocolVersion != "" && !slices.Contains(mcp.SupportedProtocolVersions(), d.ProtocolVersion):
		return bad("downstream.protocol-version", "%q: want one of %s", d.ProtocolVersion, strings.Join(mcp.SupportedProtocolVersions(), ", "))
	case len(d.Command) > 0:
		if d.Command[0] == "" {
			return bad("downstream.command[0]", "the program is empty")
		}
		if len(d.Headers) > 0 {
			return bad("downstream.headers", "go with url, not with command")
		}
	default:
		u, err := url.Parse(d.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("downstream.url", "%q: want an http:// or https:// URL of a streamable HTTP endpoint", d.URL)
		}
		if u.User != nil {
			return bad("downstream.url", "%q: no credentials in the URL (headers carries them)", d.URL)
		}
		if len(d.Env) > 0 || d.Dir != "" {
			return bad("downstream", "env and dir go with command, not with url")
		}
		for h, v := range d.Headers {
			if strings.ContainsAny(v, "\r\n\x00") {
				return bad("downstream.headers."+h, "a header value must be one line")
			}
		}
	}
	return nil
}

// ParseTools reads the tools key of the guard's config file: a mapping of
// downstream tool names to how each is guarded, keys named as in
// docs/MCP.md. An unknown key, a missing action or identity, or a bad value
// is a *ConfigError naming the key ("tools.create_refund.identity").
func ParseTools(raw json.RawMessage) (map[string]*Tool, error) {
	var byName map[string]json.RawMessage
	if err := strictDecode(raw, &byName); err != nil || byName == nil {
		return nil, bad("tools", "want a mapping of tool names to how each is guarded")
	}
	out := map[string]*Tool{}
	for _, name := range sortedKeys(byName) {
		t, err := parseTool("tools."+name, name, byName[name])
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	if len(out) == 0 {
		return nil, bad("tools", "names no tool: a guard guards at least one")
	}
	return out, nil
}

func parseTool(at, name string, raw json.RawMessage) (*Tool, error) {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return nil, bad(at, "want a mapping of settings (action, identity, ...)")
	}
	t := &Tool{Name: name}
	for _, k := range sortedKeys(keys) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "action":
			err = decodeAs(key, v, &t.Action)
		case "identity":
			err = parseIdentity(key, v, &t.Identity)
		case "terms":
			err = decodeAs(key, v, &t.Terms)
		case "operation":
			err = decodeAs(key, v, &t.Operation)
		case "operation-key":
			err = parseDestination(key, v, &t.OperationKey)
		case "approval":
			err = decodeAs(key, v, &t.Approval)
		case "timeout":
			t.Timeout, err = durationAt(key, v)
		case "on-tool-error":
			err = decodeAs(key, v, &t.OnToolError)
		case "wait-in-progress":
			t.WaitInProgress, err = durationAt(key, v)
		case "max-attempts":
			err = decodeAs(key, v, &t.MaxAttempts)
		case "lookup":
			t.Lookup = &Lookup{}
			err = parseLookup(key, v, t.Lookup)
		default:
			err = bad(key, "unknown key; a tool's keys are action, identity, terms, operation, operation-key, approval, timeout, on-tool-error, wait-in-progress, max-attempts, lookup")
		}
		if err != nil {
			return nil, err
		}
	}
	return t, t.settle(at)
}

func parseIdentity(at string, raw json.RawMessage, id *Identity) error {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return bad(at, "want a mapping: arguments, meta, headers, values")
	}
	for _, k := range sortedKeys(keys) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "arguments":
			err = decodeAs(key, v, &id.Arguments)
		case "meta":
			err = decodeAs(key, v, &id.Meta)
		case "headers":
			err = decodeAs(key, v, &id.Headers)
		case "values":
			err = decodeAs(key, v, &id.Values)
		default:
			err = bad(key, "unknown key; identity's keys are arguments (the model's), meta (the host's _meta), headers (the host's HTTP headers) and values (this guard's)")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseDestination(at string, raw json.RawMessage, d *Destination) error {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return bad(at, "want a mapping with argument or meta: where the downstream reads the operation key")
	}
	for _, k := range sortedKeys(keys) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "argument":
			err = decodeAs(key, v, &d.Argument)
		case "meta":
			err = decodeAs(key, v, &d.Meta)
		default:
			err = bad(key, "unknown key; operation-key's keys are argument and meta")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseLookup(at string, raw json.RawMessage, l *Lookup) error {
	var keys map[string]json.RawMessage
	if err := strictDecode(raw, &keys); err != nil || keys == nil {
		return bad(at, "want a mapping: tool, argument, found-field")
	}
	for _, k := range sortedKeys(keys) {
		v, key := keys[k], at+"."+k
		var err error
		switch k {
		case "tool":
			err = decodeAs(key, v, &l.Tool)
		case "argument":
			err = decodeAs(key, v, &l.Argument)
		case "found-field":
			err = decodeAs(key, v, &l.FoundField)
		default:
			err = bad(key, "unknown key; a lookup's keys are tool, argument, found-field")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// settle fills in t's defaults and checks it whole; at names it in errors
// ("tools.create_refund").
func (t *Tool) settle(at string) error {
	if !toolName.MatchString(t.Name) {
		return bad(at, "a tool's name is 1-128 bytes of letters, digits and '_.-'")
	}
	if t.Name == StatusTool || t.Name == CompletedTool {
		return bad(at, "%s is the guard's own read-only tool", t.Name)
	}
	if t.Action == "" {
		return bad(at+".action", "required: the kind of business operation, such as refund.create")
	}
	if !action.MatchString(t.Action) {
		return bad(at+".action", "%q: 1-128 bytes of letters, digits and '-_.:'", t.Action)
	}
	id := t.Identity
	if len(id.Meta) == 0 && len(id.Headers) == 0 && len(id.Values) == 0 {
		return bad(at+".identity", "needs meta (keys of _meta the host sets), headers (HTTP headers the host sets) or values (this guard's own): a key from the model's arguments alone is the model's to change")
	}
	seen := map[string]string{}
	for _, kind := range []string{"arguments", "meta", "headers"} {
		names := map[string][]string{"arguments": id.Arguments, "meta": id.Meta, "headers": id.Headers}[kind]
		for i, n := range names {
			if n == "" {
				return bad(fmt.Sprintf("%s.identity.%s[%d]", at, kind, i), "empty name")
			}
			if other, dup := seen[n]; dup {
				return bad(at+".identity", "%q is named twice (%s and %s): identity fields are one object", n, other, kind)
			}
			seen[n] = kind
		}
	}
	for n := range id.Values {
		if other, dup := seen[n]; dup {
			return bad(at+".identity.values."+n, "%q is also named in %s", n, other)
		}
	}
	if t.Operation == "" {
		t.Operation = t.Name
	}
	if !action.MatchString(t.Operation) || len(t.Operation) > 64 {
		return bad(at+".operation", "%q: 1-64 bytes of letters, digits and '-_.:'", t.Operation)
	}
	switch d := t.OperationKey; {
	case d.Argument == "" && d.Meta == "":
		return bad(at+".operation-key", "required: argument (an argument of the downstream tool) or meta (a key of _meta) that carries the operation key")
	case d.Argument != "" && d.Meta != "":
		return bad(at+".operation-key", "gives both argument and meta: one place")
	case d.Argument != "" && slices.Contains(t.Terms, d.Argument):
		return bad(at+".terms", "names %q, the operation key's argument: the guard sets it", d.Argument)
	case d.Argument != "" && slices.Contains(id.Arguments, d.Argument):
		return bad(at+".identity.arguments", "names %q, the operation key's argument: the guard sets it", d.Argument)
	}
	switch t.Approval {
	case "":
		t.Approval = "call"
	case "call", "host":
	default:
		return bad(at+".approval", "%q: want call (the call registers the intent) or host (the host's approval step registered it)", t.Approval)
	}
	if t.Timeout == 0 {
		t.Timeout = DefaultTimeout
	}
	if t.Timeout < 0 || t.Timeout > maxTimeout {
		return bad(at+".timeout", "%v is outside (0, %v]", t.Timeout, maxTimeout)
	}
	switch t.OnToolError {
	case "":
		t.OnToolError = "release"
	case "release", "fail", "complete":
	default:
		return bad(at+".on-tool-error", "%q: want release, fail or complete", t.OnToolError)
	}
	if t.WaitInProgress == 0 {
		t.WaitInProgress = DefaultWaitInProgress
	}
	if t.WaitInProgress < 0 || t.WaitInProgress > maxTimeout {
		return bad(at+".wait-in-progress", "%v is outside (0, %v]", t.WaitInProgress, maxTimeout)
	}
	if t.MaxAttempts < 0 || t.MaxAttempts > 1000 {
		return bad(at+".max-attempts", "%d is outside [0, 1000]", t.MaxAttempts)
	}
	if l := t.Lookup; l != nil {
		if l.Tool == "" {
			return bad(at+".lookup.tool", "required: the downstream tool that finds an effect by operation key")
		}
		if l.Argument == "" {
			return bad(at+".lookup.argument", "required: the lookup tool's argument that carries the operation key")
		}
		if l.FoundField == "" {
			l.FoundField = "found"
		}
	}
	return nil
}

func durationAt(key string, raw json.RawMessage) (time.Duration, error) {
	var s string
	if strictDecode(raw, &s) != nil {
		return 0, bad(key, "%s is no duration (such as 10s, 1m30s: a number needs its unit)", strings.TrimSpace(string(raw)))
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
		case *int32:
			what = "a whole number"
		case *[]string:
			what = "a list of strings"
		case *map[string]string:
			what = "a mapping of names to strings"
		case *map[string]any:
			what = "a mapping of names to values"
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

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
