package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
)

const weightsHelp = `Usage: clawmesh weights <ls|get|use> [flags] --data DIR

The adapter versions the mesh's trainers publish come back to every device:
a node in a mesh fetches the newest one over QUIC (from the trainers and
from every device that already holds it), verifies it chunk by chunk
against a manifest a majority of the mesh's voters certified (the
trainers its admin trusts), installs it under
DIR/adapters/vN and hot-swaps it into its model server, with no request
lost. These commands ask the node running on DIR.

  clawmesh weights ls [--json]        versions known: downloading (with
                                      progress), held, installed, serving;
                                      held-out pass@1 where the trainers
                                      evaluated a version on a task set
  clawmesh weights get VERSION        fetch and install a version now (v3)
  clawmesh weights use VERSION        pin a version (v3), or base for the
                                      base model; use latest to follow the
                                      newest again
`

func runWeights(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	var s settings
	fs := newFlags("weights "+sub, weightsHelp, stderr)
	s.bindClient(fs)
	asJSON := fs.Bool("json", false, "print the node's weights status as JSON (a stable format: pin, serving, latest, driver, versions with their evals, error)")
	switch sub {
	case "-h", "--help", "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return nil
	case "":
		return usageErr("weights needs a subcommand: ls, get or use")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	want := 0
	switch sub {
	case "ls":
	case "get", "use":
		want = 1
	default:
		return usageErr("unknown weights subcommand %q (want ls, get or use)", sub)
	}
	if fs.NArg() != want {
		if want == 0 {
			return usageErr("weights ls takes no arguments")
		}
		return usageErr("weights %s takes one version (v3%s)", sub, map[bool]string{true: ", base or latest"}[sub == "use"])
	}
	// A version name is checked before the node is looked for.
	if v := fs.Arg(0); sub == "get" || (sub == "use" && v != adapters.Base && v != "latest") {
		if _, err := adapters.ParseVersion(v); err != nil {
			return usageErr("%v", err)
		}
	}
	c, err := runningNode(&s)
	if err != nil {
		return err
	}
	var st adapters.Status
	switch sub {
	case "ls":
		st, err = c.Weights(ctx)
	case "use":
		st, err = c.UseWeights(ctx, fs.Arg(0))
		if err == nil && !*asJSON {
			if st.Pin == "" {
				fmt.Fprintln(stdout, "following the newest version")
			} else {
				fmt.Fprintf(stdout, "pinned %s: the node loads it and then serves it\n", st.Pin)
			}
		}
	case "get":
		st, err = getWithProgress(ctx, c, fs.Arg(0), stdout, *asJSON)
	}
	if err != nil && strings.Contains(err.Error(), strings.TrimPrefix(node.ErrNoWeights.Error(), "node: ")) {
		return withHint(fmt.Errorf("the node on %s follows no adapter versions: it is not in a mesh, or runs with --weights off", s.Data),
			"Join a mesh ('clawmesh join TOKEN --data %s') and restart the node, without --weights off", s.Data)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, st)
	}
	printWeights(stdout, st)
	return nil
}

// getWithProgress fetches a version through the node, drawing a progress
// bar from the node's status while the fetch runs.
func getWithProgress(ctx context.Context, c *node.Client, version string, w io.Writer, quiet bool) (adapters.Status, error) {
	if _, err := adapters.ParseVersion(version); err != nil {
		return adapters.Status{}, usageErr("%v", err)
	}
	type result struct {
		st  adapters.Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := c.GetWeights(ctx, version)
		done <- result{st, err}
	}()
	tk := time.NewTicker(200 * time.Millisecond)
	defer tk.Stop()
	drawn := false
	for {
		select {
		case r := <-done:
			if drawn {
				fmt.Fprintln(w)
			}
			return r.st, r.err
		case <-tk.C:
			if quiet {
				continue
			}
			st, err := c.Weights(ctx)
			if err != nil {
				continue
			}
			for _, v := range st.Versions {
				if v.Version == version && v.Bytes > 0 {
					fmt.Fprintf(w, "\r%s %s", version, bar(v.Downloaded, int64(v.Bytes), v.State))
					drawn = true
				}
			}
		}
	}
}

// bar draws "[#####.....]  42% 10.5/25.0 MiB".
func bar(done, total int64, state string) string {
	if state != "downloading" && state != "known" {
		done = total
	}
	const width = 30
	n := int(done * width / max(total, 1))
	return fmt.Sprintf("[%s%s] %3d%% %.1f/%.1f MiB", strings.Repeat("#", n), strings.Repeat(".", width-n),
		done*100/max(total, 1), float64(done)/(1<<20), float64(total)/(1<<20))
}

func printWeights(w io.Writer, st adapters.Status) {
	follow := "the newest version"
	if st.Pin != "" {
		follow = st.Pin + " (pinned; `clawmesh weights use latest` follows the newest again)"
	}
	driver := st.Driver
	if driver == "" {
		driver = "none (the upstream cannot hot-swap adapters: versions are installed, not served)"
	}
	fmt.Fprintf(w, "serving:  %s\nfollows:  %s\nhot swap: %s\n", st.Serving, follow, driver)
	if st.Error != "" {
		fmt.Fprintf(w, "waiting:  %s\n", st.Error)
	}
	if len(st.Versions) == 0 {
		fmt.Fprintln(w, "\nno version announced yet: the trainers publish one after their first round")
		return
	}
	// The held-out column shows only where a version was evaluated on a
	// task set (a mesh without task sets has none).
	evals := slices.ContainsFunc(st.Versions, func(v adapters.Version) bool { return len(v.Evals) > 0 })
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "VERSION\tHASH\tSTATE\tSIZE\tBUNDLE\tTERM\tINDEX"
	if evals {
		head += "\tHELD-OUT PASS@1"
	}
	fmt.Fprintln(tw, head)
	for _, v := range st.Versions {
		state := v.State
		if v.State == "downloading" {
			state = "downloading " + bar(v.Downloaded, int64(v.Bytes), v.State)
		}
		if v.Failed != "" {
			state += " (not served: " + v.Failed + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f MiB\t%s\t%d\t%d", v.Version, core.ShortHash(v.Hash), state, float64(v.Bytes)/(1<<20), core.ShortHash(v.Bundle), v.Term, v.Index)
		if evals {
			fmt.Fprintf(tw, "\t%s", adapters.FormatEvals(v.Evals))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
