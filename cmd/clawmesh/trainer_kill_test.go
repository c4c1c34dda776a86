package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
)

// TestTrainerKill9 runs three `clawmesh trainer` processes, kills the
// leader's with SIGKILL, and checks that the other two elect a new leader
// and that the killed one, restarted, rejoins as a follower.
func TestTrainerKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it")
	}
	bin := buildBinary(t)
	a := t.TempDir()
	cli(t, "mesh", "init", "--data", a)
	n := runMeshNode(t, a, "http://127.0.0.1:9/v1", share.Policy{})
	boot := n.Peer().Host.Addrs()

	dirs := make([]string, 3)
	procs := make([]*exec.Cmd, 3)
	start := func(i int) {
		args := []string{"trainer", "--data", dirs[i], "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns", "--join-wait", "2s", "--log", "warn"}
		for _, b := range boot {
			args = append(args, "--bootstrap", b)
		}
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "CLAWMESH_DATA=")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		waitFor(t, "the trainer's address file", func() bool {
			_, err := trainer.ReadAddr(dirs[i])
			return err == nil
		})
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if p != nil && p.ProcessState == nil {
				p.Process.Signal(syscall.SIGTERM)
				p.Wait()
			}
		}
	})
	for i := range dirs {
		dirs[i] = t.TempDir()
		// Every trainer a voter: the group outlives its leader.
		tok := strings.TrimSpace(cli(t, "invite", "--role", "trainer", "--voter", "--data", a))
		cli(t, "join", tok, "--data", dirs[i], "--p2p-listen", loopbackP2P[1])
		start(i)
	}
	status := func(i int) (trainer.Status, bool) {
		out, _, code := runCLI(t, "trainer", "status", "--json", "--data", dirs[i])
		var st trainer.Status
		return st, code == 0 && json.Unmarshal([]byte(out), &st) == nil
	}
	leaderIdx := func(exclude int) int {
		for i := range dirs {
			if i == exclude {
				continue
			}
			if st, ok := status(i); ok && st.State == "leader" && len(st.Voters) == 3 {
				return i
			}
		}
		return -1
	}
	li := -1
	waitFor(t, "a leader of three voters", func() bool { li = leaderIdx(-1); return li >= 0 })
	old, _ := status(li)

	if err := procs[li].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	procs[li].Wait()
	os.Remove(filepath.Join(dirs[li], trainer.AddrFile)) // a killed process leaves it behind
	ni := -1
	waitLong(t, 2*time.Minute, "a new leader", func() bool { ni = leaderIdx(li); return ni >= 0 })
	st, _ := status(ni)
	if st.Peer == old.Peer || st.Term <= old.Term {
		t.Fatalf("new leader %s at term %d, old %s at term %d", st.Peer, st.Term, old.Peer, old.Term)
	}

	start(li)
	waitFor(t, "the killed trainer back as a follower", func() bool {
		s, ok := status(li)
		return ok && s.State == "follower" && s.Leader == st.Peer && s.Versions >= 1 && slices.Contains(s.Voters, old.Peer)
	})
}
