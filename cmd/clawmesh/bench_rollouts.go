package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/clawmesh/clawmesh/reward"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// benchCharsetVerifier is the verifier `bench rollouts` builds when it is
// given none: a task's answer is a set of characters, a reply made of them
// only scores +1, any other the share of its characters in the set less 1
// (partial credit, so that GRPO groups differ from the start).
const benchCharsetVerifier = `package main

import (
	"strings"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func score(in *rewards.Input) rewards.Result {
	if in.Task == nil {
		return rewards.Abstain("not a task rollout")
	}
	allowed, reply := in.AnswerText(), strings.TrimSpace(in.Action.Content)
	if reply == "" {
		return rewards.Score(-1)
	}
	ok, all := 0, 0
	for _, r := range reply {
		all++
		if strings.ContainsRune(allowed, r) {
			ok++
		}
	}
	if ok == all {
		return rewards.Score(1)
	}
	return rewards.Score(float64(ok)/float64(all) - 1)
}

func main() {}
`

// benchLetterTasks is the task set `bench rollouts` trains on when it is
// given none: n prompts asking for lower-case words, each answered by the
// characters a reply may use.
func benchLetterTasks(n, maxTokens int) []byte {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":"w%03d","messages":[{"role":"user","content":"Answer in lower-case words only. Item %d."}],"answer":"abcdefghijklmnopqrstuvwxyz ","meta":{"max_tokens":%d}}`+"\n", i, i, maxTokens)
	}
	return []byte(b.String())
}

// buildBenchVerifier scaffolds and builds the charset verifier in dir.
func buildBenchVerifier(ctx context.Context, dir string) ([]byte, error) {
	if _, err := exec.LookPath("go"); err != nil {
		return nil, fmt.Errorf("bench rollouts builds its verifier with the go command, which is not on PATH: give one with --reward")
	}
	src := filepath.Join(dir, "charset")
	if err := reward.ScaffoldVerifier(src, "charset"); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(benchCharsetVerifier), 0o644); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(src, "main_test.go"))
	out, err := reward.Build(ctx, src, "", io.Discard)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

func benchRollouts(ctx context.Context, stdout io.Writer, o harness.RolloutBenchOptions, tasksFile, rewardFile string, maxTokens int, asJSON bool) error {
	dir, err := os.MkdirTemp("", "clawmesh-bench-rollouts-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o.Dir = filepath.Join(dir, "versions")
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	if tasksFile != "" {
		if o.Tasks, err = os.ReadFile(tasksFile); err != nil {
			return fmt.Errorf("task file: %w", err)
		}
	} else {
		o.Tasks = benchLetterTasks(max(40, o.Prompts*o.Rounds*5/4), maxTokens)
	}
	if rewardFile != "" {
		if o.Verifier, err = os.ReadFile(rewardFile); err != nil {
			return fmt.Errorf("verifier plugin: %w", err)
		}
	} else if o.Verifier, err = buildBenchVerifier(ctx, dir); err != nil {
		return err
	}
	rep, err := harness.BenchRollouts(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, rep)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSAMPLES\tTOKENS\tROLLOUT S\tTRAIN S\tROLLOUT SHARE\tMEAN REWARD\tFLAT GROUPS\tHELD-OUT PASS@1")
	for _, r := range rep.Rounds {
		fmt.Fprintf(tw, "v%d\t%d\t%d\t%.3f\t%.3f\t%.0f%%\t%+.3f\t%d\t%.2f\n", r.Version, r.Samples, r.Tokens, r.RolloutSeconds, r.TrainSeconds,
			100*r.RolloutShare, r.MeanReward, r.FlatGroups, r.HeldOutPassAt1)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "rollouts: %.0f tokens/s (sampled, scored by the verifier, made into steps) against %.0f tokens/s of the engine's raw sampling of the same prompts: %.2fx\n",
		rep.RolloutTokensPerS, rep.RawTokensPerS, rep.VsRaw)
	fmt.Fprintf(stdout, "a round: %.0f%% rollouts, %.0f%% training (%.2f s and %.2f s over %d rounds)\n",
		100*rep.RolloutShare, 100*(1-rep.RolloutShare), rep.RolloutSeconds, rep.TrainSeconds, len(rep.Rounds))
	return nil
}
