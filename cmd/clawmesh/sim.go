package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/sim"
)

const simHelp = `Usage: clawmesh sim [--nodes N] [--trainers N] [--voters N] [--seed N] [--scenario NAME] [--hole-punch S] [--spot-check S] [--personal S] [--personal-mesh S] [--personal-for D] [--json] [--plot DIR]

Simulates the mesh at scale in one process, in virtual time: devices on
home-network links (some behind NAT: two NAT devices meet through a relay,
and only a connection hole punching makes direct carries anything), the
trainers' raft group running rounds, adapter versions spreading back by
gossip offers and chunked fetches re-served from device to device. The
protocol's real code runs where it is cheap enough (certificates and
revocations, manifest signing, verification and fencing, the trainers'
replicated state machine, aggregation, the weight fetch's chunk plan);
links, transfers, raft's timing and training are modelled (see the sim
package's documentation). The same seed gives the same output, byte for
byte; the seed is printed first.

  clawmesh sim --nodes 1000 --trainers 3 --seed 7          # a table of results
  clawmesh sim --nodes 1000 --trainers 3 --seed 7 --json   # the same as JSON
  clawmesh sim --scenario churn --plot out/                # PNG plots
  clawmesh sim --personal 0.5 --personal-mesh 0.2          # and personal adapters

Scenarios (--scenario):
  baseline   a quiet mesh; one device is revoked part way
  churn      devices sleep, wake and leave; the leader is killed and later
             restarted; another trainer is paused for 30 s
  partition  the network is cut in two, the leader on the smaller side with
             30% of the devices, and healed two rounds later
  relays     the baseline again over NAT shares 0/40/70% and 2 or the
             default number of relays, at the run's --hole-punch share
  poison     --malicious of the devices misbehave (flipped rewards and forged
             scores, sent 16 times as often; oversized and malformed
             batches), one trainer returns a huge delta; the learning curve
             with no defence, each defence alone, and all of them, against
             a clean run
  trust      volunteers (trainers that do not vote) and voters (6 trainers,
             3 of them voters): one volunteer forges its deltas, caught by
             spot checks (--spot-check of the volunteers' deltas re-executed
             a round, at least one) and benched; one voter below quorum
             leads first and publishes a forged version, which the honest
             voters refuse and the next leader retracts; one device floods
             announcements far past its token bucket; against the same run
             clean, and a sweep of the share of rogue volunteers among 10
             trainers (3 seeds, at most 200 devices): the largest share
             whose learning curve stays within 10% of the clean one's

Personal adapters (--personal S, any scenario): a share S of the devices
train a personal adapter on their own steps, over --personal-for of virtual
time (default 72h) after the scenario's run, on the same devices and links.
The agent records 8 steps a minute in active sessions (15 min on average,
45 min apart, between 07:00 and 23:00 in the device's own time zone) and is
idle at night. In local mode the device trains its oldest steps, at most
256 a job, only while the agent is idle, at its own speed: half the devices
are Apple M-series (0.5-4 steps/s), half small CPU boxes (0.02-0.2 steps/s);
a job is preempted, its progress lost, when the agent becomes active. In mesh
mode (--personal-mesh: the share of them) the steps go up the device's link
to a trainer it trusts, which trains jobs in order on a quarter of its time
(20 steps/s), and the adapter comes back down the link. An adapter keeps up
when the oldest step not yet trained into it is at most 6 h old at the end.

Figures:
  50%/95%/99%   seconds from a version's publication until that share of the
                devices live then (and still in the mesh) held it or a newer one
  stayed up     the same over the devices that stayed awake from the
                publication until they held it (or to the end): under churn
                the others slept before they could get it
  hole punching --hole-punch: the share of connections between two NAT
                devices that hole punching (DCUtR) turns direct, drawn per
                pair from the seed; the others carry nothing, as a relay
                only brokers the punch (0: NAT devices talk to public ones
                only). A relay takes at most 128 NAT devices' reservations;
                two NAT devices with none never connect
  bound         the log-tree bound: ceil(log2(k+1)) hops to reach k devices,
                a hop being the whole bundle over the median device link plus
                the median latency
  score         after each version, the probability that the policy's reply
                is the one users prefer, as a share of the way from the
                start's to 1; the learning model is fitted to the native
                engine's measured curves (sim/RATIONALE.md)
  delivery      the share of live devices a gossip message reached, over
                gossipsub's meshes (6 peers each, the library's default)
                and its IHAVE/IWANT gossip at each heartbeat
  staleness     device-time spent serving an adapter older than the newest
  wasted work   batches trained twice (must be 0), retrained after a lost
                round, refused (stale, verify, unreadable, revoked)
  failover      from a fault to the new leader's first commit
  bytes         chunk bytes each device uploaded per version
  absorbed      trust: the largest share of rogue volunteers among the
                trainers for which, on every seed, the final score and the
                area under the curve stay within 10% of the clean run's
  ingest        trust: seconds from an honest batch's shipping to the
                leader's ledger, against the clean run's
  keep up       personal: the share of the devices whose personal adapter
                keeps up; lag: the steps not yet trained into it at the end,
                and the age of the oldest (median and 90th percentile);
                preempted: local jobs stopped because the agent became active
  invariants    checked at the end of every run; a violation is printed, and
                the command exits with status 1
`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("sim", simHelp, stderr)
	var o sim.Options
	fs.IntVar(&o.Nodes, "nodes", sim.DefaultNodes, "devices in the mesh")
	fs.IntVar(&o.Trainers, "trainers", sim.DefaultTrainers, "trainer peers in the raft group, 1-64: the first --voters vote, the others are volunteers (trust default: 6)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of every random draw")
	fs.StringVar(&o.Scenario, "scenario", sim.Baseline, "baseline, churn, partition, relays, poison or trust")
	fs.IntVar(&o.Voters, "voters", 0, "trainers that vote; the others are volunteers (default: all up to 5; trust: 3)")
	rogueVol := fs.Int("rogue-volunteers", -1, "volunteers forging their deltas (trust; -1: one)")
	rogueVoters := fs.Int("rogue-voters", -1, "voters voting for forged versions, fewer than a quorum (trust; -1: one with 3 voters or more)")
	flooders := fs.Int("flooders", -1, "devices flooding announcements (trust; -1: one)")
	fs.Float64Var(&o.SpotCheck, "spot-check", sim.DefaultSpotCheck, "share of the volunteers' deltas a voter re-executes each round, at least one, 0-1 (trust)")
	fs.IntVar(&o.Versions, "versions", 0, "adapter versions the trainers publish (default 5, poison 10)")
	fs.Float64Var(&o.Malicious, "malicious", sim.DefaultMalicious, "fraction of malicious devices (poison)")
	malTrainers := fs.Int("malicious-trainers", -1, "trainers returning a huge delta (poison; -1: one when there are 3 trainers or more)")
	fs.IntVar(&o.BundleMiB, "bundle-mib", sim.DefaultBundleMiB, "adapter bundle size in MiB")
	fs.Float64Var(&o.NATShare, "nat", sim.DefaultNATShare, "fraction of devices behind NAT")
	fs.IntVar(&o.Relays, "relays", 0, "relay nodes (default: one per 50 devices, at least 2)")
	fs.Float64Var(&o.HolePunch, "hole-punch", sim.DefaultHolePunch, "share of NAT-to-NAT connections hole punching makes direct, 0-1 (0: none, NAT devices talk to public ones only)")
	fs.DurationVar(&o.Duration, "duration", 0, "virtual time limit of a run (default: versions+5 round intervals)")
	fs.DurationVar(&o.RoundEvery, "round-every", sim.DefaultRoundEvery, "least virtual time between two rounds")
	fs.Float64Var(&o.Personal, "personal", 0, "share of the devices with a personal adapter, 0-1 (0: none, no personal section)")
	fs.Float64Var(&o.PersonalMesh, "personal-mesh", 0, "share of the personal adapters trained by a trusted trainer (mesh mode), the others on the device (local mode), 0-1")
	fs.DurationVar(&o.PersonalFor, "personal-for", sim.DefaultPersonalFor, "virtual time the personal adapters' run covers, 1h-720h")
	asJSON := fs.Bool("json", false, "print the report as JSON (fields: see README.md)")
	plotDir := fs.String("plot", "", "write PNG plots of the run into this directory")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	if !slices.Contains(sim.Scenarios, o.Scenario) {
		return usageErr("unknown scenario %q: want one of %s", o.Scenario, strings.Join(sim.Scenarios, ", "))
	}
	// The options' zero values mean defaults; on the command line 0 means 0.
	switch {
	case o.Nodes < 4:
		return usageErr("--nodes %d: at least 4 devices", o.Nodes)
	case o.Trainers < 1:
		return usageErr("--trainers %d: at least 1 trainer", o.Trainers)
	case o.BundleMiB < 1:
		return usageErr("--bundle-mib %d: at least 1", o.BundleMiB)
	case o.Versions < 0:
		return usageErr("--versions %d: at least 1", o.Versions)
	case !(o.HolePunch >= 0 && o.HolePunch <= 1):
		return usageErr("--hole-punch %v: a share in [0, 1]", o.HolePunch)
	}
	switch {
	case *malTrainers == 0:
		o.MaliciousTrainers = -1 // none
	case *malTrainers > 0:
		o.MaliciousTrainers = *malTrainers
	case *malTrainers < -1:
		return usageErr("--malicious-trainers %d: at least 0", *malTrainers)
	}
	// --trainers left unset: the scenario's default.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["trainers"] && o.Scenario == sim.Trust {
		o.Trainers = 0
	}
	for _, c := range []struct {
		name string
		v    int
		to   *int
	}{{"rogue-volunteers", *rogueVol, &o.RogueVolunteers}, {"rogue-voters", *rogueVoters, &o.RogueVoters}, {"flooders", *flooders, &o.Flooders}} {
		switch {
		case c.v == 0:
			*c.to = -1 // none
		case c.v > 0:
			*c.to = c.v
		case c.v < -1:
			return usageErr("--%s %d: at least 0", c.name, c.v)
		}
	}
	switch {
	case o.Voters < 0:
		return usageErr("--voters %d: at least 1", o.Voters)
	case !(o.SpotCheck >= 0 && o.SpotCheck <= 1):
		return usageErr("--spot-check %v: a share in [0, 1]", o.SpotCheck)
	case o.SpotCheck == 0:
		o.SpotCheck = -1 // none
	case !(o.Personal >= 0 && o.Personal <= 1):
		return usageErr("--personal %v: a share in [0, 1]", o.Personal)
	case !(o.PersonalMesh >= 0 && o.PersonalMesh <= 1):
		return usageErr("--personal-mesh %v: a share in [0, 1]", o.PersonalMesh)
	case o.PersonalFor < time.Hour || o.PersonalFor > 30*24*time.Hour:
		return usageErr("--personal-for %v: between 1h and 720h", o.PersonalFor)
	}
	if o.NATShare == 0 {
		o.NATShare = -1 // --nat 0 means none
	}
	if o.Malicious == 0 {
		o.Malicious = -1
	}
	if o.HolePunch == 0 {
		o.HolePunch = -1 // --hole-punch 0: no NAT-to-NAT connection carries anything
	}
	if err := o.Validate(); err != nil {
		return usageErr("%v", strings.TrimPrefix(err.Error(), sim.ErrOptions.Error()+": "))
	}
	start := time.Now()
	r, err := sim.Run(o)
	if err != nil {
		return err
	}
	wall := time.Since(start)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else if err := r.WriteTable(stdout); err != nil {
		return err
	}
	// Wall time varies from run to run: it goes to stderr, so that stdout
	// stays the same for the same seed.
	fmt.Fprintf(stderr, "simulated in %.1f s of wall time\n", wall.Seconds())
	if *plotDir != "" {
		if err := os.MkdirAll(*plotDir, 0o755); err != nil {
			return err
		}
		paths, err := plotSim(r, *plotDir)
		if err != nil {
			return err
		}
		for _, p := range paths {
			fmt.Fprintf(stderr, "wrote %s\n", filepath.Clean(p))
		}
	}
	if !r.Invariants.OK {
		return fmt.Errorf("%d invariants violated (seed %d)", len(r.Invariants.Violations), r.Seed)
	}
	return ctx.Err()
}
