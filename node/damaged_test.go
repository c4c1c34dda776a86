package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/fakeupstream"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/gateway"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/pool/pooltest"
)

// TestNodeServesOnDamagedPool: a node whose pool has a damaged WAL segment
// starts, answers calls (recording paused, and the health endpoint says
// so), and once `pool repair` has salvaged the pool it records again
// without a restart.
func TestNodeServesOnDamagedPool(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data := t.TempDir()
	dir := filepath.Join(data, "pool")
	pooltest.Fill(t, dir, "old", 300)
	pooltest.DamageLargestWAL(t, dir)

	up := fakeupstream.New(fakeupstream.Script{Turns: []fakeupstream.Turn{{Text: "Served anyway."}}})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Run(ctx, upLn)
	n, err := node.New(ctx, node.Config{DataDir: data, Upstream: "http://" + upLn.Addr().String() + "/v1", NoScoring: true})
	if err != nil {
		t.Fatalf("a node on a damaged pool does not start: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, ln) }()
	defer func() {
		cancel()
		<-served
		n.Close(context.Background())
	}()
	base := "http://" + ln.Addr().String()
	if h := n.Pool().Health(); h.Recording || !h.Damaged {
		t.Fatalf("pool health on a damaged pool: %+v", h)
	}
	post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"first"}]}`)
	if h := getHealth(t, base); h.Recording || !strings.Contains(h.Paused, "recording paused") || h.Unrecorded != 1 {
		t.Fatalf("/clawmesh/v1/health on a damaged pool: %+v", h)
	}
	// The admin API (what `clawmesh pool stats` asks a running node) says
	// what is damaged and what to do.
	st, err := (&node.Client{Base: base, Token: n.AdminToken()}).Stats(ctx)
	if err != nil || st.Health == nil || st.Health.Recording || !st.Health.Damaged ||
		!strings.Contains(st.Health.Paused, "write-ahead log segment") || !strings.Contains(st.Health.Paused, "clawmesh pool repair") {
		t.Fatalf("admin stats on a damaged pool: %+v (%v), health %+v", st, err, st.Health)
	}

	var rep pool.RepairReport
	for range 200 { // the node's reopen attempts hold the lock a moment
		if rep, err = pool.Repair(ctx, dir, time.Now()); !errors.Is(err, pool.ErrLocked) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("repair while the node runs: %v", err)
	}
	if rep.Steps == 0 || rep.Steps >= 300 {
		t.Fatalf("repair report %+v", rep)
	}
	for i := 0; i < 300 && !n.Pool().Health().Recording; i++ { // up to 30 s
		time.Sleep(100 * time.Millisecond)
	}
	if h := n.Pool().Health(); !h.Recording {
		t.Fatalf("recording did not resume after the repair: %+v", h)
	}
	post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"after the repair"}]}`)
	steps, err := n.Pool().List(ctx, pool.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	recorded := false
	for _, s := range steps {
		if len(s.Request.Messages) > 0 && s.Request.Messages[len(s.Request.Messages)-1].Content == "after the repair" {
			recorded = true
		}
	}
	if !recorded || len(steps) != rep.Steps+1 {
		t.Fatalf("after the repair the pool lists %d steps (salvaged %d), the new call recorded: %v", len(steps), rep.Steps, recorded)
	}
}

// getHealth reads the gateway's health endpoint.
func getHealth(t *testing.T, base string) gateway.Health {
	t.Helper()
	resp, err := http.Get(base + "/clawmesh/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h gateway.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}
