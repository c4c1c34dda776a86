package reward

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// builtinHash is the SHA-256 of a built-in's module, as embedded.
func builtinHash(t testing.TB, name string) string {
	t.Helper()
	b, err := builtin.Module(name)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func readTestSteps(t testing.TB) map[core.StepID]*core.Step {
	t.Helper()
	f, err := os.Open("testdata/steps.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	steps, err := ReadSteps(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[core.StepID]*core.Step{}
	for i := range steps {
		out[steps[i].ID] = &steps[i]
	}
	return out
}

func newTestRunner(t testing.TB, opts Options) *Runner {
	t.Helper()
	ctx := context.Background()
	if opts.Deadline == 0 {
		// Generous: the test machine is shared; the tests assert outcomes,
		// not timings.
		opts.Deadline = 5 * time.Second
	}
	if opts.CacheDir == "" {
		opts.CacheDir = cacheDir()
	}
	r, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(ctx) })
	return r
}

// sign: +1 positive, -1 negative, 0 abstain.
func sign(s core.Score) int {
	switch {
	case s.Value == nil:
		return 0
	case *s.Value > 0:
		return 1
	case *s.Value < 0:
		return -1
	}
	return 2 // a score of exactly 0
}

func TestBuiltinsOnRecordedSteps(t *testing.T) {
	steps := readTestSteps(t)
	r := newTestRunner(t, Options{Plugins: Builtins()})
	ctx := context.Background()
	cases := []struct {
		step     core.StepID
		plugin   string
		sign     int
		wantHint bool
	}{
		{"01-correction", "correction", -1, false},
		{"01-correction", "toolerror", 0, false},
		{"01-correction", "feedback", 0, false},
		{"02-reask", "correction", -1, false},
		{"03-moved-on", "correction", 1, false},
		{"03-moved-on", "hint", 0, false},
		{"04-traceback", "toolerror", -1, true},
		{"04-traceback", "correction", 0, false},
		{"05-is-error", "toolerror", -1, true},
		{"06-tool-ok", "toolerror", 0, false},
		{"07-feedback-endpoint", "feedback", 1, true},
		{"08-slash-bad", "feedback", -1, true},
		{"08-slash-bad", "hint", 0, true},
		{"08-slash-bad", "correction", 0, false}, // explicit feedback is feedback's to score
		{"09-directive", "hint", 0, true},
		{"09-directive", "correction", -1, false},
		{"10-thumbs-up", "feedback", 1, false},
		{"10-thumbs-up", "correction", 0, false},
		{"11-exit-code", "toolerror", -1, true},
		{"12-no-next", "correction", 0, false},
		{"12-no-next", "hint", 0, false},
	}
	for _, c := range cases {
		s := steps[c.step]
		if s == nil {
			t.Fatalf("no step %s in testdata", c.step)
		}
		sc, _ := r.ScorePlugin(ctx, c.plugin, s)
		if got := sign(sc); got != c.sign {
			t.Errorf("%s/%s: sign %d, want %d (score %+v)", c.step, c.plugin, got, c.sign, sc)
		}
		if (sc.Hint != "") != c.wantHint {
			t.Errorf("%s/%s: hint %q, want hint: %v", c.step, c.plugin, sc.Hint, c.wantHint)
		}
		if sc.Hash != builtinHash(t, c.plugin) || sc.Plugin != c.plugin {
			t.Errorf("%s/%s: score not attributed (want the hash %s): %+v", c.step, c.plugin, builtinHash(t, c.plugin), sc)
		}
		t.Logf("%s/%s: %v %q %q", c.step, c.plugin, fmtVal(sc.Value), sc.Reason, sc.Hint)
	}
}

func fmtVal(v *float64) any {
	if v == nil {
		return "abstain"
	}
	return *v
}
