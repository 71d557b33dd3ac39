package mcpguard

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	"github.com/intentd/intentd/client"
)

// Config is a guard's configuration.
type Config struct {
	// Name is the guard's name: intents it registers carry the label
	// mcp.guard=<Name>, which its read-only tools list by. Default
	// "mcp-guard".
	Name string
	// Downstream is the server the guard stands in front of.
	Downstream *Downstream
	// Tools are the guarded tools, by name. Every other tool passes through.
	Tools map[string]*Tool
	// Tenant is the intents' tenant (empty: the credentials' own).
	Tenant string
	// Worker names the guard's intentd session (default "mcp-guard").
	Worker string
	// SessionTTL is the session's lease time to live (default 15s): a guard
	// that dies mid-call holds the intent that long, then the next call
	// reconciles.
	SessionTTL time.Duration
	// Logger receives the guard's log (default: none).
	Logger *slog.Logger
}

// The guard's own read-only tools.
const (
	StatusTool    = "intent_status"
	CompletedTool = "list_completed"
)

// Labels of the intents a guard registers.
const (
	LabelGuard = "mcp.guard"
	LabelTool  = "mcp.tool"
)

// Validate checks cfg whole and fills in its defaults.
func (cfg *Config) Validate() error {
	if cfg.Name == "" {
		cfg.Name = "mcp-guard"
	}
	if cfg.Worker == "" {
		cfg.Worker = "mcp-guard"
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 15 * time.Second
	}
	if cfg.SessionTTL < time.Second || cfg.SessionTTL > 10*time.Minute {
		return fmt.Errorf("session TTL %v: want 1s to 10m", cfg.SessionTTL)
	}
	if cfg.Downstream == nil {
		return bad("downstream", "required: the MCP server the guard stands in front of")
	}
	if err := cfg.Downstream.Validate(); err != nil {
		return err
	}
	if len(cfg.Tools) == 0 {
		return bad("tools", "names no tool: a guard guards at least one")
	}
	for name, t := range cfg.Tools {
		if t.Name == "" {
			t.Name = name
		}
		if err := t.settle("tools." + name); err != nil {
			return err
		}
	}
	return nil
}

// Guard stands between MCP clients and one downstream MCP server: guarded
// tools go through intentd (one effect per approved intent), everything
// else passes through.
type Guard struct {
	cfg    Config
	api    *client.Client
	down   *downstream
	server *mcp.Server
	log    *slog.Logger

	smu  sync.Mutex
	sess *client.Session

	tmu    sync.Mutex
	mirror map[string]bool // downstream tools the server offers
}

// New connects to the downstream server, checks that every guarded tool
// (and its lookup tool) is one of its tools and takes the arguments its
// config names, and builds the MCP server the guard serves. conn reaches
// intentd; opts configure the intentd client (client.WithTenant is set
// from cfg.Tenant).
func New(ctx context.Context, cfg Config, conn grpc.ClientConnInterface, opts ...client.Option) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tenant != "" {
		opts = append(opts, client.WithTenant(cfg.Tenant))
	}
	g := &Guard{cfg: cfg, api: client.New(conn, opts...), log: cfg.Logger, mirror: map[string]bool{}}
	g.down = &downstream{cfg: cfg.Downstream, impl: &mcp.Implementation{Name: "intentd-mcp-guard", Version: "1"}, changed: g.refreshTools}
	s, err := g.down.session(ctx)
	if err != nil {
		return nil, err
	}
	tools, err := g.down.tools(ctx)
	if err != nil {
		g.down.close()
		return nil, err
	}
	if err := g.check(tools); err != nil {
		g.down.close()
		return nil, err
	}
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	if dc := s.InitializeResult().Capabilities; dc != nil {
		caps.Prompts, caps.Resources, caps.Completions, caps.Logging = dc.Prompts, dc.Resources, dc.Completions, dc.Logging
		if caps.Resources != nil {
			r := *caps.Resources
			r.Subscribe = false // subscriptions are not passed through
			caps.Resources = &r
		}
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "intentd-mcp-guard", Version: "1"}, &mcp.ServerOptions{
		Instructions: s.InitializeResult().Instructions,
		Capabilities: caps,
	})
	srv.AddReceivingMiddleware(g.passThrough)
	g.tmu.Lock()
	g.server = srv
	g.tmu.Unlock()
	g.addOwnTools()
	g.setTools(tools)
	return g, nil
}

// Server is the MCP server the guard serves: run it on stdio
// (Server().Run(ctx, &mcp.StdioTransport{})) or behind
// mcp.NewStreamableHTTPHandler.
func (g *Guard) Server() *mcp.Server {
	g.tmu.Lock()
	defer g.tmu.Unlock()
	return g.server
}

// Close ends the guard's intentd session and its downstream connection.
func (g *Guard) Close(ctx context.Context) error {
	g.down.close()
	g.smu.Lock()
	s := g.sess
	g.sess = nil
	g.smu.Unlock()
	if s != nil {
		return s.Close(ctx)
	}
	return nil
}

// check says which configured tool the downstream lacks.
func (g *Guard) check(tools []*mcp.Tool) error {
	byName := map[string]*mcp.Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	have := strings.Join(slices.Sorted(maps.Keys(byName)), ", ")
	for _, name := range slices.Sorted(maps.Keys(g.cfg.Tools)) {
		t := g.cfg.Tools[name]
		dt, ok := byName[name]
		if !ok {
			return bad("tools."+name, "the downstream %s has no tool %s (it has: %s)", g.down.name(), name, have)
		}
		// A misspelt term would go unfingerprinted (the model could change
		// it), a misspelt identity argument refuse every call.
		props, at := schemaProps(dt.InputSchema), "tools."+name
		if err := cmp.Or(takes(at+".operation-key.argument", name, props, t.OperationKey.Argument),
			takes(at+".identity.arguments", name, props, t.Identity.Arguments...),
			takes(at+".terms", name, props, t.Terms...)); err != nil {
			return err
		}
		if l := t.Lookup; l != nil {
			lt, ok := byName[l.Tool]
			if !ok {
				return bad(at+".lookup.tool", "the downstream %s has no tool %s (it has: %s)", g.down.name(), l.Tool, have)
			}
			if err := takes(at+".lookup.argument", l.Tool, schemaProps(lt.InputSchema), l.Argument); err != nil {
				return err
			}
		}
	}
	for _, own := range []string{StatusTool, CompletedTool} {
		if _, ok := byName[own]; ok {
			return bad("downstream", "the downstream %s has a tool named %s, the guard's own", g.down.name(), own)
		}
	}
	return nil
}

// schemaProps is the properties of an input schema, or nil when it has none.
// takes is the bad config at at when the downstream's tool, whose input
// schema has the properties props, takes not every one of names (an
// empty name is none; nil props, a schema without properties, take any).
func takes(at, tool string, props map[string]any, names ...string) error {
	for _, a := range names {
		if a != "" && props != nil && props[a] == nil {
			return bad(at, "the downstream's %s takes no argument %q (its arguments: %s)", tool, a, strings.Join(slices.Sorted(maps.Keys(props)), ", "))
		}
	}
	return nil
}

func schemaProps(schema any) map[string]any {
	var m map[string]any
	b, err := json.Marshal(schema)
	if err != nil || json.Unmarshal(b, &m) != nil {
		return nil
	}
	props, _ := m["properties"].(map[string]any)
	return props
}

// setTools makes the server offer tools: the guarded ones through the
// guard, the others forwarded as they are.
func (g *Guard) setTools(tools []*mcp.Tool) {
	g.tmu.Lock()
	defer g.tmu.Unlock()
	if g.server == nil {
		return // New lists them once the server exists
	}
	now := map[string]bool{}
	for _, t := range tools {
		if t.Name == StatusTool || t.Name == CompletedTool {
			continue
		}
		now[t.Name] = true
		if gt, ok := g.cfg.Tools[t.Name]; ok {
			g.server.AddTool(guardedView(t, gt), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return g.guarded(ctx, gt, req)
			})
			continue
		}
		name := t.Name
		g.server.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return g.down.call(ctx, &mcp.CallToolParams{Meta: forwardMeta(req.Params.Meta), Name: name, Arguments: req.Params.Arguments})
		})
	}
	var gone []string
	for n := range g.mirror {
		if !now[n] {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	g.mirror = now
}

// refreshTools lists the downstream's tools again (it said they changed).
func (g *Guard) refreshTools() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := g.down.tools(ctx)
	if err != nil {
		g.log.Warn("mcp-guard: listing the downstream's tools again failed", "err", err)
		return
	}
	if err := g.check(tools); err != nil {
		// A guarded tool vanished: keep offering it (calls will fail
		// downstream, never unguarded).
		g.log.Warn("mcp-guard: the downstream's tools changed", "err", err)
	}
	g.setTools(tools)
}

// guardedView is the downstream tool as the model sees it through the
// guard: without the operation key's argument (the guard sets it), and
// saying that it is guarded.
func guardedView(t *mcp.Tool, gt *Tool) *mcp.Tool {
	v := *t
	if a := gt.OperationKey.Argument; a != "" {
		var m map[string]any
		if b, err := json.Marshal(t.InputSchema); err == nil && json.Unmarshal(b, &m) == nil {
			if props, ok := m["properties"].(map[string]any); ok {
				props = maps.Clone(props)
				delete(props, a)
				m["properties"] = props
			}
			if req, ok := m["required"].([]any); ok {
				m["required"] = slices.DeleteFunc(slices.Clone(req), func(x any) bool { return x == a })
			}
			v.InputSchema = m
		}
	}
	v.Description = strings.TrimSpace(t.Description + "\n\nGuarded by intentd: the same request is carried out once; a repeat answers what happened instead of doing it again.")
	return &v
}

// forwardMeta is the host's _meta as the downstream gets it: without the
// progress token and the protocol's own keys, which describe the host's
// session with the guard, not the guard's with the downstream.
func forwardMeta(m mcp.Meta) mcp.Meta {
	if len(m) == 0 {
		return nil
	}
	out := maps.Clone(m)
	delete(out, "progressToken")
	for k := range out {
		if strings.HasPrefix(k, "io.modelcontextprotocol/") {
			delete(out, k) // this session's protocol, not the downstream's
		}
	}
	return out
}

// passThrough forwards prompts, resources and completions to the
// downstream as they are.
func (g *Guard) passThrough(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "prompts/list", "prompts/get", "resources/list", "resources/templates/list", "resources/read", "completion/complete":
		default:
			return next(ctx, method, req)
		}
		s, err := g.down.session(ctx)
		if err != nil {
			return nil, err
		}
		var res mcp.Result
		if p := req.GetParams(); p != nil {
			p.SetMeta(forwardMeta(p.GetMeta()))
		}
		switch p := req.GetParams().(type) {
		case *mcp.ListPromptsParams:
			res, err = s.ListPrompts(ctx, p)
		case *mcp.GetPromptParams:
			res, err = s.GetPrompt(ctx, p)
		case *mcp.ListResourcesParams:
			res, err = s.ListResources(ctx, p)
		case *mcp.ListResourceTemplatesParams:
			res, err = s.ListResourceTemplates(ctx, p)
		case *mcp.ReadResourceParams:
			res, err = s.ReadResource(ctx, p)
		case *mcp.CompleteParams:
			res, err = s.Complete(ctx, p)
		default:
			return next(ctx, method, req)
		}
		if err != nil && !answered(err) {
			g.down.drop(s)
		}
		return res, err
	}
}

// session is the guard's intentd session, opened again when it was lost.
func (g *Guard) session(ctx context.Context) (*client.Session, error) {
	g.smu.Lock()
	defer g.smu.Unlock()
	if g.sess != nil && g.sess.Err() == nil {
		return g.sess, nil
	}
	s, err := g.api.OpenSession(ctx, g.cfg.Worker, g.cfg.SessionTTL)
	if err != nil {
		return nil, err
	}
	g.sess = s
	return s, nil
}
