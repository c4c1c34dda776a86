package pool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// MaxLineBytes is the longest JSONL line Import accepts (without its newline).
const MaxLineBytes = 64 << 20

// SourceImport is the Source given to imported steps that name none.
const SourceImport = "import"

// Export writes the live steps f selects as JSONL, one core.ExportedStep per
// line with Schema set to core.SchemaVersion, in List order, from one
// consistent snapshot. It returns the number of steps written. Tombstones
// are not exported: a filter on StateDropped is an error.
func (p *Pool) Export(ctx context.Context, w io.Writer, f Filter) (int, error) {
	if f.State == core.StateDropped {
		return 0, fmt.Errorf("pool: export: dropped steps have no content to export")
	}
	in, done, err := p.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	n := 0
	err = p.each(ctx, in, f, func(s *core.Step) error {
		if err := enc.Encode(core.ExportedStep{Schema: core.SchemaVersion, Step: *s}); err != nil {
			return fmt.Errorf("pool: export %s: %w", s.ID, err)
		}
		n++
		return nil
	})
	if err != nil {
		return n, err
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("pool: export: %w", err)
	}
	return n, nil
}

// ImportReport says what Import did.
type ImportReport struct {
	Imported   int       `json:"imported"`
	Duplicates int       `json:"duplicates"` // ids already in the pool (or dropped from it)
	Bad        []BadLine `json:"bad,omitempty"`
}

// BadLine is a line Import rejected.
type BadLine struct {
	Line int    `json:"line"` // 1-based
	Err  string `json:"err"`
}

// Import reads JSONL steps (schema core.SchemaVersion, lines up to
// MaxLineBytes) and stores the valid ones whose ids the pool does not know
// yet, live or dropped. Blank lines are skipped; every other line that is
// not a valid step is reported in Bad with its number and the reason, and
// the import goes on. See decodeLine for how states and sources are set.
// Everything imported is synced when Import returns; an error (reading r,
// storage, ctx) stops the import with what was done so far reported.
func (p *Pool) Import(ctx context.Context, r io.Reader) (ImportReport, error) {
	var rep ImportReport
	in, done, err := p.enterWrite(ctx)
	if err != nil {
		return rep, err
	}
	defer done()
	br := bufio.NewReaderSize(r, 1<<20)
	var buf []byte
	for lineNo := 1; ; lineNo++ {
		if err := ctx.Err(); err != nil {
			return rep, p.syncAfter(in, rep, err)
		}
		line, tooLong, rerr := readLine(br, MaxLineBytes, buf[:0])
		buf = line
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return rep, p.syncAfter(in, rep, fmt.Errorf("pool: import: line %d: %w", lineNo, rerr))
		}
		if errors.Is(rerr, io.EOF) && len(line) == 0 && !tooLong {
			break
		}
		switch {
		case tooLong:
			rep.Bad = append(rep.Bad, BadLine{lineNo, fmt.Sprintf("line longer than %d bytes", MaxLineBytes)})
		case len(bytes.TrimSpace(line)) == 0:
			// blank
		default:
			s, err := decodeLine(line)
			if err != nil {
				rep.Bad = append(rep.Bad, BadLine{lineNo, err.Error()})
				break
			}
			added, err := p.importStep(in, s)
			if err != nil {
				return rep, p.syncAfter(in, rep, fmt.Errorf("pool: import: line %d: %w", lineNo, err))
			}
			if added {
				rep.Imported++
			} else {
				rep.Duplicates++
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
	}
	return rep, p.syncAfter(in, rep, nil)
}

// syncAfter syncs the WAL if anything was imported (imports commit unsynced,
// one sync covers them all) and returns err, or the sync's error.
func (p *Pool) syncAfter(in *instance, rep ImportReport, err error) error {
	if rep.Imported == 0 {
		return err
	}
	if serr := in.logSync(); serr != nil && err == nil {
		err = fmt.Errorf("pool: import: sync: %w", serr)
	}
	return err
}

// importStep stores s unless its id is known; it reports whether it did.
func (p *Pool) importStep(in *instance, s *core.Step) (bool, error) {
	mu := p.stripe(in, s.ID)
	mu.Lock()
	defer mu.Unlock()
	_, exists, err := p.oldHeader(in, s.ID)
	if err != nil || exists {
		return false, err
	}
	if s.Timings.Start.IsZero() {
		s.Timings.Start = p.now()
	}
	return true, p.writeLocked(in, []*core.Step{s}, pebble.NoSync)
}

// readLine reads one line into buf (without the newline). A line longer than
// max is consumed whole but returned empty with tooLong set. err is io.EOF
// on the last line, which may be non-empty.
func readLine(br *bufio.Reader, max int, buf []byte) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+2 { // room for "\r\n"
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		buf = bytes.TrimSuffix(buf, []byte("\n"))
		buf = bytes.TrimSuffix(buf, []byte("\r"))
		if len(buf) > max {
			tooLong, buf = true, buf[:0]
		}
		return buf, tooLong, err
	}
}

// decodeLine decodes and checks one JSONL line, and settles the state and
// source of the step it holds:
//
//   - the line must be one JSON object with "schema" equal to
//     core.SchemaVersion and nothing after it; unknown fields are ignored;
//   - Source defaults to "import";
//   - a missing state ("state" absent, empty or "unknown") becomes closed if the step has a next_state, else
//     open;
//   - batched and shipped describe another device's outbox, so they come
//     in as scored when the step has a reward, else as closed or open by
//     the rule above;
//   - dropped cannot be imported (a tombstone carries no step);
//   - the result must pass core.Step.Validate.
func decodeLine(line []byte) (*core.Step, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var e importLine
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("invalid json: %v", err)
	}
	if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) != 0 {
		return nil, fmt.Errorf("trailing data after the step")
	}
	if e.Schema != core.SchemaVersion {
		return nil, fmt.Errorf("schema %q, want %q", e.Schema, core.SchemaVersion)
	}
	if e.State != nil && *e.State != "" && *e.State != core.StateUnknown.String() {
		st, err := core.ParseState(*e.State)
		if err != nil {
			return nil, fmt.Errorf("state: %v", err)
		}
		e.Step.State = st
	}
	s := &e.Step
	if s.Source == "" {
		s.Source = SourceImport
	}
	switch s.State {
	case core.StateUnknown:
		s.State = openOrClosed(s)
	case core.StateBatched, core.StateShipped, core.StateHeld:
		if s.Reward != nil {
			s.State = core.StateScored
		} else {
			s.State = openOrClosed(s)
		}
	case core.StateDropped:
		return nil, fmt.Errorf("step %s: state dropped cannot be imported", s.ID)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// importLine reads the state itself: core.State writes an unset state as
// "unknown" but does not read that back, and an import treats it, an empty
// string and a missing field alike as "not given". The outer State field
// shadows the step's.
type importLine struct {
	core.ExportedStep
	State *string `json:"state"`
}

func openOrClosed(s *core.Step) core.State {
	if s.NextState != nil {
		return core.StateClosed
	}
	return core.StateOpen
}
