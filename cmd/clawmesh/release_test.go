package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestReleaseReproducible runs scripts/release.sh twice for this machine's
// target: the archives are the same bytes, checksums.txt holds their
// SHA-256, the binary in the archive says its version and revision, the
// archive's files carry the commit's time, and the Homebrew formula names
// the archive with its checksum.
func TestReleaseReproducible(t *testing.T) {
	for _, c := range []string{"git", "tar", "gzip", "sha256sum", "bash"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s is not installed: scripts/release.sh needs it", c)
		}
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	commitTime, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
	if err != nil {
		t.Fatal(err)
	}
	epoch, _ := strconv.ParseInt(strings.TrimSpace(string(commitTime)), 10, 64)
	target := runtime.GOOS + "/" + runtime.GOARCH
	name := "clawmesh_0.0.0-test_" + runtime.GOOS + "_" + runtime.GOARCH
	release := func(out string) {
		cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "release.sh"), "v0.0.0-test")
		cmd.Env = append(os.Environ(), "OUT="+out, "TARGETS="+target, "BASE_URL=https://example.org/dl")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("scripts/release.sh: %v\n%s", err, b)
		}
	}
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	release(a)
	release(b)

	archive, err := os.ReadFile(filepath.Join(a, name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(b, name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(archive, again) {
		t.Error("two release builds of one commit differ")
	}
	sum := sha256.Sum256(archive)
	sums, _ := os.ReadFile(filepath.Join(a, "checksums.txt"))
	if want := hex.EncodeToString(sum[:]) + "  " + name + ".tar.gz\n"; string(sums) != want {
		t.Errorf("checksums.txt:\n%s\nwant\n%s", sums, want)
	}

	// The archive: the binary and the README, with the commit's time.
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	files := map[string]bool{}
	bin := filepath.Join(t.TempDir(), "clawmesh")
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = true
		if !h.ModTime.Equal(time.Unix(epoch, 0)) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v, owner %d:%d; want the commit's time %v, root", h.Name, h.ModTime, h.Uid, h.Gid, time.Unix(epoch, 0))
		}
		if h.Name == name+"/clawmesh" {
			b, _ := io.ReadAll(tr)
			if err := os.WriteFile(bin, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []string{name + "/", name + "/clawmesh", name + "/README.md"} {
		if !files[f] {
			t.Errorf("the archive has no %s: %v", f, files)
		}
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("the released binary: %v", err)
	}
	if want := "clawmesh v0.0.0-test (" + strings.TrimSpace(string(head))[:12]; !strings.HasPrefix(string(out), want) {
		t.Errorf("clawmesh version says %q, want it to begin %q", out, want)
	}

	formula, _ := os.ReadFile(filepath.Join(a, "clawmesh.rb"))
	for _, want := range []string{`version "0.0.0-test"`, `url "https://example.org/dl/` + name + `.tar.gz"`,
		`sha256 "` + hex.EncodeToString(sum[:]) + `"`} {
		if !bytes.Contains(formula, []byte(want)) {
			t.Errorf("the formula has no %s:\n%s", want, formula)
		}
	}
	if bytes.Contains(formula, []byte("@VERSION@")) || bytes.Contains(formula, []byte("@BASE_URL@")) {
		t.Errorf("the formula keeps a placeholder:\n%s", formula)
	}
}
