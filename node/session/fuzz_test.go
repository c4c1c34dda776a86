package session

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// byteSource hands out the fuzzer's bytes; it reads zeros once they run out.
type byteSource struct {
	b []byte
	i int
}

func (s *byteSource) next() byte {
	if s.i >= len(s.b) {
		return 0
	}
	s.i++
	return s.b[s.i-1]
}

func (s *byteSource) left() bool { return s.i < len(s.b) }

func (s *byteSource) n(max int) int { return int(s.next()) % max }

type fuzzStep struct {
	req     []core.Message
	actions []core.Message
	state   int // 0 in flight, 1 completed, 2 aborted
	closed  int
}

// FuzzTracker drives a Tracker with random sequences of Begin, Complete,
// Abort, Tick and End built from the input, and checks after every call: the
// internal invariants and memory bounds (Tracker.check), that only completed
// steps close, each at most once, that next states come from another call,
// are non-empty and never hold a volatile message; and at the end, once every
// call has completed and all chains went idle, that every completed step
// closed exactly once.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{3, 2, 5, 0, 0, 0, 1, 1, 0, 0, 3, 0, 1, 1, 0})
	f.Add([]byte("\x01\x01\x01\x00\x10\x20\x01\x00\x00\x00\x01\x01\x02\x04\x05\x00\x03\x09"))
	f.Add([]byte(strings.Repeat("\x00\x07\x01\x02\x01\x00\x03\x11", 20)))
	f.Add([]byte(strings.Repeat("\x00\x01\x03\x05\x02\x00\x01\x00\x04\x02", 30)))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{b: data}
		opts := Options{
			MaxSessions: 1 + src.n(4),
			MaxSteps:    1 + src.n(6),
			IdleTimeout: time.Duration(1+src.n(10)) * time.Minute,
		}
		tr, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		steps := map[core.StepID]*fuzzStep{}
		var order []core.StepID // begun, in order
		closures := func(op string, cl []Closure, from core.StepID) {
			for _, c := range cl {
				s := steps[c.StepID]
				if s == nil || s.state != 1 {
					t.Fatalf("%s: closure of %s, which is not a completed step", op, c.StepID)
				}
				if s.closed++; s.closed > 1 {
					t.Fatalf("%s: %s closed twice", op, c.StepID)
				}
				if ns := c.NextState; ns != nil {
					// From the call being begun, or (a continuation seen
					// before the reply) from an earlier call.
					if (from != "" && ns.StepID != from) || steps[ns.StepID] == nil || ns.StepID == c.StepID {
						t.Fatalf("%s: next state for %s from %q", op, c.StepID, ns.StepID)
					}
					if len(ns.Messages) == 0 {
						t.Fatalf("%s: empty next state for %s", op, c.StepID)
					}
					for _, m := range ns.Messages {
						if volatile(&m, tr.opts.VolatileMarkers) {
							t.Fatalf("%s: volatile message in next state of %s", op, c.StepID)
						}
					}
				}
			}
			if err := tr.check(); err != nil {
				t.Fatalf("%s: %v", op, err)
			}
		}
		pick := func(state int) core.StepID {
			var ids []core.StepID
			for _, id := range order {
				if steps[id].state == state {
					ids = append(ids, id)
				}
			}
			if len(ids) == 0 {
				return ""
			}
			return ids[src.n(len(ids))]
		}
		for op := 0; src.left() && op < 500; op++ {
			switch src.n(6) {
			case 0, 1: // Begin
				id := core.StepID(fmt.Sprintf("x%d", len(order)))
				c := Call{Now: now, StepID: id, Turn: core.TurnMain, TraceID: []string{"", "", "t1", "t2"}[src.n(4)]}
				if k := src.n(5); k < 3 {
					c.Session = core.SessionID([]string{"A", "B", "C"}[k])
					c.Source = SourceHeader
				}
				if src.n(4) == 0 {
					c.Turn = core.TurnSide
				}
				c.Done = src.n(8) == 0
				switch k := src.n(4); {
				case k == 0 || len(order) == 0: // fresh
					c.Messages = []core.Message{{Role: core.RoleSystem, Content: fmt.Sprint("sys", src.n(3))}}
				case k == 1: // retry of an earlier request
					c.Messages = append(c.Messages, steps[order[src.n(len(order))]].req...)
				default: // continue an earlier step's history
					s := steps[order[src.n(len(order))]]
					c.Messages = append(c.Messages, s.req...)
					if len(s.actions) > 0 {
						a := s.actions[src.n(len(s.actions))]
						a.ToolCalls = append([]core.ToolCall(nil), a.ToolCalls...)
						for i := range a.ToolCalls { // clients rewrite ids
							a.ToolCalls[i].ID = strings.ReplaceAll(a.ToolCalls[i].ID, "_", "")
						}
						c.Messages = append(c.Messages, a)
					} else if s.state == 0 { // continue a reply not reported yet
						c.Messages = append(c.Messages, core.Message{Role: core.RoleAssistant, Content: fmt.Sprint("a", src.n(3))})
					}
				}
				// Drop earlier volatile messages now and then, add new ones.
				if src.n(2) == 0 {
					kept := c.Messages[:0:0]
					for _, m := range c.Messages {
						if !volatile(&m, tr.opts.VolatileMarkers) {
							kept = append(kept, m)
						}
					}
					c.Messages = kept
				}
				for k := src.n(3); k > 0; k-- {
					switch src.n(3) {
					case 0:
						c.Messages = append(c.Messages, core.Message{Role: core.RoleUser, Content: fmt.Sprint("u", src.n(4))})
					case 1:
						c.Messages = append(c.Messages, core.Message{Role: core.RoleTool, ToolCallID: "callx", Content: fmt.Sprint("r", src.n(3))})
					default:
						c.Messages = append(c.Messages, core.Message{Role: core.RoleUser, Content: OpenClawMarker + fmt.Sprint(src.n(3))})
					}
				}
				a := tr.Begin(c)
				if a.Session == "" || a.Chain == "" || a.Parent == id {
					t.Fatalf("begin %s: bad assignment %+v", id, a)
				}
				if c.Session != "" && a.Session != c.Session {
					t.Fatalf("begin %s: session %s, asked for %s", id, a.Session, c.Session)
				}
				steps[id] = &fuzzStep{req: c.Messages}
				order = append(order, id)
				closures("begin "+string(id), a.Closures, id)
			case 2: // Complete
				id := pick(0)
				if id == "" {
					continue
				}
				n := 1 + src.n(2)
				acts := make([]core.Message, n)
				for i := range acts {
					switch src.n(4) {
					case 0:
						acts[i] = core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "call_1", Name: "f", Arguments: fmt.Sprintf(`{"a": %d}`, src.n(2))}}}
					case 1:
						acts[i] = core.Message{Role: core.RoleAssistant}
					default:
						acts[i] = core.Message{Role: core.RoleAssistant, Content: fmt.Sprint("a", src.n(3)), Reasoning: "r"}
					}
				}
				steps[id].state, steps[id].actions = 1, acts
				closures("complete "+string(id), tr.Complete(id, acts, now), "")
			case 3: // Abort
				if id := pick(0); id != "" {
					steps[id].state = 2
					tr.Abort(id)
					closures("abort "+string(id), nil, "")
				}
			case 4: // Tick
				now = now.Add(time.Duration(src.n(12)) * time.Minute)
				closures("tick", tr.Tick(now), "")
			case 5: // End
				closures("end", tr.End(core.SessionID([]string{"A", "B", "C", "s-x0", "s-x1"}[src.n(5)]), now), "")
			}
		}
		// Every call completes, every chain goes idle: every completed
		// step must have closed exactly once.
		for _, id := range order {
			if s := steps[id]; s.state == 0 {
				s.state = 1
				closures("final complete", tr.Complete(id, []core.Message{{Role: core.RoleAssistant, Content: "end"}}, now), "")
			}
		}
		closures("final tick", tr.Tick(now.Add(24*time.Hour)), "")
		for _, id := range order {
			if s := steps[id]; s.state == 1 && s.closed != 1 {
				t.Fatalf("%s completed but closed %d times", id, s.closed)
			}
		}
		if st := tr.Stats(); st.Open != 0 || st.InFlight != 0 {
			t.Fatalf("after the end: %+v", st)
		}
	})
}
