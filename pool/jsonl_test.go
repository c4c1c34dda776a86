package pool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

func exportLine(t testing.TB, s *core.Step) string {
	t.Helper()
	b, err := json.Marshal(core.ExportedStep{Schema: core.SchemaVersion, Step: *s})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := openTest(t, t.TempDir(), Options{})
	gen := NewStepGen("x", 5)
	var want []*core.Step
	for i := 0; i < 23; i++ {
		s := gen.Step(i)
		if i == 4 {
			s = richStep("rich", "x-s000000", gen.Base.Add(4*time.Second))
		}
		want = append(want, s)
		if err := src.Put(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	n, err := src.Export(ctx, &buf, Filter{})
	if err != nil || n != len(want) {
		t.Fatalf("Export: %d, %v", n, err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("%d lines for %d steps", len(lines), n)
	}
	if !strings.HasPrefix(lines[0], `{"schema":"clawmesh.step/v1","id":`) {
		t.Fatalf("line does not start with the schema: %.80s", lines[0])
	}

	dst := openTest(t, t.TempDir(), Options{})
	rep, err := dst.Import(ctx, bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Imported != n || rep.Duplicates != 0 || len(rep.Bad) != 0 {
		t.Fatalf("import report %+v", rep)
	}
	got, err := dst.List(ctx, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d steps imported, want %d", len(got), len(want))
	}
	for i := range want {
		mustEqual(t, got[i], want[i])
	}

	// A filtered export.
	buf.Reset()
	n, err = src.Export(ctx, &buf, Filter{Session: "x-s000001"})
	if err != nil || n != 5 {
		t.Fatalf("filtered export: %d, %v", n, err)
	}
	if _, err := src.Export(ctx, io.Discard, Filter{State: core.StateDropped}); err == nil {
		t.Fatal("export of dropped steps accepted")
	}
}

func TestImportTwiceNoDuplicates(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(48 * time.Hour)
	p := openTest(t, t.TempDir(), Options{MaxAge: 24 * time.Hour, Now: func() time.Time { return now }})
	var in strings.Builder
	for i := 0; i < 10; i++ {
		s := simpleStep(core.StepID(fmt.Sprintf("i%d", i)), "s", t0.Add(time.Duration(i)*time.Hour*4), core.StateClosed, fmt.Sprint(i))
		in.WriteString(exportLine(t, s) + "\n")
	}
	// The same id twice in one file counts as a duplicate too.
	in.WriteString(exportLine(t, simpleStep("i3", "s", t0, core.StateOpen, "again")) + "\n")

	rep, err := p.Import(ctx, strings.NewReader(in.String()))
	if err != nil || rep.Imported != 10 || rep.Duplicates != 1 {
		t.Fatalf("first import: %+v, %v", rep, err)
	}
	rep, err = p.Import(ctx, strings.NewReader(in.String()))
	if err != nil || rep.Imported != 0 || rep.Duplicates != 11 {
		t.Fatalf("second import: %+v, %v", rep, err)
	}
	// Steps retention dropped stay dropped: importing them again is a duplicate.
	dropped, err := p.ApplyRetention(ctx)
	if err != nil || dropped != 6 {
		t.Fatalf("retention dropped %d, %v", dropped, err)
	}
	rep, err = p.Import(ctx, strings.NewReader(in.String()))
	if err != nil || rep.Imported != 0 || rep.Duplicates != 11 {
		t.Fatalf("import after retention: %+v, %v", rep, err)
	}
	st, err := p.Stats(ctx)
	if err != nil || st.Steps != 4 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	// The original step i3 was kept, not the second line's.
	if _, err := p.Get(ctx, "i3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("i3 should have been dropped: %v", err)
	}
	got, err := p.Get(ctx, "i9")
	if err != nil || got.Request.Messages[1].Content != "9" || got.Source != SourceImport {
		t.Fatalf("i9: %+v, %v", got, err)
	}
}

func TestImportBadLinesAndStates(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	good := simpleStep("g1", "s", t0, core.StateClosed, "ok")
	noState := simpleStep("g2", "s", t0, core.StateUnknown, "ok")
	noStateNext := simpleStep("g3", "s", t0, core.StateUnknown, "ok")
	noStateNext.NextState = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: "more"}}}
	shippedScored := simpleStep("g4", "s", t0, core.StateShipped, "ok")
	shippedScored.Reward = &core.Reward{Value: ptr(1.0), At: t0}
	shippedScored.Source = "gateway"
	batched := simpleStep("g5", "s", t0, core.StateBatched, "ok")
	noMsgs := simpleStep("b1", "s", t0, core.StateOpen, "x")
	noMsgs.Request.Messages = nil
	droppedLine := simpleStep("b2", "s", t0, core.StateDropped, "x")
	wrongSchema := strings.Replace(exportLine(t, simpleStep("b3", "s", t0, core.StateOpen, "x")), core.SchemaVersion, "clawmesh.step/v0", 1)

	lines := []string{
		exportLine(t, good),                // 1
		"{not json",                        // 2
		"",                                 // 3 blank: skipped
		wrongSchema,                        // 4
		exportLine(t, noMsgs),              // 5
		exportLine(t, noState),             // 6
		exportLine(t, noStateNext) + " {}", // 7 trailing data
		exportLine(t, noStateNext) + "\r",  // 8 CRLF is fine
		exportLine(t, droppedLine),         // 9
		`{"schema":"clawmesh.step/v1","id":"b4","session_id":"s","turn":"main","api":"chat.completions","state":"bogus","request":{"messages":[{"role":"user"}]}}`, // 10
		"   \t",                      // 11 blank
		exportLine(t, shippedScored), // 12
		`["an array"]`,               // 13
		exportLine(t, batched),       // 14
		// 15: no state field at all, then a blank line 16.
		strings.Replace(exportLine(t, simpleStep("g6", "s", t0, core.StateUnknown, "ok")), `"state":"unknown",`, "", 1) + "\n",
		exportLine(t, simpleStep("g7", "s", t0, core.StateScored, "ok")), // 17, no newline at the end
	}
	rep, err := p.Import(ctx, strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	wantBad := map[int]string{2: "invalid json", 4: "schema", 5: "no messages", 7: "trailing data", 9: "dropped", 10: "unknown state", 13: "invalid json"}
	if rep.Imported != 7 || rep.Duplicates != 0 || len(rep.Bad) != len(wantBad) {
		t.Fatalf("report %+v", rep)
	}
	for _, b := range rep.Bad {
		if sub, ok := wantBad[b.Line]; !ok || !strings.Contains(b.Err, sub) {
			t.Errorf("bad line %d: %q, want one of %v", b.Line, b.Err, wantBad)
		}
	}
	wantState := map[core.StepID]core.State{
		"g1": core.StateClosed, "g2": core.StateOpen, "g3": core.StateClosed,
		"g4": core.StateScored, "g5": core.StateOpen, "g6": core.StateOpen, "g7": core.StateScored,
	}
	for id, st := range wantState {
		s, err := p.Get(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if s.State != st {
			t.Errorf("%s: state %v, want %v", id, s.State, st)
		}
		wantSrc := SourceImport
		if id == "g4" {
			wantSrc = "gateway"
		}
		if s.Source != wantSrc {
			t.Errorf("%s: source %q, want %q", id, s.Source, wantSrc)
		}
	}
}

func TestReadLine(t *testing.T) {
	in := "short\n" + strings.Repeat("x", 25) + "\nexactly10!\r\n" + strings.Repeat("y", 11) + "\nlast"
	br := bufio.NewReaderSize(strings.NewReader(in), 16) // smaller than a long line
	type res struct {
		line    string
		tooLong bool
	}
	var got []res
	for range 10 {
		line, tooLong, err := readLine(br, 10, nil)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		got = append(got, res{string(line), tooLong})
		if err != nil {
			break
		}
	}
	want := []res{{"short", false}, {"", true}, {"exactly10!", false}, {"", true}, {"last", false}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestImportTooLongLine(t *testing.T) {
	ctx := context.Background()
	p := openTest(t, t.TempDir(), Options{})
	huge := `{"schema":"clawmesh.step/v1","id":"` + strings.Repeat("h", MaxLineBytes) + `"}`
	in := exportLine(t, simpleStep("a", "s", t0, core.StateOpen, "x")) + "\n" + huge + "\n" +
		exportLine(t, simpleStep("b", "s", t0, core.StateOpen, "y")) + "\n"
	rep, err := p.Import(ctx, strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Imported != 2 || len(rep.Bad) != 1 || rep.Bad[0].Line != 2 || !strings.Contains(rep.Bad[0].Err, "longer than") {
		t.Fatalf("report %+v", rep)
	}
}

func TestImportCanceled(t *testing.T) {
	p := openTest(t, t.TempDir(), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Import(ctx, strings.NewReader("")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Import with canceled ctx: %v", err)
	}
}

func FuzzImportLine(f *testing.F) {
	f.Add([]byte(exportLine(f, richStep("a", "s", t0))))
	f.Add([]byte(exportLine(f, simpleStep("b", "s", t0, core.StateUnknown, "x"))))
	f.Add([]byte(`{"schema":"clawmesh.step/v1","id":"c","session_id":"s","turn":"side","api":"responses","state":"shipped","request":{"messages":[{"role":"tool","parts":[{"type":"x","raw":{}}]}]},"next_state":{"messages":[]}}`))
	f.Add([]byte(`{"schema":"clawmesh.step/v1"} x`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"schema":"clawmesh.step/v1","id":"d","state":"dropped"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		s, err := decodeLine(line)
		if err != nil {
			if s != nil {
				t.Fatal("step returned with an error")
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted an invalid step: %v", err)
		}
		if s.State < core.StateOpen || s.State > core.StateScored {
			t.Fatalf("accepted state %v", s.State)
		}
		if s.Source == "" {
			t.Fatal("no source")
		}
		// What we accept re-exports to a line we accept as the same step.
		again, err := decodeLine([]byte(exportLine(t, s)))
		if err != nil {
			t.Fatalf("re-export rejected: %v", err)
		}
		a, _ := json.Marshal(s)
		b, _ := json.Marshal(again)
		if !bytes.Equal(a, b) {
			t.Fatalf("re-import differs:\n%s\n%s", a, b)
		}
	})
}
