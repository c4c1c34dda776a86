// Package tasks reads task sets: the JSONL files a mesh admin points the
// trainers at to train on many rollouts per prompt, scored by a verifier
// plugin that knows each task's answer (white-box offline mode). A line is
//
//	{"id": "...", "messages": [...], "tools": [...], "answer": ..., "meta": {...}}
//
// Decoding is strict (unknown fields, duplicate ids and oversized sets are
// refused), the canonical form of a set (its tasks re-encoded one a line,
// in file order) is what its content hash names, and the held-out split is
// a pure function of that hash and the tasks' ids, of the size asked for
// (rounded), so every trainer draws the same split and never trains on a
// held-out task. Nothing here touches
// a disk, a clock or a network.
package tasks

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/core"
)

// ErrTask wraps every reason a task line or a set is refused.
var ErrTask = errors.New("tasks: bad task")

// Limits of a task set.
const (
	// MaxLine bounds one task line, MaxSet a whole set's canonical bytes,
	// MaxTasks its tasks.
	MaxLine  = 256 << 10
	MaxSet   = 2 << 20
	MaxTasks = 10000
	// MaxID bounds a task id.
	MaxID = 128
	// MaxTurns bounds the model turns of one episode of a task with tools.
	MaxTurns = 8
)

// Task is one line of a task set.
type Task struct {
	ID       string         `json:"id"`
	Messages []core.Message `json:"messages"`
	Tools    []core.Tool    `json:"tools,omitempty"`
	// Answer is what the verifier compares a reply with: any JSON value,
	// passed to it as it is.
	Answer json.RawMessage `json:"answer,omitempty"`
	// Meta is passed to the verifier too; it also carries the episode's
	// own settings: max_tokens (the reply's token limit) and max_turns
	// (the model turns of an episode with tools).
	Meta json.RawMessage `json:"meta,omitempty"`
}

// Settings are the episode settings a task's meta may give.
type Settings struct {
	MaxTokens int `json:"max_tokens"`
	MaxTurns  int `json:"max_turns"`
}

// Settings reads max_tokens and max_turns from the task's meta, with
// defaults (maxTokens, and 1 turn, or 4 with tools) for what it lacks.
func (t *Task) Settings(maxTokens int) Settings {
	var s Settings
	if len(t.Meta) > 0 {
		json.Unmarshal(t.Meta, &s) // checked by Decode
	}
	if s.MaxTokens <= 0 {
		s.MaxTokens = maxTokens
	}
	if s.MaxTurns <= 0 {
		s.MaxTurns = 1
		if len(t.Tools) > 0 {
			s.MaxTurns = 4
		}
	}
	s.MaxTurns = min(s.MaxTurns, MaxTurns)
	return s
}

// DecodeLine decodes and checks one task line.
func DecodeLine(line []byte) (*Task, error) {
	if len(line) > MaxLine {
		return nil, fmt.Errorf("%w: line of %d bytes (at most %d)", ErrTask, len(line), MaxLine)
	}
	if !utf8.Valid(line) {
		return nil, fmt.Errorf("%w: not UTF-8", ErrTask)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var t Task
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTask, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the task", ErrTask)
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	return &t, nil
}

func (t *Task) check() error {
	switch {
	case t.ID == "" || len(t.ID) > MaxID:
		return fmt.Errorf("%w: id %q: 1 to %d bytes", ErrTask, clip(t.ID), MaxID)
	case strings.ContainsFunc(t.ID, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%w: id %q has control characters", ErrTask, clip(t.ID))
	case len(t.Messages) == 0:
		return fmt.Errorf("%w: task %q has no messages", ErrTask, clip(t.ID))
	}
	for i, m := range t.Messages {
		switch m.Role {
		case core.RoleSystem, core.RoleUser, core.RoleAssistant, core.RoleTool:
		default:
			return fmt.Errorf("%w: task %q message %d: role %q", ErrTask, clip(t.ID), i, clip(m.Role))
		}
	}
	for i, tl := range t.Tools {
		if tl.Name == "" {
			return fmt.Errorf("%w: task %q tool %d has no name", ErrTask, clip(t.ID), i)
		}
		if len(tl.Parameters) > 0 && !json.Valid(tl.Parameters) {
			return fmt.Errorf("%w: task %q tool %q: parameters are not JSON", ErrTask, clip(t.ID), tl.Name)
		}
	}
	if len(t.Meta) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(t.Meta, &m); err != nil || m == nil {
			return fmt.Errorf("%w: task %q: meta is not an object", ErrTask, clip(t.ID))
		}
		var s Settings
		if err := json.Unmarshal(t.Meta, &s); err != nil || s.MaxTokens < 0 || s.MaxTurns < 0 {
			return fmt.Errorf("%w: task %q: meta max_tokens and max_turns are counts", ErrTask, clip(t.ID))
		}
	}
	if len(t.Answer) > 0 && bytes.Equal(bytes.TrimSpace(t.Answer), []byte("null")) {
		t.Answer = nil
	}
	return nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Set is a decoded task set.
type Set struct {
	Tasks []*Task
	// Canonical is the set as it is hashed and replicated: each task
	// re-encoded, one a line, in file order.
	Canonical []byte
	// Hash is the SHA-256 (hex) of Canonical.
	Hash string
}

// Parse decodes a task set from JSONL: blank lines are skipped, ids must
// be unique, and the set must hold at least two tasks (one to train on,
// one to hold out). Errors name the line.
func Parse(r io.Reader) (*Set, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine+1)
	set := &Set{}
	seen := map[string]bool{}
	var canon bytes.Buffer
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		t, err := DecodeLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if seen[t.ID] {
			return nil, fmt.Errorf("line %d: %w: id %q twice", n, ErrTask, clip(t.ID))
		}
		seen[t.ID] = true
		if len(set.Tasks) == MaxTasks {
			return nil, fmt.Errorf("%w: more than %d tasks", ErrTask, MaxTasks)
		}
		b, err := json.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: %v", n, ErrTask, err)
		}
		canon.Write(b)
		canon.WriteByte('\n')
		if canon.Len() > MaxSet {
			return nil, fmt.Errorf("%w: set larger than %d bytes", ErrTask, MaxSet)
		}
		set.Tasks = append(set.Tasks, t)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrTask, MaxLine)
		}
		return nil, err
	}
	if len(set.Tasks) < 2 {
		return nil, fmt.Errorf("%w: %d tasks: a set needs at least 2", ErrTask, len(set.Tasks))
	}
	set.Canonical = canon.Bytes()
	set.Hash = Hash(set.Canonical)
	return set, nil
}

// Hash is the SHA-256 (hex) of b: how task sets and plugins are named.
func Hash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// HeldOut reports whether task id of the set whose hash is setHash falls
// in the held-out split of fraction frac as sets were split before the
// split was made exact (LegacySplit): the first 8 bytes of
// SHA-256(setHash "\x00" id), read as a number, fall below frac of their
// range. The number of tasks it holds out only follows frac on average.
func HeldOut(setHash, id string, frac float64) bool {
	if frac <= 0 {
		return false
	}
	return float64(rank(setHash, id))/float64(^uint64(0)) < frac
}

// rank is task id's draw in the set whose hash is setHash: the first 8
// bytes of SHA-256(setHash "\x00" id), read as a number.
func rank(setHash, id string) uint64 {
	h := sha256.Sum256([]byte(setHash + "\x00" + id))
	return binary.BigEndian.Uint64(h[:8])
}

// HeldOutCount is how many of n tasks a split of fraction frac holds
// out: frac·n rounded to the nearest, at least one when frac > 0 and at
// most n-1, so that each side keeps a task (n >= 2).
func HeldOutCount(n int, frac float64) int {
	if frac <= 0 || n < 2 {
		return 0
	}
	k := int(math.Round(frac * float64(n)))
	return min(max(k, 1), n-1)
}

// Split divides the set's tasks into the training split and the held-out
// one, each in file order. The held-out split is exactly HeldOutCount
// tasks: those whose draw (SHA-256 of the set's hash and the task's id)
// ranks lowest, ties broken by id. It depends on nothing else, so every
// trainer draws the same split.
//
// The group records a set's split when it adds it: a set added before
// the split was exact keeps the split it was added with (LegacySplit).
func (s *Set) Split(frac float64) (train, held []*Task) {
	k := HeldOutCount(len(s.Tasks), frac)
	order := make([]int, len(s.Tasks))
	ranks := make([]uint64, len(s.Tasks))
	for i, t := range s.Tasks {
		order[i], ranks[i] = i, rank(s.Hash, t.ID)
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(ranks[a], ranks[b]); c != 0 {
			return c
		}
		return strings.Compare(s.Tasks[a].ID, s.Tasks[b].ID)
	})
	out := make([]bool, len(s.Tasks))
	for _, i := range order[:k] {
		out[i] = true
	}
	for i, t := range s.Tasks {
		if out[i] {
			held = append(held, t)
		} else {
			train = append(train, t)
		}
	}
	return train, held
}

// LegacySplit is the split of earlier versions: each task drawn on its
// own (HeldOut), so that the held-out split's size only follows frac on
// average. A split that would leave either side empty moves one task
// over: the first task is trained on, the last held out. The leader still
// accepts it from a trainer of an earlier version.
func (s *Set) LegacySplit(frac float64) (train, held []*Task) {
	for _, t := range s.Tasks {
		if HeldOut(s.Hash, t.ID, frac) {
			held = append(held, t)
		} else {
			train = append(train, t)
		}
	}
	switch {
	case frac > 0 && len(held) == 0 && len(train) > 1:
		held, train = train[len(train)-1:], train[:len(train)-1]
	case len(train) == 0 && len(held) > 1:
		train, held = held[:1], held[1:]
	}
	return train, held
}

// ByID indexes the set's tasks.
func (s *Set) ByID() map[string]*Task {
	m := make(map[string]*Task, len(s.Tasks))
	for _, t := range s.Tasks {
		m[t.ID] = t
	}
	return m
}
