package reward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

// KitModule is the kit's module path; scaffolded plugins import it and
// replace it with their own copy.
const KitModule = "github.com/clawmesh/clawmesh/wasm-rewards"

// Errors of the plugin author's tooling.
var (
	ErrExists   = errors.New("reward: already exists")
	ErrBadName  = errors.New("reward: bad plugin name")
	ErrBadSteps = errors.New("reward: bad steps")
)

// MaxStepLine is the longest JSONL line ReadSteps accepts.
const MaxStepLine = 64 << 20

// ReadSteps reads steps in the JSONL form `clawmesh pool export` writes (a
// core.ExportedStep per line). Blank lines are skipped; a line that is not a
// step of the known schema fails with its line number.
func ReadSteps(r io.Reader) ([]core.Step, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxStepLine)
	var out []core.Step
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		s, err := DecodeStep(b)
		if err != nil {
			return out, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("%w: %v", ErrBadSteps, err)
	}
	return out, nil
}

// DecodeStep decodes one exported step line.
func DecodeStep(b []byte) (core.Step, error) {
	var e core.ExportedStep
	if err := json.Unmarshal(b, &e); err != nil {
		return core.Step{}, fmt.Errorf("%w: %v", ErrBadSteps, err)
	}
	if e.Schema != "" && e.Schema != core.SchemaVersion {
		return core.Step{}, fmt.Errorf("%w: schema %q, want %q", ErrBadSteps, e.Schema, core.SchemaVersion)
	}
	if e.State == core.StateUnknown {
		e.State = core.StateClosed
	}
	if err := e.Step.Validate(); err != nil {
		return core.Step{}, fmt.Errorf("%w: %v", ErrBadSteps, err)
	}
	return e.Step, nil
}

var validName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

// Scaffold writes a new Go plugin called name into dir (which must not
// exist or be empty): go.mod, main.go, and under kit/ a copy of the
// wasm-rewards kit that go.mod's replace directive points at, so the plugin
// builds offline with nothing but a Go toolchain (≥ 1.24).
func Scaffold(dir, name string) error { return scaffold(dir, name, false) }

// ScaffoldVerifier is Scaffold for a verifier plugin: one that scores a
// rollout of a task set against the task's answer (input.task), for
// `clawmesh tasks add --reward`.
func ScaffoldVerifier(dir, name string) error { return scaffold(dir, name, true) }

func scaffold(dir, name string, verifier bool) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("%w %q: use lower-case letters, digits, - and _", ErrBadName, name)
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%w: %s is not empty", ErrExists, dir)
	}
	files := map[string]string{
		"go.mod":          fmt.Sprintf(scaffoldGoMod, name, KitModule, KitModule),
		"main.go":         fmt.Sprintf(scaffoldMain, name, name, name, KitModule),
		"main_test.go":    fmt.Sprintf(scaffoldTest, KitModule),
		"kit/go.mod":      fmt.Sprintf("module %s\n\ngo 1.24\n", KitModule),
		"README.md":       fmt.Sprintf(scaffoldReadme, name, name, name, name),
		"testdata/.keep":  "",
		"kit/README.md":   "A copy of the clawmesh reward plugin kit (wasm-rewards), written by `clawmesh reward new`.\nThe plugin's go.mod replaces the kit's module path with this directory, so it builds offline.\n",
		"kit/ABI_VERSION": fmt.Sprintf("%d\n", rewards.ABIVersion),
	}
	if verifier {
		files["main.go"] = fmt.Sprintf(verifierMain, name, name, KitModule)
		files["main_test.go"] = fmt.Sprintf(verifierTest, KitModule)
		files["README.md"] = fmt.Sprintf(verifierReadme, name, name, name)
	}
	err := fs.WalkDir(rewards.Source(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(rewards.Source(), p)
		files["kit/"+p] = string(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("reward: scaffold: %w", err)
	}
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("reward: scaffold: %w", err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return fmt.Errorf("reward: scaffold: %w", err)
		}
	}
	return nil
}

const scaffoldGoMod = `module %s

go 1.24

require %s v0.0.0

replace %s => ./kit
`

const scaffoldMain = `// Command %s is a clawmesh reward plugin.
//
// Build it with "clawmesh reward build ." (or
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o %s.wasm)
// and try it with "clawmesh reward test %s.wasm --steps steps.jsonl".
package main

import (
	"strings"

	rewards "%s"
)

func init() { rewards.Register(score) }

// score looks at one step: in.Context is what the model saw, in.Action what
// it answered, in.NextState what followed (nil if nothing did).
func score(in *rewards.Input) rewards.Result {
	next := strings.ToLower(in.NextUser())
	switch {
	case next == "":
		return rewards.Abstain("no user reply")
	case strings.Contains(next, "thank"):
		return rewards.Score(0.5).WithLabels("thanked")
	case strings.HasPrefix(next, "please") || strings.Contains(next, " please"):
		return rewards.Abstain("a polite request").WithHint("The user asks politely; answer in kind.")
	}
	return rewards.Abstain("no signal")
}

// main is not called: the node calls the exports the kit defines.
func main() {}
`

const scaffoldTest = `package main

import (
	"encoding/json"
	"testing"

	rewards "%s"
)

func TestScore(t *testing.T) {
	in := []byte(` + "`" + `{"context":[{"role":"user","content":"hi"}],"action":{"role":"assistant","content":"hello"},"next_state":[{"role":"user","content":"thanks!"}],"meta":{"turn":"main"}}` + "`" + `)
	var res rewards.Result
	if err := json.Unmarshal(rewards.Handle(in), &res); err != nil {
		t.Fatal(err)
	}
	if res.Score == nil || *res.Score <= 0 {
		t.Fatalf("score = %%v, want > 0 (%%s)", res.Score, res.Reason)
	}
}
`

const scaffoldReadme = "# %s\n\nA clawmesh reward plugin.\n\n" +
	"```sh\n" +
	"go test ./...                                           # the logic, natively\n" +
	"clawmesh reward build .                                 # -> %s.wasm\n" +
	"clawmesh reward test %s.wasm --steps steps.jsonl        # steps from `clawmesh pool export`\n" +
	"```\n\nThen in the node's config:\n\n" +
	"```toml\n[[plugins]]\npath = \"/path/to/%s.wasm\"\nweight = 1.0\nenabled = true\n```\n"

// Build compiles the Go plugin in dir to out (default: <dir>/<base of
// dir>.wasm) with the go command on PATH, and returns the output path.
func Build(ctx context.Context, dir, out string, stderr io.Writer) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if out == "" {
		out = filepath.Join(abs, filepath.Base(abs)+".wasm")
	}
	if out, err = filepath.Abs(out); err != nil {
		return "", err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("reward: build: the go toolchain (≥ 1.24) is needed on PATH: %w", err)
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-buildmode=c-shared", "-trimpath", "-o", out, ".")
	cmd.Dir = abs
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("reward: build %s: %w", dir, err)
	}
	return out, nil
}

// StepResult is one step scored by `clawmesh reward test`.
type StepResult struct {
	Step   core.StepID
	Plugin string
	Score  core.Score
	Took   time.Duration
}

// TestPlugins scores every step with every plugin of r, enabled or not, in
// order, and calls report for each result.
func TestPlugins(ctx context.Context, r *Runner, steps []core.Step, report func(StepResult)) {
	for i := range steps {
		for _, c := range r.Plugins() {
			sc, took := r.ScorePlugin(ctx, c.Name, &steps[i])
			report(StepResult{Step: steps[i].ID, Plugin: c.Name, Score: sc, Took: took})
		}
	}
}
