package scrub

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ScrubJSONL scrubs the steps of in, JSON lines as `clawmesh pool export`
// writes them (core.ExportedStep), into out, one scrubbed step a line, in
// one pass with one table per session, so that a value keeps its
// placeholder across a session's steps. A line is at most maxLine bytes.
// It returns how many of each kind it replaced; an error names the line.
func (sc *Scrubber) ScrubJSONL(ctx context.Context, in io.Reader, out io.Writer, o *StepOptions, maxLine int) (map[Kind]int, error) {
	br := bufio.NewReaderSize(in, 1<<20)
	pass := sc.NewPass()
	tables := map[core.SessionID]*Table{}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	counts := map[Kind]int{}
	for line := 1; ; line++ {
		if err := ctx.Err(); err != nil {
			return counts, err
		}
		raw, err := readLongLine(br, maxLine)
		if errors.Is(err, io.EOF) && len(raw) == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return counts, fmt.Errorf("line %d: %w", line, err)
		}
		if len(strings.TrimSpace(string(raw))) == 0 {
			continue
		}
		var e core.ExportedStep
		if jerr := json.Unmarshal(raw, &e); jerr != nil {
			return counts, fmt.Errorf("line %d: not a step: %v", line, jerr)
		}
		if e.Schema != "" && e.Schema != core.SchemaVersion {
			return counts, fmt.Errorf("line %d: schema %q, want %q", line, e.Schema, core.SchemaVersion)
		}
		if verr := e.Step.Validate(); verr != nil {
			return counts, fmt.Errorf("line %d: %v", line, verr)
		}
		t := tables[e.SessionID]
		if t == nil {
			t = &Table{}
			tables[e.SessionID] = t
		}
		s, serr := pass.Step(t, &e.Step, o)
		if serr != nil {
			return counts, serr
		}
		if werr := enc.Encode(core.ExportedStep{Schema: core.SchemaVersion, Step: *s}); werr != nil {
			return counts, werr
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	for _, t := range tables {
		for k, n := range t.Counts() {
			counts[k] += n
		}
	}
	return counts, nil
}

// readLongLine reads a line of up to max bytes, without its newline.
func readLongLine(br *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > max {
			return nil, fmt.Errorf("a line over %d MiB", max>>20)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(buf); n > 0 && buf[n-1] == '\n' {
			buf = buf[:n-1]
		}
		return buf, err
	}
}
