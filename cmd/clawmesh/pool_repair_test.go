package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/pool/pooltest"
)

// TestPoolRepairCLI: `pool stats` on a pool with a damaged WAL says what to
// do, `pool repair --json` salvages it (the report as JSON, the damaged
// pool kept), the pool then opens, and a second repair says there is
// nothing to repair. `pool` alone names repair among its commands.
func TestPoolRepairCLI(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "pool")
	pooltest.Fill(t, dir, "s", 300)
	pooltest.DamageLargestWAL(t, dir)

	out, errs, code := runCLI(t, "pool", "stats", "--data", data)
	if code == 0 || !strings.Contains(errs, "is damaged") || !strings.Contains(errs, "clawmesh pool repair --data "+data) {
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
