package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/personal"
)

const personalHelp = `Usage: clawmesh personal status|reset|off|on [--json]
       clawmesh personal train --job FILE --base DIR   (the worker the node runs)

A personal adapter is trained on this device's own steps only and served
stacked on the mesh's shared version: the model server gets one adapter,
shared + personal, whose rank is the sum of both, and it is rebuilt when
either changes. The mesh learns what its users share; the personal adapter
learns what is yours (a word first, say, where the others want a digit).

Where it trains is the [personal] mode in the node's config file:
  local   on this device, by a worker process at low priority, only while
          the agent has been idle for [personal] idle (default 2m); nothing
          leaves the device. It needs the base model's directory
          ([personal] base, or the node's model when it is one), and trains
          with the native engine (small models) or, with [personal] engine =
          "torch", a PyTorch worker (device = "cpu" or "cuda").
  mesh    by a trainer you trust ([personal] trainers = ["<peer id>"]):
          your scrubbed steps go to it alone, over an encrypted stream, and
          the adapter comes back to this device alone; it is never
          re-served, gossiped or mixed into the shared version.
  off     none (the default).
Personal training never uses another device's steps, and its changes never
enter the shared version. It needs the node in a mesh (it stacks on the
mesh's versions).

Commands (they talk to the running node):
  status   the mode, the version serving, the steps it learned from, its
           versions and its score on your held-back turns (the share of
           them where it agrees with your reactions: a reply you liked made
           more likely than by the shared version alone, one you disliked
           less likely)
  reset    forget it: its versions are removed and the shared version
           serves alone; it learns again from your new steps
  off      stop training and serving it (its versions are kept)
  on       back on, after off
`

func runPersonal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, personalHelp)
		return nil
	case "":
		return usageErr("personal needs a subcommand: status, reset, off or on")
	case "train":
		return runPersonalTrain(ctx, args, stdout, stderr)
	case "status", "reset", "off", "on":
	default:
		return usageErr("unknown personal subcommand %q (want status, reset, off or on)", sub)
	}
	var s settings
	fs := newFlags("personal "+sub, personalHelp, stderr)
	s.bindClient(fs)
	asJSON := fs.Bool("json", false, "print the personal adapter's status as JSON (a stable format: mode, enabled, current, learned_steps, pending_steps, training, score, versions, last_error)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErr("personal %s takes no arguments", sub)
	}
	c, err := runningNode(&s)
	if err != nil {
		return err
	}
	var st personal.Status
	if sub == "status" {
		st, err = c.Personal(ctx)
	} else {
		st, err = c.PersonalDo(ctx, sub)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	switch sub {
	case "reset":
		fmt.Fprintln(stdout, "personal adapter reset: the shared version serves alone; it learns again from your new steps")
	case "off":
		fmt.Fprintln(stdout, "personal adapter off: the shared version serves alone (its versions are kept; `clawmesh personal on` brings it back)")
	case "on":
		fmt.Fprintln(stdout, "personal adapter on")
	}
	printPersonal(stdout, st)
	return nil
}

// printPersonal writes the personal adapter's status for a person.
func printPersonal(w io.Writer, st personal.Status) {
	state := "on"
	switch {
	case st.Mode == personal.ModeOff:
		state = "off ([personal] mode)"
	case !st.Enabled:
		state = "off (clawmesh personal off)"
	case st.Training:
		state = "training now"
	}
	fmt.Fprintf(w, "mode     %s, %s\n", st.Mode, state)
	cur := st.Current
	if cur == "" {
		cur = "none (the shared version serves alone)"
	}
	fmt.Fprintf(w, "serving  %s\n", cur)
	fmt.Fprintf(w, "learned  %d steps (%d new ones waiting)\n", st.Learned, st.Pending)
	if st.Score >= 0 {
		fmt.Fprintf(w, "score    %.2f on your held-back turns\n", st.Score)
	}
	if st.LastError != "" {
		fmt.Fprintf(w, "error    %s\n", st.LastError)
	}
	if len(st.Versions) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tON\tSTEPS\tHELD BACK\tSCORE\tTRAINED")
	for _, v := range st.Versions {
		score := "-"
		if v.ScoreAfter >= 0 {
			score = fmt.Sprintf("%.2f -> %.2f", v.ScoreBefore, v.ScoreAfter)
		}
		shared := v.Shared
		if shared == "" {
			shared = "base"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s (%.0f s)\n", v.Version, shared, v.Trained, v.HeldBack, score, v.At.Local().Format("2006-01-02 15:04"), v.Seconds)
	}
	tw.Flush()
}

// personalConfig makes the node's [personal] policy from the settings:
// under local, the worker this program runs; under mesh, the trainers the
// user trusts (the node reaches them over the mesh).
func personalConfig(s settings, serve *modelserver.Config, log *slog.Logger) (*node.PersonalConfig, error) {
	ps := s.Personal
	if ps.Mode == "" || ps.Mode == personal.ModeOff {
		return nil, nil
	}
	pc := &node.PersonalConfig{Mode: ps.Mode, Idle: ps.Idle, MinSteps: ps.MinSteps, Trainers: ps.Trainers}
	if ps.Mode == personal.ModeLocal {
		base := ps.Base
		if base == "" && serve != nil && isDirPath(serve.Model) {
			base = serve.Model
		}
		if base == "" {
			return nil, fmt.Errorf("[personal] mode = \"local\" needs the base model's directory to train on: set [personal] base in %s (the Hugging Face directory of the model your server serves)", nodeConfigPath(s))
		}
		if !isDirPath(base) {
			return nil, fmt.Errorf("[personal] base %q is not a directory: it is the base model's Hugging Face directory", base)
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("[personal]: finding this program to run its worker: %w", err)
		}
		pc.Trainer = &execTrainer{Exe: exe, Base: base, Engine: ps.Engine, Device: ps.Device, Logger: log}
	}
	return pc, nil
}

func isDirPath(p string) bool {
	fi, err := os.Stat(p)
	return p != "" && err == nil && fi.IsDir()
}

// personalFlag reads --personal into the settings.
func personalFlag(s *settings, v string) error {
	if v == "" {
		return nil
	}
	m, err := personal.ParseMode(v)
	if err != nil {
		return usageErr("--personal %q: want local, mesh or off", v)
	}
	if m == personal.ModeMesh && len(s.Personal.Trainers) == 0 {
		return usageErr("--personal mesh needs [personal] trainers in %s: the trainers you trust with your steps", strings.TrimSpace(nodeConfigPath(*s)))
	}
	s.Personal.Mode = m
	return nil
}
