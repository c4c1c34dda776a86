package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/engine/torch"
	nodepersonal "github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/trainer/personal"
)

const personalTrainHelp = `Usage: clawmesh personal train --job FILE --base DIR [--recipe R] [--rank N] [--engine native|torch [--device cpu|cuda] [--python PY]]

Trains a device's personal adapter once: the worker a node in [personal]
mode local starts, at low priority, while the agent is idle. It opens the
base model in DIR with the native engine (small models) or the torch
engine (where the device has PyTorch: --engine torch, on its CPU or GPU),
merges the job's shared adapter into it, trains the job's previous personal adapter (or a fresh one of rank
N) on the job's steps, writes the personal adapter alone to the job's out
directory (which must not exist) and prints the result as JSON on stdout:

  {"trained": 64, "held_back": 32, "score_before": 0.5, "score_after": 0.69, "seconds": 2.1}

trained counts the steps trained on (the newest 512 at most); the scores
are the share of the held-back steps (the newest 256 at most) on which the
policy agrees with the user's reward, before and after (-1: none to score;
0.5 before for a fresh adapter).

The job FILE is one JSON object, the steps inline as the pool exports them:

  {"shared": "DIR", "shared_version": "v12", "prev": "DIR", "out": "DIR",
   "seed": 1, "steps": [STEP, ...], "held_back": [STEP, ...]}

shared and prev may be empty (the base alone; a fresh adapter); out is
required.
`

// maxJobBytes bounds a job file: 512 steps and 256 held-back ones of long
// agent contexts fit with room to spare.
const maxJobBytes = 256 << 20

// personalJobFile is the job file's format: core.PersonalJob with its
// fields named for JSON.
type personalJobFile struct {
	Shared        string       `json:"shared,omitempty"`
	SharedVersion string       `json:"shared_version,omitempty"`
	Prev          string       `json:"prev,omitempty"`
	Out           string       `json:"out"`
	Seed          uint64       `json:"seed,omitempty"`
	Steps         []*core.Step `json:"steps"`
	HeldBack      []*core.Step `json:"held_back,omitempty"`
}

func jobFile(j core.PersonalJob) personalJobFile {
	return personalJobFile{Shared: j.Shared, SharedVersion: j.SharedVersion, Prev: j.Prev, Out: j.Out,
		Seed: j.Seed, Steps: j.Steps, HeldBack: j.HeldBack}
}

func (f personalJobFile) job() core.PersonalJob {
	return core.PersonalJob{Shared: f.Shared, SharedVersion: f.SharedVersion, Prev: f.Prev, Out: f.Out,
		Seed: f.Seed, Steps: f.Steps, HeldBack: f.HeldBack}
}

// readPersonalJob reads a job file.
func readPersonalJob(path string) (core.PersonalJob, error) {
	f, err := os.Open(path)
	if err != nil {
		return core.PersonalJob{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJobBytes+1))
	if err != nil {
		return core.PersonalJob{}, err
	}
	if len(b) > maxJobBytes {
		return core.PersonalJob{}, fmt.Errorf("job %s: over %d MiB", path, maxJobBytes>>20)
	}
	var jf personalJobFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jf); err != nil {
		return core.PersonalJob{}, fmt.Errorf("job %s: %w", path, err)
	}
	if dec.More() {
		return core.PersonalJob{}, fmt.Errorf("job %s: more than one JSON object", path)
	}
	if jf.Out == "" {
		return core.PersonalJob{}, fmt.Errorf("job %s: no \"out\" directory", path)
	}
	return jf.job(), nil
}

// runPersonalTrain is `clawmesh personal train`.
func runPersonalTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("personal train", personalTrainHelp, stderr)
	jobPath := fs.String("job", "", "the job file (JSON, see above)")
	base := fs.String("base", "", "the base model's directory (a Hugging Face directory with tokenizer.json)")
	recipe := fs.String("recipe", personal.DefaultRecipe, "the recipe: binary, opd or combined")
	rank := fs.Int("rank", personal.DefaultRank, "the rank of a fresh personal adapter (one trained before keeps its own)")
	eng := fs.String("engine", personal.EngineNative, "the engine: native (Go, CPU; small models) or torch (a PyTorch worker: CPU or CUDA)")
	device := fs.String("device", torch.DeviceCPU, "the torch engine's device: cpu or cuda")
	python := fs.String("python", "", "the torch engine's Python (default: the first python3 that imports torch)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *eng != personal.EngineNative && *eng != personal.EngineTorch {
		return usageErr("--engine %q: want native or torch", *eng)
	}
	if *eng != personal.EngineTorch && (*device != torch.DeviceCPU || *python != "") {
		return usageErr("--device and --python are the torch engine's: add --engine torch")
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("personal train takes no arguments, got %q", fs.Args())
	case *jobPath == "":
		return usageErr("personal train needs --job FILE")
	case *base == "":
		return usageErr("personal train needs --base DIR")
	case *rank < 1:
		return usageErr("--rank %d: want a positive rank", *rank)
	}
	j, err := readPersonalJob(*jobPath)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res, err := personal.Train(ctx, personal.Options{Base: *base, Recipe: *recipe, Rank: *rank, Logger: log,
		Engine: *eng, Torch: torch.Options{Python: *python, Device: *device}}, j)
	if err != nil {
		return err
	}
	return printJSON(stdout, res)
}

// execTrainer trains personal adapters in a worker process, `Exe personal
// train`, at low priority: the node's Trainer under [personal] mode local.
// The worker is killed when the context of its job ends.
type execTrainer struct {
	// Exe is the clawmesh executable.
	Exe string
	// Base, Recipe and Rank are the worker's --base, --recipe and --rank
	// ("" and 0: the worker's defaults).
	Base   string
	Recipe string
	Rank   int
	// Engine, Device and Python are the worker's --engine, --device and
	// --python ("": its defaults, the native engine).
	Engine, Device, Python string
	// Nice is the worker's nice value on Linux and macOS (0: 10).
	Nice   int
	Logger *slog.Logger
}

var _ nodepersonal.Trainer = (*execTrainer)(nil)

// defaultNice is the worker's nice value when execTrainer.Nice is 0.
const defaultNice = 10

// Bounds on what a worker writes back: its result, and the end of its
// error output quoted in the error.
const (
	maxWorkerStdout = 1 << 20
	maxWorkerStderr = 8 << 10
)

// Train implements node/personal.Trainer: it writes the job to a file (0600,
// beside j.Out: it holds the device's steps) and runs the worker on it.
func (t *execTrainer) Train(ctx context.Context, j core.PersonalJob) (core.PersonalResult, error) {
	if t.Exe == "" || t.Base == "" {
		return core.PersonalResult{}, errors.New("personal: no worker executable or base model")
	}
	if j.Out == "" {
		return core.PersonalResult{}, errors.New("personal: job without an output directory")
	}
	log := t.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b, err := json.Marshal(jobFile(j))
	if err != nil {
		return core.PersonalResult{}, err
	}
	dir := filepath.Dir(filepath.Clean(j.Out))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return core.PersonalResult{}, err
	}
	f, err := os.CreateTemp(dir, ".personal-job-*.json")
	if err != nil {
		return core.PersonalResult{}, err
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Close()); err != nil {
		return core.PersonalResult{}, fmt.Errorf("personal: write job: %w", err)
	}

	args := []string{"personal", "train", "--job", f.Name(), "--base", t.Base}
	if t.Recipe != "" {
		args = append(args, "--recipe", t.Recipe)
	}
	if t.Rank != 0 {
		args = append(args, "--rank", strconv.Itoa(t.Rank))
	}
	if t.Engine != "" {
		args = append(args, "--engine", t.Engine)
	}
	if t.Device != "" {
		args = append(args, "--device", t.Device)
	}
	if t.Python != "" {
		args = append(args, "--python", t.Python)
	}
	cmd := exec.CommandContext(ctx, t.Exe, args...)
	// Killed (SIGKILL) when ctx ends; its pipes are not waited on for
	// longer than this after it is gone.
	cmd.WaitDelay = 5 * time.Second
	out := &capBuffer{max: maxWorkerStdout}
	errb := &tailBuffer{max: maxWorkerStderr}
	cmd.Stdout, cmd.Stderr = out, errb
	nice := t.Nice
	if nice == 0 {
		nice = defaultNice
	}
	niceErr, err := startNice(cmd, nice)
	if err != nil {
		return core.PersonalResult{}, fmt.Errorf("personal: start worker: %w", err)
	}
	if niceErr != nil {
		log.Warn("personal worker runs at normal priority", "err", niceErr)
	}
	log.Debug("personal worker started", "pid", cmd.Process.Pid, "nice", nice, "steps", len(j.Steps))
	err = cmd.Wait()
	if ctx.Err() != nil {
		return core.PersonalResult{}, fmt.Errorf("personal: worker stopped: %w", context.Cause(ctx))
	}
	if err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = "no error output"
		}
		return core.PersonalResult{}, fmt.Errorf("personal: worker: %w: %s", err, msg)
	}
	if out.over {
		return core.PersonalResult{}, fmt.Errorf("personal: worker: result over %d bytes", maxWorkerStdout)
	}
	var res core.PersonalResult
	dec := json.NewDecoder(bytes.NewReader(out.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		return core.PersonalResult{}, fmt.Errorf("personal: worker result: %w", err)
	}
	return res, nil
}

// capBuffer keeps the first max bytes written to it and notes whether
// more came.
type capBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *capBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// tailBuffer keeps the last max bytes written to it (from a line start
// when it dropped some).
type tailBuffer struct {
	buf     []byte
	max     int
	dropped bool
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if n := len(b.buf) - b.max; n > 0 {
		b.buf = append(b.buf[:0], b.buf[n:]...)
		b.dropped = true
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	s := string(b.buf)
	if b.dropped {
		if i := strings.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
			s = s[i+1:]
		}
		s = "… " + s
	}
	return s
}
