package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// userManagerScript starts a systemd user manager ($2) that sees only what
// it is given: in a cgroup of its own ($1, under each cgroup hierarchy
// systemd uses), in private mount and cgroup namespaces, with
// /run/systemd/system present in its own view (the mark of a machine booted
// with systemd, without which a user manager refuses to start) and its own
// cgroup as the root of the hierarchies it is shown. Nothing outside its
// cgroup is moved or changed.
const userManagerScript = `set -e
cg=$1
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then hs=/sys/fs/cgroup; else
  hs=/sys/fs/cgroup/systemd; [ -f /sys/fs/cgroup/unified/cgroup.controllers ] && hs="$hs /sys/fs/cgroup/unified"
fi
for h in $hs; do mkdir "$h/$cg"; echo $$ > "$h/$cg/cgroup.procs"; done
exec unshare --mount --cgroup --propagation private sh -c '
  set -e
  if [ -d /run/systemd ]; then mount -t tmpfs tmpfs /run/systemd; else mount -t tmpfs tmpfs /run; fi
  mkdir -p /run/systemd/system
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then mount -t cgroup2 cgroup2 /sys/fs/cgroup; else
    mount -t tmpfs tmpfs /sys/fs/cgroup
    mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
    mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
    mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified 2>/dev/null || rmdir /sys/fs/cgroup/unified
  fi
  exec "$0" --user' "$2"
`

// privateUserManager starts a systemd user manager of the test's own, with
// a runtime and a config directory of its own (XDG_RUNTIME_DIR and
// XDG_CONFIG_HOME, set for the rest of the test, so that systemctl --user
// and clawmesh service reach it and write its units there), and stops it
// and removes its cgroup when the test ends. It needs root (to make the
// namespaces), systemd, unshare and a cgroup hierarchy systemd knows; where
// one is missing, or the manager does not come up, it says why ("" when it
// runs).
func privateUserManager(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		return "a private systemd user manager needs root (for its mount and cgroup namespaces)"
	}
	var systemd string
	for _, p := range []string{"/usr/lib/systemd/systemd", "/lib/systemd/systemd"} {
		if _, err := os.Stat(p); err == nil {
			systemd = p
			break
		}
	}
	if systemd == "" {
		return "systemd is not installed"
	}
	for _, c := range []string{"unshare", "systemctl"} {
		if _, err := exec.LookPath(c); err != nil {
			return c + " is not installed"
		}
	}
	var hierarchies []string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		hierarchies = []string{"/sys/fs/cgroup"}
	} else if _, err := os.Stat("/sys/fs/cgroup/systemd/cgroup.procs"); err == nil {
		hierarchies = []string{"/sys/fs/cgroup/systemd"}
		if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err == nil {
			hierarchies = append(hierarchies, "/sys/fs/cgroup/unified")
		}
	} else {
		return "no cgroup hierarchy systemd can use (/sys/fs/cgroup is neither cgroup v2 nor has name=systemd)"
	}

	home, rt := t.TempDir(), t.TempDir()
	if err := os.Chmod(rt, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", rt)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "")
	cg := "clawmesh-test-" + strconv.Itoa(os.Getpid()) + "-" + filepath.Base(rt)
	var log syncBuffer
	cmd := exec.Command("sh", "-c", userManagerScript, "sh", cg, systemd)
	cmd.Env = append(os.Environ(), "HOME="+home)
	cmd.Stdout, cmd.Stderr = &log, &log
	// Ended with the test's process, should it die first; its output's
	// pipe is not waited on past its end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return "cannot start systemd --user: " + err.Error()
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-exited
		}
		// What is left in its cgroup was started by it: ended, then the
		// cgroup removed, deepest first.
		for _, h := range hierarchies {
			root := filepath.Join(h, cg)
			var dirs []string
			filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if b, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs")); err == nil {
					for _, f := range strings.Fields(string(b)) {
						if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
							syscall.Kill(pid, syscall.SIGKILL)
						}
					}
				}
				for try := 0; try < 100 && os.Remove(dirs[i]) != nil; try++ {
					time.Sleep(50 * time.Millisecond) // its last processes dying
				}
			}
		}
	}
	// Running once systemctl --user reaches it and it says so (in its
	// SystemState: is-system-running, outside its namespace, finds no
	// /run/systemd/system and answers "offline").
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			stop()
			return "a private systemd user manager did not start: " + strings.TrimSpace(log.String())
		default:
		}
		out, _ := exec.Command("systemctl", "--user", "show", "--property", "SystemState", "--value").Output()
		if s := strings.TrimSpace(string(out)); s == "running" || s == "degraded" {
			break
		}
		if time.Now().After(end) {
			stop()
			return "a private systemd user manager did not come up in a minute: " + strings.TrimSpace(log.String())
		}
	}
	t.Cleanup(stop)
	return ""
}
