package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// childSpec is what a worker child process needs from its parent.
type childSpec struct {
	// Mode is what the child does (below).
	Mode string
	// Intentd is intentd's gRPC address; Merchant and Gateway the
	// providers' base URLs.
	Intentd, Merchant, Gateway string
	// Key is the intent to work on, TTL the worker's session TTL.
	Key string
	TTL time.Duration
}

// Worker child modes (childSpec.Mode).
const (
	// modePause places the order, prints "effect-done", and waits for a
	// "resume" line on stdin before it returns the result: the parent
	// stops the process (SIGSTOP) in between, past its session TTL.
	modePause = "pause-after-effect"
	// modeCrash places the order, prints "effect-done", and sleeps: the
	// parent kills it (SIGKILL) before it reports.
	modeCrash = "crash-after-effect"
	// modeStaleGateway prints "ready" under its lease and waits for
	// "resume" before it books a pickup through the gateway: the parent
	// stops it in between, and another worker takes over.
	modeStaleGateway = "stale-gateway"
)

// TestWorkerProcess is a worker, run in a child process by the scenarios
// that stop or kill workers (startChild). It does nothing in the parent.
// It reports on stdout, one line per step ("session ...", "effect-done
// ...", "run-result ..."), and "error ..." when something went wrong.
func TestWorkerProcess(t *testing.T) {
	var spec childSpec
	if ok, err := harness.ChildSpec(&spec); !ok {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := runWorker(ctx, spec); err != nil {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " | "))
	}
	fmt.Println("exit")
}

// runWorker runs one worker child: a session, one Run of spec.Key, and a
// report of what the Run returned.
func runWorker(ctx context.Context, spec childSpec) error {
	mode := spec.Mode
	c, closeConn, err := dialIntentd(spec.Intentd)
	if err != nil {
		return err
	}
	defer closeConn()
	sess, err := c.OpenSession(ctx, "child-"+mode, spec.TTL)
	if err != nil {
		return err
	}
	defer sess.Close(context.Background())
	fmt.Println("session", sess.ID())

	s := &shop{harness.Shop{Merchant: spec.Merchant, Gateway: spec.Gateway}}
	stdin := bufio.NewScanner(os.Stdin)
	awaitLine := func(word string) error {
		for stdin.Scan() {
			if stdin.Text() == word {
				return nil
			}
		}
		return fmt.Errorf("stdin closed before %q", word)
	}
	task := client.Task{Key: spec.Key, WaitInProgress: 10 * time.Second}
	switch mode {
	case modePause:
		task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			res, err := s.executeOrder(ctx, att)
			if err != nil {
				return nil, err
			}
			fmt.Printf("effect-done %s token=%d\n", res.GetExternalRefs()[refOrder], att.Token)
			// Stopped here. When it resumes, the worker does what any
			// worker does with an answer in hand: it reports it.
			if err := awaitLine("resume"); err != nil {
				return nil, err
			}
			return res, nil
		}
	case modeCrash:
		task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			res, err := s.executeOrder(ctx, att)
			if err != nil {
				return nil, err
			}
			fmt.Printf("effect-done %s token=%d\n", res.GetExternalRefs()[refOrder], att.Token)
			time.Sleep(time.Minute) // killed here, before any report
			return nil, errors.New("not killed within a minute")
		}
	case modeStaleGateway:
		task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			fmt.Printf("ready token=%d\n", att.Token)
			if err := awaitLine("resume"); err != nil {
				return nil, err
			}
			// A stopped process's request was already on its way: it does
			// not see its lease's end before it sends.
			p, err := s.BookPickup(context.WithoutCancel(ctx), att.Key, att.Token, fakes.Pickup{Parcel: att.Key, Address: "Dock 4"})
			code := harness.HTTPStatus(err)
			if err == nil {
				code = 201
			}
			fmt.Printf("gateway-status %d\n", code)
			if harness.HTTPStatus(err) == 409 {
				// The gateway refused: the courier never saw the call.
				return nil, client.NotAttempted(err)
			}
			if err != nil {
				return nil, err
			}
			return refs(refPickup, p.ID), nil
		}
	default:
		return fmt.Errorf("unknown worker mode %q", mode)
	}
	out, err := sess.Run(ctx, task)
	state := intentv1.State_STATE_UNSPECIFIED
	if out != nil {
		state = out.Intent.GetState()
	}
	fmt.Printf("run-result stale=%t lease-lost=%t state=%s\n",
		errors.Is(err, client.ErrStaleToken), errors.Is(err, client.ErrLeaseLost), state)
	if err != nil {
		fmt.Println("run-error", err)
	}
	return nil
}
