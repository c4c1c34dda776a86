package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/pool"
)

// TestPoolRepairCLI: `pool stats` on a pool with a damaged WAL says what to
// do, `pool repair --json` salvages it (the report as JSON, the damaged
// pool kept), the pool then opens, and a second repair says there is
// nothing to repair. `pool` alone names repair among its commands.
func TestPoolRepairCLI(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	dir := filepath.Join(data, "pool")
	p, err := pool.Open(dir, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	for i := range 300 {
		s := &core.Step{
			ID: core.StepID(fmt.Sprintf("s%03d", i)), SessionID: "s", Turn: core.TurnMain, API: core.APIChat, State: core.StateOpen,
			Request:  core.Request{Messages: []core.Message{{Role: core.RoleUser, Content: fmt.Sprintf("%d %s", i, strings.Repeat("x", 500))}}},
			Response: core.Response{Choices: []core.Choice{{Message: core.Message{Role: core.RoleAssistant, Content: "ok"}}}},
			Timings:  core.Timings{Start: t0.Add(time.Duration(i) * time.Second)},
		}
		if err := p.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var wal string
	var size int64
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > size {
			wal, size = l, fi.Size()
		}
	}
	f, err := os.OpenFile(wal, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(make([]byte, 32), size/2)
	f.Close()

	out, errs, code := runCLI(t, "pool", "stats", "--data", data)
	if code == 0 || !strings.Contains(out+errs, "damaged") {
		t.Fatalf("pool stats on a damaged pool: code %d\n%s%s", code, out, errs)
	}
	out = cli(t, "pool", "repair", "--data", data, "--json")
	var rep pool.RepairReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("pool repair --json: %v\n%s", err, out)
	}
	if rep.Steps == 0 || rep.Steps >= 300 || rep.BadWALRecords != 1 {
		t.Fatalf("repair report %+v", rep)
	}
	if _, err := os.Stat(rep.Moved); err != nil {
		t.Fatalf("the damaged pool is not kept: %v", err)
	}
	out = cli(t, "pool", "stats", "--data", data)
	if !strings.Contains(out, fmt.Sprintf("steps     %d", rep.Steps)) {
		t.Fatalf("pool stats after the repair:\n%s", out)
	}
	if out, errs, code := runCLI(t, "pool", "repair", "--data", data); code == 0 || !strings.Contains(errs, "nothing to repair") {
		t.Fatalf("a second repair: code %d\n%s%s", code, out, errs)
	}
	if _, errs, code := runCLI(t, "pool"); code == 0 || !strings.Contains(errs, "repair") {
		t.Fatalf("pool with no command: code %d\n%s", code, errs)
	}
}
