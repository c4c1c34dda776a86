package trainer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/chat"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/tokenizer"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/learn"
	"github.com/clawmesh/clawmesh/trainer/sample"
)

// Engines and devices a trainer accepts.
const (
	EngineNative = "native"
	EngineTorch  = "torch"
	DeviceCPU    = "cpu"
	DeviceCUDA   = "cuda"
)

// ErrEngine reports an engine or device this trainer cannot run.
var ErrEngine = errors.New("trainer: engine unavailable")

// worker trains shares of rounds: it holds the base model and its engine,
// made once the group's configuration is known.
type worker struct {
	log *slog.Logger

	mu       sync.Mutex // one training at a time
	cfg      group.Config
	eng      engine.Engine
	builder  *sample.Builder
	tok      *tokenizer.Tokenizer
	render   chat.Renderer
	baseDir  string // --base DIR ("" for tiny)
	engineID string
	// device, gpus, gradCheckpoint and python configure the torch engine.
	device         string
	gpus           int
	gradCheckpoint bool
	python         string
}

// checkEngine refuses an engine and device this trainer cannot run; for
// the torch engine it finds a Python with PyTorch (returned, for the
// worker) and, for CUDA, a GPU.
func checkEngine(ctx context.Context, name, device string, gpus int) (python string, err error) {
	switch {
	case name != "" && name != EngineNative && name != EngineTorch:
		return "", fmt.Errorf("%w: unknown engine %q (native or torch)", ErrEngine, name)
	case device != "" && device != DeviceCPU && device != DeviceCUDA:
		return "", fmt.Errorf("%w: unknown device %q (cpu or cuda)", ErrEngine, device)
	case gpus < 0 || gpus > 1 && (name != EngineTorch || device != DeviceCUDA):
		return "", fmt.Errorf("%w: %d GPUs: several GPUs need --engine torch --device cuda", ErrEngine, gpus)
	case name != EngineTorch && device == DeviceCUDA:
		return "", fmt.Errorf("%w: the native engine runs on the CPU; CUDA needs --engine torch", ErrEngine)
	case name != EngineTorch:
		return "", nil
	}
	env, err := torch.Probe(ctx, "")
	if errors.Is(err, torch.ErrUnavailable) {
		return "", fmt.Errorf("%w: --engine torch needs PyTorch, which %s cannot import; %s", ErrEngine,
			strings.Join(torch.Candidates(), " and "), torch.HowToInstall)
	}
	if err != nil {
		return "", err
	}
	if device == DeviceCUDA && !env.CUDA {
		return "", fmt.Errorf("%w: torch %s (%s) sees no CUDA device; use --device cpu or install a CUDA build of PyTorch", ErrEngine, env.Torch, env.Python)
	}
	if device == DeviceCUDA && max(gpus, 1) > env.GPUs {
		return "", fmt.Errorf("%w: %d GPUs asked for, torch sees %d", ErrEngine, gpus, env.GPUs)
	}
	return env.Python, nil
}

// BaseID names a base model as the group's configuration records it:
// "tiny", or a model directory's name with the SHA-256 of its weights: of
// model.safetensors, or, for weights split in shards as larger models are
// published (model.safetensors.index.json), of the list of the shards'
// names and SHA-256s in name order. A directory's hash is computed once per
// process while its files keep their sizes and modification times.
func BaseID(base string) (name, hash string, err error) {
	if base == "" || base == group.DefaultBase {
		return group.DefaultBase, "", nil
	}
	h, err := weightsHash(base)
	if err != nil {
		return "", "", fmt.Errorf("trainer: base model %s: %w", base, err)
	}
	return filepath.Base(filepath.Clean(base)), h, nil
}

// weightsHashes remembers weightsHash's results by the weights' files,
// sizes and modification times.
var weightsHashes sync.Map // string → string

func weightsHash(dir string) (string, error) {
	files := []string{"model.safetensors"}
	single := true
	if _, err := os.Stat(filepath.Join(dir, files[0])); errors.Is(err, fs.ErrNotExist) {
		data, ierr := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
		if errors.Is(ierr, fs.ErrNotExist) {
			return "", fmt.Errorf("no model.safetensors, nor model.safetensors.index.json for sharded weights")
		}
		if ierr != nil {
			return "", ierr
		}
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &index); err != nil {
			return "", fmt.Errorf("model.safetensors.index.json: %w", err)
		}
		files = files[:0]
		for _, f := range index.WeightMap {
			if f != filepath.Base(f) || f == "." || f == ".." {
				return "", fmt.Errorf("model.safetensors.index.json names a shard outside the directory: %q", f)
			}
			if !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		if len(files) == 0 {
			return "", fmt.Errorf("model.safetensors.index.json lists no shard")
		}
		slices.Sort(files)
		single = false
	} else if err != nil {
		return "", err
	}
	var key strings.Builder
	for _, f := range files {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&key, "%s\x00%d\x00%d\n", filepath.Join(dir, f), fi.Size(), fi.ModTime().UnixNano())
	}
	if h, ok := weightsHashes.Load(key.String()); ok {
		return h.(string), nil
	}
	var list strings.Builder
	var h string
	for _, f := range files {
		fh, err := fileHash(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		h = fh
		fmt.Fprintf(&list, "%s %s\n", fh, f)
	}
	if !single {
		sum := sha256.Sum256([]byte(list.String()))
		h = hex.EncodeToString(sum[:])
	}
	weightsHashes.Store(key.String(), h)
	return h, nil
}

// ready makes the engine for cfg if it is not made yet. It refuses a
// configuration whose base is not the one this trainer was given.
func (w *worker) ready(ctx context.Context, cfg group.Config) error {
	if w.eng != nil {
		if cfg.Base != w.cfg.Base || cfg.Seed != w.cfg.Seed || cfg.BaseHash != w.cfg.BaseHash {
			return fmt.Errorf("trainer: the group's base changed under a running engine")
		}
		w.cfg = cfg
		return nil
	}
	name, hash, err := BaseID(w.baseDir)
	if err != nil {
		return err
	}
	if name != cfg.Base || hash != cfg.BaseHash {
		return fmt.Errorf("trainer: the group trains base %q (%s), this trainer has %q (%s): restart with the group's --base", cfg.Base, short(cfg.BaseHash), name, short(hash))
	}
	var (
		eng engine.Engine
		txt modeldir.Text
	)
	if w.baseDir == "" {
		var nc native.Config
		if txt, nc, err = modeldir.Tiny(); err != nil {
			return err
		}
		if w.engineID == EngineTorch {
			eng, err = torch.OpenTiny(ctx, nc, cfg.Seed, w.torchOptions(cfg, "tiny"))
		} else {
			eng, err = native.NewTiny(nc, cfg.Seed, native.Options{Name: "tiny", Seed: cfg.Seed})
		}
	} else {
		if txt, err = modeldir.Load(w.baseDir); err != nil {
			return err
		}
		if txt.TemplateErr != nil {
			w.log.Warn("no usable chat template in the base's tokenizer_config.json; using Qwen3's", "err", txt.TemplateErr)
		}
		if w.engineID == EngineTorch {
			eng, err = torch.Open(ctx, w.baseDir, w.torchOptions(cfg, ""))
		} else {
			eng, err = native.Open(ctx, w.baseDir, native.Options{Seed: cfg.Seed})
		}
	}
	if err != nil {
		return err
	}
	w.eng, w.cfg = eng, cfg
	w.builder = sample.NewBuilder(txt.Tokenizer, txt.Renderer, sample.Options{})
	w.tok, w.render = txt.Tokenizer, txt.Renderer
	return nil
}

// torchOptions configures the torch engine for the group's cfg.
func (w *worker) torchOptions(cfg group.Config, name string) torch.Options {
	return torch.Options{Python: w.python, Device: w.device, Procs: w.gpus, GradCheckpoint: w.gradCheckpoint, Seed: cfg.Seed, Name: name, Logger: w.log}
}

// genesis writes version 0, the fresh adapter every trainer starts from, to
// dir, and returns its hash.
func (w *worker) genesis(ctx context.Context, cfg group.Config, dir string) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ready(ctx, cfg); err != nil {
		return "", err
	}
	if err := w.eng.ResetAdapter(); err != nil {
		return "", err
	}
	return exportBundle(ctx, w.eng, dir)
}

// exportBundle exports eng's adapter to dir (atomically, through the bundle
// writer) and returns its hash.
func exportBundle(ctx context.Context, eng engine.Engine, dir string) (string, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".export-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := eng.ExportAdapter(ctx, tmp); err != nil {
		return "", err
	}
	b, err := adapter.Read(tmp)
	if err != nil {
		return "", err
	}
	if err := b.Write(dir); err != nil {
		return "", err
	}
	return adapter.Hash(dir)
}

// trained is one share's result.
type trained struct {
	delta   *adapter.Delta
	samples int
	seconds float64
	report  learn.Report
	// rollouts reports the rollouts of the share's task prompts, and
	// trainSeconds the training alone (seconds less the rollouts).
	rollouts     rolloutStats
	trainSeconds float64
}

// train trains K steps from the adapter in parentDir (version base) on
// steps and on the rollouts of items (sampled first, from the same
// adapter, in round), and returns the delta from it.
func (w *worker) train(ctx context.Context, cfg group.Config, parentDir string, base, round uint64, steps []*core.Step, items []rolloutItem) (*trained, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ready(ctx, cfg); err != nil {
		return nil, err
	}
	parent, err := adapter.Read(parentDir)
	if err != nil {
		return nil, err
	}
	if err := w.eng.LoadAdapter(ctx, parentDir); err != nil {
		return nil, err
	}
	// The episodes of the rollouts sampled below: tags on steps made here,
	// never read from a device's steps.
	var episodes map[*core.Step]episodeTag
	l, err := learn.New(w.eng, w.builder, learn.Options{
		Recipe:    cfg.RecipeOf(),
		Weights:   cfg.WeightsOf(),
		Engine:    engine.Recipe{LR: cfg.LR},
		Staleness: max(cfg.MaxLag, 0),
		Epochs:    cfg.LocalSteps,
		Version:   base,
		Logger:    w.log,
		EpisodeOf: func(st *core.Step) (string, string, bool) {
			t, ok := episodes[st]
			return t.group, t.episode, ok
		},
	})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var ro rolloutStats
	if len(items) > 0 {
		rs, tags, st, err := w.rollouts(ctx, items, base, round)
		if err != nil {
			return nil, err
		}
		ro, episodes = st, tags
		steps = append(steps[:len(steps):len(steps)], rs...)
	}
	trainStart := time.Now()
	rep, err := l.Train(ctx, steps)
	if err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	trainSecs := time.Since(trainStart).Seconds()
	tmp, err := os.MkdirTemp(filepath.Dir(parentDir), ".child-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := w.eng.ExportAdapter(ctx, tmp); err != nil {
		return nil, err
	}
	child, err := adapter.Read(tmp)
	if err != nil {
		return nil, err
	}
	d, err := adapter.Diff(child, parent)
	if err != nil {
		return nil, err
	}
	return &trained{delta: d, samples: rep.Used, seconds: secs, report: rep, rollouts: ro, trainSeconds: trainSecs}, nil
}

func (w *worker) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.eng == nil {
		return nil
	}
	err := w.eng.Close()
	w.eng = nil
	return err
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	if h == "" {
		return "-"
	}
	return h
}

// fileHash is the SHA-256 (hex) of a file's bytes.
func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
