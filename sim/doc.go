// Package sim is a deterministic simulator of the mesh at scale: a
// thousand devices and a few trainers in one process, in virtual time, with
// churn, partitions, relays and poisoners (`clawmesh sim`). The demo's
// mesh, real and on one machine, is sim/live, and its simulated users are
// sim/live/scenario; this package imports neither.
//
// Run runs a scenario (Options) and returns its Report, which prints as a
// table (WriteTable) or encodes as JSON; with personal adapters on, the
// report adds how well the devices' personal adapters keep up with their
// steps (below, "Personal adapters"); CheckLineage is the ledger and
// lineage invariants, for the simulator's runs and the real trainers' alike.
//
// # How it runs
//
// A discrete-event core: a virtual clock and a queue of events ordered by
// (time, sequence). One goroutine runs them; every random draw comes from
// a PCG stream seeded by the run's seed and named by purpose (links, graph,
// NAT, gossip loss, fetch back-off, raft timeouts, batches, learning
// noise, churn, faults), so that a draw added for one purpose leaves the
// others as they were; which connections hole punching makes direct is a
// hash of the seed and the pair, drawn from no stream. Output never
// depends on map order. The same Options give the same Report, byte for
// byte once encoded.
//
// # What is the real code
//
// All of it is pure: the simulator links no transport (no go-libp2p,
// quic-go or hashicorp/raft; internal/layout's test checks).
//
//   - Membership: every peer's key and certificate are made by
//     mesh/member.IssueCertificate under one admin key; each connection
//     verifies the peer's certificate with Certificate.Verify; the
//     revocation is made by member.NewRevocation, travels as bytes,
//     is parsed and verified by every node (ParseRevocation,
//     RevocationList.Add) or merged from a neighbour's list on
//     reconnecting (ParseRevocationList, Merge), and every send asks the
//     node's own RevocationList.IsRevoked.
//   - Adapter versions: the leader builds each version's manifest with
//     mesh/weights/chunks.NewManifest over a bundle of the configured size
//     (1 MiB chunks), fills in the lineage (version, parent, term, index),
//     has every voter it reaches that applied the version vote for it
//     (Manifest.VoteFor, under the admin's member.VoterSet of the group's
//     voters), attaches the votes (Manifest.Certify) and signs it
//     (Manifest.Sign); every node parses it from bytes, checks the chain
//     admin → trainer certificate → signature (Manifest.Verify), adopts
//     the voter set the certification carries if it is newer, checks the
//     votes of a quorum (Manifest.VerifyCertified) and fences it against
//     the last one it accepted (Manifest.Fence).
//   - The trainers' replicated state: every trainer holds its own
//     trainer/group.State and applies the committed log to it with
//     State.Apply; the leader decides with State.Plan (per-device quota,
//     round size, shares by speed) and State.Stale, and opens, publishes
//     and aborts rounds with the group's own entries. The batch ledger and
//     the lineage with (term, index) are the real code's.
//   - Aggregation: trainer/adapter.Aggregate (ClippedMean with MaxNorm,
//     TrimmedMean) on small adapter.Deltas, for the norm-clipping and
//     trimmed-mean defences.
//   - The weight fetch's plan: every fetch runs a mesh/weights/chunks.Plan, the
//     real fetcher's, which decides which chunks each request asks of
//     which holder, puts back what a busy or failed request did not get,
//     and leaves holders.
//
// # What is modelled
//
//   - Links. Each device's access link is drawn from home-network
//     figures: downlink 25–500 Mbit/s and uplink 5–50 Mbit/s, both
//     log-uniform (an assumption spanning DSL, cable and fibre plans;
//     the draws' medians come out near 110 Mbit/s down and 16 up);
//     a one-way latency to the core of 5–40 ms (a round trip of 10–80
//     ms to a nearby server), a gossip loss of 0–1% per link end.
//     Trainers sit on 1 Gbit/s links with 5 ms. The latency between two
//     nodes is the sum of theirs. A transfer from a to b holds a's uplink
//     and b's downlink, each a first-come, first-served queue at the
//     link's full rate, for its bytes: no link carries more than its
//     rate, a holder interleaves its fetchers and a fetcher its sources,
//     and the transfer is in once both queues have passed it (a fluid
//     model of the flows sharing each link). Loss is left to QUIC's
//     recovery and costs chunk transfers no time (their rate is not
//     loss-bound at these rates).
//   - NAT and relays: a share of the devices (default 40%) is behind NAT.
//     A NAT device reaches a public one directly (it dials out). Each
//     NAT device holds a reservation on a relay (a public device), at
//     most 128 per relay (circuit relay v2's default, which mesh/p2p
//     keeps); with every relay full it holds none. Two NAT devices meet
//     through the relay of either that holds a reservation (neither: no
//     connection at all), and hole punching (libp2p's DCUtR with AutoNAT,
//     which mesh/p2p enables) then makes a share HolePunch of those
//     connections direct (default 70%), with a direct link's latency and
//     bandwidth. The others carry nothing: libp2p opens no stream on a
//     relayed connection unless asked to, and neither the mesh's
//     protocols nor gossipsub ask, so a relay only brokers the punch and
//     no byte of the mesh's crosses one (relayed bytes are always 0).
//     Which pairs are punched is decided per unordered pair by a hash of
//     the seed and the two ids. Connections are made at the start, long
//     before the first version. No hole punching (a negative HolePunch;
//     `--hole-punch 0`) is the pessimistic model: NAT devices talk to
//     public ones only.
//   - Peer graph: every node dials random peers until Degree (default 8)
//     of its connections carry streams, and is dialled by others, about
//     11 connections each, as libp2p's connection manager keeps a bounded
//     set and the mesh dials other known peers while too few answer.
//   - Gossip is gossipsub's, with the library's defaults, as mesh/p2p
//     runs it: each node keeps a mesh of 6 of its neighbours (grafting
//     below 5, none past 12, symmetric, repaired when a peer is gone or
//     has pruned it), pushes a message it sees first to its mesh (flood
//     publishing off), and at each of its next 3 heartbeats (1 s apart,
//     each node's at its own phase) sends an IHAVE of it to 6 neighbours
//     outside its mesh (or a quarter of them, if more); a neighbour that
//     has not seen it asks (IWANT) once at a time and gets it. Each
//     message, IHAVE and IWANT is lost with the link's loss.
//     TestGossipsubCopiesMatchLibrary checks the copies a node receives
//     against go-libp2p-pubsub itself on 40 hosts. Batch
//     announcements do not go through gossip event by event (a thousand
//     devices' announcements would dominate the run): they reach each
//     trainer the device can reach after twice their latency.
//   - Weights: the transfers, and when a holder is busy or gone, are
//     modelled; which chunks go to which holder is the real fetcher's
//     plan (above). A node that accepts a newer manifest fetches it from
//     the trainers that hold it and the neighbours that said they do,
//     over direct connections only (as mesh/weights asks a NAT device
//     over the mesh host's streams on a punched connection), with the
//     real defaults: 2 requests at once per source, 8 chunks each. A
//     holder serves 4 requests at once and answers the next busy; the worker puts
//     its chunks back and asks again after a back-off (100 ms doubling to
//     2 s). A holder that cannot be reached is left after 10 s of
//     silence; an attempt no source can finish fails, and the next
//     starts 5 s later (the node's retry) from the chunks already held.
//     A node that completes a version re-serves it and tells its
//     neighbours, and fetches under way add it as a source, as the
//     weights service's fetches follow the offers that arrive while they
//     run; a node that wakes starts a new attempt, and asks its
//     neighbours for their newest manifest. A newer offer replaces an
//     older fetch.
//   - Raft among the trainers: not hashicorp/raft itself but its timing
//     and its election rules: a leader commits an entry once a quorum of
//     the voters (at most group.MaxVoters) is reachable, after the
//     quorum's slowest round trip and an fsync (2 ms). A follower's
//     heartbeat timer fires every 1–2 s (HeartbeatTimeout's default and
//     its randomisation), and the follower stands when it fires a second
//     or more after the leader's last heartbeat; it asks for pre-votes,
//     which a voter grants only once it has stood itself and if its log
//     is no newer; refused, it asks again after an election timeout (1–2
//     s); with a quorum it wins after two round trips and commits a
//     no-op first. TestFailoverMatchesRaft checks the election time
//     against hashicorp/raft itself, run in virtual time. A leader cut
//     from a quorum steps down; entries of a deposed leader are lost. A
//     trainer that comes back applies the entries it missed.
//   - Training: a sample costs 64 tokens at the native engine's measured
//     15,032 tokens a second on the tiny model (docs/benchmarks.md,
//     2026-11-25), about 4.3 ms; a trainer pulls its share's batches from
//     their devices (4 KiB a step) and sends its delta (a bundle's size)
//     to the leader.
//   - Learning: the adapter is a vector of 32 numbers and a hidden target
//     t at distance 1 from the start. The score of adapter v is the
//     probability that the policy's reply is the one the user prefers,
//     σ(−1.11 + 9.25·(1 − ‖v − t‖)), as a share of the way from the
//     start's (0.248) to 1: 0 at the start, 0.999 at the target. A batch
//     of s steps points from the round's base v toward t (a direction of
//     length 1) plus noise of 0.85/√s per coordinate; a batch with
//     flipped rewards points the other way, one with forged scores in a
//     random direction twice as long. A trainer's delta is 0.3 long,
//     along the steps-weighted mean of its batches' directions: a round
//     is one AdamW step, which moves every weight by about the learning
//     rate whatever the gradient's size. A malicious trainer returns 100
//     times the opposite. The four constants are fitted to the native
//     engine's measured learning curves: Binary RL on the tiny model,
//     each reply alone against the running baseline as in live use, one
//     step a round at the group's learning rate, rounds of 8, 32 and 128
//     samples, seeds 1–6 (testdata/native_curves.json, measured again by
//     `go test ./sim -run TestNativeCurves -update`); TestLearningFit
//     checks that no other constants on a grid fit them better and that
//     the model's mean curves are nearer the measured means than the
//     measured curves are to one another. Defences:
//     re-verification refuses flipped and forged batches (the verifier
//     re-runs the reward and the recomputed reward disagrees), the quota
//     caps a device at 32 steps a round (group.Config.Quota), norm
//     clipping caps a delta at 0.6 (twice an honest one), the
//     trimmed mean is coordinate-wise. With no defence the aggregate is
//     the plain sample-weighted mean (Aggregate always clips at the
//     round's lower median, itself a defence). Oversized and malformed
//     batches are refused at intake and counted.
//   - Devices ship a 16-step batch every 2 minutes on average; a
//     flooding malicious device 16 times as often.
//   - Voters and volunteers: the first Voters trainers are voters (raft
//     voters, and the voter set that certifies versions); the others are
//     volunteers, which apply the log and train shares but never vote.
//   - Trust (the trust scenario). A rogue volunteer forges its deltas,
//     in turn the honest delta reversed at its honest length (subtle)
//     or reversed and 100 times as long (huge). Each round the leader
//     has a voter re-execute a sample of the volunteers' deltas,
//     SpotCheck of them and at least one, drawn from their own stream;
//     re-execution on the native engine is exact, so a sampled forged
//     delta is caught with certainty, dropped from the aggregate (its
//     batches go back to pending), and its volunteer benched: it gets no
//     more shares. The re-executions delay the round's close by their
//     samples at the engine's rate. A delta not sampled meets norm
//     clipping and the trimmed mean. A rogue volunteer's delta is among
//     the max(1, ⌈r·k⌉) checked of a round's k volunteers' deltas with
//     probability q ≥ max(1, ⌈r·v⌉)/v for v volunteers, so it is benched
//     within ⌈ln 0.001 / ln(1 − q)⌉ rounds with probability 0.999: 18
//     rounds for 3 volunteers at 0.1, and at most 66 whatever their
//     number (q ≥ 0.1). A rogue voter
//     (fewer than a quorum) is the first leader; leading, it publishes
//     the round's aggregate reversed and 100 times as long. Every voter
//     it reaches recomputes the aggregate from the deltas and the honest
//     ones refuse to vote, so the manifest gets no quorum and goes to no
//     device through the mesh; the rogue offers it to its neighbours
//     anyway with its own vote, and they refuse it (VerifyCertified).
//     The honest voters stop answering it; it loses its quorum and steps
//     down, and the next leader retracts the version (group.Retract)
//     before it plans a round. As a follower it votes only for forged
//     versions, which the honest quorum does not need. A flooding
//     device announces 1,024 batches a second to every trainer; each
//     trainer takes them through the real token bucket
//     (golang.org/x/time/rate, mesh.AnnounceBurst 128 then
//     mesh.AnnounceRate 8 a second), counts a strike per announcement
//     over it as mesh's puller does (MaxStrikes 16, one forgotten every
//     StrikeDecay 5 s) and disconnects the device at 16; the device
//     dials back a second later. At most PullsPerPeer+PullQueue of its
//     taken announcements wait for the ledger; more are dropped without
//     a strike.
//
// # Scenarios
//
// Every scenario publishes Versions versions, a round at most every
// RoundEvery, and revokes one device half a round after the middle
// version; the run ends once every live device holds the newest version
// (or at Duration). Churn: devices stay awake for an exponential time of
// mean 20 minutes and sleep for one of mean 5, and one sleep in ten is a
// departure for good (relays and the revoked device stay up; churn stops
// once the last version is out, so that the run can settle); the leader
// is killed 5 s into the second round, while its trainers train, and
// restarted two round intervals later; after three round intervals
// another trainer is paused for 30 s. Partition: after one and a
// half round intervals the leader and 30% of the devices are cut from the
// rest, and healed two intervals later; on healing, nodes reconnect and
// exchange their newest manifests and revocation lists. Relays: the
// baseline over NAT shares of 0, 40% and 70% with 2 relays or the
// default number, at the run's HolePunch. Poison: the baseline with Malicious of the devices
// misbehaving (in turn: flipped rewards and forged scores, both shipped
// 16 times as often; oversized and malformed batches) and
// MaliciousTrainers trainers returning huge deltas, run under each set
// of defences, and once clean. Trust: 6 trainers, 3 of them voters, with
// one rogue volunteer, one rogue voter and one flooding device, every
// defence on, against the same run with none of them; then a sweep of
// the share of rogue volunteers among 10 trainers (3 voters; 0 to 50%,
// no rogue voter, no flood), on 3 seeds from the run's, at most 200
// devices: the largest share whose learning curve stays within 10% of
// the clean run's (final score and mean score over the versions, on
// every seed) is the share the mesh absorbs.
//
// # Personal adapters
//
// With Options.Personal, a share of the devices keep a personal adapter,
// trained on their own steps only (local mode: on the device; mesh mode,
// PersonalMesh of them: by a trainer they trust), and the run adds a
// second one on its own clock over PersonalFor (default three days),
// after the scenario's, on the same devices, links and trainers: the
// mesh's run covers minutes, a personal adapter's life days. Its draws
// come from streams of their own, so the rest of the report is the same
// with it and without it. The model, each part an assumption:
//
//   - The agent's activity: each device has a time zone (its local time
//     is virtual time plus a phase, uniform over the day); from 07:00
//     to 23:00 local the agent alternates idle gaps (exponential, mean
//     45 minutes) and active sessions (exponential, mean 15 minutes, cut
//     at 23:00); it is idle at night, and the device stays on. An active
//     agent records 8 scored steps a minute (the mesh model's 16-step
//     batch every 2 minutes), spread evenly over the session.
//   - Device classes: half the devices are Apple M-series laptops or
//     minis training at 0.5–4 steps a second, half small CPU boxes at
//     0.02–0.2, each speed drawn log-uniform within its class.
//   - Jobs: a job trains the device's oldest untrained steps, at most
//     PersonalJobSteps (256); it starts when the agent goes idle, and the
//     next when one ends while the agent is still idle. A local job takes
//     its steps over the device's speed and runs only while the agent is
//     idle: when a session starts it is preempted, its progress lost (the
//     worker is stopped), and its steps go back to the queue. A mesh job
//     goes up the device's uplink (4 KiB a step, plus the latency) to its
//     trusted trainer (one of the trainers, drawn per device), which
//     trains the jobs it gets one at a time in order of arrival, at 20
//     steps a second on a quarter of its time (the rest is the rounds'),
//     and the adapter (a bundle's size) comes back down the device's
//     downlink; mesh jobs are not preempted, and the trainers stay up.
//   - Keeping up: at the end, a device's lag is the steps not yet trained
//     into its adapter (queued, or in a job running or away) and the age
//     of the oldest; its adapter keeps up when that age is at most
//     PersonalKeepUp (6 hours). The report gives the share that keeps
//     up, the median and 90th percentile lag in steps and hours, the jobs
//     done, started and preempted, the share of the trainers' slice in
//     use, and the same by mode and device class.
//
// # The figures
//
// A version's reach q is the time from its publication until a share q of
// the devices live at publication hold it or a newer version; a device
// that leaves for good, or sleeps through the end of the run, before it
// has the version is not counted. Its awake reach q is the same over the
// devices that stayed awake from the publication until they held the
// version (or to the end of the run): a device that fell asleep or left
// before it had the version cannot be reached by any protocol until it
// wakes, and under churn those are the last percent. A partitioned device
// is awake, so under a partition the two measures are the same. The bound
// is the log-tree bound for whole-bundle store-and-forward: reaching k
// devices takes ceil(log2(k+1)) hops, a hop being the bundle over the
// median device link (the smaller of the median uplink and downlink)
// plus the median one-way latency. Chunked fetching from several holders
// pipelines and can come under it. Across a partition a version also has a
// bound given the cut: a device on a side where, when the cut began, no
// node had a byte of the version or of a newer one, and where none was
// published before the heal, cannot hold it sooner than the heal plus the
// whole bundle at its own downlink plus the latency from the nearest node
// across; if 99% needs such devices, the bound given the cut is the time
// until enough of them could, where that is later than the log-tree bound
// (elsewhere it is that bound). Staleness is device-time spent
// serving a version older than the newest committed one. Failover runs
// from a fault to the new leader's first commit. In the trust scenario,
// an honest batch's ingest runs from its shipping to its entry in the
// leader's ledger, and a learning curve's area is its mean score over the
// versions; the flood's figures are within 1.5 times the clean run's when
// both the honest ingest's 99th percentile and the versions' median 99%
// reach are.
//
// # Invariants
//
// Every run checks, and reports in Report.Invariants: no batch is in two
// versions, and a batch is Trained exactly when the lineage has it; the
// versions strictly increase with (term, index) and every trainer holds
// the same lineage; every manifest a device accepted passes the lineage's
// State.Check; every live device (but the revoked one) holds the newest
// version at the end; the revoked peer received nothing from a node after
// that node learnt of the revocation. In the trust scenario, also: no
// device accepts a forged version (every manifest a device accepts has
// passed VerifyCertified).
package sim
