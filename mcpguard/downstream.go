package mcpguard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// downstream is the guard's one client session to the downstream server,
// opened on first use and again after the connection is lost (a stdio
// server is started again then).
type downstream struct {
	cfg     *Downstream
	impl    *mcp.Implementation
	changed func() // the downstream's tool list changed

	mu   sync.Mutex
	sess *mcp.ClientSession
}

// session is the open session, connecting when there is none.
func (d *downstream) session(ctx context.Context) (*mcp.ClientSession, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sess != nil {
		return d.sess, nil
	}
	c := mcp.NewClient(d.impl, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			if d.changed != nil {
				go d.changed()
			}
		},
	})
	var t mcp.Transport
	if len(d.cfg.Command) > 0 {
		// Not CommandContext: the server outlives the call that started it.
		cmd := exec.Command(d.cfg.Command[0], d.cfg.Command[1:]...)
		cmd.Dir = d.cfg.Dir
		cmd.Env = os.Environ()
		for k, v := range d.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = os.Stderr
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	} else {
		hc := &http.Client{Transport: headers{set: d.cfg.Headers, next: http.DefaultTransport}}
		// No retries: a POST whose answer was lost is the guard's to
		// report as unknown, never the transport's to send again.
		t = &mcp.StreamableClientTransport{Endpoint: d.cfg.URL, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: d.changed == nil}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	s, err := c.Connect(cctx, t, &mcp.ClientSessionOptions{ProtocolVersion: d.cfg.ProtocolVersion})
	if err != nil {
		return nil, fmt.Errorf("downstream %s: %w", d.name(), err)
	}
	d.sess = s
	go func() { // a stdio server that exits ends its session
		_ = s.Wait()
		d.drop(s)
	}()
	return s, nil
}

func (d *downstream) name() string {
	if d.cfg.URL != "" {
		return d.cfg.URL
	}
	return d.cfg.Command[0]
}

// drop forgets s, if it is the open session, so that the next use connects
// again.
func (d *downstream) drop(s *mcp.ClientSession) {
	d.mu.Lock()
	if d.sess == s {
		d.sess = nil
	}
	d.mu.Unlock()
	_ = s.Close()
}

// call sends one tools/call. An error that is no JSON-RPC answer (the
// connection broke, a timeout) drops the session: the next call connects
// again.
func (d *downstream) call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := d.session(ctx)
	if err != nil {
		return nil, &notSentError{err}
	}
	res, err := s.CallTool(ctx, p)
	if errors.Is(err, mcp.ErrSessionMissing) {
		// The downstream does not know the session (it restarted): it
		// refused the request unread, so a new session may send it.
		d.drop(s)
		if s, err = d.session(ctx); err != nil {
			return nil, &notSentError{err}
		}
		res, err = s.CallTool(ctx, p)
	}
	if err != nil && !answered(err) {
		d.drop(s)
	}
	return res, err
}

// tools lists every downstream tool, page by page.
func (d *downstream) tools(ctx context.Context) ([]*mcp.Tool, error) {
	s, err := d.session(ctx)
	if err != nil {
		return nil, err
	}
	var out []*mcp.Tool
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			if !answered(err) {
				d.drop(s)
			}
			return nil, fmt.Errorf("downstream %s: tools/list: %w", d.name(), err)
		}
		out = append(out, t)
	}
	return out, nil
}

func (d *downstream) close() {
	d.mu.Lock()
	s := d.sess
	d.sess = nil
	d.mu.Unlock()
	if s != nil {
		_ = s.Close()
	}
}

// answered reports whether err is the downstream's JSON-RPC answer, rather
// than the loss of one.
func answered(err error) bool {
	var je *jsonrpc.Error
	return errors.As(err, &je)
}

// refusedUnsent reports whether err is a JSON-RPC answer that says the call
// was not carried out: malformed, an unknown method, bad parameters.
func refusedUnsent(err error) bool {
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		return false
	}
	switch je.Code {
	case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
		return true
	}
	return false
}

// notSentError is a call that never reached the downstream: no connection.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// headers sets the downstream's own headers on every request.
type headers struct {
	set  map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.set) == 0 {
		return h.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	for k, v := range h.set {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}
