package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// formatsAnswer is the JSON a replica's metrics listener answers at
// GET /formats (internal/run/daemon's FormatsAnswer): the fields shown.
type formatsAnswer struct {
	Cluster struct {
		Version int       `json:"version"`
		By      string    `json:"by"`
		At      time.Time `json:"at"`
	} `json:"cluster"`
	Effective   int              `json:"effective"`
	Target      int              `json:"target"`
	Settled     bool             `json:"settled"`
	Self        formatsReplica   `json:"self"`
	Replicas    []formatsReplica `json:"replicas"`
	Unannounced []string         `json:"unannounced"`
}

type formatsReplica struct {
	ID      string    `json:"id"`
	Version string    `json:"version"`
	Commit  string    `json:"commit"`
	Reads   int       `json:"reads"`
	Writes  int       `json:"writes"`
	Since   time.Time `json:"since"`
}

// newFormatsCommand shows the cluster's storage format version and every
// live replica's, as one replica's metrics listener reads them from etcd
// (docs/OPERATIONS.md, "Rolling upgrades").
func newFormatsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "formats URL",
		Short: "Show the cluster's storage format version and each replica's build and formats (rolling upgrades)",
		Long: `formats asks one replica's metrics listener (URL: http://host:7651, any
replica; the path /formats is added) for the cluster's storage format
version and every live replica's announcement: its id, build, the newest
format it reads and the one it writes. A replica of the first release
announces nothing and is listed as unannounced. "settled: yes" means every
replica reads the same formats and the cluster's version is the newest of
them; during a rolling upgrade it says what holds the version back.

While the cluster's version is one the previous release reads (RELEASES
lists the newest format each release reads), that release can take the
replicas back; once the version is past it, it refuses to start.

It needs no credentials and no gRPC. Exit 0, 1 when the replica answers an
error (its etcd does not answer), 3 when nothing answers.`,
		Args: cobra.ExactArgs(1),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(args[0])
			if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
				return &usageError{msg: fmt.Sprintf("formats %q: want the URL of a replica's metrics listener, such as http://127.0.0.1:7651", args[0])}
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = "/formats"
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			body, err := getFormats(ctx, u.String())
			if err != nil {
				return err
			}
			var a formatsAnswer
			if err := json.Unmarshal(body, &a); err != nil {
				return fmt.Errorf("formats %s: not a formats answer: %w", u, err)
			}
			w := cmd.OutOrStdout()
			if g.out.machine() {
				// The answer as it came, indented (yaml: JSON is YAML).
				var b bytes.Buffer
				if err := json.Indent(&b, bytes.TrimSpace(body), "", "  "); err != nil {
					return err
				}
				_, err := fmt.Fprintln(w, b.String())
				return err
			}
			return printFormats(w, a, g.out.wide())
		}),
	}
}

// getFormats GETs url and returns its body; an error unless 200.
func getFormats(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &usageError{msg: fmt.Sprintf("formats %q: %v", url, err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, &unreachable{err: fmt.Errorf("formats %s: %w", url, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("formats %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("formats %s: %s: a replica of the first release answers no /formats; ask a replica of a later one", url, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		first, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return nil, fmt.Errorf("formats %s: %s %s", url, resp.Status, first)
	}
	return body, nil
}

// printFormats prints a for people: the cluster's version, then a table of
// the replicas (wide: with commits and since when).
func printFormats(w io.Writer, a formatsAnswer, wide bool) error {
	if a.Cluster.Version == 0 {
		fmt.Fprintf(w, "cluster format version: none yet (format %d is written)\n", a.Effective)
	} else {
		fmt.Fprintf(w, "cluster format version: %d (advanced by %s at %s)\n", a.Cluster.Version, a.Cluster.By, a.Cluster.At.UTC().Format(time.RFC3339))
	}
	settled := "yes"
	if !a.Settled {
		settled = "no"
		switch {
		case len(a.Unannounced) > 0 && a.Cluster.Version > 1:
			settled += fmt.Sprintf(": replicas of the first release run on a cluster at format %d, which they do not read: stop them", a.Cluster.Version)
		case len(a.Unannounced) > 0:
			settled += ": replicas of the first release still run"
		case a.Target > a.Cluster.Version:
			settled += fmt.Sprintf(": every replica reads format %d, the version advances to it shortly", a.Target)
		default:
			settled += ": the replicas read different formats (an upgrade or a rollback half done)"
		}
	}
	fmt.Fprintf(w, "settled: %s\n", settled)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "REPLICA\tVERSION\tREADS\tWRITES\tCOMMIT\tSINCE\t")
	} else {
		fmt.Fprintln(tw, "REPLICA\tVERSION\tREADS\tWRITES\t")
	}
	for _, r := range a.Replicas {
		id := r.ID
		if id == a.Self.ID {
			id += " (answered)"
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t\n", id, r.Version, r.Reads, r.Writes, r.Commit, r.Since.UTC().Format(time.RFC3339))
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", id, r.Version, r.Reads, r.Writes)
		}
	}
	for _, id := range a.Unannounced {
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\t\t\n", id, "(first release: unannounced)", 1, 1)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", id, "(first release: unannounced)", 1, 1)
		}
	}
	return tw.Flush()
}
