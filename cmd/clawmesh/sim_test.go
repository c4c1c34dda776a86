package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimJSONAndTable(t *testing.T) {
	args := []string{"sim", "--nodes", "60", "--seed", "5", "--versions", "2"}
	a, errs, code := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	b, _, _ := runCLI(t, append(args, "--json")...)
	if a != b {
		t.Error("the same seed gave different JSON")
	}
	var r struct {
		Seed     uint64 `json:"seed"`
		Scenario string `json:"scenario"`
		Options  struct {
			HolePunch float64 `json:"hole_punch"`
		} `json:"options"`
		Network struct {
			NATPairs int `json:"nat_pairs"`
			Punched  int `json:"punched_pairs"`
		} `json:"network"`
		Versions []struct {
			Version      uint64  `json:"version"`
			Reach99      float64 `json:"reach99_s"`
			AwakeReach99 float64 `json:"awake_reach99_s"`
		} `json:"versions"`
		Invariants struct {
			OK bool `json:"ok"`
		} `json:"invariants"`
	}
	if err := json.Unmarshal([]byte(a), &r); err != nil {
		t.Fatal(err)
	}
	if r.Seed != 5 || r.Scenario != "baseline" || len(r.Versions) != 2 || !r.Invariants.OK || r.Versions[1].Reach99 <= 0 {
		t.Errorf("report: %+v", r)
	}
	if r.Options.HolePunch != 0.7 || r.Network.Punched == 0 || r.Versions[1].AwakeReach99 != r.Versions[1].Reach99 {
		t.Errorf("hole punching %v, %d of %d NAT pairs punched; v2 reached 99%% in %v s, of those that stayed up in %v s",
			r.Options.HolePunch, r.Network.Punched, r.Network.NATPairs, r.Versions[1].Reach99, r.Versions[1].AwakeReach99)
	}
	// --hole-punch 0: no NAT-to-NAT connection carries anything.
	c, errs, code := runCLI(t, append(args, "--json", "--hole-punch", "0")...)
	if code != 0 {
		t.Fatalf("--hole-punch 0: code %d: %s", code, errs)
	}
	r.Network.Punched = -1
	if err := json.Unmarshal([]byte(c), &r); err != nil {
		t.Fatal(err)
	}
	if r.Options.HolePunch != 0 || r.Network.Punched != 0 || r.Network.NATPairs == 0 {
		t.Errorf("--hole-punch 0: hole punching %v, %d of %d NAT pairs punched", r.Options.HolePunch, r.Network.Punched, r.Network.NATPairs)
	}
	table, errs, code := runCLI(t, args...)
	if code != 0 || !strings.HasPrefix(table, "seed 5, scenario baseline") || !strings.Contains(table, "invariants: all held") {
		t.Errorf("code %d: %s\n%s", code, errs, table)
	}
	if !strings.Contains(errs, "wall time") {
		t.Errorf("stderr does not say the wall time: %q", errs)
	}
}

func TestSimPlot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	_, errs, code := runCLI(t, "sim", "--nodes", "40", "--versions", "2", "--scenario", "churn", "--plot", dir)
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	for _, f := range []string{"sim-churn-propagation.png", "sim-churn-learning.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestSimBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "--scenario", "storm"},
		{"sim", "--nodes", "2"},
		{"sim", "--trainers", "0"},
		{"sim", "--malicious", "0.7"},
		{"sim", "--hole-punch", "1.5"},
		{"sim", "--hole-punch", "-0.2"},
		{"sim", "extra"},
	} {
		_, errs, code := runCLI(t, args...)
		if code == 0 || errs == "" || strings.Contains(errs, "main.") {
			t.Errorf("%v: code %d, %q", args, code, errs)
		}
	}
	out, errs, code := runCLI(t, "sim", "--help")
	if out += errs; code != 0 || !strings.Contains(out, "partition") || !strings.Contains(out, "log-tree bound") || !strings.Contains(out, "--json") || !strings.Contains(out, "--hole-punch") {
		t.Errorf("sim --help: code %d\n%s", code, out)
	}
}

func TestSimTrust(t *testing.T) {
	args := []string{"sim", "--scenario", "trust", "--nodes", "40", "--versions", "2", "--seed", "3"}
	out, errs, code := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	var r struct {
		Trainers int `json:"trainers"`
		Trust    *struct {
			Voters         int     `json:"voters"`
			Volunteers     int     `json:"volunteers"`
			Retracted      int     `json:"retracted"`
			ForgedAccepted int     `json:"forged_accepted"`
			Disconnects    int     `json:"disconnects"`
			Absorbed       float64 `json:"absorbed_share"`
			Sweep          []struct {
				Share float64 `json:"share"`
			} `json:"sweep"`
		} `json:"trust"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if tr := r.Trust; r.Trainers != 6 || tr == nil || tr.Voters != 3 || tr.Volunteers != 3 || tr.Retracted == 0 || tr.ForgedAccepted != 0 || tr.Disconnects == 0 || len(tr.Sweep) != 6 {
		t.Errorf("trust report: %d trainers, %+v", r.Trainers, tr)
	}
	dir := filepath.Join(t.TempDir(), "out")
	table, errs, code := runCLI(t, append(args, "--rogue-voters", "0", "--flooders", "0", "--plot", dir)...)
	if code != 0 || !strings.Contains(table, "absorbed: up to") || !strings.Contains(table, "rogue voters: 0; 0 forged versions") {
		t.Errorf("code %d: %s\n%s", code, errs, table)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sim-trust-absorbed.png")); err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Errorf("sim-trust-absorbed.png: %v", err)
	}
	for _, bad := range [][]string{{"--spot-check", "1.5"}, {"--voters", "6"}, {"--rogue-voters", "2"}, {"--rogue-volunteers", "4"}, {"--flooders", "-3"}} {
		_, errs, code := runCLI(t, append([]string{"sim", "--scenario", "trust", "--nodes", "40"}, bad...)...)
		if code == 0 || errs == "" || strings.Contains(errs, "main.") {
			t.Errorf("%v: code %d, %q", bad, code, errs)
		}
	}
}

func TestSimPersonal(t *testing.T) {
	args := []string{"sim", "--nodes", "40", "--seed", "5", "--versions", "2", "--json"}
	off, errs, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("code %d: %s", code, errs)
	}
	on, errs, code := runCLI(t, append(args, "--personal", "0.5", "--personal-mesh", "0.5", "--personal-for", "48h")...)
	if code != 0 {
		t.Fatalf("--personal: code %d: %s", code, errs)
	}
	var a, b map[string]json.RawMessage
	if err := json.Unmarshal([]byte(off), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(on), &b); err != nil {
		t.Fatal(err)
	}
	if _, ok := a["personal"]; ok {
		t.Error("a report without --personal has a personal section")
	}
	var p struct {
		Hours   float64 `json:"hours"`
		Devices int     `json:"devices"`
		Local   int     `json:"local"`
		Mesh    int     `json:"mesh"`
		KeepUp  float64 `json:"keep_up_share"`
		Lag90   float64 `json:"lag_h90"`
		Jobs    int     `json:"jobs"`
		Groups  []struct {
			Mode string `json:"mode"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(b["personal"], &p); err != nil {
		t.Fatal(err)
	}
	if p.Hours != 48 || p.Devices != 20 || p.Local != 10 || p.Mesh != 10 || p.Jobs == 0 || !(p.KeepUp > 0) || len(p.Groups) < 2 || p.Groups[len(p.Groups)-1].Mode != "mesh" {
		t.Errorf("personal: %+v", p)
	}
	// The rest of the report is the one without personal adapters.
	delete(b, "personal")
	for k, v := range a {
		if string(b[k]) != string(v) {
			t.Errorf("--personal changed %q: %s, without it %s", k, b[k], v)
		}
	}
	if len(a) != len(b) {
		t.Errorf("%d fields with --personal, %d without", len(b), len(a))
	}
	dir := filepath.Join(t.TempDir(), "out")
	table, errs, code := runCLI(t, "sim", "--nodes", "40", "--seed", "5", "--versions", "2", "--personal", "1", "--plot", dir)
	if code != 0 || !strings.Contains(table, "personal adapters over 72 h: 40 devices (40 local, 0 mesh)") || !strings.Contains(table, "keep up") {
		t.Errorf("code %d: %s\n%s", code, errs, table)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sim-baseline-personal.png")); err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Errorf("sim-baseline-personal.png: %v", err)
	}
	for _, bad := range [][]string{{"--personal", "1.5"}, {"--personal", "-0.1"}, {"--personal", "0.5", "--personal-mesh", "2"}, {"--personal", "0.5", "--personal-for", "10m"}} {
		_, errs, code := runCLI(t, append([]string{"sim", "--nodes", "40"}, bad...)...)
		if code == 0 || !strings.Contains(errs, "--personal") || strings.Contains(errs, "main.") {
			t.Errorf("%v: code %d, %q", bad, code, errs)
		}
	}
	out, errs, code := runCLI(t, "sim", "--help")
	if out += errs; code != 0 || !strings.Contains(out, "--personal-mesh") || !strings.Contains(out, "keeps up") {
		t.Errorf("sim --help: code %d\n%s", code, out)
	}
}
