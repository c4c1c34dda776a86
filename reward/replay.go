package reward

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// What a peer that checks a score holds is the step as it left the device,
// the score's plugin name and the hash of its module: nothing of the
// plugin's config and no way to ask the device's LLM. Replay runs a plugin
// as such a peer can; Rescore makes a device's scores ones such a peer can
// replay. See RATIONALE.md, "Scores a trainer can replay".

// Replayed is one plugin's run on a step as a replay sees it.
type Replayed struct {
	// Score is the plugin's score, its name and module hash filled in.
	Score core.Score
	// Judged says the plugin asked the LLM judge. A replay refuses judge
	// calls (no peer but the device can ask its LLM), so Score is then the
	// plugin's answer to a judge that failed, not its verdict.
	Judged bool
	// Failed says the plugin gave no verdict: it could not be loaded or
	// was set aside, its input was over the limit, or the call trapped,
	// exited or ran out of time. Score.Reason says which.
	Failed bool
}

// ReplayOptions say how Replay shows the step to the plugin.
type ReplayOptions struct {
	// NoConfig leaves meta.config out of the input, as a peer that knows
	// only the plugin's name and module runs it.
	NoConfig bool
}

type replayState struct{ judged bool }

type replayKey struct{}

func replayOf(ctx context.Context) *replayState {
	rs, _ := ctx.Value(replayKey{}).(*replayState)
	return rs
}

// Replay runs the plugin named name of the current set (enabled or not) on
// step, refusing its judge calls, and says whether what it returned is a
// verdict that a replay elsewhere can reproduce.
func (r *Runner) Replay(ctx context.Context, name string, step *core.Step, o ReplayOptions) Replayed {
	s, err := r.acquire()
	if err != nil {
		return Replayed{Score: core.Score{Plugin: name, Reason: ErrClosed.Error()}, Failed: true}
	}
	defer s.release()
	p := s.all[name]
	if p == nil {
		return Replayed{Score: core.Score{Plugin: name, Reason: fmt.Sprintf("%v %q", ErrUnknownPlugin, name)}, Failed: true}
	}
	return p.replay(ctx, newInput(step), o)
}

func (p *plugin) replay(ctx context.Context, in *input, o ReplayOptions) Replayed {
	c := p.cfg
	if o.NoConfig {
		c.Config = nil
	}
	rs := &replayState{}
	sc, failed := p.run(context.WithValue(ctx, replayKey{}, rs), in, c)
	return Replayed{Score: sc, Judged: rs.judged, Failed: failed}
}

// Rescore scores step again with the enabled plugins of the current set,
// so that every score of the result is one a peer holding only step, the
// plugin's name and its module can check by replaying it (Replay with
// NoConfig), or else a judge's verdict, which no peer can replay:
//
//   - a plugin that gives no verdict on step (Replayed.Failed) is left out:
//     a failure is the host's state, not something the step determines;
//   - a plugin whose verdict with its config differs from its verdict
//     without (a different value, abstention or hint) is left out: the
//     config does not leave the device;
//   - a plugin that asks the judge keeps the score it already has in
//     step.Reward (the same plugin name and module hash), and is left out
//     if it has none: the judge is not asked again.
//
// Judge calls are refused throughout. The scores are combined as Score
// does; the reward is stamped with the runner's clock.
func (r *Runner) Rescore(ctx context.Context, step *core.Step) core.Reward {
	s, err := r.acquire()
	if err != nil {
		return core.Reward{Scores: []core.Score{}, At: r.opts.Now()}
	}
	defer s.release()
	in := newInput(step)
	scores := make([]core.Score, 0, len(s.plugins))
	for _, p := range s.plugins {
		got := p.replay(ctx, in, ReplayOptions{})
		if got.Failed {
			continue
		}
		if len(p.cfg.Config) > 0 {
			bare := p.replay(ctx, in, ReplayOptions{NoConfig: true})
			if bare.Failed || bare.Judged != got.Judged || !SameVerdict(bare.Score, got.Score, 0) {
				continue
			}
		}
		if got.Judged {
			prior, ok := priorScore(step, got.Score)
			if !ok {
				continue
			}
			got.Score = prior
		}
		scores = append(scores, got.Score)
	}
	return Combine(scores, r.opts.Now())
}

// priorScore finds in step's reward the score of the plugin that made sc.
func priorScore(step *core.Step, sc core.Score) (core.Score, bool) {
	if step.Reward == nil || sc.Hash == "" {
		return core.Score{}, false
	}
	for _, x := range step.Reward.Scores {
		if x.Plugin == sc.Plugin && x.Hash == sc.Hash {
			x.Weight = sc.Weight
			return x, true
		}
	}
	return core.Score{}, false
}

// SameVerdict reports whether two scores give the same verdict: both
// abstain or both have values within tol of each other, and their hints
// are the same. Labels and reasons are notes, not verdicts.
func SameVerdict(a, b core.Score, tol float64) bool {
	if (a.Value == nil) != (b.Value == nil) || a.Hint != b.Hint {
		return false
	}
	if a.Value == nil {
		return true
	}
	d := *a.Value - *b.Value
	return d <= tol && -d <= tol
}

// maxModules bounds the modules a runner remembers for Module.
const maxModules = 256

// remember notes the modules of set s for Module.
func (r *Runner) remember(s *set) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mods == nil || len(r.mods)+len(s.all) > maxModules {
		r.mods = make(map[string]PluginConfig, len(s.all))
	}
	for _, p := range s.all {
		if p.hash != "" {
			r.mods[p.hash] = p.cfg
		}
	}
}

// Module returns the bytes of a plugin module the runner has loaded (in its
// current set or an earlier one), by the hex sha256 of the bytes (a
// Score.Hash). A plugin file that has changed since it was loaded no longer
// has the module; the error then, as for a hash the runner never loaded,
// wraps ErrUnknownPlugin.
func (r *Runner) Module(hash string) ([]byte, error) {
	r.mu.Lock()
	c, ok := r.mods[hash]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: no module with hash %q", ErrUnknownPlugin, hash)
	}
	var bin []byte
	var err error
	if c.Builtin != "" {
		bin, err = builtin.Module(c.Builtin)
	} else {
		bin, err = os.ReadFile(c.Path)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: module %s (plugin %q): %v", ErrUnknownPlugin, hash, c.Name, err)
	}
	sum := sha256.Sum256(bin)
	if hex.EncodeToString(sum[:]) != hash {
		return nil, fmt.Errorf("%w: module %s: %s has changed since plugin %q was loaded", ErrUnknownPlugin, hash, c.Path, c.Name)
	}
	return bin, nil
}
