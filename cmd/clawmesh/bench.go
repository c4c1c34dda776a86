package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/engine"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/engine/torch"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/node/gateway/bench"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/nodebench"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/sim/live"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/harness"
	"github.com/clawmesh/clawmesh/trainer/learn"
)

const benchHelp = `Usage: clawmesh bench <gateway|pool|soak|idle|engine|learn|scrub|mesh|trainers|weights|rollouts> [flags]

Measures clawmesh's parts on this machine, against a baseline measured in
the same run. Everything runs locally (loopback, a temporary directory).

  gateway   the same open-loop load sent to a local scripted LLM server
            through a bare Go reverse proxy (net/http/httputil) and through
            the gateway (recording into Pebble), interleaved; prints the
            gateway's added latency p50/p99 for non-streaming calls and for
            streaming ones (time to first and to last byte) beside the goal
            (p50 <= +0.3 ms, p99 <= +2 ms), requests/s, and the disk's
            synced-write latency (the floor under the durable path);
            --realistic sends agent-sized requests in sessions that continue
            call by call
  pool      DataPool ingest: synced writes per second of agent-sized steps
            from one and from --writers concurrent writers, put latency
            p50/p99, beside bare Pebble's synced writes from as many writers
            in the same run, of the same steps stored whole (their JSON)
            and of as many bytes a write as the pool writes a step (goal:
            >= 20,000 steps/s and >= 0.6x bare Pebble storing the steps)
  soak      this binary run as a node at its defaults under load (by
            default 6 clients in a closed loop for 180s; --rate for a steady
            open-loop load), each call its own conversation, left open as
            an agent that never says it is done, and then idle: its
            resident memory over time, at 120s and at the end of the load,
            and its slope over the last minute of the load (goal: at most
            300 MiB, and flat: at most +5 MiB/min), and the scorer's rate
            and lag (closed steps waiting, and those shed past
            --max-score-backlog) with the built-in plugins
  idle      this binary run as a fresh node with the built-in plugins: 20
            calls, scored, then 60s idle; its resident memory (anonymous
            and file-backed) against the goal of 100 MiB, its data
            directory's size against 20 MiB, and the size of the plugins'
            compilation cache (in the user's cache directory)
  engine    the native Go engine: training and generation tokens/s on a
            tiny and a small (0.5B-shaped, 2 layers) model, with the
            arithmetic rate achieved against the measured matmul rate;
            with --engine torch (or --base, --device): the torch engine's
            train step and generation on --base (tiny or a model
            directory), against the native engine on the same model on
            the CPU, or on CUDA against the GPU's own measured matmul
            rate (model FLOPs utilisation) with its peak memory
  learn     the learning recipes side by side: Binary RL, on-policy
            distillation and both combined, on a user who prefers replies
            that start with a word and hints "Reply with OK."; each starts
            from the same tiny model, first taught to read the hint (so
            that OPD's default teacher, the frozen base, can teach it);
            prints mean reward, the probability of a preferred first token
            and log p("OK") without the hint, before and after
  scrub     the scrubber: recall and precision per kind and vendor on the
            labelled corpus, its rate in MB/s, and what scrubbing an
            agent-sized step costs alone and in a 64-step batch, against
            encoding the step as JSON in the same run; and the outbox
            preparing that batch from a Pebble pool
  mesh      the mesh on loopback: announcement-to-stored latency p50/p99
            (a member shipping, a trainer collecting), the pull protocol's
            throughput against a bare libp2p stream copying the same bytes
            in the same run (goal >= 0.8x), and what an idle node costs as
            a mesh peer: CPU and resident memory of this binary run as an
            idle node in a mesh and as one that is not (goal: under 1% of a
            core and 100 MiB more)
  weights   adapter versions over QUIC on loopback: a bundle (64 MiB) fetched
            through the protocol (verifying, writing, fsync) against bare
            quic-go and TLS over TCP moving the same bytes in the same run
            (goal >= 0.8x bare quic-go), CPU seconds per GB, the fan-out
            to 1..8 fetchers with and without re-serving, what deltas
            between consecutive versions would save, and the time from a
            version's commit on the trainers' leader to the first reply a
            node serves with it (the whole loop on loopback, tiny model;
            goal p50 <= 5 s)
  trainers  the trainers' raft group on loopback: time from the leader's
            death to a new leader, p50/p99 over repeated kills (goal p99
            <= 3 s with the default timing), and a round's overhead
            (start to commit) against its pure training time on the tiny
            model (goal <= 10%)
  rollouts  training from a task set on the tiny model (native engine, the
            trainer's own share code): rounds of G rollouts per prompt,
            scored by a verifier plugin, then trained; prints rollout
            tokens/s against the engine's raw sampling of the same prompts
            in the same run, and the share of a round spent on rollouts
            versus training (--tasks and --reward bench your own set; the
            default set and verifier are built here and need the go
            command)

Examples:
  clawmesh bench gateway --rate 1000 --duration 10s
  clawmesh bench gateway --memory       # without the synced write per step
  clawmesh bench gateway --realistic --rate 200
  clawmesh bench pool --writers 64 --steps 20000
  clawmesh bench soak --json
  clawmesh bench soak --rate 1700 --duration 240s --idle 60s
  clawmesh bench idle --json
  clawmesh bench engine --model tiny
  clawmesh bench engine --engine torch --base tiny --device cpu
  clawmesh bench engine --engine torch --base ~/models/Qwen3-0.6B --device cuda
  clawmesh bench learn --rounds 8
  clawmesh bench scrub
  clawmesh bench mesh --idle 30s
  clawmesh bench trainers --kills 20
  clawmesh bench weights --size 64MiB --fetchers 8
  clawmesh bench rollouts --group 8 --prompts 8 --rounds 4
`

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchHelp)
		return usageErr("which benchmark? gateway, pool, soak, idle, engine, learn, scrub, mesh, trainers, weights or rollouts")
	}
	sub, args := args[0], args[1:]
	fs := newFlags("bench "+sub, benchHelp, stderr)
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, benchHelp)
		return nil
	case "gateway":
		var o bench.GatewayOptions
		fs.IntVar(&o.Rate, "rate", 1000, "requests per second through the gateway (the same rate goes through the bare proxy)")
		fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured load duration")
		fs.DurationVar(&o.Warmup, "warmup", time.Second, "load before measuring")
		fs.IntVar(&o.Chunks, "chunks", 8, "chunks per streamed reply")
		fs.BoolVar(&o.Memory, "memory", false, "record into memory instead of the synced Pebble pool (the gateway's own cost)")
		fs.BoolVar(&o.Metrics, "metrics", false, "observe every recorded call in a Prometheus histogram, as a node does for /metrics")
		fs.BoolVar(&o.Realistic, "realistic", false, "agent-sized requests: a 40,000-character system prompt, 12 tools, sessions whose history grows call by call")
		fs.IntVar(&o.Turns, "turns", 12, "calls per session with --realistic")
		fs.StringVar(&o.DataDir, "data", "", "directory for the pool (default: a temporary directory, removed after); its disk's fsync is measured too")
		if err := parse(fs, args); err != nil {
			return err
		}
		r, err := bench.Gateway(ctx, o)
		if err != nil {
			return err
		}
		r.Print(stdout)
		return nil
	case "soak":
		var o nodebench.SoakOptions
		fs.IntVar(&o.Clients, "clients", 6, "clients sending calls in a closed loop (each sends its next call once the last is answered)")
		fs.IntVar(&o.Rate, "rate", 0, "calls a second, sent open loop, instead of --clients")
		fs.DurationVar(&o.Duration, "duration", 180*time.Second, "how long the load runs")
		fs.DurationVar(&o.Idle, "idle", 30*time.Second, "how long the node is watched idle after the load")
		fs.DurationVar(&o.Every, "every", time.Second, "time between samples")
		fs.IntVar(&o.MaxSessions, "max-sessions", 0, "the node's --max-sessions (default its own)")
		fs.BoolVar(&o.SessionDone, "session-done", false, "end each conversation with X-Session-Done, so that it closes at once")
		fs.StringVar(&o.MemoryLimit, "memory-limit", "", "the node's --memory-limit (default its own)")
		nodeLog := fs.Bool("node-log", false, "show the node's log (warnings and errors) on stderr")
		asJSON := fs.Bool("json", false, "print the result (every sample too) as JSON")
		quiet := fs.Bool("quiet", false, "no line per sample while it runs")
		if err := parse(fs, args); err != nil {
			return err
		}
		if o.Rate > 0 {
			if flagSet(fs, "clients") {
				return usageErr("--rate (open loop) and --clients (closed loop): give one")
			}
			o.Clients = 0
		}
		if o.Rate < 0 || o.Clients < 0 || (o.Rate == 0 && o.Clients == 0) || o.Duration <= 0 || o.Idle < 0 || o.Every <= 0 || o.MaxSessions < 0 {
			return usageErr("--clients or --rate, --duration and --every must be positive, --idle and --max-sessions not negative")
		}
		if *nodeLog {
			o.NodeLog = stderr
		}
		if !*quiet {
			o.Progress = stderr
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Binary = exe
		r, err := nodebench.Soak(ctx, o)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, r)
		}
		r.Print(stdout)
		return nil
	case "idle":
		var o nodebench.FootprintOptions
		fs.IntVar(&o.Calls, "calls", 20, "calls sent (each scored) before the node is left idle")
		fs.DurationVar(&o.Wait, "wait", 60*time.Second, "how long the node is left idle, once the calls are scored, before it is measured")
		asJSON := fs.Bool("json", false, "print the result as JSON")
		if err := parse(fs, args); err != nil {
			return err
		}
		if o.Calls < 0 || o.Wait < 0 {
			return usageErr("--calls and --wait must not be negative")
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Binary = exe
		r, err := nodebench.Footprint(ctx, o)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, r)
		}
		r.Print(stdout)
		return nil
	case "engine":
		var bc native.BenchConfig
		models := fs.String("model", "tiny,small", "native engine: comma-separated: tiny (vocab 512, hidden 64, 2 layers), small (Qwen2.5-0.5B-shaped, 2 layers)")
		fs.IntVar(&bc.Layers, "layers", 0, "native engine: override the model's depth")
		fs.IntVar(&bc.Vocab, "vocab", 0, "native engine: override the model's vocabulary")
		fs.IntVar(&bc.Seqs, "seqs", 0, "sequences per training batch (default 4)")
		fs.IntVar(&bc.SeqLen, "seq-len", 0, "tokens per training sequence (default 64)")
		fs.IntVar(&bc.Steps, "steps", 0, "timed training steps (default 2, torch 3)")
		fs.IntVar(&bc.GenTokens, "gen-tokens", 0, "tokens generated (default 32)")
		engineName := fs.String("engine", trainer.EngineNative, "engine measured: native or torch (the PyTorch worker)")
		base := fs.String("base", "", "with --engine torch: tiny (default) or a Hugging Face model directory (Qwen3)")
		device := fs.String("device", trainer.DeviceCPU, "cpu or cuda (torch engine)")
		gpus := fs.Int("gpus", 1, "GPUs the torch engine trains on (more than one: torchrun, data-parallel)")
		gradCkpt := fs.Bool("grad-checkpoint", false, "torch engine: recompute activations in backward (less memory)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *engineName != trainer.EngineNative && *engineName != trainer.EngineTorch {
			return usageErr("--engine %q: native or torch", *engineName)
		}
		if *device != trainer.DeviceCPU && *device != trainer.DeviceCUDA {
			return usageErr("--device %q: cpu or cuda", *device)
		}
		if *engineName == trainer.EngineTorch || *base != "" || *device != trainer.DeviceCPU {
			if *engineName == trainer.EngineNative && *device == trainer.DeviceCUDA {
				return usageErr("the native engine runs on the CPU; --device cuda needs --engine torch")
			}
			r, err := torch.Bench(ctx, torch.BenchOptions{Engine: *engineName, Base: *base, Device: *device, Procs: *gpus,
				GradCheckpoint: *gradCkpt, Seqs: bc.Seqs, SeqLen: bc.SeqLen, Steps: bc.Steps, GenTokens: bc.GenTokens})
			if err != nil {
				return err
			}
			r.Print(stdout)
			return nil
		}
		fmt.Fprintln(stdout, "native engine (pure Go, float32, CPU); rates against the better of its matmul kernel and gonum's Sgemm, each at its best over a 0.5B layer's products, measured in the same run:")
		for _, m := range strings.Split(*models, ",") {
			c := bc
			c.Model = strings.TrimSpace(m)
			r, err := native.Bench(ctx, c)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "  %s\n", r)
		}
		return nil
	case "weights":
		var o weights.BenchOptions
		size := fs.String("size", "64MiB", "bundle size (bytes, or with KiB, MiB or GiB)")
		fs.IntVar(&o.Fetchers, "fetchers", 8, "the most fetchers of the fan-out (1, 2, 4, ... up to it)")
		fs.StringVar(&o.Dir, "dir", "", "directory for the fetched bundles (default: a temporary directory, removed after)")
		asJSON := fs.Bool("json", false, "print the figures as JSON")
		versions := fs.Int("versions", 5, "versions the whole loop on loopback (a node before clawmesh serve --tiny, three trainers) publishes, timing each from its commit to the node's first reply with it; 0 skips the loop")
		var ls live.LoopServe
		fs.StringVar(&ls.Kind, "serve", "", "in the loop, the node runs its model server itself, as node --serve does: clawmesh or llama-server (the tiny model as GGUF, versions swapped blue/green); default: the tiny model served in process")
		fs.StringVar(&ls.Bin, "serve-bin", "", "with --serve: the server's program (default: this program for clawmesh, llama-server on PATH)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *versions < 0 {
			return usageErr("--versions must be 0 or more")
		}
		switch ls.Kind {
		case "":
			if ls.Bin != "" {
				return usageErr("--serve-bin goes with --serve")
			}
		case modelserver.KindClawmesh:
			if ls.Bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				ls.Bin = exe
			}
		case modelserver.KindLlamaServer:
		default:
			return usageErr("--serve %q: want clawmesh or llama-server", ls.Kind)
		}
		n, err := parseSize(*size)
		if err != nil || n <= 0 || n > chunks.MaxBundle {
			return usageErr("--size: want a size up to 4GiB, got %q", *size)
		}
		o.Size = int(n)
		return benchWeights(ctx, stdout, o, ls, *versions, *asJSON)
	case "rollouts":
		var o harness.RolloutBenchOptions
		fs.IntVar(&o.Group, "group", 8, "G: rollouts per prompt")
		fs.IntVar(&o.Prompts, "prompts", 8, "prompts per round")
		fs.IntVar(&o.Rounds, "rounds", 4, "rounds (versions) to run")
		fs.IntVar(&o.LocalSteps, "local-steps", 2, "optimizer steps per round")
		maxTokens := fs.Int("max-tokens", 16, "a reply's token limit in the default task set")
		tasksFile := fs.String("tasks", "", "a task set (JSONL) instead of the default one")
		rewardFile := fs.String("reward", "", "the verifier plugin (.wasm) of --tasks (default: a character-set verifier built here)")
		asJSON := fs.Bool("json", false, "print the figures as JSON: rounds [{version, samples, tokens, rollout_seconds, train_seconds, rollout_share, mean_reward, flat_groups, trained_samples, held_out_pass_at_1, held_out_mean_reward}], rollout_tokens, rollout_seconds, train_seconds, rollout_tokens_per_s, raw_tokens_per_s (the baseline), vs_raw, rollout_share")
		if err := parse(fs, args); err != nil {
			return err
		}
		switch {
		case o.Group < 2 || o.Group > 64:
			return usageErr("--group must be in [2, 64]")
		case o.Prompts < 1 || o.Rounds < 1 || o.LocalSteps < 1 || *maxTokens < 1:
			return usageErr("--prompts, --rounds, --local-steps and --max-tokens must be at least 1")
		case (*tasksFile == "") != (*rewardFile == ""):
			return usageErr("--tasks and --reward go together")
		}
		return benchRollouts(ctx, stdout, o, *tasksFile, *rewardFile, *maxTokens, *asJSON)
	case "learn":
		rounds := fs.Int("rounds", 8, "rounds of sample → score → train per recipe")
		seed := fs.Uint64("seed", 3, "seed of the tiny model's random weights")
		alone := fs.Bool("alone", false, "train each reply alone against a running reward baseline, as in live use (default: the replies to one prompt form a GRPO group)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *rounds < 1 {
			return usageErr("--rounds must be at least 1")
		}
		return benchLearn(ctx, stdout, *rounds, *seed, *alone)
	case "mesh":
		var o harness.BenchOptions
		fs.IntVar(&o.Batches, "batches", 0, "batches announced one at a time for the latency (default 50)")
		fs.Int64Var(&o.PullBytes, "pull-bytes", 0, "size of the batch pulled for the throughput (default 16 MiB)")
		fs.IntVar(&o.Rounds, "rounds", 0, "copies of it each way (default 5)")
		idle := fs.Duration("idle", 20*time.Second, "how long the idle nodes are measured (0: skip)")
		if err := parse(fs, args); err != nil {
			return err
		}
		r, err := harness.BenchMesh(ctx, o)
		if err != nil {
			return err
		}
		r.Print(stdout)
		if *idle > 0 {
			fmt.Fprintf(stdout, "\nidle node, measured for %s once started (this binary as two nodes, neither serving a call):\n", *idle)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			r, err := nodebench.Idle(ctx, nodebench.IdleOptions{Binary: exe, Duration: *idle})
			if err != nil {
				return err
			}
			r.Print(stdout)
		}
		return nil
	case "trainers":
		var o harness.GroupBenchOptions
		fs.IntVar(&o.Kills, "kills", 0, "times the leader is killed (default 10)")
		fs.IntVar(&o.Trainers, "trainers", 0, "trainers in the failover group (default 3)")
		fs.IntVar(&o.Rounds, "rounds", 0, "rounds measured for the overhead (default 5)")
		fs.IntVar(&o.RoundBatches, "round-batches", 0, "batches a round (default 8)")
		fs.IntVar(&o.BatchSteps, "batch-steps", 0, "steps a batch (default 16)")
		asJSON := fs.Bool("json", false, "print JSON (a stable format)")
		if err := parse(fs, args); err != nil {
			return err
		}
		r, err := harness.BenchGroup(ctx, o)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, r)
		}
		r.Print(stdout)
		return nil
	case "scrub":
		minTime := fs.Duration("time", time.Second, "how long each timed measure runs at least")
		if err := parse(fs, args); err != nil {
			return err
		}
		r, err := share.BenchScrub(ctx, *minTime)
		if err != nil {
			return err
		}
		r.Print(stdout)
		return nil
	case "pool":
		writers := fs.Int("writers", 64, "concurrent writers")
		steps := fs.Int("steps", 20000, "steps to write")
		if err := parse(fs, args); err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "clawmesh-bench-pool-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if *writers <= 0 || *steps <= 0 {
			return usageErr("--writers and --steps must be positive")
		}
		one, err := pool.BenchIngest(ctx, dir+"/one", 1, min(*steps, 2000))
		if err != nil {
			return err
		}
		many, err := pool.BenchIngest(ctx, dir+"/many", *writers, *steps)
		if err != nil {
			return err
		}
		// Bare Pebble stores the same agent-sized steps whole (their JSON,
		// encoded beforehand), and then as many bytes a write as the pool
		// writes a step.
		values, err := pool.StepValues(24)
		if err != nil {
			return err
		}
		bare, err := pool.BenchPebble(ctx, dir+"/bare", *writers, *steps, values, 0)
		if err != nil {
			return err
		}
		small, err := pool.BenchPebble(ctx, dir+"/small", *writers, *steps, nil, many.WALBytes)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pool ingest, synced writes (every Put durable when it returns), agent-sized steps:\n")
		line := func(what string, r pool.IngestResult) {
			fmt.Fprintf(stdout, "  %-28s %8.0f steps/s  p50 %s  p99 %s  (%d in %s, %d B to the WAL each)\n",
				what, r.StepsPerSec, ms(r.P50), ms(r.P99), r.Steps, r.Elapsed.Round(time.Millisecond), r.WALBytes)
		}
		line("pool, 1 writer", one)
		line(fmt.Sprintf("pool, %d writers", many.Writers), many)
		line(fmt.Sprintf("bare Pebble, %d writers", bare.Writers), bare)
		line("  same bytes as the pool", small)
		ratio := many.StepsPerSec / bare.StepsPerSec
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "NOT met"
		}
		fmt.Fprintf(stdout, "  %d writers: %.0f steps/s (goal >= 20000: %s), %.2fx bare Pebble storing the steps whole (goal >= 0.6x: %s), %.2fx bare Pebble writing the pool's bytes, %.1fx 1 writer\n",
			many.Writers, many.StepsPerSec, verdict(many.StepsPerSec >= 20000), ratio, verdict(ratio >= 0.6), many.StepsPerSec/small.StepsPerSec, many.StepsPerSec/one.StepsPerSec)
		return nil
	}
	return usageErr("unknown benchmark %q: want gateway, pool, soak, engine, learn, scrub, mesh, trainers, weights or rollouts", sub)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }

// benchLearn runs learn.CompareRecipes on the tiny model and prints it.
func benchLearn(ctx context.Context, stdout io.Writer, rounds int, seed uint64, alone bool) error {
	txt, cfg, err := modeldir.Tiny()
	if err != nil {
		return err
	}
	tok := txt.Tokenizer
	eng, err := native.NewTiny(cfg, seed, native.Options{Seed: seed + 100})
	if err != nil {
		return err
	}
	defer eng.Close()
	start := time.Now()
	recipes := []loss.Recipe{loss.RecipeRL, loss.RecipeOPD, loss.RecipeCombined}
	cmp, err := learn.CompareRecipes(ctx, eng, tok, recipes, learn.PreferenceOptions{
		Seed: 7, Rounds: rounds, Alone: alone,
		// The default teacher (the frozen base, which HintReader taught to
		// read the hint) and the default OPD bound.
		Learn: learn.Options{Engine: engine.Recipe{LR: 3e-3}},
	}, learn.TeachOptions{})
	if err != nil {
		return err
	}
	mode := "replies to one prompt form a GRPO group"
	if alone {
		mode = "each reply alone, against a running reward baseline"
	}
	fmt.Fprintf(stdout, "learning recipes on the tiny model (%d rounds of 4 prompts x 8 replies; %s);\n", rounds, mode)
	l := cmp.Lesson
	fmt.Fprintf(stdout, "OPD teacher: the frozen base model, first taught to read the hint %q (the adapter merged):\n", learn.DefaultHint)
	fmt.Fprintf(stdout, "log p(target | hint) %.2f → %.2f, log p(target) without the hint %.2f → %.2f\n\n",
		l.HintedBefore, l.HintedAfter, l.UnhintedBefore, l.UnhintedAfter)
	cmp.Print(stdout)
	fmt.Fprintf(stdout, "\n(%s)\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// flagSet says whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
