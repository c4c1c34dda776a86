// Package pooltest makes damaged pools for other packages' tests: a pool
// on disk filled with steps, then one WAL segment overwritten in its
// middle, as a bad disk or a stray write leaves it.
package pooltest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/pool"
)

// Fill opens the pool in dir, puts n open steps of about 500 bytes each
// (ids prefix000, prefix001, ...; session prefix), and closes it.
func Fill(t testing.TB, dir, prefix string, n int) {
	t.Helper()
	p, err := pool.Open(dir, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	for i := range n {
		s := &core.Step{
			ID: core.StepID(fmt.Sprintf("%s%03d", prefix, i)), SessionID: core.SessionID(prefix), Turn: core.TurnMain, API: core.APIChat, State: core.StateOpen,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%d %s", i, strings.Repeat("x", 500))}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Timings:  core.Timings{Start: t0.Add(time.Duration(i) * time.Second)},
		}
		if err := p.Put(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// DamageLargestWAL overwrites 32 bytes in the middle of the largest WAL
// segment of the pool in dir, which must span several 32 KiB blocks.
func DamageLargestWAL(t testing.TB, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var wal string
	var size int64
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > size {
			wal, size = l, fi.Size()
		}
	}
	if size < 128<<10 {
		t.Fatalf("WAL files %v: none spans several blocks", logs)
	}
	f, err := os.OpenFile(wal, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 32), size/2); err != nil {
		t.Fatal(err)
	}
}
