package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/model/loss"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

const trainerHelp = `Usage: clawmesh trainer --data DIR [--engine native|torch] [--device cpu|cuda] [--base tiny|DIR] [flags]
       clawmesh trainer status [--json] --data DIR
       clawmesh trainer leave --data DIR
       clawmesh trainer clear PEER --data DIR
       clawmesh trainer config [--recipe binary|opd|combined] [...] --data DIR

Runs a trainer peer: it joins the mesh with its trainer certificate (from
'clawmesh join' with a token made by 'clawmesh invite --role trainer'), pulls
every batch the devices announce, verifies it and keeps it in DIR/batches,
and acknowledges it, so the device marks it shipped. A batch is pulled from
the device that signed its announcement, and credited to that device.
Each device's work is bounded: 8 announcements a second after a burst of
128, 2 pulls at a time, memory taken as the bytes arrive, and all pulls
together within --pull-budget (default 512MiB); a device that keeps
overstepping is disconnected.

The mesh's trainers form a raft group. The first trainer bootstraps it
(after --join-wait without finding one); later ones join through its
leader: up to 5 voters, then non-voters, promoted when a voter leaves or
stops answering. The leader runs rounds: it shares the pending batches
among the live trainers in proportion to their speed, each trains
--local-steps steps from the current adapter version on its share, and the
leader aggregates their deltas into the next version, kept as a PEFT
bundle in DIR/adapters/vN. Kill any trainer at any moment: the others go on,
and no batch is trained twice or lost.

Trainers the mesh's admin trusts (its voter set) vote and certify versions;
the others are volunteers. The leader retrains a sample of the volunteers'
deltas itself (--spot-check, default 0.1 of them, and at least one a round
that has any): the same share from the same version with the same seed. A
delta that is not what its share makes is left out of the round and its
trainer benched: it gets no share until the admin clears it with 'trainer
clear PEER'. A check costs the leader the training time of the share.

With --personal the trainer also trains personal adapters: a member device
whose user names this trainer in its [personal] trainers sends it its own
steps over a direct stream, and the trainer trains that device's adapter
alone, on its own copy of the shared version the device serves, and sends
it back to that device only, signed for that job. The steps and the adapter
are kept only while the job runs (in DIR/personal): never in a round, the
shared adapter, the batch store nor the weights service. One job runs at a
time, one per device, at most 12 a device an hour.

  clawmesh trainer status --data DIR        leader, term, voters, round, adapter
                                            version, batches pending/trained/refused
  clawmesh trainer leave --data DIR         hand over cleanly, then stop
  clawmesh trainer clear PEER --data DIR    give a benched trainer shares again
  clawmesh trainer config --recipe opd --data DIR
                                            change what the group trains
  clawmesh mesh batches --data DIR          the batches it received

Engines: native (pure Go, CPU, small models; needs nothing else) or torch
(a PyTorch worker the trainer starts and watches: CPU or CUDA, bf16 on the
GPU; --gpus N > 1 launches it with torchrun and trains data-parallel;
--grad-checkpoint trades compute for memory on a large model). The
torch engine needs Python 3 with PyTorch: Debian or Ubuntu, CPU: apt-get
install python3-torch libopenblas0-pthread; otherwise pip install torch
(the CUDA build from pytorch.org for a GPU); CLAWMESH_PYTHON names the
interpreter. Both engines train the same batch to the same adapter.

  clawmesh trainer --engine torch --base ~/models/Qwen3-4B --device cuda --data DIR

The recipe, base model and training settings are the group's: the first
trainer proposes its flags (--recipe, --local-steps, ...); 'trainer config'
changes them later (the base model and seed never change once a version
exists). Every trainer must run the group's base model.

One process at a time has a data directory: a trainer refuses one that
another trainer, a node or a command writing it holds (naming the command,
its pid and since when), and a node's directory (one with a pool).

SIGINT or SIGTERM stops it.
`

func runTrainer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "status", "leave", "config", "clear":
			return runTrainerCommand(ctx, args[0], args[1:], stdout, stderr)
		}
	}
	var s settings
	fs := newFlags("trainer", trainerHelp, stderr)
	fs.StringVar(&s.Config, "config", "", "config file (TOML); default $CLAWMESH_CONFIG, else DATA/config.toml if it exists")
	fs.StringVar(&s.Data, "data", "", "data directory (default $CLAWMESH_DATA, else ~/.clawmesh)")
	var listen, bootstrap multiFlag
	fs.Var(&listen, "p2p-listen", "libp2p multiaddr to listen on (repeatable; default QUIC and TCP on port 4001, or a free port)")
	fs.Var(&bootstrap, "bootstrap", "a peer's multiaddr to dial at start (repeatable)")
	noMDNS := fs.Bool("no-mdns", false, "do not look for peers on the local network")
	admin := fs.String("admin", "127.0.0.1:0", "loopback address of the admin API")
	weightsListen := fs.String("weights", ":0", "UDP address of the QUIC service that serves the committed adapter versions to the devices; off serves none")
	logLevel := fs.String("log", "info", "log level: debug, info, warn, error")
	engine := fs.String("engine", trainer.EngineNative, "training engine: native (Go, CPU) or torch (a PyTorch worker: CPU or CUDA)")
	device := fs.String("device", trainer.DeviceCPU, "device of the engine: cpu or cuda (cuda needs --engine torch)")
	gpus := fs.Int("gpus", 1, "GPUs the torch engine trains on; more than one launches its worker with torchrun (data-parallel)")
	gradCkpt := fs.Bool("grad-checkpoint", false, "torch engine: recompute each layer's activations in backward (less GPU memory, more compute)")
	base := fs.String("base", group.DefaultBase, "base model: tiny (built in, no download) or a Hugging Face model directory")
	joinWait := fs.Duration("join-wait", 5*time.Second, "how long to look for a trainers' group before bootstrapping one")
	pullBudget := fs.String("pull-budget", "512MiB", "most bytes of batches being pulled at once, from every device together (a size of at least 32MiB, the largest batch; each device also gets at most 2 pulls at once)")
	personal := fs.Bool("personal", false, "also train the personal adapters of the member devices that trust this trainer ([personal] trainers): each device's own steps, its adapter sent back to it alone and kept nowhere")
	spotCheck := fs.Float64("spot-check", trainer.DefaultSpotCheck, "share of the volunteers' deltas this trainer, leading, retrains to check them, from 0 (none) to 1 (all); a round with any volunteer's delta has one checked")
	var gc group.Config
	bindGroupFlags(fs, &gc)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q (trainer commands: status, leave, config, clear)", fs.Args())
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageErr("--log: %v", err)
	}
	if err := gc.Validate(); err != nil {
		return usageErr("%v", err)
	}
	if *joinWait <= 0 {
		return usageErr("--join-wait must be positive")
	}
	budget, err := parseSize(*pullBudget)
	if err != nil || budget < mesh.DefaultMaxBatch {
		return usageErr("--pull-budget %q: want a size of at least 32MiB, such as 1GiB", *pullBudget)
	}
	if !(*spotCheck >= 0 && *spotCheck <= 1) {
		return usageErr("--spot-check %v: from 0 (none) to 1 (every volunteer's delta)", *spotCheck)
	}
	switch {
	case *engine != trainer.EngineNative && *engine != trainer.EngineTorch:
		return usageErr("--engine %q: native or torch", *engine)
	case *device != trainer.DeviceCPU && *device != trainer.DeviceCUDA:
		return usageErr("--device %q: cpu or cuda", *device)
	case *engine == trainer.EngineNative && *device == trainer.DeviceCUDA:
		return usageErr("the native engine runs on the CPU; --device cuda needs --engine torch")
	case *gpus < 1:
		return usageErr("--gpus must be at least 1")
	case *gpus > 1 && *device != trainer.DeviceCUDA:
		return usageErr("--gpus %d: several GPUs need --engine torch --device cuda", *gpus)
	case *gradCkpt && *engine != trainer.EngineTorch:
		return usageErr("--grad-checkpoint needs --engine torch")
	}
	// The data directory is this process's before anything in it is
	// opened (its identity, its stores), and the addresses it listens on
	// (admin, libp2p, weights) are free.
	lock, err := lockData(s.Data, "trainer", false)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	defer lock.Release()
	if *admin != "off" {
		ln, err := net.Listen("tcp", *admin)
		if err != nil {
			return addrError(err, "the admin API", "trainer", *admin, "admin")
		}
		ln.Close()
	}
	if err := checkTrainerAddrs(listen, *weightsListen); err != nil {
		return err
	}
	log := newLogger(stderr, level)
	t, err := trainer.New(ctx, trainer.Config{DataDir: s.Data, Weights: *weightsListen, Listen: listen, Bootstrap: bootstrap, MDNS: !*noMDNS, NAT: true,
		Admin: *admin, Engine: *engine, Device: *device, GPUs: *gpus, GradCheckpoint: *gradCkpt, Base: *base, Group: gc, Timing: trainer.Timing{JoinWait: *joinWait}, PullBudget: budget,
		SpotCheck: *spotCheck, NoSpotCheck: *spotCheck == 0, Personal: trainer.PersonalConfig{On: *personal}, Logger: log})
	if errors.Is(err, mesh.ErrNotJoined) {
		return withHint(fmt.Errorf("%s is not in a mesh", s.Data),
			"Get a token from 'clawmesh invite --role trainer' on a device of the mesh, then run 'clawmesh join TOKEN --data %s'", s.Data)
	}
	if err != nil {
		return err
	}
	runErr := t.Run(ctx)
	if err := t.Close(); err != nil && runErr == nil {
		runErr = err
	}
	if runErr == nil {
		fmt.Fprintln(stderr, "clawmesh trainer: stopped")
	}
	return runErr
}

// bindGroupFlags binds the group's configuration; a flag not given keeps
// its zero value, which means "unchanged" to 'trainer config' and "the
// default" to a bootstrapping trainer.
func bindGroupFlags(fs interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	Float64Var(*float64, string, float64, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}, c *group.Config) {
	fs.StringVar(&c.Recipe, "recipe", "", "learning recipe: binary (GRPO on rewards), opd (on-policy distillation from hints) or combined (default combined)")
	fs.IntVar(&c.LocalSteps, "local-steps", 0, fmt.Sprintf("optimizer steps each trainer takes on its share of a round (default %d)", group.DefaultLocalSteps))
	fs.Float64Var(&c.LR, "lr", 0, fmt.Sprintf("learning rate (default %g)", group.DefaultLR))
	fs.IntVar(&c.MaxLag, "max-lag", 0, fmt.Sprintf("steps made by an adapter more than this many versions old are refused as stale (default %d)", group.DefaultMaxLag))
	fs.IntVar(&c.Quota, "quota", 0, fmt.Sprintf("most steps one device may put in a round (default %d)", group.DefaultQuota))
	fs.IntVar(&c.RoundSteps, "round-steps", 0, fmt.Sprintf("most steps in a round (default %d)", group.DefaultRoundSteps))
	fs.IntVar(&c.MinRoundSteps, "min-round-steps", 0, "steps of device batches a round waits for before it starts (default 1: start as soon as anything is pending)")
	fs.DurationVar(&c.RoundWait, "round-wait", 0, fmt.Sprintf("longest a pending batch waits for --min-round-steps before a round starts anyway (default %s)", group.DefaultRoundWait))
	fs.DurationVar(&c.Deadline, "round-deadline", 0, fmt.Sprintf("how long the leader waits for a round's deltas before leaving stragglers out (default %s)", group.DefaultDeadline))
	fs.StringVar(&c.Aggregate, "aggregate", "", "how deltas combine: mean (sample-weighted, each norm-clipped to the round's lower median) or trimmed (coordinate-wise trimmed mean) (default mean)")
	fs.Float64Var(&c.MaxNorm, "max-norm", 0, "cap on every delta's norm (default: none beyond the round's median)")
	fs.Float64Var(&c.Trim, "trim", 0, fmt.Sprintf("fraction the trimmed mean cuts from each end (default %g)", group.DefaultTrim))
	fs.Float64Var(&c.RLWeight, "rl-weight", 0, fmt.Sprintf("combined recipe: weight of the reward's signal, 0 to %g (default %g)", float64(group.MaxWeight), loss.DefaultWeights.RL))
	fs.Float64Var(&c.OPDWeight, "opd-weight", 0, fmt.Sprintf("combined recipe: weight of the hint's signal, 0 to %g (default %g)", float64(group.MaxWeight), loss.DefaultWeights.OPD))
}

func runTrainerCommand(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("trainer "+sub, trainerHelp, stderr)
	s.bindClient(fs)
	var asJSON bool
	var gc group.Config
	switch sub {
	case "status":
		fs.BoolVar(&asJSON, "json", false, "print JSON (a stable format)")
	case "config":
		bindGroupFlags(fs, &gc)
		fs.BoolVar(&asJSON, "json", false, "print the configuration as JSON")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	var peerArg mesh.PeerID
	switch {
	case sub == "clear" && fs.NArg() != 1:
		return usageErr("clear takes one argument: the peer id of the benched trainer (see 'clawmesh trainer status')")
	case sub == "clear":
		peerArg = mesh.PeerID(strings.TrimSpace(fs.Arg(0)))
		if _, err := p2p.PublicKey(peerArg); err != nil {
			return usageErr("clear %q: not a peer id: a peer id looks like 12D3KooW... ('clawmesh trainer status' lists the benched trainers)", fs.Arg(0))
		}
	case fs.NArg() > 0:
		return usageErr("%s takes no arguments", sub)
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	c, err := trainerClient(s)
	if err != nil {
		return err
	}
	switch sub {
	case "status":
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, st)
		}
		printTrainerStatus(stdout, st)
		return nil
	case "leave":
		if err := c.Leave(ctx); refused(err) {
			return withHint(err, "'clawmesh trainer status --data %s' shows the group", s.Data)
		} else if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "left the trainers' group; the trainer stops now")
		return nil
	case "clear":
		if err := c.Clear(ctx, peerArg); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "cleared %s: it gets shares again\n", peerArg)
		return nil
	}
	cur, err := c.Configure(ctx, gc)
	if refused(err) {
		return withHint(err, "'clawmesh trainer config --help' lists the settings, with their defaults")
	}
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, cur)
	}
	fmt.Fprintf(stdout, "recipe %s, base %s (seed %d), %d local steps at lr %g, max lag %d, quota %d, %d steps a round (waits up to %s for %d), deadline %s, aggregate %s",
		cur.Recipe, cur.Base, cur.Seed, cur.LocalSteps, cur.LR, cur.MaxLag, cur.Quota, cur.RoundSteps, cur.RoundWait, cur.MinRoundSteps, cur.Deadline, cur.Aggregate)
	if cur.RecipeOf() == loss.RecipeCombined {
		w := cur.WeightsOf()
		fmt.Fprintf(stdout, ", weights: reward %g, hint %g", w.RL, w.OPD)
	}
	fmt.Fprintln(stdout)
	return nil
}

func printTrainerStatus(w io.Writer, st trainer.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "peer\t%s (%s)\n", st.Peer, st.State)
	switch {
	case st.Trusted:
		fmt.Fprintf(tw, "trust\ta voter: it votes in the group and certifies versions (voter set %d)\n", st.VoterSet)
	case st.VoterSet == 0:
		fmt.Fprintf(tw, "trust\tno voter set known yet: the mesh's admin trusts trainers with 'clawmesh mesh trust PEER'\n")
	default:
		fmt.Fprintf(tw, "trust\ta volunteer: it trains shares, never votes nor certifies (voter set %d)\n", st.VoterSet)
	}
	fmt.Fprintf(tw, "leader\t%s\n", orDash(string(st.Leader)))
	fmt.Fprintf(tw, "term\t%d (applied %d)\n", st.Term, st.Applied)
	fmt.Fprintf(tw, "voters\t%s\n", joinIDs(st.Voters))
	if len(st.Nonvoters) > 0 {
		fmt.Fprintf(tw, "non-voters\t%s\n", joinIDs(st.Nonvoters))
	}
	fmt.Fprintf(tw, "recipe\t%s on %s\n", orDash(st.Config.Recipe), orDash(st.Config.Base))
	if v := st.Version; v != nil {
		cert := "not certified yet"
		switch {
		case v.Version.Version == 0:
			cert = "the starting adapter"
		case v.Cert != nil:
			cert = fmt.Sprintf("certified, %s", plural(len(v.Cert.Votes), "vote", "votes"))
		}
		fmt.Fprintf(tw, "adapter\t%s (hash %s, term %d, index %d, %s)\n", v.Name, core.ShortHash(v.Hash), v.Term, v.Index, cert)
		if v.Dir != "" {
			fmt.Fprintf(tw, "adapter dir\t%s\n", v.Dir)
		}
	} else {
		fmt.Fprintf(tw, "adapter\t-\n")
	}
	if r := st.Round; r != nil {
		fmt.Fprintf(tw, "round\t%d from v%d, %s, deadline %s\n", r.Number, r.Base, plural(len(r.Shares), "trainer", "trainers"), r.Deadline.Local().Format("15:04:05"))
	} else {
		fmt.Fprintf(tw, "round\t%d done, none open\n", st.Rounds)
	}
	b := st.Batches
	fmt.Fprintf(tw, "batches\t%d pending, %d assigned, %d trained, %d refused\n", b.Pending, b.Assigned, b.Trained, b.Refused)
	if p := st.Prompts; p != (trainer.BatchCounts{}) {
		fmt.Fprintf(tw, "task prompts\t%d pending, %d assigned, %d trained (clawmesh tasks status)\n", p.Pending, p.Assigned, p.Trained)
	}
	for reason, n := range st.Refusals {
		fmt.Fprintf(tw, "  refused\t%d %s\n", n, reason)
	}
	if st.Retracted > 0 {
		fmt.Fprintf(tw, "retracted\t%s (not certified by the voters)\n", plural(st.Retracted, "version", "versions"))
	}
	fmt.Fprintf(tw, "trainers\t%d\n", len(st.Trainers))
	if len(st.Benched) > 0 {
		fmt.Fprintf(tw, "benched\t%d (no share until 'clawmesh trainer clear PEER')\n", len(st.Benched))
	}
	tw.Flush()
	for _, b := range st.Benched {
		fmt.Fprintf(w, "  benched %s since round %d: %s\n", b.Trainer, b.Round, b.Reason)
	}
	// The trainers' ids are longer than every key above: a column of
	// their own.
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, t := range st.Trainers {
		speed := "speed not measured yet"
		if t.Measured {
			speed = fmt.Sprintf("%.1f samples/s", t.Speed)
		}
		fmt.Fprintf(tw, "  %s\t%s/%s, %s\n", t.ID, t.Engine, t.Device, speed)
	}
	tw.Flush()
}

func joinIDs(ids []mesh.PeerID) string {
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = string(id)
	}
	return strings.Join(s, " ")
}

func shortHash(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}
