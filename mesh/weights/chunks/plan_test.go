package chunks

import (
	"errors"
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	pl := NewPlan([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 3, 2)
	if !pl.Add("a") || !pl.Add("b") || pl.Add("a") {
		t.Fatal("Add: a source added twice, or a new one refused")
	}
	// Each source starts at its own share: a at the start, b half way.
	if got := pl.Take("a"); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("a took %v", got)
	}
	if got := pl.Take("b"); !slices.Equal(got, []int{6, 7, 8}) { // half way through the 7 left, 3..9
		t.Fatalf("b took %v", got)
	}
	if pl.Take("c") != nil {
		t.Fatal("a source never added took chunks")
	}
	// a got chunk 0, sent chunk 1 wrong, and 2 was not got.
	pl.Got()
	if why := pl.Settle("a", []int{1, 2}, 1, nil); why != "" {
		t.Fatalf("one bad chunk left a: %q", why)
	}
	if pl.Missing() != 6 || pl.Inflight() != 3 {
		t.Fatalf("missing %d, in flight %d", pl.Missing(), pl.Inflight())
	}
	// a is not asked for chunk 1 again; its requests are consecutive runs.
	if got := pl.Take("a"); !slices.Equal(got, []int{2, 3, 4}) {
		t.Fatalf("a took %v after sending 1 wrong", got)
	}
	// A second bad chunk leaves a; what it had goes back.
	if why := pl.Settle("a", []int{2, 3, 4}, 2, nil); why != "2 bad chunks" || pl.Live("a") || pl.Sources() != 1 {
		t.Fatalf("two bad chunks: left %q, a live %v", why, pl.Live("a"))
	}
	if pl.Take("a") != nil || pl.Add("a") {
		t.Fatal("a left source was asked again, or added again")
	}
	if l := pl.Left(); l["a"] != "2 bad chunks" || len(l) != 1 {
		t.Fatalf("left %v", l)
	}
	// b finishes everything.
	for range 3 {
		pl.Got()
	}
	pl.Settle("b", nil, -1, nil)
	for !pl.Over() {
		got := pl.Take("b")
		if got == nil {
			t.Fatalf("b took nothing with %d missing", pl.Missing())
		}
		for range got {
			pl.Got()
		}
		pl.Settle("b", nil, -1, nil)
	}
	if pl.Stuck() {
		t.Error("a finished plan is stuck")
	}
}

func TestPlanStuck(t *testing.T) {
	pl := NewPlan([]int{0, 1}, 8, 5)
	if !pl.Stuck() {
		t.Error("no source at all: not stuck")
	}
	pl.Add("a")
	if pl.Stuck() {
		t.Error("stuck with a source that may send every chunk")
	}
	got := pl.Take("a")
	if pl.Stuck() {
		t.Error("stuck with chunks in flight")
	}
	pl.Settle("a", got, 0, nil) // 0 wrong, 1 not got
	if pl.Stuck() {
		t.Error("stuck while a may still send chunk 1")
	}
	got = pl.Take("a")
	pl.Settle("a", got, 1, nil)
	if !pl.Stuck() {
		t.Error("a sent both chunks wrong and is the only source: not stuck")
	}
	pl.Add("b")
	if pl.Stuck() {
		t.Error("a new source could finish it: stuck")
	}
	if why := pl.Settle("b", nil, -1, errors.New("stalled")); why != "stalled" || !pl.Stuck() {
		t.Errorf("b left (%q): stuck %v", why, pl.Stuck())
	}
}
