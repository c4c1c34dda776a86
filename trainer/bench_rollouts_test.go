package trainer_test

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/harness"
)

// TestBenchRollouts runs harness.BenchRollouts small (here, beside the
// task set and the verifier plugin the tests of package trainer build).
func TestBenchRollouts(t *testing.T) {
	rep, err := harness.BenchRollouts(context.Background(), harness.RolloutBenchOptions{Tasks: trainer.LetterTasks(20), Verifier: trainer.CharsetPlugin(t), Group: 4, Prompts: 4, Rounds: 2, LocalSteps: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if len(rep.Rounds) != 2 || rep.RolloutTokens == 0 || !(rep.RolloutTokensPerS > 0) || !(rep.RawTokensPerS > 0) ||
		!(rep.RolloutShare > 0 && rep.RolloutShare < 1) || rep.Rounds[0].Samples != 16 {
		t.Fatalf("report %+v", rep)
	}
}
