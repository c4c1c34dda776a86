package personal

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/model/peft"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/pool"
)

// Mode is where a device's personal adapter trains.
type Mode string

const (
	// ModeOff trains no personal adapter and serves none (the default).
	ModeOff Mode = "off"
	// ModeLocal trains it on the device, while the agent is idle.
	ModeLocal Mode = "local"
	// ModeMesh has a trainer the user trusts train it.
	ModeMesh Mode = "mesh"
)

// ParseMode reads a [personal] mode ("" is off).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return ModeOff, nil
	case ModeOff, ModeLocal, ModeMesh:
		return m, nil
	}
	return "", fmt.Errorf("personal: mode is local, mesh or off, not %q", s)
}

// Defaults of Config.
const (
	DefaultIdle     = 2 * time.Minute
	DefaultMinSteps = 16
	DefaultMaxSteps = 256
	DefaultHoldBack = 0.2
	DefaultPoll     = 10 * time.Second
	// maxHeldBack caps the held-back steps a job is scored on.
	maxHeldBack = 128
	// keepVersions is how many personal versions stay on disk.
	keepVersions = 2
)

// ErrOff is asked of a device whose personal adapter is off.
var ErrOff = errors.New("personal: the personal adapter is off (set [personal] mode = local or mesh, or run `clawmesh personal on`)")

// ErrNotEnough is a training asked for with too few new steps.
var ErrNotEnough = errors.New("personal: not enough new scored steps to learn from")

// Config configures a Manager.
type Config struct {
	// Dir holds the personal versions (Dir/p3), the stacked adapters
	// (Dir/stacked/v12-p3) and the state. Required.
	Dir  string
	Mode Mode
	// Trainer trains the adapter (required unless Mode is off).
	Trainer Trainer
	// Pool is the device's DataPool: its own steps, the only ones a
	// personal adapter learns from. Required.
	Pool *pool.Pool
	// Shared returns the shared version serving now and its installed
	// directory ("", "": the base model).
	Shared func() (version, dir string)
	// Changed is told when the personal version changes (a new one, a
	// reset, off or on): the stack serving is to be rebuilt.
	Changed func()
	// LastCall returns when the agent last called the gateway; a job
	// starts only after Idle without a call, and Preempt stops it.
	LastCall func() time.Time
	// Prepare, if set, runs on the steps before they are handed to the
	// Trainer (mode mesh scrubs them there).
	Prepare func([]*core.Step) ([]*core.Step, error)
	// Idle (default 2m), MinSteps (new scored steps for a job, default
	// 16), MaxSteps (the newest steps a job takes, default 256), HoldBack
	// (the share of steps kept out of training to score on, default 0.2)
	// and Poll (how often the loop looks, default 10s).
	Idle     time.Duration
	MinSteps int
	MaxSteps int
	HoldBack float64
	Poll     time.Duration
	Seed     uint64
	Now      func() time.Time
	Logger   *slog.Logger
}

// Record is one personal version.
type Record struct {
	Version string    `json:"version"` // p3
	At      time.Time `json:"at"`
	// Shared is the shared version it was trained on top of.
	Shared      string  `json:"shared"`
	Trained     int     `json:"trained"`
	HeldBack    int     `json:"held_back"`
	ScoreBefore float64 `json:"score_before"`
	ScoreAfter  float64 `json:"score_after"`
	Seconds     float64 `json:"seconds"`
}

type state struct {
	// Disabled is set by `clawmesh personal off`.
	Disabled bool `json:"disabled,omitempty"`
	// Next numbers the versions; Current is the one serving ("" none).
	Next    int    `json:"next"`
	Current string `json:"current,omitempty"`
	// Cursor is the newest step trained on: the next job takes the steps
	// after it.
	Cursor  core.StepID `json:"cursor,omitempty"`
	CursorT time.Time   `json:"cursor_time,omitzero"`
	// From is the cursor at the last reset: the steps up to it are
	// learned from no more.
	From    core.StepID `json:"from,omitempty"`
	FromT   time.Time   `json:"from_time,omitzero"`
	Learned int         `json:"learned"`
	History []Record    `json:"history,omitempty"`
}

// maxHistory caps the versions remembered in the state.
const maxHistory = 50

// Manager keeps a device's personal adapter: it trains it while the agent
// is idle and stacks it on the shared version serving.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	st      state
	running context.CancelFunc // the job under way, nil when none
	lastErr string
	pending int // new scored steps seen by the last look
	// jobMu makes one job at a time.
	jobMu sync.Mutex
	kick  chan struct{}
}

const stateFile = "state.json"

// New opens the manager's directory and reads its state.
func New(cfg Config) (*Manager, error) {
	if cfg.Dir == "" || cfg.Pool == nil {
		return nil, errors.New("personal: a manager needs a directory and the pool")
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeOff
	}
	if cfg.Mode != ModeOff && cfg.Trainer == nil {
		return nil, fmt.Errorf("personal: mode %s needs a trainer", cfg.Mode)
	}
	if cfg.Shared == nil {
		cfg.Shared = func() (string, string) { return "", "" }
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	if cfg.LastCall == nil {
		cfg.LastCall = func() time.Time { return time.Time{} }
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.MinSteps <= 0 {
		cfg.MinSteps = DefaultMinSteps
	}
	if cfg.MaxSteps <= 0 {
		cfg.MaxSteps = DefaultMaxSteps
	}
	if cfg.HoldBack <= 0 || cfg.HoldBack >= 1 {
		cfg.HoldBack = DefaultHoldBack
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "stacked"), 0o700); err != nil {
		return nil, fmt.Errorf("personal: %w", err)
	}
	m := &Manager{cfg: cfg, log: cfg.Logger.With("component", "personal"), kick: make(chan struct{}, 1)}
	if b, err := os.ReadFile(filepath.Join(cfg.Dir, stateFile)); err == nil {
		if err := json.Unmarshal(b, &m.st); err != nil {
			m.log.Warn("the personal state does not read; starting afresh", "err", err)
			m.st = state{}
		}
	}
	if m.st.Current != "" && !isDir(m.versionDir(m.st.Current)) {
		m.log.Warn("the personal version serving is gone from disk; serving the shared version alone", "version", m.st.Current)
		m.st.Current = ""
	}
	// What an interrupted job or stack left behind.
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "stacked")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				os.RemoveAll(filepath.Join(d, e.Name()))
			}
		}
	}
	return m, nil
}

// Mode is the configured mode.
func (m *Manager) Mode() Mode { return m.cfg.Mode }

// active reports whether the personal adapter trains and serves.
func (m *Manager) active() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg.Mode != ModeOff && !m.st.Disabled
}

func (m *Manager) versionDir(v string) string { return filepath.Join(m.cfg.Dir, v) }

// Current is the personal version to stack on the shared one and its
// directory; "", "" when none serves (none trained yet, reset, or off).
func (m *Manager) Current() (name, dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.Mode == ModeOff || m.st.Disabled || m.st.Current == "" {
		return "", ""
	}
	return m.st.Current, m.versionDir(m.st.Current)
}

// Stacked returns the directory of the adapter that is the shared version
// (its installed directory sharedDir; "" for the base model) with the
// personal version p (directory pdir) on top: one adapter whose rank is the
// sum of both, built once and kept under Dir/stacked.
func (m *Manager) Stacked(version, sharedDir, p, pdir string) (string, error) {
	if sharedDir == "" {
		return pdir, nil
	}
	out := filepath.Join(m.cfg.Dir, "stacked", adapters.StackName(version, p))
	if isDir(out) {
		return out, nil
	}
	tmp := filepath.Join(m.cfg.Dir, "stacked", ".tmp-"+adapters.StackName(version, p))
	os.RemoveAll(tmp)
	if err := peft.Stack(tmp, sharedDir, pdir); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("personal: stacking %s on %s: %w", p, version, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("personal: %w", err)
	}
	m.pruneStacked(adapters.StackName(version, p))
	return out, nil
}

// pruneStacked removes the stacked adapters but the newest ones.
func (m *Manager) pruneStacked(keep string) {
	d := filepath.Join(m.cfg.Dir, "stacked")
	ents, _ := os.ReadDir(d)
	type ent struct {
		name string
		at   time.Time
	}
	var all []ent
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if info, err := e.Info(); err == nil {
			all = append(all, ent{e.Name(), info.ModTime()})
		}
	}
	slices.SortFunc(all, func(a, b ent) int { return b.at.Compare(a.at) })
	for i, e := range all {
		if i >= 3 && e.name != keep {
			os.RemoveAll(filepath.Join(d, e.name))
		}
	}
}

// Preempt stops the job under way: the agent is busy again. The job is
// tried again once the agent is idle.
func (m *Manager) Preempt() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running != nil && m.cfg.Mode == ModeLocal {
		m.running()
	}
}

// Run trains a new personal version whenever the agent has been idle for
// Idle and at least MinSteps new scored steps wait, until ctx is done.
func (m *Manager) Run(ctx context.Context) {
	if m.cfg.Mode == ModeOff {
		return
	}
	tk := time.NewTicker(m.cfg.Poll)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-m.kick:
		}
		if !m.active() || m.cfg.Now().Sub(m.cfg.LastCall()) < m.cfg.Idle {
			continue
		}
		_, err := m.Train(ctx)
		switch {
		case err == nil, errors.Is(err, ErrNotEnough), errors.Is(err, ErrOff), ctx.Err() != nil:
		case errors.Is(err, context.Canceled):
			m.log.Debug("personal training stopped: the agent is busy")
		default:
			m.log.Warn("personal training failed", "err", err)
		}
	}
}

// Train trains a new personal version now, from the scored steps since
// the last one, and returns its record; ErrNotEnough when fewer than
// MinSteps new scored steps wait.
func (m *Manager) Train(ctx context.Context) (Record, error) {
	if !m.active() {
		return Record{}, ErrOff
	}
	m.jobMu.Lock()
	defer m.jobMu.Unlock()
	m.mu.Lock()
	st := m.st
	m.mu.Unlock()
	// An idle device looks every Poll: the steps since the cursor are
	// counted first, and the whole pool is read only for a job.
	fresh, err := m.fresh(ctx, st)
	if err != nil {
		return Record{}, err
	}
	var train, held []*core.Step
	var cursor core.StepID
	var cursorT time.Time
	if fresh >= m.cfg.MinSteps {
		if train, held, fresh, cursor, cursorT, err = m.steps(ctx, st); err != nil {
			return Record{}, err
		}
	}
	m.mu.Lock()
	m.pending = fresh
	m.mu.Unlock()
	if fresh < m.cfg.MinSteps {
		return Record{}, fmt.Errorf("%w (%d of %d)", ErrNotEnough, fresh, m.cfg.MinSteps)
	}
	if m.cfg.Prepare != nil {
		if train, err = m.cfg.Prepare(train); err != nil {
			return Record{}, err
		}
		if held, err = m.cfg.Prepare(held); err != nil {
			return Record{}, err
		}
	}
	shared, sharedDir := m.cfg.Shared()
	name := "p" + strconv.Itoa(st.Next+1)
	tmp := filepath.Join(m.cfg.Dir, ".tmp-"+name)
	os.RemoveAll(tmp)
	prev := ""
	if st.Current != "" {
		prev = m.versionDir(st.Current)
	}
	jctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	m.running = cancel
	m.mu.Unlock()
	defer func() {
		cancel()
		m.mu.Lock()
		m.running = nil
		m.mu.Unlock()
	}()
	start := m.cfg.Now()
	res, err := m.cfg.Trainer.Train(jctx, core.PersonalJob{Shared: sharedDir, SharedVersion: shared, Prev: prev,
		Steps: train, HeldBack: held, Out: tmp, Seed: m.cfg.Seed + uint64(st.Next)})
	if err != nil {
		os.RemoveAll(tmp)
		m.setErr(err)
		if jctx.Err() != nil && ctx.Err() == nil {
			return Record{}, fmt.Errorf("personal: %w", context.Canceled)
		}
		return Record{}, fmt.Errorf("personal: training %s: %w", name, err)
	}
	if !isDir(tmp) {
		m.setErr(errors.New("the trainer wrote no adapter"))
		return Record{}, fmt.Errorf("personal: training %s: the trainer wrote no adapter", name)
	}
	if err := os.Rename(tmp, m.versionDir(name)); err != nil {
		os.RemoveAll(tmp)
		return Record{}, fmt.Errorf("personal: %w", err)
	}
	rec := Record{Version: name, At: m.cfg.Now().UTC(), Shared: shared, Trained: res.Trained, HeldBack: res.HeldBack,
		ScoreBefore: res.ScoreBefore, ScoreAfter: res.ScoreAfter, Seconds: m.cfg.Now().Sub(start).Seconds()}
	if res.Seconds > 0 {
		rec.Seconds = res.Seconds
	}
	m.mu.Lock()
	if m.st.Disabled || m.cfg.Mode == ModeOff {
		// Turned off while it trained: the version is not served.
		m.mu.Unlock()
		os.RemoveAll(m.versionDir(name))
		return Record{}, ErrOff
	}
	m.st.Next = max(m.st.Next, st.Next) + 1
	m.st.Current = name
	m.st.Cursor, m.st.CursorT = cursor, cursorT
	m.st.Learned += fresh
	m.st.History = append(m.st.History, rec)
	if len(m.st.History) > maxHistory {
		m.st.History = m.st.History[len(m.st.History)-maxHistory:]
	}
	m.pending = 0
	m.lastErr = ""
	err = m.saveLocked()
	m.mu.Unlock()
	m.pruneVersions(name)
	m.log.Info("personal version trained", "version", name, "shared", shared, "steps", rec.Trained,
		"held_back", rec.HeldBack, "score_before", rec.ScoreBefore, "score_after", rec.ScoreAfter, "took", time.Duration(rec.Seconds*float64(time.Second)).Round(time.Millisecond))
	m.cfg.Changed()
	return rec, err
}

func (m *Manager) setErr(err error) {
	m.mu.Lock()
	m.lastErr = err.Error()
	m.mu.Unlock()
}

// steps picks a job's steps: the device's scored steps with a signal
// (since the last reset), less those held back, the newest MaxSteps of
// them, so that a job replays the recent past with the new steps; and the
// held-back ones (the newest maxHeldBack). fresh counts the steps after the
// cursor (the newest step of the last job), which must be MinSteps for a
// job. A step is held back by a hash of its id, so it is held back every
// time.
func (m *Manager) steps(ctx context.Context, st state) (train, held []*core.Step, fresh int, cursor core.StepID, cursorT time.Time, err error) {
	all, err := m.cfg.Pool.List(ctx, pool.Filter{})
	if err != nil {
		return nil, nil, 0, "", time.Time{}, fmt.Errorf("personal: listing the steps: %w", err)
	}
	cursor, cursorT = st.Cursor, st.CursorT
	for _, s := range all {
		if !learnable(s) {
			continue
		}
		if m.heldBack(s.ID) {
			held = append(held, s)
			continue
		}
		if st.From != "" && !after(s, st.From, st.FromT) {
			continue // before the last reset
		}
		train = append(train, s)
		if st.Cursor == "" || after(s, st.Cursor, st.CursorT) {
			fresh++
			cursor, cursorT = s.ID, s.Timings.Start
		}
	}
	if len(train) > m.cfg.MaxSteps {
		train = train[len(train)-m.cfg.MaxSteps:]
	}
	if len(held) > maxHeldBack {
		held = held[len(held)-maxHeldBack:]
	}
	return train, held, fresh, cursor, cursorT, nil
}

// fresh counts the steps a job would learn from that are newer than the
// cursor, reading only the steps since its time.
func (m *Manager) fresh(ctx context.Context, st state) (int, error) {
	newer, err := m.cfg.Pool.List(ctx, pool.Filter{Since: st.CursorT})
	if err != nil {
		return 0, fmt.Errorf("personal: listing the steps: %w", err)
	}
	n := 0
	for _, s := range newer {
		if learnable(s) && !m.heldBack(s.ID) && (st.Cursor == "" || after(s, st.Cursor, st.CursorT)) {
			n++
		}
	}
	return n, nil
}

// learnable reports whether a step carries something to learn from: a
// reward with a signal, and a reply.
func learnable(s *core.Step) bool {
	return s.Reward != nil && s.Reward.Value != nil && *s.Reward.Value != 0 && len(s.Response.Choices) > 0
}

// after reports whether s sorts after the step (id, t): by time, then id,
// as the pool lists them.
func after(s *core.Step, id core.StepID, t time.Time) bool {
	if c := s.Timings.Start.Compare(t); c != 0 {
		return c > 0
	}
	return s.ID > id
}

// heldBack reports whether the step is kept out of training, to score on.
func (m *Manager) heldBack(id core.StepID) bool {
	h := sha256.Sum256([]byte("clawmesh personal held back\x00" + string(id)))
	return float64(binary.BigEndian.Uint64(h[:8])>>11)/(1<<53) < m.cfg.HoldBack
}

// pruneVersions removes the personal versions but the newest few.
func (m *Manager) pruneVersions(keep string) {
	ents, _ := os.ReadDir(m.cfg.Dir)
	var vs []int
	for _, e := range ents {
		if n, ok := versionNumber(e.Name()); ok && e.IsDir() {
			vs = append(vs, n)
		}
	}
	slices.Sort(vs)
	for i, n := range vs {
		name := "p" + strconv.Itoa(n)
		if i < len(vs)-keepVersions && name != keep {
			os.RemoveAll(m.versionDir(name))
		}
	}
}

func versionNumber(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "p")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// Reset forgets the personal adapter: its versions are removed and the
// device serves the shared version alone; the steps are learned from
// afresh (from now on: the cursor stays, so the old steps are not
// learned again).
func (m *Manager) Reset() error {
	m.Preempt()
	m.jobMu.Lock()
	defer m.jobMu.Unlock()
	m.mu.Lock()
	m.st.Current = ""
	m.st.Learned = 0
	m.st.History = nil
	m.st.From, m.st.FromT = m.st.Cursor, m.st.CursorT
	err := m.saveLocked()
	m.mu.Unlock()
	ents, _ := os.ReadDir(m.cfg.Dir)
	for _, e := range ents {
		if _, ok := versionNumber(e.Name()); ok {
			os.RemoveAll(m.versionDir(e.Name()))
		}
	}
	os.RemoveAll(filepath.Join(m.cfg.Dir, "stacked"))
	os.MkdirAll(filepath.Join(m.cfg.Dir, "stacked"), 0o700)
	m.log.Info("personal adapter reset: serving the shared version alone")
	m.cfg.Changed()
	return err
}

// SetEnabled turns the personal adapter off (false: it stops training and
// the device serves the shared version alone; its versions are kept) or
// back on.
func (m *Manager) SetEnabled(on bool) error {
	if !on {
		m.Preempt()
	}
	m.mu.Lock()
	m.st.Disabled = !on
	err := m.saveLocked()
	m.mu.Unlock()
	m.cfg.Changed()
	if on {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	return err
}

func (m *Manager) saveLocked() error {
	b, err := json.MarshalIndent(m.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(m.cfg.Dir, ".tmp-"+stateFile)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("personal: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(m.cfg.Dir, stateFile)); err != nil {
		return fmt.Errorf("personal: %w", err)
	}
	return nil
}

// Status is what `clawmesh personal status` and the dashboard show.
type Status struct {
	// Mode is the configured mode; Enabled is false after `clawmesh
	// personal off`.
	Mode    Mode `json:"mode"`
	Enabled bool `json:"enabled"`
	// Current is the personal version serving ("" none); Learned the
	// steps it learned from, over all its versions since the last reset.
	Current string `json:"current,omitempty"`
	Learned int    `json:"learned_steps"`
	// Pending is the new scored steps the last look found not learned
	// yet; Training is set while a job runs.
	Pending  int  `json:"pending_steps"`
	Training bool `json:"training"`
	// Score is the latest version's score on the user's held-back turns
	// (-1: none held back yet).
	Score     float64  `json:"score"`
	Versions  []Record `json:"versions"`
	LastError string   `json:"last_error,omitempty"`
}

// Status reports the personal adapter's state.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Status{Mode: m.cfg.Mode, Enabled: m.cfg.Mode != ModeOff && !m.st.Disabled, Current: m.st.Current,
		Learned: m.st.Learned, Pending: m.pending, Training: m.running != nil, Score: -1,
		Versions: slices.Clone(m.st.History), LastError: m.lastErr}
	if s.Versions == nil {
		s.Versions = []Record{}
	}
	if n := len(m.st.History); n > 0 {
		s.Score = m.st.History[n-1].ScoreAfter
	}
	if !s.Enabled {
		s.Current = ""
	}
	return s
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
