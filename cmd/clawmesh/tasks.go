package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

const tasksHelp = `Usage: clawmesh tasks add FILE --reward VERIFIER.wasm [--group G] [--holdout 0.1] [--ratio R] [--tools TOOLSIM.wasm] [...] --data DIR
       clawmesh tasks ls [--json] --data DIR
       clawmesh tasks status [--json] --data DIR

Trains the mesh's adapter on a task set (white-box offline mode): many
rollouts per prompt, scored by a verifier plugin that knows each task's
answer, compared within their group (GRPO), mixed with the live batches in
every round. Run it on a trainer (DIR is the trainer's data directory).

A task set is JSONL, one task a line:

  {"id": "q1", "messages": [{"role": "user", "content": "2+2?"}], "tools": [],
   "answer": 4, "meta": {"max_tokens": 16}}

id (unique) and messages are required; answer and meta (any JSON; meta an
object) reach the verifier as input.task (see wasm-rewards/ABI.md; write one
with 'clawmesh reward new --verifier NAME'); meta.max_tokens bounds a reply.

  add     checks the file and the plugins (they must load, and the verifier
          must score at least one of the set's first 5 tasks, each tried
          with its answer as the reply: a verifier that abstains or fails on
          all of them is refused), and has the group's leader add the set:
          it is named by the SHA-256 of its canonical form, and a held-out
          split (round(--holdout x tasks) of them, drawn from the hash and
          the ids, the same on every trainer, and recorded when the set is
          added) is never trained on but scored after every version: pass@1
          (the share of held-out prompts whose greedy reply the verifier
          scores positive) and the mean reward, kept in the version's
          lineage record.
  ls      the task sets and their progress.
  status  the same with every version's evaluation, and the held-out
          prompts the verifier gave no score (ABSTAINED; when more than half,
          status says the evaluation says little).

Each round takes at most --per-round prompts of a set (G rollouts each from
the round's version, advantages normalised within each prompt's group:
(r - mean) / (std + eps); a group whose rewards are all equal carries no
signal and is left out of the step; a round in which every group is so
publishes no version, and its prompts count as done); while device batches
are pending too, the prompts take at most --ratio of the round's steps.
Adding a set the group holds already with the same settings says so and
changes nothing; with other settings it is refused, naming them
("--holdout 0.25 here, 0.1 in the group"). Every prompt is trained
--epochs times; the ledger records which round trained it, so a failover
neither skips nor repeats one.

--json prints a list of task sets, oldest first, each with: hash, name,
reward, tools (the plugins' SHA-256), group, holdout, ratio, per_round,
epochs, max_tokens, prompts (training split), held_out, items (prompts x
epochs), done, assigned, pending, added, and evals: [{version, task,
prompts, passed, pass_at_1, mean_reward, by, abstained, mostly_abstained}],
oldest version first.
`

func runTasks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, tasksHelp)
		if len(args) == 0 {
			return usageErr("tasks needs a subcommand: add, ls or status")
		}
		return nil
	}
	sub := args[0]
	switch sub {
	case "add", "ls", "status":
	default:
		return usageErr("unknown tasks subcommand %q (add, ls, status)", sub)
	}
	var s settings
	fs := newFlags("tasks "+sub, tasksHelp, stderr)
	s.bindClient(fs)
	var (
		asJSON         bool
		rewardPath     string
		toolsPath      string
		a              trainer.AddTasks
		defaultHoldout = group.DefaultTaskHoldout
	)
	if sub == "add" {
		fs.StringVar(&rewardPath, "reward", "", "the verifier plugin (.wasm) that scores a reply against the task's answer (required)")
		fs.StringVar(&toolsPath, "tools", "", "a tool simulator plugin (.wasm) that answers the tasks' tool calls")
		fs.IntVar(&a.Group, "group", group.DefaultTaskGroup, "G: rollouts per prompt, compared within their group (2 to 64)")
		fs.Float64Var(&a.Holdout, "holdout", defaultHoldout, "the share of the tasks held out for evaluation, in [0, 1)")
		fs.Float64Var(&a.Ratio, "ratio", group.DefaultTaskRatio, "the share of a round's steps rollouts take while device batches wait too, in (0, 1]")
		fs.IntVar(&a.PerRound, "per-round", group.DefaultTaskPerRound, "prompts of this set one round trains at most")
		fs.IntVar(&a.Epochs, "epochs", group.DefaultTaskEpochs, "how many times every training prompt is trained")
		fs.IntVar(&a.MaxTokens, "max-tokens", group.DefaultTaskMaxTokens, "a reply's token limit (a task's meta.max_tokens overrides it)")
	} else {
		fs.BoolVar(&asJSON, "json", false, "print JSON (a stable format, described in --help)")
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if sub == "add" && fs.NArg() != 1 {
		return usageErr("tasks add takes one task file (JSONL)")
	}
	if sub != "add" && fs.NArg() > 0 {
		return usageErr("tasks %s takes no arguments", sub)
	}
	if sub == "add" && rewardPath == "" {
		return usageErr("tasks add needs --reward VERIFIER.wasm")
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	if sub == "add" {
		file := fs.Arg(0)
		var err error
		if a.Tasks, err = os.ReadFile(file); err != nil {
			return fmt.Errorf("task file: %w", err)
		}
		if a.Reward, err = os.ReadFile(rewardPath); err != nil {
			return fmt.Errorf("verifier plugin: %w", err)
		}
		if toolsPath != "" {
			if a.Tools, err = os.ReadFile(toolsPath); err != nil {
				return fmt.Errorf("tool simulator plugin: %w", err)
			}
		}
		a.Name = filepath.Base(file)
	}
	c, err := trainerClient(s)
	if err != nil {
		return err
	}
	if sub == "add" {
		ts, err := c.AddTasks(ctx, a)
		if refused(err) {
			return withHint(err, "'clawmesh tasks ls --data %s' lists the sets in the group; 'clawmesh reward test' tries a verifier", s.Data)
		}
		if err != nil {
			return err
		}
		if ts.Existing {
			fmt.Fprintf(stdout, "task set %s (sha256 %s) is there already, with the same settings: nothing changed (%s to train on, %d held out, %d/%d done)\n",
				orDash(ts.Name), shortHash(ts.Hash), plural(len(ts.Train), "prompt", "prompts"), len(ts.HeldOut), setDone(ctx, c, ts.Hash), len(ts.Train)*ts.Epochs)
			return nil
		}
		fmt.Fprintf(stdout, "task set %s added (sha256 %s): %s to train on, %d held out, %s each\n",
			ts.Name, shortHash(ts.Hash), plural(len(ts.Train), "prompt", "prompts"), len(ts.HeldOut), plural(ts.Group, "rollout", "rollouts"))
		return nil
	}
	sets, err := c.TaskSets(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, sets)
	}
	printTaskSets(stdout, sets, sub == "status")
	return nil
}

// setDone is how many of set's ledger lines are trained, as the trainer says
// (0 when it cannot say).
func setDone(ctx context.Context, c *trainer.Client, set string) int {
	sets, _ := c.TaskSets(ctx)
	for _, s := range sets {
		if s.Hash == set {
			return s.Done
		}
	}
	return 0
}

// trainerClient reaches the trainer running on s.Data.
func trainerClient(s settings) (*trainer.Client, error) {
	r, err := reachRunning(&s, "trainer", trainer.AddrFile)
	if err != nil {
		return nil, err
	}
	return &trainer.Client{Base: r.Base, HTTP: r.HTTP, Token: r.Token}, nil
}

func printTaskSets(w io.Writer, sets []trainer.TaskSetStatus, evals bool) {
	if len(sets) == 0 {
		fmt.Fprintln(w, "no task sets (add one with 'clawmesh tasks add FILE --reward VERIFIER.wasm')")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SET\tNAME\tPROMPTS\tHELD OUT\tDONE\tG\tLATEST\tPASS@1\tMEAN REWARD")
	for _, s := range sets {
		latest, pass, mean := "-", "-", "-"
		if n := len(s.Evals); n > 0 {
			e := s.Evals[n-1]
			latest, pass, mean = fmt.Sprintf("v%d", e.Version), fmt.Sprintf("%.2f", e.PassAt1), fmt.Sprintf("%+.3f", e.MeanReward)
			if e.MostlyAbstained {
				mean += fmt.Sprintf(" (verifier abstained on %d/%d)", e.Abstained, e.Prompts)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%d\t%s\t%s\t%s\n", shortHash(s.Hash), orDash(s.Name), s.Prompts, s.HeldOut,
			s.Done, s.Items, s.Group, latest, pass, mean)
	}
	tw.Flush()
	if !evals {
		return
	}
	for _, s := range sets {
		fmt.Fprintf(w, "\n%s (%s): %d assigned, %d pending; verifier %s\n", orDash(s.Name), shortHash(s.Hash), s.Assigned, s.Pending, shortHash(s.Reward))
		if len(s.Evals) == 0 {
			fmt.Fprintln(w, "  not evaluated yet")
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  VERSION\tPASS@1\tPASSED\tMEAN REWARD\tABSTAINED")
		var most []string
		for _, e := range s.Evals {
			fmt.Fprintf(tw, "  v%d\t%.2f\t%d/%d\t%+.3f\t%d/%d\n", e.Version, e.PassAt1, e.Passed, e.Prompts, e.MeanReward, e.Abstained, e.Prompts)
			if e.MostlyAbstained {
				most = append(most, fmt.Sprintf("v%d", e.Version))
			}
		}
		tw.Flush()
		if len(most) > 0 {
			fmt.Fprintf(w, "  the verifier gave no score to more than half the held-out prompts of %s: their pass@1 and mean reward\n"+
				"  (abstentions count 0) say little; check the verifier with 'clawmesh reward test'\n", strings.Join(most, ", "))
		}
	}
}
