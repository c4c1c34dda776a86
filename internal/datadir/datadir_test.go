package datadir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAcquire(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := Acquire(dir, Holder{Command: "pool repair"}, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing directory without create: %v, want ErrNotExist", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("Acquire without create made the directory")
	}
	started := time.Date(2026, 11, 29, 7, 12, 3, 0, time.UTC)
	l, err := Acquire(dir, Holder{Command: "trainer", PID: 4242, Started: started}, true)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ReadHolder(dir)
	if err != nil || h.Command != "trainer" || h.PID != 4242 || !h.Started.Equal(started) {
		t.Fatalf("holder %+v, %v", h, err)
	}
	_, err = Acquire(dir, Holder{Command: "node", PID: 7}, true)
	var he *HeldError
	if !errors.Is(err, ErrHeld) || !errors.As(err, &he) {
		t.Fatalf("a second holder: %v, want a HeldError", err)
	}
	msg := err.Error()
	for _, want := range []string{dir, "'clawmesh trainer'", "pid 4242", "since", "stop it, or use another --data"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, HolderFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the holder's note outlived the lock: %v", err)
	}
	l, err = Acquire(dir, Holder{Command: "node", PID: 7}, false)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	defer l.Release()
}

func TestHeldErrorUnknownHolder(t *testing.T) {
	err := (&HeldError{Dir: "/d"}).Error()
	if !strings.Contains(err, "another clawmesh process") || !strings.Contains(err, "use another --data") {
		t.Fatal(err)
	}
}

func TestIs(t *testing.T) {
	dir := t.TempDir()
	if Is(dir, NodeMark) || Is(dir, TrainerMark) {
		t.Fatal("an empty directory is marked")
	}
	os.Mkdir(filepath.Join(dir, TrainerMark), 0o700)
	os.WriteFile(filepath.Join(dir, NodeMark), nil, 0o600) // a file is no mark
	if !Is(dir, TrainerMark) || Is(dir, NodeMark) {
		t.Fatal("marks misread")
	}
}
