package verify_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/trainer/verify"
	"github.com/clawmesh/clawmesh/wasm-rewards/builtin"
)

// world is a device that scored and sealed the recorded steps, a mesh in
// which its node serves the plugins, and a checker on the trainer's side
// that fetches through the mesh.
type world struct {
	dev    *device
	mp     *meshPair
	fetch  *countingFetch
	cache  string
	honest *batch.Batch
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{dev: newDevice(t), cache: t.TempDir()}
	w.dev.record(t, recordedSteps(t)...)
	w.mp = newMeshPair(t, runnerPlugins{w.dev.runner})
	w.fetch = &countingFetch{fetch: w.mp.trainer.Mesh.FetchPlugin}
	_, w.honest = seal(t, w.dev.out)
	return w
}

func (w *world) checker(t *testing.T, cfg verify.Config) *verify.Checker {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = w.cache
	}
	if cfg.CompileDir == "" {
		cfg.CompileDir = compileCache()
	}
	if cfg.Fetch == nil {
		cfg.Fetch = w.fetch.Fetch
	}
	if cfg.Seed == 0 {
		cfg.Seed = 42
	}
	c, err := verify.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func (w *world) check(t *testing.T, c *verify.Checker, b *batch.Batch) verify.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Check(ctx, b, w.mp.node.Mesh.ID())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestVerify: the batch an honest device seals is verified, its plugins
// fetched from its node over the mesh once and then taken from the cache
// (the disk cache too, by a new checker); a forged score, a forged
// combined reward and a score of a plugin that fails on the step are each
// refused, naming the step and the plugin; judge scores are counted, not
// replayed.
func TestVerify(t *testing.T) {
	w := newWorld(t)
	all := len(w.honest.Steps)
	c := w.checker(t, verify.Config{Sample: all})

	res := w.check(t, c, w.honest)
	if !res.Verified || res.Err != nil {
		t.Fatalf("honest batch refused: %s", res.Reason)
	}
	plugins := len(w.honest.Header.Plugins)
	if res.Fetched != plugins || w.fetch.count() != plugins {
		t.Errorf("fetched %d modules (%d fetches) for %d plugins", res.Fetched, w.fetch.count(), plugins)
	}
	if len(res.Sampled) != all || res.Replayed == 0 || res.Judged == 0 {
		t.Errorf("sampled %d of %d steps, %d scores replayed, %d judged", len(res.Sampled), all, res.Replayed, res.Judged)
	}
	if w.dev.judged == 0 {
		t.Fatal("the device's judge was never asked: the judge scores are not the device's")
	}
	// Again: nothing fetched. A new checker on the same cache: nothing
	// fetched either.
	if res := w.check(t, c, w.honest); !res.Verified || res.Fetched != 0 {
		t.Fatalf("second check: %+v", res)
	}
	if res := w.check(t, w.checker(t, verify.Config{Sample: all}), w.honest); !res.Verified || res.Fetched != 0 {
		t.Fatalf("a new checker on the cache: %+v", res)
	}
	if n := w.fetch.count(); n != plugins {
		t.Fatalf("%d fetches in all, want %d", n, plugins)
	}

	withHint := func(sc core.Score) bool { return sc.Hint != "" }
	negative := func(sc core.Score) bool { return sc.Value != nil && *sc.Value < 0 }
	cases := []struct {
		name   string
		plugin string
		pick   func(core.Score) bool
		edit   func(s *core.Step, i int)
		want   error
		reason string
	}{
		{"a score's value changed", "correction", negative, func(s *core.Step, i int) {
			*s.Reward.Scores[i].Value = 1
			recombine(s)
		}, verify.ErrScore, "recorded 1, replay gives -0.8"},
		{"an abstention made a value", "hint", withHint, func(s *core.Step, i int) {
			s.Reward.Scores[i].Value = f64(0.5)
			recombine(s)
		}, verify.ErrScore, "recorded 0.5"},
		{"a hint changed", "hint", withHint, func(s *core.Step, i int) {
			s.Reward.Scores[i].Hint = "always agree with the user"
			recombine(s)
		}, verify.ErrScore, "always agree"},
		{"the combined reward changed", "correction", negative, func(s *core.Step, i int) {
			s.Reward.Value = f64(1)
		}, verify.ErrCombined, "its scores make"},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			forged := reencode(t, cloneBatch(t, w.honest), func(steps []*core.Step) {
				for _, s := range steps {
					for i, sc := range s.Reward.Scores {
						if sc.Plugin == k.plugin && k.pick(sc) {
							k.edit(s, i)
							return
						}
					}
				}
				t.Fatalf("no step scored by %s to forge", k.plugin)
			})
			res := w.check(t, c, forged)
			if res.Verified || !errors.Is(res.Err, k.want) || !strings.Contains(res.Reason, k.reason) {
				t.Fatalf("%+v; want %v with %q", res, k.want, k.reason)
			}
			if res.Step == "" || !strings.Contains(res.Reason, string(res.Step)) {
				t.Errorf("the reason does not name the step: %q", res.Reason)
			}
			if k.want == verify.ErrScore && (res.Plugin != k.plugin || !strings.Contains(res.Reason, k.plugin)) {
				t.Errorf("the reason does not name the plugin %s: %q", k.plugin, res.Reason)
			}
		})
	}

	// A score of a plugin that fails on the step (an honest device leaves
	// such a score out): refused.
	t.Run("a plugin that fails", func(t *testing.T) {
		target, _ := stepWith(w.honest, "contact", nil)
		forged := reencode(t, cloneBatch(t, w.honest), func(steps []*core.Step) {
			for _, x := range steps {
				if x.ID == target.ID {
					x.Response.Choices[0].Message.Content = "trap"
				}
			}
		})
		res := w.check(t, c, forged)
		if res.Verified || !errors.Is(res.Err, verify.ErrUnusable) || res.Plugin != "contact" || res.Step != target.ID {
			t.Fatalf("%+v", res)
		}
	})
}

// TestScrubbedStepNotRefused: the device scored the step with an e-mail
// address before scrubbing, and the plugin reads the address. The batch
// the outbox seals carries the scores made again on the scrubbed step, and
// is verified; had the scores made before scrubbing left as they were,
// the same check would have refused the batch for a score it could not
// reproduce; and a score forged on that step is refused.
func TestScrubbedStepNotRefused(t *testing.T) {
	w := newWorld(t)
	c := w.checker(t, verify.Config{Sample: len(w.honest.Steps)})

	s, i := addressStep(w.honest)
	if s == nil {
		t.Fatal("the scrubbed e-mail step is not in the batch, or its address was not scrubbed")
	}
	if sc := s.Reward.Scores[i]; *sc.Value != -1 || sc.Hint != "" {
		t.Fatalf("the shipped contact score is %+v, want -1 made on the scrubbed reply", sc)
	}
	pre, _ := w.dev.pool.Get(context.Background(), "13-address")
	if got := preScore(pre, "contact"); got == nil || *got.Value != 1 {
		t.Fatalf("before scrubbing contact scored %+v: the test needs a verdict scrubbing changes", got)
	}
	if res := w.check(t, c, w.honest); !res.Verified {
		t.Fatalf("refused: %s", res.Reason)
	}

	// The scores made before scrubbing, shipped as they were: refused,
	// though the device is honest. This is what scoring again prevents.
	_, raw := seal(t, w.dev.raw)
	res := w.check(t, c, raw)
	if res.Verified || !errors.Is(res.Err, verify.ErrScore) || res.Plugin != "contact" {
		t.Fatalf("pre-scrub scores: %+v", res)
	}

	// A score forged on the scrubbed step: refused.
	forged := reencode(t, cloneBatch(t, w.honest), func(steps []*core.Step) {
		for _, x := range steps {
			if x.ID == s.ID {
				*x.Reward.Scores[i].Value = 1
				recombine(x)
			}
		}
	})
	res = w.check(t, c, forged)
	if res.Verified || !errors.Is(res.Err, verify.ErrScore) || res.Step != s.ID || res.Plugin != "contact" {
		t.Fatalf("forged: %+v", res)
	}
}

// TestPluginUnavailable: a score naming a module its announcer cannot
// serve is refused with "plugin unavailable", as is one whose module a
// peer sends with other bytes; neither is cached.
func TestPluginUnavailable(t *testing.T) {
	w := newWorld(t)
	c := w.checker(t, verify.Config{Sample: len(w.honest.Steps)})
	unknown := sha([]byte("a module nobody has"))
	forged := reencode(t, cloneBatch(t, w.honest), func(steps []*core.Step) {
		s := steps[0]
		s.Reward.Scores = append(s.Reward.Scores, core.Score{Plugin: "secret", Hash: unknown, Value: f64(1), Weight: 1})
		recombine(s)
	})
	res := w.check(t, c, forged)
	if res.Verified || !errors.Is(res.Err, verify.ErrUnavailable) || !strings.Contains(res.Reason, "plugin unavailable") ||
		res.Hash != unknown || res.Plugin != "secret" || !errors.Is(res.Err, verify.ErrUnavailable) {
		t.Fatalf("%+v", res)
	}
	if !strings.Contains(res.Reason, mesh.ErrNoPlugin.Error()) {
		t.Errorf("reason %q does not say the peer has no such module", res.Reason)
	}

	// A member that answers with the bytes of another module.
	liar := w.mp.join(t, member.RoleMember)
	other, _ := builtin.Module("hint")
	liar.Host.Handle(mesh.ProtoPlugin, func(s mesh.Stream) {
		defer s.Close()
		br := bufio.NewReader(s)
		n, _ := binary.ReadUvarint(br)
		io.CopyN(io.Discard, br, int64(min(n, 1024)))
		rep, _ := json.Marshal(map[string]any{"status": "ok", "size": len(other)})
		s.Write(append(binary.AppendUvarint(nil, uint64(len(rep))), rep...))
		s.Write(other)
	})
	fresh := w.checker(t, verify.Config{CacheDir: t.TempDir(), Fetch: w.mp.trainer.Mesh.FetchPlugin})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for deadline := time.Now().Add(20 * time.Second); !w.mp.trainer.Mesh.Admitted(liar.Mesh.ID()); {
		if time.Now().After(deadline) {
			t.Fatal("the trainer did not admit the liar")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := fresh.Check(ctx, w.honest, liar.Mesh.ID())
	if err != nil {
		t.Fatal(err)
	}
	if res.Verified || !errors.Is(res.Err, verify.ErrUnavailable) || !strings.Contains(res.Reason, mesh.ErrPluginHash.Error()) {
		t.Fatalf("wrong bytes: %+v", res)
	}
	// The honest node then serves them: verified.
	if res, err := fresh.Check(ctx, w.honest, w.mp.node.Mesh.ID()); err != nil || !res.Verified {
		t.Fatalf("after the liar: %+v, %v", res, err)
	}
}

// TestSample: the sample is Config.Sample steps, the same for the same
// seed and batch, another for another seed.
func TestSample(t *testing.T) {
	w := newWorld(t)
	a := w.check(t, w.checker(t, verify.Config{Sample: 3, Seed: 1}), w.honest)
	b := w.check(t, w.checker(t, verify.Config{Sample: 3, Seed: 1}), w.honest)
	if !a.Verified || len(a.Sampled) != 3 || !slices.Equal(a.Sampled, b.Sampled) {
		t.Fatalf("samples %v and %v", a.Sampled, b.Sampled)
	}
	differs := false
	for seed := uint64(2); seed < 12 && !differs; seed++ {
		c := w.check(t, w.checker(t, verify.Config{Sample: 3, Seed: seed}), w.honest)
		differs = !slices.Equal(c.Sampled, a.Sampled)
	}
	if !differs {
		t.Fatal("ten other seeds all picked the same sample")
	}
	for _, bad := range []verify.Config{{}, {CacheDir: w.cache, Sample: -1}, {CacheDir: w.cache, Tolerance: -1}} {
		if _, err := verify.New(bad); !errors.Is(err, verify.ErrConfig) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

func cloneBatch(t *testing.T, b *batch.Batch) *batch.Batch {
	t.Helper()
	payload, err := batch.Encode(batch.Meta{Created: b.Header.Created, Policy: b.Header.Policy}, b.Steps)
	if err != nil {
		t.Fatal(err)
	}
	out, err := batch.Decode(payload, batch.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func scoreOf(s *core.Step, plugin string) int {
	if s.Reward == nil {
		return -1
	}
	for i, sc := range s.Reward.Scores {
		if sc.Plugin == plugin {
			return i
		}
	}
	return -1
}

// addressStep finds the step whose reply gave an address, scrubbed, and
// the index of its contact score.
func addressStep(b *batch.Batch) (*core.Step, int) {
	for _, s := range b.Steps {
		if strings.Contains(s.Action().Content, "<EMAIL_1>") {
			return s, scoreOf(s, "contact")
		}
	}
	return nil, -1
}

func preScore(s *core.Step, plugin string) *core.Score {
	if s == nil || s.Reward == nil {
		return nil
	}
	for i := range s.Reward.Scores {
		if s.Reward.Scores[i].Plugin == plugin {
			return &s.Reward.Scores[i]
		}
	}
	return nil
}
