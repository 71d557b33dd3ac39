// Command intentctl is the operator's command line for intentd. It talks to
// intentd through the Go client (package client), exactly as any other
// caller does, and so sees only what its token or certificate may see.
//
//	intentctl get KEY                       a summary, then the history as a timeline
//	intentctl history KEY                   the history alone
//	intentctl list [--state S ...] [--label k=v] [--parent P] [--page-size N] [--page-token T] [--all]
//	intentctl review-queue [...list flags]  list --state UNKNOWN --state NEEDS_REVIEW
//	intentctl sessions [...list flags]      the worker sessions holding leases, from the IN_PROGRESS intents
//	intentctl register [KEY] --params JSON [--action A --identity JSON] [--summary TEXT] [--params-version V] [--label k=v ...] [--parent P] [--retention D] [--max-attempts N]
//	intentctl resolve KEY --decision completed|pending|failed|cancelled --actor A --reason R [--ref k=v ...] [--payload P] [--failure-code C] [--force] [--request-id ID]
//	intentctl cancel KEY --reason R [--actor A]
//	intentctl escalate KEY --reason R [--actor A] [--force]
//	intentctl watch [KEY] [--state S ...] [--label k=v] [--parent P] [--from REV]
//	intentctl derive-key ACTION k=v ...     values are JSON when they parse as JSON, else strings
//	intentctl health                        gRPC health: SERVING while intentd's etcd answers
//	intentctl token new --name N --tenant T --role R [--role R2]
//	intentctl token hash                    the SHA-256 of a token read on stdin
//	intentctl dev-certs --out DIR [--client NAME ...] [--host H ...] [--test-certs] [--force]
//	intentctl probe URL                     GET /healthz or /readyz: exit 0 on 2xx (an image's health check)
//	intentctl formats URL                   the cluster's storage format version and each replica's (rolling upgrades)
//	intentctl completion bash|zsh|fish      a shell completion script
//	intentctl --version                     the build's version (intentd --version too)
//
// Global flags, each also read from INTENTCTL_<NAME> when not given:
// --addr (default 127.0.0.1:7650; also the older INTENTD_ADDR), --tenant,
// --token (also the older INTENTD_TOKEN; sent as "authorization: Bearer
// <token>" on every call), --tls, --cacert, --cert and --key (a client
// certificate for mutual TLS), --timeout (the deadline of a whole command;
// watch has none), -o/--output (text, wide, json or yaml). A flag on the
// command line wins over the environment.
//
// Exit status: 0 done, 1 intentd refused the call (its code, reason, field
// and statement are printed on stderr) or the command failed, 2 usage
// error, 3 intentd unreachable or UNAVAILABLE (no answer: the call may or
// may not have taken effect, and is safe to repeat).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/intentd/intentd/client"
)

// Exit statuses, documented in the root command's help and docs/CONFIGURATION.md.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitUnreachable = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

// lookupEnv reads an environment variable; tests pass their own.
type lookupEnv func(name string) (string, bool)

// run executes intentctl with args and returns its exit status. Everything
// it reads and writes goes through the given streams and env.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env lookupEnv) int {
	root := newRootCommand(env)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var f *failure
	if errors.As(err, &f) {
		printFailure(stderr, f.err)
		var u *unreachable
		if errors.As(err, &u) || errors.Is(err, client.ErrUnavailable) {
			return exitUnreachable
		}
		return exitFailure
	}
	fmt.Fprintf(stderr, "intentctl: %s\nRun '%s --help' for usage.\n", clean(usageLine(err.Error())), cmd.CommandPath())
	return exitUsage
}

// usageLine puts cobra's suggestions for a mistyped command ("unknown
// command \"regster\" ...\n\nDid you mean this?\n\tregister\n") on the
// error's line, which clean would otherwise print with its newlines and
// tabs escaped: `unknown command "regster" for "intentctl"; did you mean
// register?`.
func usageLine(msg string) string {
	head, suggestions, ok := strings.Cut(msg, "\n\nDid you mean this?\n")
	if !ok {
		return strings.TrimRight(msg, "\n")
	}
	return head + "; did you mean " + strings.Join(strings.Fields(suggestions), " or ") + "?"
}

// failure marks an error a command met while running, as opposed to one in
// how it was called: it exits 1, every other error exits 2.
type failure struct{ err error }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// unreachable is a failure to reach intentd at all: exit 3, as for
// intentd's own UNAVAILABLE (its etcd does not answer).
type unreachable struct{ err error }

func (u *unreachable) Error() string { return u.err.Error() }
func (u *unreachable) Unwrap() error { return u.err }

// usageError is an error in a command's arguments that cobra cannot see
// (a malformed value, flags that do not go together); it exits 2.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// action wraps a command's body: what it returns is a failure (exit 1)
// unless it is a usage error (exit 2). Errors cobra finds before the body
// runs (unknown commands and flags, missing arguments and required flags)
// never pass through here, and exit 2.
func action(body func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := body(cmd, args)
		var u *usageError
		if err == nil || errors.As(err, &u) {
			return err
		}
		return &failure{err: err}
	}
}

// printFailure writes why a command failed. For a refusal that is what
// intentd said: code, reason, field, metadata and the statement's text, one
// per line, so a person can read it and a script can grep it.
func printFailure(w io.Writer, err error) {
	var e *client.Error
	if errors.As(err, &e) {
		printRefusal(w, e)
		return
	}
	fmt.Fprintf(w, "intentctl: %s\n", clean(err.Error()))
}

// printRefusal prints what intentd said, which quotes what callers sent
// (keys, fields, reasons): each line through clean.
func printRefusal(w io.Writer, e *client.Error) {
	fmt.Fprintf(w, "intentctl: intentd: %s\n", clean(e.Message))
	fmt.Fprintf(w, "  code: %s\n", codeName(e.Code.String()))
	if e.Reason != "" {
		fmt.Fprintf(w, "  reason: %s\n", e.Reason)
	}
	if e.Field != "" {
		fmt.Fprintf(w, "  field: %s\n", clean(e.Field))
	}
	keys := make([]string, 0, len(e.Metadata))
	for k := range e.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "field" && e.Metadata[k] == e.Field {
			continue // printed above
		}
		fmt.Fprintf(w, "  %s: %s\n", clean(k), clean(e.Metadata[k]))
	}
	if t := e.Statement.GetText(); t != "" {
		fmt.Fprintf(w, "  statement: %s\n", clean(t))
	}
}

var wordStart = regexp.MustCompile(`([a-z])([A-Z])`)

// codeName spells a gRPC code as the protocol does: FailedPrecondition is
// FAILED_PRECONDITION.
func codeName(s string) string {
	return strings.ToUpper(wordStart.ReplaceAllString(s, "${1}_${2}"))
}
