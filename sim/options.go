package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/trainer/group"
)

// Scenarios.
const (
	Baseline  = "baseline"  // a quiet mesh: propagation, gossip, one revocation
	Churn     = "churn"     // devices sleep, wake and leave; the leader killed, a trainer paused
	Partition = "partition" // the network cut in two (the leader on the small side), then healed
	Relays    = "relays"    // the baseline over a sweep of NAT shares and relay counts
	Poison    = "poison"    // malicious contributors, the learning curve under each defence
	Trust     = "trust"     // a rogue volunteer, a rogue voter below quorum, a flood of announcements
)

// Scenarios lists the scenarios, in the order help shows them.
var Scenarios = []string{Baseline, Churn, Partition, Relays, Poison, Trust}

// ErrOptions is returned for options out of range.
var ErrOptions = errors.New("sim: invalid options")

// Defaults of Options.
const (
	DefaultNodes      = 1000
	DefaultTrainers   = 3
	DefaultVersions   = 5
	DefaultBundleMiB  = 16
	DefaultNATShare   = 0.4
	DefaultHolePunch  = 0.7
	DefaultDegree     = 8
	DefaultRoundEvery = 3 * time.Minute
	DefaultMalicious  = 0.1
	// DefaultSpotCheck is the share of the volunteers' deltas a voter
	// re-executes each round (at least one).
	DefaultSpotCheck = 0.1
	// The trust scenario's trainers: 3 voters and 3 volunteers.
	trustTrainers = 6
	trustVoters   = 3
)

// Options configure a run. The zero value of a field means its default.
type Options struct {
	// Seed seeds every random draw; the same seed gives the same run.
	Seed uint64
	// Scenario is one of Scenarios (default Baseline).
	Scenario string
	// Nodes is the number of devices (default 1000); Trainers the number
	// of trainer peers in the raft group (default 3; Trust's default is 6).
	Nodes, Trainers int
	// Voters is how many of the trainers are voters: they vote in raft
	// and certify versions; the others are volunteers, which train shares
	// and never vote (default all of them up to group.MaxVoters; Trust's
	// default is 3).
	Voters int
	// Versions is how many adapter versions the trainers publish before
	// they stop (default 5; Poison's default is 10).
	Versions int
	// BundleMiB is an adapter bundle's size in MiB (default 16).
	BundleMiB int
	// NATShare is the fraction of devices behind NAT, which other NAT
	// devices meet through a relay (default 0.4; negative means none).
	// Relays is the number of relay nodes (default one per 50 devices, at
	// least 2), each taking at most relayReservations NAT devices.
	NATShare float64
	Relays   int
	// HolePunch is the share of connections between two NAT devices that
	// hole punching (libp2p's DCUtR) turns direct; the others carry
	// nothing (default 0.7; negative means none).
	// Which pairs are punched is drawn per pair from the seed.
	HolePunch float64
	// Degree is how many peers each node dials (default 8, or Nodes−1 if
	// fewer); with the peers that dial it a node keeps about twice as
	// many.
	Degree int
	// RoundEvery is the least time between two rounds' starts (default
	// 3m, longer than the log-tree bound at 1,000 devices, so that a
	// version mostly spreads before the next one).
	RoundEvery time.Duration
	// Duration bounds the virtual time of a run (default Versions+5
	// round intervals).
	Duration time.Duration
	// Malicious is the fraction of malicious devices in the Poison
	// scenario (default 0.1; negative means none). MaliciousTrainers is the
	// number of trainers that return a huge delta there (default 1 when
	// there are at least 3 trainers).
	Malicious         float64
	MaliciousTrainers int
	// The Trust scenario's adversaries (see the package documentation).
	// RogueVolunteers is the number of volunteers whose deltas are forged
	// (default 1); RogueVoters the number of voters that vote for forged
	// versions and against honest ones, the first of them the first
	// leader (default 1; fewer than a quorum); Flooders the number of
	// devices announcing far beyond their token bucket (default 1).
	// Negative means none. SpotCheck is the share of the volunteers'
	// deltas a voter re-executes each round, at least one (default 0.1;
	// negative means none).
	RogueVolunteers, RogueVoters, Flooders int
	SpotCheck                              float64
	// Personal is the share of devices with a personal adapter on, 0-1
	// (default 0: none, and the report has no personal section). Of
	// them, PersonalMesh is the share in mesh mode, trained by a trainer
	// they trust; the others are in local mode, training on the device
	// while the agent is idle (default 0: all local). PersonalFor is the
	// virtual time the personal adapters' run covers (default 72h). See
	// the package documentation, "Personal adapters".
	Personal, PersonalMesh float64
	PersonalFor            time.Duration
}

// WithDefaults returns o with zero fields set to their defaults. A
// negative NATShare, HolePunch, Malicious or MaliciousTrainers (none)
// stays negative, so that applying it twice changes nothing.
func (o Options) WithDefaults() Options {
	if o.Scenario == "" {
		o.Scenario = Baseline
	}
	if o.Nodes == 0 {
		o.Nodes = DefaultNodes
	}
	if o.Trainers == 0 {
		o.Trainers = DefaultTrainers
		if o.Scenario == Trust {
			o.Trainers = trustTrainers
		}
	}
	if o.Voters == 0 {
		o.Voters = min(o.Trainers, group.MaxVoters)
		if o.Scenario == Trust {
			o.Voters = min(o.Trainers, trustVoters)
		}
	}
	if o.SpotCheck == 0 {
		o.SpotCheck = DefaultSpotCheck
	}
	if o.Scenario == Trust {
		if o.RogueVolunteers == 0 && o.Trainers > o.Voters {
			o.RogueVolunteers = 1
		}
		if o.RogueVoters == 0 && o.Voters >= 3 {
			o.RogueVoters = 1
		}
		if o.Flooders == 0 {
			o.Flooders = 1
		}
	}
	if o.Versions == 0 {
		o.Versions = DefaultVersions
		if o.Scenario == Poison {
			o.Versions = 10
		}
	}
	if o.BundleMiB == 0 {
		o.BundleMiB = DefaultBundleMiB
	}
	if o.NATShare == 0 {
		o.NATShare = DefaultNATShare
	}
	if o.HolePunch == 0 {
		o.HolePunch = DefaultHolePunch
	}
	if o.Relays == 0 {
		o.Relays = max(2, o.Nodes/50)
	}
	if o.Degree == 0 {
		o.Degree = min(DefaultDegree, o.Nodes-1)
	}
	if o.RoundEvery == 0 {
		o.RoundEvery = DefaultRoundEvery
	}
	if o.Duration == 0 {
		o.Duration = time.Duration(o.Versions+5) * o.RoundEvery
	}
	if o.Malicious == 0 {
		o.Malicious = DefaultMalicious
	}
	if o.MaliciousTrainers == 0 && o.Trainers >= 3 && o.Malicious > 0 {
		o.MaliciousTrainers = 1
	}
	if o.PersonalFor == 0 && o.Personal > 0 {
		o.PersonalFor = DefaultPersonalFor
	}
	return o
}

// Validate reports options out of range (after defaults).
func (o Options) Validate() error {
	d := o.WithDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, a...))
	}
	switch {
	case !slices.Contains(Scenarios, d.Scenario):
		return bad("unknown scenario %q (want one of %v)", d.Scenario, Scenarios)
	case d.Nodes < 4 || d.Nodes > 100_000:
		return bad("nodes %d outside [4, 100000]", d.Nodes)
	case d.Trainers < 1 || d.Trainers > 64:
		return bad("trainers %d outside [1, 64]", d.Trainers)
	case d.Voters < 1 || d.Voters > min(d.Trainers, group.MaxVoters):
		return bad("voters %d outside [1, %d]", d.Voters, min(d.Trainers, group.MaxVoters))
	case d.RogueVolunteers > d.Trainers-d.Voters:
		return bad("%d rogue volunteers of %d volunteers", d.RogueVolunteers, d.Trainers-d.Voters)
	case d.RogueVoters > 0 && d.Voters-d.RogueVoters < d.Voters/2+1:
		return bad("%d rogue voters of %d: the others must make a quorum", d.RogueVoters, d.Voters)
	case d.Flooders > d.Nodes/4:
		return bad("%d flooders of %d devices: at most a quarter", d.Flooders, d.Nodes)
	case d.SpotCheck > 1 || math.IsNaN(d.SpotCheck):
		return bad("spot-check share %v outside [0, 1]", o.SpotCheck)
	case d.Versions < 1 || d.Versions > 1000:
		return bad("versions %d outside [1, 1000]", d.Versions)
	case d.BundleMiB < 1 || d.BundleMiB > 1024:
		return bad("bundle of %d MiB outside [1, 1024]", d.BundleMiB)
	case !(d.NATShare < 1) || math.IsNaN(d.NATShare):
		return bad("NAT share %v outside [0, 1)", o.NATShare)
	case d.HolePunch > 1 || math.IsNaN(d.HolePunch):
		return bad("hole punching share %v outside [0, 1]", o.HolePunch)
	case d.Relays < 1 || d.Relays > d.Nodes/2:
		return bad("relays %d outside [1, nodes/2]", d.Relays)
	case d.Degree < 1 || d.Degree >= d.Nodes:
		return bad("degree %d outside [1, nodes)", d.Degree)
	case d.RoundEvery < time.Second:
		return bad("round interval %v under 1s", d.RoundEvery)
	case d.Duration < time.Minute || d.Duration > 7*24*time.Hour:
		return bad("duration %v outside [1m, 7d]", d.Duration)
	case !(d.Malicious < 0.5) || math.IsNaN(d.Malicious):
		return bad("malicious fraction %v outside [0, 0.5)", o.Malicious)
	case d.MaliciousTrainers*2 >= d.Trainers && d.MaliciousTrainers > 0:
		return bad("%d malicious trainers of %d: fewer than half must be", d.MaliciousTrainers, d.Trainers)
	case !(d.Personal >= 0 && d.Personal <= 1):
		return bad("personal share %v outside [0, 1]", o.Personal)
	case !(d.PersonalMesh >= 0 && d.PersonalMesh <= 1):
		return bad("personal mesh share %v outside [0, 1]", o.PersonalMesh)
	case d.Personal > 0 && (d.PersonalFor < time.Hour || d.PersonalFor > 30*24*time.Hour):
		return bad("personal run of %v outside [1h, 30d]", d.PersonalFor)
	}
	return nil
}
