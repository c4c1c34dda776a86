package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
)

// TestPersonalOverMeshNode: a node under [personal] mode mesh gets its
// personal adapter from the trainer it trusts, over the mesh; its scrubbed
// steps go to that trainer alone: another trainer that serves personal
// jobs too (a volunteer the user does not trust) never gets a job, and the
// adapter is nowhere but on the device.
func TestPersonalOverMeshNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a node and two trainers")
	}
	ctx := context.Background()
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	trusted, volunteer := t.TempDir(), t.TempDir()
	_, trustedID, err := peer.Identity(trusted)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := startMeshNode(t, node.Config{
		DataDir: a, Upstream: scriptedUpstream(t, "Sure."), Share: share.Policy{Mode: share.ModeNone}, ShareInterval: 50 * time.Millisecond, ScoreInterval: 50 * time.Millisecond,
		Mesh:     &node.MeshConfig{Listen: loopbackP2P, Ship: mesh.ShipOptions{Retry: 500 * time.Millisecond, MaxRetry: 2 * time.Second, Poll: 100 * time.Millisecond}},
		Personal: &node.PersonalConfig{Mode: personal.ModeMesh, Trainers: []string{string(trustedID)}, Idle: time.Hour, Poll: time.Hour, MinSteps: 8},
	})
	if n.Personal() == nil {
		t.Fatal("no personal adapter manager under mode mesh")
	}
	timing := trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond}
	var logs [2]*syncBuffer
	for i, d := range []string{trusted, volunteer} {
		logs[i] = &syncBuffer{}
		joinTrainer(t, a, d, trainer.Config{Bootstrap: n.Peer().Host.Addrs(), Timing: timing,
			Personal: trainer.PersonalConfig{On: true}, Logger: slog.New(slog.NewTextHandler(logs[i], nil))})
	}
	// The device's own scored steps, with a name in them the scrubber
	// hides; held-back ones are kept out of training.
	secret := "Alice Zhou"
	for i := range 24 {
		v := 1.0
		if i%2 == 1 {
			v = -1
		}
		s := &core.Step{ID: core.StepID(fmt.Sprintf("s%03d", i)), SessionID: core.SessionID(fmt.Sprint("sess", i)), Turn: core.TurnMain, API: core.APIChat,
			State: core.StateScored, Source: "gateway", Timings: core.Timings{Start: time.Now().Add(time.Duration(i-100) * time.Second)},
			Request:  core.Request{Messages: []core.Message{{Role: "user", Content: "I am " + secret + ". What time is it?"}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: "assistant", Content: []string{"Noon", "12 o'clock"}[i%2]}}}},
			Reward:   &core.Reward{Value: &v}}
		if err := n.Pool().Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var rec personal.Record
	waitFor(t, "the trusted trainer to train the personal adapter", func() bool {
		rec, err = n.Personal().Train(ctx)
		if err != nil && !errors.Is(err, personal.ErrNotEnough) {
			t.Logf("not yet: %v", err)
		}
		return err == nil
	})
	dir := filepath.Join(a, node.PersonalDir, rec.Version)
	if rec.Version != "p1" || rec.Trained == 0 || rec.HeldBack == 0 {
		t.Fatalf("record %+v", rec)
	}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the personal adapter on the device: %v", err)
		}
	}
	if !strings.Contains(logs[0].String(), "personal adapter trained and sent") {
		t.Fatalf("the trusted trainer's log says no job:\n%s", logs[0].String())
	}
	if strings.Contains(logs[1].String(), "personal") && strings.Contains(logs[1].String(), "device=") {
		t.Fatalf("the volunteer trainer saw a personal job:\n%s", logs[1].String())
	}
	// Nothing of the job is left on either trainer: no adapter, no steps.
	for i, d := range []string{trusted, volunteer} {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				if e.Name() == "adapter_model.safetensors" && strings.Contains(p, trainer.PersonalDir) && !strings.Contains(p, "tiny-") {
					t.Errorf("trainer %d keeps a personal adapter: %s", i+1, p)
				}
				if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
					t.Errorf("trainer %d holds the device's unscrubbed text in %s", i+1, p)
				}
			}
			return nil
		})
	}

	// What the owner sees and does, through the running node.
	status := func(args ...string) personal.Status {
		t.Helper()
		out, errs, code := runCLI(t, append(append([]string{"personal"}, args...), "--json", "--data", a)...)
		if code != 0 {
			t.Fatalf("personal %v: code %d, %s", args, code, errs)
		}
		var st personal.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("personal %v --json: %v\n%s", args, err, out)
		}
		return st
	}
	if st := status("status"); st.Mode != personal.ModeMesh || !st.Enabled || st.Current != "p1" || st.Learned != rec.Trained || len(st.Versions) != 1 {
		t.Fatalf("status %+v", st)
	}
	out, _, code := runCLI(t, "personal", "status", "--data", a)
	if code != 0 || !strings.Contains(out, "serving  p1") || !strings.Contains(out, "mode     mesh, on") {
		t.Fatalf("personal status: %s", out)
	}
	if st := status("off"); st.Enabled || st.Current != "" {
		t.Fatalf("after off: %+v", st)
	}
	if name, _ := n.Personal().Current(); name != "" {
		t.Fatalf("off, yet %s is stacked", name)
	}
	if st := status("on"); !st.Enabled || st.Current != "p1" {
		t.Fatalf("after on: %+v", st)
	}
	if st := status("reset"); st.Current != "" || st.Learned != 0 || len(st.Versions) != 0 {
		t.Fatalf("after reset: %+v", st)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the personal adapter is still on disk after reset: %v", err)
	}
}
