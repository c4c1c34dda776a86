package live

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/serve"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// recipeOptions configures one recipe's run of the demo.
type recipeOptions struct {
	Recipe string
	Rounds int
	Seed   uint64
	Users  []scenario.User
	// Failover stops the trainers' leader after half the rounds.
	Failover bool
	// Sessions is how many sessions each user opens per prompt and round
	// (default 4): the replies to one prompt are compared with each other.
	Sessions int
	// Cache, when set, is a directory that keeps the reward plugins'
	// compilation cache from node to node and run to run: the nodes share
	// it, and each trainer starts with a copy.
	Cache string
	// Samples is how many replies per held-back prompt the score is
	// measured on (default 32).
	Samples int
	// Base is the base model's directory (BaseModel); empty means the
	// tiny model.
	Base string
	// Logs, when set, is a directory where each node and trainer writes
	// its log at debug level (RECIPE-node1.log, RECIPE-trainer1.log, ...).
	Logs string
	// Serve, when set, has each node run its model server itself (as
	// `clawmesh node --serve`) instead of a tiny model served in process.
	Serve *modelserver.Config
	// Personal gives every node a personal adapter (mode local, trained in
	// process after each round) and measures each user's score with the
	// shared version alone too, on a model server of its own.
	Personal bool
}

// liveMesh is the running mesh of one recipe's run.
type liveMesh struct {
	models []string // the model servers' base URLs (http://addr)
	// shared is the model server that serves the shared version alone
	// (with Personal).
	shared   string
	nodes    []*node.Node
	gateways []string // the nodes' base URLs
	trainers []*liveTrainer
}

// liveTrainer is one of the mesh's trainers. Stopping it (cancel, then
// waiting for done) is how the demo kills the leader.
type liveTrainer struct {
	tr     *trainer.Trainer
	cancel context.CancelFunc
	done   chan struct{}
	alive  bool
}

// runRecipe starts the mesh for one recipe, runs the users and the rounds,
// and tears the mesh down.
func runRecipe(ctx context.Context, o recipeOptions, w io.Writer) (RecipeRun, error) {
	if o.Sessions == 0 {
		o.Sessions = 4
	}
	if o.Samples == 0 {
		o.Samples = 32
	}
	run := RecipeRun{Recipe: o.Recipe, LeaderChanges: []LeaderChange{}}
	start := time.Now()
	say := func(format string, a ...any) {
		fmt.Fprintf(w, "[%s %5.1fs] %s\n", o.Recipe, time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	root, err := os.MkdirTemp("", "clawmesh-demo-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithCancel(ctx)
	var stops []func()
	defer func() {
		cancel()
		for _, s := range slices.Backward(stops) {
			s()
		}
	}()
	m, err := startMesh(ctx, root, o, &stops, say)
	if err != nil {
		return run, err
	}
	say("mesh up: 3 nodes (each before its own model server) and 3 trainers, joined with invite tokens")

	leader := func() *liveTrainer {
		for _, t := range m.trainers {
			if t.alive && t.tr.Status().State == "leader" {
				return t
			}
		}
		return nil
	}
	// Every status read looks for a change of leader: the planned stop
	// says its own failover line, any other change gets one here.
	var watch leaderWatch
	round := 0 // the round under way, for the changes of leader
	status := func() trainer.Status {
		st := trainer.Status{}
		if l := leader(); l != nil {
			st = l.tr.Status()
		} else {
			for _, t := range m.trainers {
				if t.alive {
					st = t.tr.Status()
					break
				}
			}
		}
		if c := watch.see(st); c != nil {
			c.At, c.Round = time.Since(start).Seconds(), round
			run.LeaderChanges = append(run.LeaderChanges, *c)
			say("%s", c.Line())
		}
		return st
	}

	// draw samples the replies to u's held-back prompts from the model
	// server at url, which must serve version ("" any).
	draw := func(url, version string, u scenario.User) ([]string, error) {
		var rs []string
		for j, p := range u.HeldBack {
			// The server draws at most 16 replies a call.
			for k := 0; k < o.Samples; k += 16 {
				got, served, err := sampleReplies(ctx, url, p, min(16, o.Samples-k), o.Seed*1000+uint64(j*100+k))
				if err != nil {
					return nil, err
				}
				if version != "" && served != version {
					return nil, fmt.Errorf("the model server serves %q, not %s", served, version)
				}
				rs = append(rs, got...)
			}
		}
		return rs, nil
	}
	measure := func(round int, version string, liked float64, personal []string) (Round, error) {
		r := Round{Round: round, Version: version, Liked: liked, Personal: personal}
		var replies, shared [][]string
		for i, u := range o.Users {
			want := version
			if i < len(personal) {
				want = adapters.StackName(version, personal[i])
			}
			rs, err := draw(m.models[i], want, u)
			if err != nil {
				return r, fmt.Errorf("node %d: %w", i+1, err)
			}
			replies = append(replies, rs)
			r.PerUser = append(r.PerUser, u.Accepted(rs))
			if o.Personal {
				sv := version
				if round == 0 {
					sv = ""
				}
				rs, err := draw(m.shared, sv, u)
				if err != nil {
					return r, fmt.Errorf("the shared-only server: %w", err)
				}
				shared = append(shared, rs)
			}
		}
		r.Score = scenario.Score(o.Users, replies)
		if o.Personal {
			so := &SharedOnly{Score: scenario.Score(o.Users, shared)}
			for i, u := range o.Users {
				so.PerUser = append(so.PerUser, u.Accepted(shared[i]))
			}
			r.SharedOnly = so
		}
		for _, n := range m.nodes {
			steps, err := n.Pool().List(ctx, pool.Filter{})
			if err != nil {
				return r, err
			}
			r.Steps += len(steps)
			for _, s := range steps {
				if s.Reward != nil && s.Reward.Value != nil {
					r.Rewarded++
				}
				if s.Reward != nil && s.Reward.Hint != "" {
					r.Hinted++
				}
			}
		}
		r.Batches = status().Batches.Trained
		return r, nil
	}
	r0, err := measure(0, "", 0, nil)
	if err != nil {
		return run, err
	}
	r0.Version = "base"
	run.Rounds = append(run.Rounds, r0)
	run.Before = r0.Score
	say("round 0  base  score %.3f  (%s)", r0.Score, perUser(o.Users, r0.PerUser))

	rng := rand.New(rand.NewPCG(o.Seed, 0xc1a3))
	var last uint64
	for round = 1; round <= o.Rounds; round++ {
		liked, err := usersRound(ctx, m, o, round, rng)
		if err != nil {
			return run, err
		}
		v, err := settle(ctx, m, last, status, say)
		if err != nil {
			return run, fmt.Errorf("round %d: %w", round, err)
		}
		last = v
		var pvs []string
		if o.Personal {
			if pvs, err = trainPersonal(ctx, m, fmt.Sprint("v", v), say); err != nil {
				return run, fmt.Errorf("round %d: %w", round, err)
			}
		}
		r, err := measure(round, fmt.Sprint("v", v), liked, pvs)
		if err != nil {
			return run, err
		}
		run.Rounds = append(run.Rounds, r)
		st := status()
		if o.Personal {
			say("round %d  v%-3d + personal  score %.3f  (%s)  shared only %.3f  (%s)  liked while training %.2f  steps %d  batches trained %d  leader %s",
				round, v, r.Score, perUser(o.Users, r.PerUser), r.SharedOnly.Score, perUser(o.Users, r.SharedOnly.PerUser), liked, r.Steps, r.Batches, shortPeer(st.Leader))
		} else {
			say("round %d  v%-3d serving on 3 nodes  score %.3f  (%s)  liked while training %.2f  steps %d (%d rewarded, %d with a hint)  batches trained %d  leader %s",
				round, v, r.Score, perUser(o.Users, r.PerUser), liked, r.Steps, r.Rewarded, r.Hinted, r.Batches, shortPeer(st.Leader))
		}

		if o.Failover && run.Failover == nil && round == (o.Rounds+1)/2 && round < o.Rounds {
			l := leader()
			if l == nil {
				return run, fmt.Errorf("no trainer leads")
			}
			old := l.tr.ID()
			say("stopping the trainers' leader %s ...", shortPeer(old))
			stopped := time.Now()
			l.cancel()
			<-l.done
			l.tr.Close()
			l.alive = false
			var nl *liveTrainer
			for deadline := time.Now().Add(time.Minute); nl == nil; {
				if time.Now().After(deadline) {
					return run, fmt.Errorf("no new leader within a minute of stopping %s", shortPeer(old))
				}
				if nl = leader(); nl == nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
			run.Failover = &Failover{AfterRound: round, Stopped: string(old), NewLeader: string(nl.tr.ID()), Seconds: time.Since(stopped).Seconds()}
			run.LeaderChanges = append(run.LeaderChanges, LeaderChange{At: time.Since(start).Seconds(), Round: round,
				From: string(old), To: string(nl.tr.ID()), Term: nl.tr.Status().Term, Planned: true})
			say("failover: %s leads now (%.1f s after the stop); 2 of 3 trainers go on", shortPeer(nl.tr.ID()), run.Failover.Seconds)
			watch.leader = nl.tr.ID()
		}
	}
	if o.Personal {
		found, err := personalElsewhere(root, len(m.nodes))
		if err != nil {
			return run, err
		}
		run.PersonalElsewhere = len(found)
		if len(found) > 0 {
			return run, fmt.Errorf("a personal adapter left its device: %s", strings.Join(found, ", "))
		}
		say("no personal adapter is anywhere but on its own device (the other nodes' and the trainers' data searched)")
	}
	run.After = run.Rounds[len(run.Rounds)-1].Score
	run.Seconds = time.Since(start).Seconds()
	return run, nil
}

// leaderWatch notices a change of the trainers' leader between status
// reads.
type leaderWatch struct {
	leader mesh.PeerID
}

// see takes a status read and returns the change of leader it shows (its
// From, To and Term), or nil when it shows none (or no leader is known
// yet). The planned stop sets leader itself, and is not seen here.
func (w *leaderWatch) see(st trainer.Status) *LeaderChange {
	if st.Leader == "" || st.Leader == w.leader {
		return nil
	}
	old := w.leader
	w.leader = st.Leader
	if old == "" {
		return nil
	}
	return &LeaderChange{From: string(old), To: string(st.Leader), Term: st.Term}
}

// Line is the line the demo prints for an unplanned change.
func (c LeaderChange) Line() string {
	return fmt.Sprintf("failover: %s leads the trainers now (was %s; election term %d); training goes on", shortPeer(mesh.PeerID(c.To)), shortPeer(mesh.PeerID(c.From)), c.Term)
}

// loopbackListen are the libp2p addresses the mesh's peers listen on: any
// free QUIC and TCP port on loopback.
var loopbackListen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// startMesh starts one model server and one node per user, in one mesh,
// and three trainers, adding what stops them to stops.
func startMesh(ctx context.Context, root string, o recipeOptions, stops *[]func(), say func(string, ...any)) (*liveMesh, error) {
	m := &liveMesh{}
	logger := func(name string) (*slog.Logger, error) {
		if o.Logs == "" {
			return nil, nil
		}
		f, err := os.Create(filepath.Join(o.Logs, o.Recipe+"-"+name+".log"))
		if err != nil {
			return nil, err
		}
		// Closed last, after what writes to it has stopped.
		*stops = slices.Insert(*stops, 0, func() { f.Close() })
		return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug})), nil
	}
	for range o.Users {
		if o.Serve != nil {
			m.models = append(m.models, "")
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := ln.Addr().String()
		ln.Close()
		done := make(chan error, 1)
		go func() { done <- serveModel(ctx, o.Base, addr) }()
		*stops = append(*stops, func() { <-done })
		m.models = append(m.models, "http://"+addr)
	}
	if o.Personal {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := ln.Addr().String()
		ln.Close()
		done := make(chan error, 1)
		go func() { done <- serveModel(ctx, o.Base, addr) }()
		*stops = append(*stops, func() { <-done })
		m.shared = "http://" + addr
		if err := waitUp(ctx, m.shared+"/v1/models", time.Minute); err != nil {
			return nil, fmt.Errorf("the model server did not start: %w", err)
		}
	}
	for _, u := range m.models {
		if u == "" {
			continue
		}
		if err := waitUp(ctx, u+"/v1/models", time.Minute); err != nil {
			return nil, fmt.Errorf("the model server did not start: %w", err)
		}
	}

	name := "the tiny model"
	if o.Base != "" {
		name = filepath.Base(o.Base)
	}
	say("3 model servers up (%s)", name)
	first := filepath.Join(root, "node1")
	if err := initMesh(first); err != nil {
		return nil, err
	}
	for i, model := range m.models {
		dir := filepath.Join(root, fmt.Sprint("node", i+1))
		var bootstrap []string
		if i > 0 {
			tok, err := invite(first, member.RoleMember, m.nodes[0])
			if err != nil {
				return nil, err
			}
			if err := join(ctx, dir, tok); err != nil {
				return nil, err
			}
			bootstrap = m.nodes[0].Peer().Host.Addrs()
		}
		lg, err := logger(fmt.Sprint("node", i+1))
		if err != nil {
			return nil, err
		}
		upstream, kind := model+"/v1", "clawmesh"
		var serve *modelserver.Config
		if o.Serve != nil {
			sc := *o.Serve
			serve, upstream, kind = &sc, "", ""
		}
		var pc *node.PersonalConfig
		if o.Personal {
			// Trained by the demo after each round (the users' pause), not
			// by the node's own idle loop.
			pc = &node.PersonalConfig{Mode: personal.ModeLocal, Trainer: localTrainer{base: o.Base, recipe: o.Recipe},
				Idle: 24 * time.Hour, Poll: time.Hour, MinSteps: 8}
		}
		n, err := node.New(ctx, node.Config{DataDir: dir, Logger: lg, Upstream: upstream, UpstreamKind: kind, Serve: serve, Share: share.Policy{Mode: share.ModeAll}, Personal: pc,
			PluginCache: o.Cache, ShareInterval: 200 * time.Millisecond, ScoreInterval: 50 * time.Millisecond,
			Mesh: &node.MeshConfig{Listen: loopbackListen, Bootstrap: bootstrap,
				Ship:    mesh.ShipOptions{Retry: 500 * time.Millisecond, MaxRetry: 2 * time.Second, Poll: 100 * time.Millisecond},
				Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond, WeightsRetry: 300 * time.Millisecond}})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			n.Close(context.Background())
			return nil, err
		}
		done := make(chan struct{})
		go func() { n.Serve(ctx, ln); close(done) }()
		*stops = append(*stops, func() { <-done; n.Close(context.Background()) })
		m.nodes = append(m.nodes, n)
		m.gateways = append(m.gateways, "http://"+ln.Addr().String())
		say("node %d up, in the mesh", i+1)
		if i == 0 && o.Cache != "" {
			// The others start on what the first one compiled.
			if err := n.PluginsReady(ctx); err != nil {
				return nil, err
			}
		}
	}

	// A round waits for all the steps of the users' round (two calls a
	// session), so that how the steps trickle in does not decide how they
	// are cut into rounds.
	perRound := 0
	for _, u := range o.Users {
		perRound += 2 * o.Sessions * len(u.Prompts)
	}
	timing := trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond, VerifyRetry: 2 * time.Second,
		CertifyWait: 20 * time.Second}
	for i := range 3 {
		d := filepath.Join(root, fmt.Sprint("trainer", i+1))
		tok, err := invite(first, member.RoleTrainer, m.nodes[0])
		if err != nil {
			return nil, err
		}
		if err := join(ctx, d, tok); err != nil {
			return nil, err
		}
		if o.Cache != "" {
			// The trainers replay the users' scores with the same plugins.
			if err := os.CopyFS(filepath.Join(d, trainer.PluginsDir, "compiled"), os.DirFS(o.Cache)); err != nil {
				return nil, err
			}
		}
		lg, err := logger(fmt.Sprint("trainer", i+1))
		if err != nil {
			return nil, err
		}
		tctx, tcancel := context.WithCancel(ctx)
		tr, err := trainer.New(tctx, trainer.Config{DataDir: d, Logger: lg, Base: o.Base, Listen: loopbackListen, Bootstrap: m.nodes[0].Peer().Host.Addrs(), Timing: timing,
			Group:   group.Config{Recipe: groupRecipe(o.Recipe), Deadline: 5 * time.Second, LocalSteps: 2, MinRoundSteps: perRound, RoundWait: time.Minute},
			Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond})
		if err != nil {
			tcancel()
			return nil, err
		}
		t := &liveTrainer{tr: tr, cancel: tcancel, done: make(chan struct{}), alive: true}
		go func() { tr.Run(tctx); close(t.done) }()
		*stops = append(*stops, func() {
			if t.alive {
				t.cancel()
				<-t.done
				t.tr.Close()
			}
		})
		m.trainers = append(m.trainers, t)
		say("trainer %d up, in the mesh", i+1)
	}
	return m, nil
}

// usersRound has every user, on its own node and all at once, open
// o.Sessions sessions per prompt, react to each reply, and close them. It
// returns the share of replies the users liked.
func usersRound(ctx context.Context, m *liveMesh, o recipeOptions, round int, rng *rand.Rand) (float64, error) {
	type result struct {
		liked, total int
		err          error
	}
	results := make([]result, len(o.Users))
	var wg sync.WaitGroup
	for i, u := range o.Users {
		urng := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		wg.Go(func() {
			r := &results[i]
			gw := m.gateways[i]
			for k := range o.Sessions {
				for j, p := range u.Prompts {
					sid := fmt.Sprintf("%s-%d-%d-%d", u.Name, round, k, j)
					msgs := []map[string]string{{"role": "user", "content": p}}
					reply, err := chatCall(ctx, gw, sid, msgs, false, urng.Uint64()>>1)
					if err != nil {
						r.err = err
						return
					}
					re := u.React(p, reply, urng)
					r.total++
					if re.Liked {
						r.liked++
					}
					if re.Feedback != nil {
						if err := feedback(ctx, gw, sid, *re.Feedback); err != nil {
							r.err = err
							return
						}
					}
					msgs = append(msgs, map[string]string{"role": "assistant", "content": reply}, map[string]string{"role": "user", "content": re.Next})
					if _, err := chatCall(ctx, gw, sid, msgs, true, urng.Uint64()>>1); err != nil {
						r.err = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	liked, total := 0, 0
	for _, r := range results {
		if r.err != nil {
			return 0, r.err
		}
		liked += r.liked
		total += r.total
	}
	return float64(liked) / float64(max(total, 1)), nil
}

// settle waits until every node has shipped what its users did, the
// trainers have trained it into a version newer than last, and every node
// serves that version; it returns the version.
func settle(ctx context.Context, m *liveMesh, last uint64, status func() trainer.Status, say func(string, ...any)) (uint64, error) {
	deadline := time.Now().Add(3 * time.Minute)
	next := time.Now().Add(3 * time.Second)
	var why string
	for {
		if time.Now().After(next) {
			st := status()
			latest := "none"
			if st.Version != nil {
				latest = fmt.Sprint("v", st.Version.Version.Version)
			}
			say("  ... latest version %s, batches trained %d, pending %d: %s", latest, st.Batches.Trained, st.Batches.Pending+st.Batches.Assigned, why)
			next = time.Now().Add(3 * time.Second)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no new version served within 3 minutes (%s)", why)
		}
		v, ok := func() (uint64, bool) {
			for i, n := range m.nodes {
				st, err := n.Pool().Stats(ctx)
				if err != nil {
					why = err.Error()
					return 0, false
				}
				if k := st.ByState[core.StateOpen] + st.ByState[core.StateClosed] + st.ByState[core.StateScored] + st.ByState[core.StateBatched]; k > 0 {
					why = fmt.Sprintf("node %d has %d steps still to ship", i+1, k)
					return 0, false
				}
			}
			st := status()
			if st.Batches.Pending+st.Batches.Assigned > 0 || st.Round != nil {
				why = fmt.Sprintf("the trainers have %d batches to train", st.Batches.Pending+st.Batches.Assigned)
				return 0, false
			}
			if st.Version == nil || st.Version.Version.Version <= last {
				why = "no new version yet"
				return 0, false
			}
			name := fmt.Sprint("v", st.Version.Version.Version)
			for i, n := range m.nodes {
				if got, _ := adapters.SplitStack(n.Follower().Route().Version); got != name {
					why = fmt.Sprintf("node %d serves %q, not %s yet", i+1, got, name)
					return 0, false
				}
			}
			return st.Version.Version.Version, true
		}()
		if ok {
			return v, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chatCall sends one chat call to a node and returns the reply's text.
func chatCall(ctx context.Context, gw, session string, msgs []map[string]string, done bool, seed uint64) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": baseModelName, "max_tokens": 6, "temperature": 1, "seed": seed, "messages": msgs})
	req, err := http.NewRequestWithContext(ctx, "POST", gw+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	if done {
		req.Header.Set("X-Session-Done", "true")
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if _, err := post(req, &out); err != nil {
		return "", err
	}
	if len(out.Choices) == 0 {
		return "", fmt.Errorf("a reply with no choices")
	}
	return out.Choices[0].Message.Content, nil
}

// feedback rates the session's latest reply on the feedback endpoint.
func feedback(ctx context.Context, gw, session string, score float64) error {
	body, _ := json.Marshal(map[string]any{"session_id": session, "score": score})
	req, err := http.NewRequestWithContext(ctx, "POST", gw+"/clawmesh/v1/feedback", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	_, err = post(req, nil)
	return err
}

// sampleReplies draws n replies to prompt from a model server, with a fixed
// seed so that every version is measured on the same draws, and returns
// them with the adapter version that served them.
func sampleReplies(ctx context.Context, model, prompt string, n int, seed uint64) ([]string, string, error) {
	body, _ := json.Marshal(map[string]any{"model": baseModelName, "max_tokens": 4, "temperature": 1, "n": n, "seed": seed,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, err := http.NewRequestWithContext(ctx, "POST", model+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	h, err := post(req, &out)
	if err != nil {
		return nil, "", err
	}
	var rs []string
	for _, c := range out.Choices {
		rs = append(rs, c.Message.Content)
	}
	if len(rs) != n {
		return nil, "", fmt.Errorf("asked the model server for %d replies, got %d", n, len(rs))
	}
	return rs, h.Get(serveapi.AdapterHeader), nil
}

// post sends req and decodes its JSON reply into out (nil: none), and
// returns the reply's header.
func post(req *http.Request, out any) (http.Header, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
		}
	}
	return resp.Header, nil
}

// waitUp waits until url answers.
func waitUp(ctx context.Context, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func perUser(users []scenario.User, xs []float64) string {
	var parts []string
	for i, x := range xs {
		parts = append(parts, fmt.Sprintf("%s %.2f", users[i].Name, x))
	}
	return strings.Join(parts, ", ")
}

func shortPeer(p mesh.PeerID) string {
	s := string(p)
	if len(s) > 8 {
		return "…" + s[len(s)-6:]
	}
	if s == "" {
		return "none"
	}
	return s
}

// serveModel serves the base model's directory (the tiny model when base
// is empty) on addr, as `clawmesh serve --model base` (or --tiny) does,
// until ctx ends.
func serveModel(ctx context.Context, base, addr string) error {
	log := slog.New(slog.DiscardHandler)
	opts := native.Options{Seed: 1, Logger: log}
	var (
		eng *native.Engine
		txt modeldir.Text
		err error
	)
	if base == "" {
		opts.Name = "tiny"
		if eng, txt, err = newTiny(opts); err != nil {
			return err
		}
	} else {
		opts.Name = filepath.Base(filepath.Clean(base))
		if txt, err = modeldir.Load(base); err != nil {
			return err
		}
		if eng, err = native.Open(ctx, base, opts); err != nil {
			return err
		}
	}
	defer eng.Close()
	srv, err := serve.New(serve.Config{Model: eng, Tokenizer: txt.Tokenizer, Renderer: txt.Renderer, ModelName: opts.Name, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return srv.Run(ctx, ln)
}

// initMesh makes a new mesh in the data directory data, whose peer holds
// its admin key, as `clawmesh mesh init` does.
func initMesh(data string) error {
	key, id, err := peer.Identity(data)
	if err != nil {
		return err
	}
	_, err = mesh.Init(data, "", key, id, time.Now(), crand.Reader)
	return err
}

// invite returns a one-use invite token for role, issued by the peer of
// the data directory data, on which n runs, with n's addresses, as
// `clawmesh invite` does; a trainer's makes a voter (`--voter`).
func invite(data string, role member.Role, n *node.Node) (string, error) {
	key, _, err := peer.Identity(data)
	if err != nil {
		return "", err
	}
	// The demo's trainers are the mesh owner's: each is a voter.
	o := mesh.InviteOptions{Role: role, TTL: 24 * time.Hour, Uses: 1, Addrs: mesh.InviteAddrs(n.Peer().Host.Addrs())}
	if role == member.RoleTrainer {
		o.Voter = mesh.MakeVoter
	}
	tok, err := mesh.InviteWith(data, key, o, time.Now(), crand.Reader)
	if err != nil {
		return "", err
	}
	return tok.String(), nil
}

// join redeems an invite token into the data directory data, as `clawmesh
// join --p2p-listen` on loopback TCP does.
func join(ctx context.Context, data, token string) error {
	_, err := peer.Join(ctx, data, token, loopbackListen[1:], nil)
	return err
}
