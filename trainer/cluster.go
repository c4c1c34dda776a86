package trainer

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// Cluster is a mesh made for a purpose on loopback: one device that ships
// batches and n trainer peers in a raft group, each in its own data
// directory, which can be killed and restarted. Tests and `clawmesh bench
// trainers` use it.
type Cluster struct {
	Dir      string
	Node     *peer.Peer
	out      *benchOutbox
	opts     ClusterOptions
	nodeKey  []byte
	cancel   context.CancelFunc
	runCtx   context.Context
	wg       sync.WaitGroup
	trainers []*clusterTrainer
}

type clusterTrainer struct {
	dir    string
	t      *Trainer
	cancel context.CancelFunc
	done   chan struct{}
}

// ClusterOptions configure a Cluster.
type ClusterOptions struct {
	// Trainers is how many trainers to make (default 3).
	Trainers int
	// Timing and Group configure every trainer.
	Timing Timing
	Group  group.Config
	// Dir is where the data directories go (default a new temporary one,
	// removed by Close).
	Dir    string
	Logger *slog.Logger
	// Verify checks batches (see Config.Verify); nil checks nothing, as
	// the batches made up here carry no real plugin to replay.
	Verify func(ctx context.Context, id core.BatchID, from mesh.PeerID) (string, error)
}

// NewCluster makes the mesh, joins the trainers and starts them all.
func NewCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	if o.Trainers == 0 {
		o.Trainers = 3
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "clawmesh-cluster-"); err != nil {
			return nil, err
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Cluster{Dir: dir, out: newBenchOutbox(), opts: o, cancel: cancel, runCtx: runCtx}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	nodeData := filepath.Join(dir, "node")
	key, id, err := peer.Identity(nodeData)
	if err != nil {
		return nil, err
	}
	if _, err := mesh.Init(nodeData, "cluster", key, id, time.Now(), rand.Reader); err != nil {
		return nil, err
	}
	if c.Node, err = peer.Start(runCtx, peer.Options{DataDir: nodeData, Listen: benchListen}); err != nil {
		return nil, err
	}
	c.goRun(func() { c.Node.Run(runCtx) })
	c.goRun(func() {
		c.Node.Mesh.Ship(runCtx, c.out, mesh.ShipOptions{Poll: 20 * time.Millisecond, Retry: ShipRetry, MaxRetry: 5 * ShipRetry})
	})
	for i := range o.Trainers {
		td := filepath.Join(dir, "trainer"+strconv.Itoa(i))
		tok, err := mesh.Invite(nodeData, key, member.RoleTrainer, time.Hour, 1, c.Node.Host.Addrs(), time.Now(), rand.Reader)
		if err != nil {
			return nil, err
		}
		jctx, jcancel := context.WithTimeout(ctx, benchWait)
		_, err = peer.Join(jctx, td, tok.String(), benchListen, nil)
		jcancel()
		if err != nil {
			return nil, err
		}
		c.trainers = append(c.trainers, &clusterTrainer{dir: td})
	}
	for i := range c.trainers {
		if err := c.Start(ctx, i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) goRun(fn func()) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); fn() }()
}

// Len is the number of trainers.
func (c *Cluster) Len() int { return len(c.trainers) }

// Trainer is trainer i, nil while it is down.
func (c *Cluster) Trainer(i int) *Trainer { return c.trainers[i].t }

// DataDir is trainer i's data directory.
func (c *Cluster) DataDir(i int) string { return c.trainers[i].dir }

// Start starts trainer i (again) from its data directory.
func (c *Cluster) Start(ctx context.Context, i int) error {
	ct := c.trainers[i]
	if ct.t != nil {
		return fmt.Errorf("trainer %d is running", i)
	}
	boot := c.Node.Host.Addrs()
	for _, o := range c.trainers {
		if o.t != nil {
			boot = append(boot, o.t.host.Addrs()...)
		}
	}
	t, err := New(ctx, Config{DataDir: ct.dir, Listen: benchListen, Bootstrap: boot, Timing: c.opts.Timing, Group: c.opts.Group,
		Verify: c.opts.Verify, NoVerify: c.opts.Verify == nil, Weights: "127.0.0.1:0",
		Logger: c.opts.Logger.With("trainer", i)})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(c.runCtx)
	ct.t, ct.cancel, ct.done = t, cancel, make(chan struct{})
	done := ct.done
	c.goRun(func() { defer close(done); t.Run(rctx) })
	return nil
}

// Kill stops trainer i at once, as a crash would: its raft stops with no
// hand-over and its connections drop. Its data directory stays.
func (c *Cluster) Kill(i int) error {
	ct := c.trainers[i]
	if ct.t == nil {
		return nil
	}
	t := ct.t
	ct.t = nil
	err := t.crash()
	ct.cancel()
	<-ct.done
	return errors.Join(err, t.Close())
}

// crash stops the raft member and the host first, so that nothing goes out
// after the moment of the crash.
func (t *Trainer) crash() error {
	var errs []error
	if t.peer != nil {
		errs = append(errs, t.peer.Close())
	}
	errs = append(errs, t.group.raft.Shutdown().Error())
	return errors.Join(errs...)
}

// Leader is the index of the running trainer that leads, ok=false if none
// does (or more than one think they do).
func (c *Cluster) Leader() (int, bool) { return leaderAmong(len(c.trainers), c.Trainer) }

// leaderAmong finds the one running trainer of n that leads.
func leaderAmong(n int, trainer func(int) *Trainer) (int, bool) {
	idx := -1
	for i := range n {
		if t := trainer(i); t != nil && t.group.isLeader() {
			if idx >= 0 {
				return -1, false
			}
			idx = i
		}
	}
	return idx, idx >= 0
}

// Ship has the device ship a batch.
func (c *Cluster) Ship(payload []byte) core.BatchID { return c.out.ship(payload) }

// WaitUntil polls cond every few milliseconds for at most d.
func (c *Cluster) WaitUntil(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	return waitFor(ctx, d, "cluster: no "+what, cond)
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("trainer: %s within %s", what, d)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// Close stops everything and removes the directory if NewCluster made it.
func (c *Cluster) Close() error {
	var errs []error
	for i, ct := range c.trainers {
		if ct.t != nil {
			t := ct.t
			ct.t = nil
			ct.cancel()
			<-ct.done
			if err := t.Close(); err != nil {
				errs = append(errs, fmt.Errorf("trainer %d: %w", i, err))
			}
		}
	}
	c.cancel()
	if c.Node != nil {
		c.Node.Close()
	}
	c.wg.Wait()
	if c.opts.Dir == "" {
		os.RemoveAll(c.Dir)
	}
	return errors.Join(errs...)
}

// SyntheticBatch encodes a batch of n scored steps of one session, as a
// device would ship them: a user asks, the assistant answers, and a
// plugin's reward of +1 or −1 says whether the answer starts with a word.
// Different seeds give different batches.
func SyntheticBatch(seed uint64, n int, adapter string) ([]byte, error) {
	prompts := []string{"Hi, how are you?", "What time is it?", "Can you help me?", "Tell me a joke."}
	replies := []string{"OK", " ok", "Sure.", "...", "Yes", "- no"}
	steps := make([]*core.Step, n)
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for i := range n {
		k := int(seed)*7 + i
		reply := replies[(k+k/len(prompts))%len(replies)] // every prompt gets good and bad replies
		v := -1.0
		if r := reply[0]; r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' {
			v = 1
		}
		id := fmt.Sprintf("s%d-%d", seed, i)
		steps[i] = &core.Step{
			ID: core.StepID(id), SessionID: core.SessionID(fmt.Sprintf("session-%d", seed)),
			Turn: core.TurnMain, API: core.APIChat, State: core.StateScored, Adapter: adapter,
			Request: core.Request{Model: "tiny", Messages: []core.Message{{Role: core.RoleUser, Content: prompts[k%len(prompts)]}}},
			Response: core.Response{Model: "tiny", Choices: []core.Choice{{
				Message: core.Message{Role: core.RoleAssistant, Content: reply}, FinishReason: "stop"}}},
			Timings: core.Timings{Start: at},
			Reward: &core.Reward{Value: &v, At: at, Scores: []core.Score{{Plugin: "starts-with-word",
				Hash: "0000000000000000000000000000000000000000000000000000000000000000", Value: &v, Weight: 1}}},
		}
	}
	return batch.Encode(batch.Meta{Created: at, Policy: "cluster"}, steps)
}

// Isolate cuts trainer i off the other trainers (its raft and trainer
// streams are refused both ways and its connections dropped) or, with
// off false, heals it.
func (c *Cluster) Isolate(i int, on bool) {
	t := c.trainers[i].t
	if t == nil {
		return
	}
	t.isolated.Store(on)
	if on {
		for _, o := range c.trainers {
			if o.t != nil && o.t != t {
				t.host.Disconnect(o.t.self)
			}
		}
	}
}
