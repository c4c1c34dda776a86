package nodebench

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/peer"
)

// IdleOptions configures Idle.
type IdleOptions struct {
	// Binary is the clawmesh binary run as the nodes (required).
	Binary string
	// Duration is how long the idle nodes are measured once started
	// (required).
	Duration time.Duration
}

// Cost is what an idle process costs: CPU (percent of one core) and
// resident memory.
type Cost struct {
	CPU float64
	RSS int64 // bytes
}

// IdleResult is what an idle node costs, alone and as a mesh peer.
type IdleResult struct {
	// Alone is a node whose data directory is not in a mesh (the
	// baseline); Peer one that is a mesh peer.
	Alone, Peer Cost
}

// Idle runs o.Binary as two idle nodes, one whose data directory is not in
// a mesh and one that is a mesh peer (its own mesh, on loopback, with mDNS
// and NAT traversal on as by default), waits until they have started, then
// measures their CPU time over o.Duration and their resident memory, from
// /proc (Linux only).
func Idle(ctx context.Context, o IdleOptions) (IdleResult, error) {
	var r IdleResult
	if o.Binary == "" || o.Duration <= 0 {
		return r, errors.New("nodebench: Idle needs a binary and a positive duration")
	}
	var err error
	r.Alone, r.Peer, err = idle(ctx, o.Binary, o.Duration)
	return r, err
}

// idle measures the two nodes, exe run as each.
func idle(ctx context.Context, exe string, dur time.Duration) (alone, peer Cost, err error) {
	dir, err := os.MkdirTemp("", "clawmesh-bench-idle-")
	if err != nil {
		return alone, peer, err
	}
	defer os.RemoveAll(dir)
	meshed := filepath.Join(dir, "meshed")
	if err := initMesh(meshed, "bench"); err != nil {
		return alone, peer, err
	}
	common := []string{"node", "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0", "--log", "warn"}
	start := func(data string, extra ...string) (*exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, exe, append(append(append([]string{}, common...), "--data", data), extra...)...)
		return cmd, cmd.Start()
	}
	a, err := start(filepath.Join(dir, "alone"))
	if err != nil {
		return alone, peer, err
	}
	defer stop(a)
	b, err := start(meshed, "--p2p-listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--p2p-listen", "/ip4/127.0.0.1/tcp/0")
	if err != nil {
		return alone, peer, err
	}
	defer stop(b)
	// Start-up (compiling the reward plugins, the first time) takes
	// seconds of CPU: wait until both are quiet, 2 s at a time, a minute
	// at most.
	for settle := time.Now(); time.Since(settle) < time.Minute; {
		ta, _ := cpuTicks(a.Process.Pid)
		tb, err := cpuTicks(b.Process.Pid)
		if err != nil {
			return alone, peer, fmt.Errorf("reading /proc (Linux only): %w", err)
		}
		select {
		case <-ctx.Done():
			return alone, peer, ctx.Err()
		case <-time.After(2 * time.Second):
		}
		ta2, _ := cpuTicks(a.Process.Pid)
		tb2, _ := cpuTicks(b.Process.Pid)
		if ta2-ta <= 4 && tb2-tb <= 4 {
			break
		}
	}
	ta0, _ := cpuTicks(a.Process.Pid)
	tb0, err := cpuTicks(b.Process.Pid)
	if err != nil {
		return alone, peer, fmt.Errorf("reading /proc (Linux only): %w", err)
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return alone, peer, ctx.Err()
	case <-time.After(dur):
	}
	ta1, _ := cpuTicks(a.Process.Pid)
	tb1, _ := cpuTicks(b.Process.Pid)
	secs := time.Since(t0).Seconds()
	// Linux counts CPU time in clock ticks of 1/100 s (USER_HZ).
	alone.CPU = float64(ta1-ta0) / 100 / secs * 100
	peer.CPU = float64(tb1-tb0) / 100 / secs * 100
	alone.RSS, _ = rss(a.Process.Pid)
	peer.RSS, _ = rss(b.Process.Pid)
	return alone, peer, nil
}

// Print writes the idle costs, and whether the mesh's stays within its
// goal (under 1% of a core and 100 MiB more than the baseline).
func (r IdleResult) Print(w io.Writer) {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "  node, not in a mesh (baseline)   CPU %5.2f%% of a core   RSS %6.1f MiB\n", r.Alone.CPU, mib(r.Alone.RSS))
	fmt.Fprintf(w, "  node, a mesh peer                CPU %5.2f%% of a core   RSS %6.1f MiB\n", r.Peer.CPU, mib(r.Peer.RSS))
	verdict := "met"
	if r.Peer.CPU-r.Alone.CPU >= 1 || r.Peer.RSS-r.Alone.RSS >= 100<<20 {
		verdict = "NOT MET"
	}
	fmt.Fprintf(w, "  the mesh adds %.2f%% of a core and %.1f MiB; goal < 1%% and < 100 MiB: %s\n", r.Peer.CPU-r.Alone.CPU, mib(r.Peer.RSS-r.Alone.RSS), verdict)
}

// initMesh makes a new mesh named name in the data directory data, as
// `clawmesh mesh init` does.
func initMesh(data, name string) error {
	key, id, err := peer.Identity(data)
	if err != nil {
		return err
	}
	_, err = mesh.Init(data, name, key, id, time.Now(), crand.Reader)
	return err
}

// stop ends a node: SIGTERM, then after 10 s SIGKILL.
func stop(c *exec.Cmd) {
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.Process.Kill()
		<-done
	}
}

// cpuTicks is a process's user and system time, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return u + st, nil
}

// rss is a process's resident memory, in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}
