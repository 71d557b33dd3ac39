package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

func newHistoryCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "history KEY",
		Short: "Print an intent's history as a timeline: time, event, who, token, accepted",
		Long: `history prints one line per event of an intent's life, oldest first:
when, what (registered, acquired, completed, marked_unknown, lease_lapsed,
escalated, resolved, ...), who (the worker, else the principal), under which
fencing token, and whether it was accepted. A report under a superseded
token is kept with accepted "no": it changed nothing, and is evidence.
-o json and -o yaml print the whole GetResponse.`,
		Args: cobra.ExactArgs(1),
		RunE: g.showIntent(func(w io.Writer, in *intentv1.Intent, wide bool) error {
			return printHistory(w, in.GetHistory(), wide)
		}),
	}
}

// showIntent is the action of get and history: read the intent the one
// argument names and print it with text, or, with -o json or yaml, the
// whole GetResponse.
func (g *globals) showIntent(text func(w io.Writer, in *intentv1.Intent, wide bool) error) func(*cobra.Command, []string) error {
	return g.action(func(cmd *cobra.Command, args []string) error {
		resp, err := g.get(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, wide bool) error {
			return text(w, resp.GetIntent(), wide)
		})
	})
}

// get reads one intent within --timeout.
func (g *globals) get(ctx context.Context, key string) (*intentv1.GetResponse, error) {
	return callOnce(ctx, g, func(ctx context.Context, c *client.Client) (*intentv1.GetResponse, error) {
		return c.Get(ctx, &intentv1.GetRequest{Key: key})
	})
}

func newRegisterCommand(g *globals) *cobra.Command {
	var (
		params, version, parent, requestID string
		action, identity, summary          string
		labels                             []string
		retention                          time.Duration
		maxAttempts                        uint32
	)
	cmd := &cobra.Command{
		Use:   "register [KEY] --params JSON [--action A --identity JSON] [--summary TEXT] [--params-version V] [--label k=v ...]",
		Short: "Approve an intent: store KEY with its params (idempotent for the same params)",
		Long: `register approves an intent as an approver does: KEY with the approved
terms (--params, a JSON object). Running it again with the same params is
harmless (created: no); other params for the same key are refused with
FINGERPRINT_MISMATCH: a changed term is a new decision, under a new key.

--action and --identity (a JSON object: the fields that make this action
distinct, never a per-attempt id) say what the intent is; without KEY,
intentd derives the key from them as derive-key does, and with KEY it must
be that key. --summary is a sentence for the people who review the intent
(at most 200 characters, one line). Reviewers see all three; none is part
of the fingerprint, and registering again keeps the first.`,
		Example: `  intentctl register purchase-c17-cart9 --params '{"item": "desk lamp", "quantity": 1, "max_eur": 89}' --params-version v2 --label team=checkout
  intentctl register --action refund.issue --identity '{"order_id": "ORD-88412", "return_id": "RA-20931"}' \
      --summary "Refund 40.00 USD to Alice for ORD-88412" --params '{"amount_cents": 4000, "currency": "USD"}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			key := ""
			switch {
			case len(args) == 1:
				key = args[0]
			case identity == "":
				return usagef("register needs KEY, or --action and --identity to derive it from")
			}
			text, err := paramsText(cmd.InOrStdin(), params)
			if err != nil {
				return err
			}
			p, err := jsonObject("--params", text)
			if err != nil {
				return err
			}
			var id *structpb.Struct
			if identity != "" {
				if action == "" {
					return usagef("--identity needs --action: the key is derived from both")
				}
				if id, err = jsonObject("--identity", identity); err != nil {
					return err
				}
			}
			l, err := pairs("--label", labels)
			if err != nil {
				return err
			}
			if retention < 0 {
				return usagef("--retention %v: must not be negative", retention)
			}
			req := &intentv1.RegisterRequest{Key: key, Params: p, ParamsVersion: version, Labels: l, ParentKey: parent, MaxAttempts: maxAttempts, RequestId: requestID,
				Action: action, Identity: id, Summary: summary}
			if retention > 0 {
				req.Retention = durationpb.New(retention)
			}
			resp, err := callOnce(cmd.Context(), g, func(ctx context.Context, c *client.Client) (*intentv1.RegisterResponse, error) {
				return c.Register(ctx, req)
			})
			if err != nil {
				return err
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, _ bool) error {
				action := "already registered, same params"
				if resp.GetCreated() {
					action = "created"
				}
				return printChanged(w, "registered", resp.GetIntent(), action)
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&params, "params", "", "the approved terms, a JSON object; @FILE reads it from a file, - from stdin (required)")
	f.StringVar(&version, "params-version", "", "version of the params' schema, stored with them")
	f.StringArrayVar(&labels, "label", nil, "label, name=value (repeatable); list and watch select by label")
	f.StringVar(&parent, "parent", "", "key of the parent intent, for a sub-operation")
	f.DurationVar(&retention, "retention", 0, "how long the final record is kept (default: intentd's --retention)")
	f.Uint32Var(&maxAttempts, "max-attempts", 0, "attempts without a report before NEEDS_REVIEW (default: intentd's --max-attempts)")
	f.StringVar(&requestID, "request-id", "", "idempotency id (default: a fresh one, kept across retries)")
	f.StringVar(&action, "action", "", `kind of business operation, as derive-key takes it ("refund.issue")`)
	f.StringVar(&identity, "identity", "", "the fields the key is derived from, a JSON object (needs --action)")
	f.StringVar(&summary, "summary", "", "a sentence for reviewers: what is approved, for whom")
	_ = cmd.MarkFlagRequired("params")
	return cmd
}

// maxParamsInput bounds what --params @FILE and - read: intentd refuses
// canonical params beyond 64 KiB anyway.
const maxParamsInput = 1 << 20

// paramsText is --params' JSON: the flag's value, or what @FILE or -
// (stdin) holds, for terms too long or too private for a command line.
func paramsText(stdin io.Reader, flag string) (string, error) {
	var r io.Reader
	switch {
	case flag == "-":
		r = stdin
	case strings.HasPrefix(flag, "@"):
		f, err := os.Open(flag[1:])
		if err != nil {
			return "", usagef("--params: %v", err)
		}
		defer f.Close()
		r = f
	default:
		return flag, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, maxParamsInput+1))
	if err != nil {
		return "", fmt.Errorf("--params %s: %w", flag, err)
	}
	if len(b) > maxParamsInput {
		return "", usagef("--params %s: more than %d bytes", flag, maxParamsInput)
	}
	return string(b), nil
}

// services are the names intentd's gRPC health service reports: the
// server as a whole, and the intent API.
var services = []string{"", intentv1.IntentService_ServiceDesc.ServiceName}

func newHealthCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Ask intentd's gRPC health service: SERVING only while its etcd answers",
		Long: `health asks intentd's gRPC health service (grpc.health.v1), which needs no
credentials. intentd reports SERVING only while etcd answers a linearizable
read and its revision floor holds; NOT_SERVING otherwise, and while it shuts
down. Exit 0 when SERVING, 1 otherwise, 3 when nothing answers. The HTTP
/readyz of the metrics listener (intentctl probe URL) also says why.`,
		Args: cobra.NoArgs,
		RunE: g.action(func(cmd *cobra.Command, _ []string) error {
			conn, err := g.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := g.deadline(cmd.Context())
			defer cancel()
			resp := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
			tw := table(cmd.OutOrStdout())
			if !g.out.machine() {
				row(tw, "SERVICE", "STATUS", "ANSWERED IN")
			}
			for _, svc := range services {
				start := time.Now()
				r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil {
					return err
				}
				if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					resp = r
				}
				if !g.out.machine() {
					row(tw, cmp.Or(svc, "(server)"), r.GetStatus().String(), time.Since(start).Round(10*time.Microsecond).String())
				}
			}
			if g.out.machine() {
				if err := g.out.print(cmd.OutOrStdout(), resp, nil); err != nil {
					return err
				}
			} else {
				if err := tw.Flush(); err != nil {
					return err
				}
				etcd := "answers a linearizable read"
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					etcd = "does not answer, or its revision floor does not hold, or intentd is stopping: /readyz on the metrics listener says which (intentctl probe URL)"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "etcd: %s\n", etcd)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("intentd at %s is %s: its etcd does not answer, its revision floor does not hold, or it is shutting down", g.addr, resp.GetStatus())
			}
			return nil
		}),
	}
}

// session is what the intents a worker session holds tell of it: the API
// has no call that lists sessions, so a session holding nothing is not
// seen.
type session struct {
	id, worker string
	held       []string
	expires    time.Time
}

func newSessionsCommand(g *globals) *cobra.Command {
	l := &listFlags{all: true}
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List the worker sessions that hold leases now, with what each holds",
		Long: `sessions lists the worker sessions holding a live lease, one line each:
session id, worker, how many intents it holds, and when its lease ends
unless the worker heartbeats. intentd's API has no call that lists sessions;
this is what the IN_PROGRESS intents say (List, every page), so a session
that holds nothing does not appear. -o json prints the listing it read.`,
		Args: cobra.NoArgs,
		RunE: g.action(func(cmd *cobra.Command, _ []string) error {
			resp, err := l.fetch(cmd, g, []intentv1.State{intentv1.State_STATE_IN_PROGRESS})
			if err != nil {
				return err
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, wide bool) error {
				list := sessions(resp.GetIntents())
				// List leaves a lease's expiry out (it would cost a read
				// per intent); Get of one held intent gives its session's.
				for _, s := range list {
					if got, err := g.get(cmd.Context(), s.held[0]); err == nil && got.GetIntent().GetLease().GetExpiresAt() != nil {
						s.expires = got.GetIntent().GetLease().GetExpiresAt().AsTime()
					}
				}
				return printSessions(w, list, wide)
			})
		}),
	}
	l.register(cmd, false)
	return cmd
}

// sessions gathers the live leases of intents by session, ordered by
// worker, then id.
func sessions(intents []*intentv1.Intent) []*session {
	byID := map[string]*session{}
	for _, in := range intents {
		ls := in.GetLease()
		if !ls.GetLive() || ls.GetSessionId() == "" {
			continue
		}
		s := byID[ls.GetSessionId()]
		if s == nil {
			s = &session{id: ls.GetSessionId(), worker: ls.GetWorker()}
			byID[s.id] = s
		}
		s.held = append(s.held, in.GetKey())
	}
	return slices.SortedFunc(func(yield func(*session) bool) {
		for _, s := range byID {
			if !yield(s) {
				return
			}
		}
	}, func(a, b *session) int { return cmp.Or(cmp.Compare(a.worker, b.worker), cmp.Compare(a.id, b.id)) })
}

func printSessions(w io.Writer, list []*session, wide bool) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "(no session holds a lease)")
		return err
	}
	tw := table(w)
	head := []string{"SESSION", "WORKER", "HELD", "EXPIRES"}
	if wide {
		head = append(head, "KEYS")
	}
	row(tw, head...)
	for _, s := range list {
		expires := "" // List leaves the lease's expiry out: Get has it
		if !s.expires.IsZero() {
			expires = s.expires.UTC().Format(timeLayout)
		}
		cells := []string{s.id, s.worker, fmt.Sprint(len(s.held)), expires}
		if wide {
			cells = append(cells, strings.Join(s.held, ","))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}
