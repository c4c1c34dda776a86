package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// idleCost is what an idle process costs: CPU (percent of one core) and
// resident memory.
type idleCost struct {
	CPU float64
	RSS int64 // bytes
}

// benchIdle runs this binary as two idle nodes, one whose data directory
// is not in a mesh and one that is a mesh peer (its own mesh, on loopback,
// with mDNS and NAT traversal on as by default), waits until they have
// started, then measures their CPU time over dur and their resident
// memory, from /proc.
func benchIdle(ctx context.Context, dur time.Duration) (alone, peer idleCost, err error) {
	exe, err := os.Executable()
	if err != nil {
		return alone, peer, err
	}
	dir, err := os.MkdirTemp("", "clawmesh-bench-idle-")
	if err != nil {
		return alone, peer, err
	}
	defer os.RemoveAll(dir)
	meshed := filepath.Join(dir, "meshed")
	if err := meshInit(meshed, "bench", io.Discard); err != nil {
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
