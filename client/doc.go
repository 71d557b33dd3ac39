// Package client is the Go client of intentd: typed calls, errors that work
// with errors.Is, worker sessions that heartbeat on their own, and Run, the
// safe claim → act → report loop.
//
//	c := client.New(conn)
//	sess, _ := c.OpenSession(ctx, "worker-7", 15*time.Second)
//	out, err := sess.Run(ctx, client.Task{
//		Key:      key,
//		Execute:  func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) { ... },
//		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) { ... },
//	})
//
// # What Run guarantees
//
// Run executes an intent only when intentd says EXECUTE, which it says once
// per approval (and again only after a confirmed absence). A completed
// intent's stored result is returned without executing. Execute runs under
// a lease that the session heartbeats; the moment the lease is lost
// (superseded, or the session lapsed) Execute's context is cancelled. Its
// outcome is reported under the lease's token: success → Complete; Final →
// Fail; NotAttempted → Release; any other error (a timeout, a reset) →
// MarkUnknown — never a fresh attempt. The next worker then gets RECONCILE
// and must ask the downstream system, by the same operation key, what
// happened: Found → Complete, Absent → Release and execute, Undecided →
// Escalate to a human. An intent on which too many attempts end that way
// (leases lapsed, MarkUnknown: RegisterRequest.max_attempts, else the
// server's --max-attempts) is handed to a human by intentd itself: Run then
// returns Outcome NEEDS_REVIEW without executing, and Outcome.Intent's
// attempts and max_attempts say why. Reports are retried while intentd does not answer,
// under the same token, and outlive the caller's context (bounded by
// WithReportTimeout): an effect that happened gets recorded. A report is
// never left refused while the lease is held: free text (reasons, a
// failure's code and message) is cut to its limit at a character boundary;
// a result or failure intentd refuses as INVALID_ARGUMENT (a payload over
// its limit, too many references) is reported as MarkUnknown instead, the
// refusal returned, so that the next worker reconciles at once; a Found
// result so refused is escalated to a person.
//
// Calls are retried only when intentd did not answer (UNAVAILABLE, or an
// attempt's own deadline), with jittered backoff and a deadline per attempt,
// and return at once when the caller's context ends. Refusals
// (FAILED_PRECONDITION, INVALID_ARGUMENT, PERMISSION_DENIED, ABORTED) are
// returned, never resent as they are: an ABORTED / ErrStaleToken means
// another worker or a reviewer took over, and Run answers it by acquiring
// again (a bounded number of times) to learn what became of the intent;
// Outcome.Superseded then says so.
//
// # What Run cannot guarantee
//
// intentd decides who may act; it cannot stop an act already under way. A
// worker paused past its lease may still reach the provider after another
// worker took over. What keeps that from becoming a second order is the
// provider: it must deduplicate on the operation key Attempt.OperationKey
// gives (the same for every attempt and worker), or check the fencing token
// Attempt.Token (see package fencing). A provider that ignores both is not
// protected by anything here: Run then narrows the window, it does not
// close it. Reconcile must ask the provider, not guess: Absent means
// "confirmed not there", and it leads to executing again.
package client
