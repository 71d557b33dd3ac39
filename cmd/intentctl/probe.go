package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
)

// newProbeCommand is an HTTP health check for images that carry no shell,
// curl or wget: a container's HEALTHCHECK or a compose healthcheck runs
// `intentctl probe http://127.0.0.1:7651/readyz`. It needs no credentials
// and no gRPC: it asks intentd's metrics listener, which serves /healthz
// and /readyz in plain HTTP.
func newProbeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "probe URL",
		Short: "GET an HTTP health endpoint (/healthz, /readyz): exit 0 on 2xx, 1 otherwise, 3 if nothing answers",
		Long: `probe GETs URL within --timeout and prints the answer's first line.
It exits 0 when the status is 2xx, 1 for any other status (intentd's 503
says why in its body) and 3 when nothing answers, so a container runtime can
use it as its health check.`,
		Args: cobra.ExactArgs(1),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
			if err != nil {
				return &usageError{msg: fmt.Sprintf("probe %q: %v", args[0], err)}
			}
			line, err := probe(req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), clean(line))
			return nil
		}),
	}
}

// probe sends req and returns the status and the body's first line; an
// error when the status is not 2xx or nothing answered.
func probe(req *http.Request) (string, error) {
	url := req.URL.String()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", &unreachable{err: fmt.Errorf("probe %s: %w", url, err)}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	first, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	line := strings.TrimSpace(resp.Status + " " + first)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("probe %s: %s", url, line)
	}
	return line, nil
}
