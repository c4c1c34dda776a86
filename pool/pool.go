// Package pool is clawmesh's DataPool: it owns the recorded steps of one
// device, stored in Pebble under the node's data directory. It keeps each
// step's life cycle (open → closed → scored → batched → shipped, or dropped
// by retention; states only move forward, see Transition), the outbox
// batches that take scored steps to batched and then shipped (Batch,
// MarkShipped), the indices by state, session and time, the deduplicated
// message and tools blobs that steps of a conversation share, retention, and
// the JSONL export and import of steps (schema core.SchemaVersion, see
// docs/step-schema.md).
//
// Durability: Put, Update, Apply and Import return only after a synced write,
// so a reply the agent received is never lost, even if the process is
// killed (ApplyUnsynced, for what can be made again, does not wait).
// Concurrent synced writes are group-committed: the writes that arrive
// while two commits are waiting on the disk are applied together as one
// batch and committed with one sync when one of them is done, and each
// writer returns once a sync covers its write (see groupCommit); writes to
// the same step are serialized. A writer with several writes for one event (a step and its
// parent's next state) makes them one commit, one fsync, with Apply.
//
// Deduplication: every message (request, reply and next state) and every
// tools list is stored once under the sha256 of its canonical JSON; a step
// record holds only the hashes. Blobs no step references any more are swept
// by ApplyRetention.
//
// Faults: a store whose disk fails (full, an I/O error, read-only) pauses
// recording (writes fail at once with ErrPaused, Health says why) and is
// closed and opened again in the background until it works, recovering
// every acknowledged write from its WAL; the free-space guard
// (Options.MinFree) pauses writes before the disk is full. OpenServing
// starts a pool that cannot be opened (damaged, see Repair) paused instead
// of failing. See health.go.
package pool

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/pebblelock"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrClosed: the pool has been closed.
	ErrClosed = errors.New("pool: closed")
	// ErrNotFound: no such step (also returned, wrapped, for a step that
	// retention dropped).
	ErrNotFound = errors.New("pool: step not found")
	// ErrLocked: the directory is held by another process (a running
	// node). Callers fall back to asking the node over HTTP.
	ErrLocked = errors.New("pool: directory locked by another process")
	// ErrInvalid: a step that cannot be stored (fails core.Step.Validate,
	// or is otherwise unusable).
	ErrInvalid = errors.New("pool: invalid step")
	// ErrTransition: a write would move a stored step's state backwards
	// (see Transition).
	ErrTransition = errors.New("pool: bad transition")
	// ErrNoBatch: no outbox batch has that id.
	ErrNoBatch = errors.New("pool: batch not found")
	// ErrPaused: recording is paused: the store failed (a full or failing
	// disk) and is being reopened, could not be opened, or the free-space
	// guard holds writes back. Health says why.
	ErrPaused = errors.New("pool: recording paused")
	// ErrDamaged: Pebble cannot open the pool's files (a damaged WAL
	// segment or table); Repair salvages what can be read.
	ErrDamaged = errors.New("pool: damaged")
)

// Options configure a Pool. The zero value means defaults.
type Options struct {
	// Logger receives the pool's and Pebble's logs. Nil discards them.
	Logger *slog.Logger
	// Now is the clock, used for step times that were left zero and for
	// retention by age. Default time.Now.
	Now func() time.Time
	// MaxAge is the retention by age: ApplyRetention drops steps whose time
	// (Timings.Start) is older than this. 0 keeps steps forever.
	MaxAge time.Duration
	// MaxBytes is the retention by size: beyond this many bytes of step data
	// (step records plus the blobs they reference, as Stats.Bytes counts
	// them), ApplyRetention drops the oldest steps first, shipped ones before
	// all others. 0 means no limit.
	MaxBytes int64
	// TombstoneAge is how long a dropped step's tombstone is kept, counted
	// from the step's time: while it is there a late update of the step
	// (the next state of a dropped reply) is refused instead of bringing
	// the step back; then ApplyRetention purges it. 0 means
	// DefaultTombstoneAge; negative keeps tombstones forever.
	TombstoneAge time.Duration
	// MinFree is the free-space guard's low-water mark, in bytes free on the
	// filesystem of the pool's directory: below it, writes are refused with
	// ErrPaused (recording pauses before the disk is full) and
	// ApplyRetention also drops shipped steps and every tombstone to make
	// room; writes resume once the free space is above the high-water mark,
	// MinFree and a quarter. 0 means no guard.
	MinFree int64
	// ReopenInterval is the first wait between attempts to reopen a store
	// that failed (a full or failing disk) or could not be opened; the wait
	// doubles up to 10s. Default 1s.
	ReopenInterval time.Duration
	// FS is the filesystem Pebble runs on. Nil means the disk. vfs.NewMem()
	// is for unit tests only.
	FS vfs.FS
}

func (o *Options) validate() error {
	if o.MaxAge < 0 {
		return fmt.Errorf("pool: MaxAge %v is negative", o.MaxAge)
	}
	if o.MaxBytes < 0 {
		return fmt.Errorf("pool: MaxBytes %d is negative", o.MaxBytes)
	}
	if o.MinFree < 0 {
		return fmt.Errorf("pool: MinFree %d is negative", o.MinFree)
	}
	if o.ReopenInterval < 0 {
		return fmt.Errorf("pool: ReopenInterval %v is negative", o.ReopenInterval)
	}
	return nil
}

// DefaultTombstoneAge is Options.TombstoneAge's default: no session is
// still being continued a month after its step.
const DefaultTombstoneAge = 30 * 24 * time.Hour

// stripes is the number of per-step write locks; writes to steps whose ids
// fall on different stripes commit concurrently.
const stripes = 4096

// Pool is an open DataPool. It is safe for concurrent use.
type Pool struct {
	dir  string
	fs   vfs.FS // opts.FS, or the disk
	opts Options
	log  *slog.Logger
	now  func() time.Time

	// mu guards lock, cur, closed and the health fields; see health.go.
	mu     sync.Mutex
	lock   *pebble.Lock
	cur    *instance // nil while no store is open
	closed bool
	health healthState
	// stop ends the background reopening; bg waits for it.
	stop chan struct{}
	bg   sync.WaitGroup

	seed maphash.Seed

	// cache holds decoded blobs for reads.
	cache *decodedCache

	// known remembers the content addresses of blobs known to be stored, so
	// that writes skip encoding, hashing and looking up what every call of
	// a conversation resends; see knownBlobs.
	known *knownBlobs

	// errLimit bounds Pebble's error lines in the log.
	errLimit *logLimit

	// retention serializes ApplyRetention runs.
	retention sync.Mutex

	// outbox serializes the outbox's batch writers.
	outbox sync.Mutex

	// testHookSwept, if set, runs between the sweep's scan and its deletes.
	testHookSwept func()
}

// instance is one open Pebble database on the pool's directory, with the
// locks of the writes made to it. A store that fails is replaced by a new
// instance (see health.go); writes stuck in the old one keep its locks and
// never hold up the new one.
type instance struct {
	db      *pebble.DB
	stripes [stripes]sync.Mutex
	// gc coordinates blob writes with the blob sweep; see sweep.go.
	gc gcState
	// group commits concurrent synced writes together; see groupCommit.
	group groupCommit
	// ops counts the operations running on this instance.
	ops sync.WaitGroup
	// openFatal receives a fatal error Pebble reports while opening.
	openFatal chan error
	// fail marks the instance failed.
	fail func(error)
}

// Open opens (creating if needed) the pool in dir. If another process holds
// dir, Open fails at once with an error wrapping ErrLocked; a pool Pebble
// cannot open (damaged, see Repair) fails with an error wrapping ErrDamaged.
func Open(dir string, opts Options) (*Pool, error) {
	p, err := newPool(dir, opts)
	if err != nil {
		return nil, err
	}
	if err := p.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pool: open %s: %w", dir, err)
	}
	in, err := p.openInstance()
	if err != nil {
		return nil, err
	}
	p.cur = in
	p.log.Debug("opened", "dir", dir)
	return p, nil
}

// OpenServing opens the pool as Open does, for a process that must go on
// serving whatever state the pool is in (the node): a pool that cannot be
// opened (damaged, or on a full or failing disk) is not an error. The Pool
// returned then has recording paused, Health says why, and it tries to open
// the store again in the background (after `clawmesh pool repair`, once
// the disk has room) until it can. Only a bad Options and a directory held
// by another process (ErrLocked) are errors.
func OpenServing(dir string, opts Options) (*Pool, error) {
	p, openErr := Open(dir, opts)
	if openErr == nil || errors.Is(openErr, ErrLocked) {
		return p, openErr
	}
	p, err := newPool(dir, opts)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pause(openErr)
	if errors.Is(openErr, errWedged) {
		p.log.Error("the pool cannot be opened; the node serves without recording until it restarts", "dir", dir, "err", openErr)
		return p, nil
	}
	p.log.Error("the pool cannot be opened; the node serves without recording and keeps trying", "dir", dir, "err", openErr)
	p.startReopen(nil)
	return p, nil
}

// newPool makes a Pool with no store open.
func newPool(dir string, opts Options) (*Pool, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.TombstoneAge == 0 {
		opts.TombstoneAge = DefaultTombstoneAge
	}
	if opts.ReopenInterval == 0 {
		opts.ReopenInterval = time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "pool")
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	return &Pool{dir: dir, fs: fs, opts: opts, log: log, now: now, stop: make(chan struct{}), seed: maphash.MakeSeed(),
		cache: newDecodedCache(decodedCacheBytes), known: newKnownBlobs(knownBlobsMax), errLimit: &logLimit{now: now}}, nil
}

// openInstance opens Pebble on the pool's directory, taking the directory
// lock first if the pool does not hold it. The caller holds mu, or owns p
// alone.
func (p *Pool) openInstance() (in *instance, err error) {
	if p.lock == nil {
		// Take Pebble's directory lock ourselves so a held lock is
		// recognised and reported as ErrLocked (the lock is a non-blocking
		// fcntl lock: this never waits).
		lock, err := pebble.LockDirectory(p.dir, p.fs)
		if err != nil {
			if pebblelock.Held(err) {
				return nil, fmt.Errorf("%w: %s: %v", ErrLocked, p.dir, err)
			}
			return nil, fmt.Errorf("pool: lock %s: %w", p.dir, err)
		}
		p.lock = lock
	}
	defer func() {
		// A wedged Open keeps the lock: its jobs may still use the
		// directory.
		if err != nil && !errors.Is(err, errWedged) {
			_ = p.lock.Close()
			p.lock = nil
		}
	}()
	in = &instance{openFatal: make(chan error, 1)}
	in.fail = func(err error) { p.failed(in, err) }
	// The disk-full callback and the fatal-error hooks name the instance
	// they belong to: a late report from a replaced one changes nothing.
	popts := &pebble.Options{
		// WAL chunks carry sync offsets from this format on, so that a
		// damaged record in the newest log is told from a torn tail (see
		// RATIONALE.md); an older pool is upgraded as it opens.
		FormatMajorVersion: walFormat,
		FS:                 vfs.OnDiskFull(p.fs, func() { p.failed(in, errNoSpace) }),
		Lock:               p.lock,
		Logger: pebbleLogger{log: p.log, limit: p.errLimit, fatal: func(err error) {
			select { // a fatal error inside Open: see openPebble
			case in.openFatal <- err:
			default:
			}
			p.failed(in, err)
		}},
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				if diskError(err) {
					p.failed(in, err)
				}
			},
			// A block of a table that does not check out, met by a read
			// or a compaction (without this, Pebble reports it as fatal).
			DataCorruption: func(info pebble.DataCorruptionInfo) { p.corrupt(in, info) },
		},
	}
	// A step is read back by its key to be changed (a closure, a verdict)
	// seconds after it was written, while the calls' writes keep L0 busy:
	// bloom filters let such a read skip the tables without the key, and
	// a block cache larger than Pebble's 8 MiB default keeps their index
	// blocks. Both are within the node's stated memory bound (see
	// cmd/clawmesh's --memory-limit).
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	cache := pebble.NewCache(blockCacheBytes)
	defer cache.Unref() // the store holds its own reference
	popts.Cache = cache
	// Pebble reports some failures while opening as fatal (a manifest it
	// cannot write): see openPebble.
	db, err := p.openPebble(in, popts)
	if errors.Is(err, errWedged) {
		return nil, fmt.Errorf("pool: open %s: %w", p.dir, err)
	}
	if err != nil {
		if pebble.IsCorruptionError(err) || strings.Contains(err.Error(), "error when replaying WAL") {
			what := "its files are damaged"
			switch bad := damagedWALs(p.fs, p.dir); len(bad) {
			case 0:
			case 1:
				what = "the write-ahead log segment " + bad[0] + " is damaged"
			default:
				what = "the write-ahead log segments " + strings.Join(bad, ", ") + " are damaged"
			}
			return nil, fmt.Errorf("%w: %s: %s (%v); %s", ErrDamaged, p.dir, what, err, repairHint)
		}
		return nil, fmt.Errorf("pool: open %s: %w", p.dir, err)
	}
	in.db = db
	return in, nil
}

// repairHint says what to do about a damaged pool.
const repairHint = "'clawmesh pool repair' moves it aside (never deleting it) and salvages every step it can read into a fresh pool"

// blockCacheBytes is the Pebble block cache of a pool.
const blockCacheBytes = 32 << 20

// Close flushes nothing (every write is already synced) and releases the
// directory. Operations in progress finish first, for as long as
// closeWait; a store wedged beyond that (a disk that stopped answering) is
// left to the operating system, which loses nothing synced.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	close(p.stop)
	in := p.cur
	p.cur = nil
	p.mu.Unlock()
	if !waitTimeout(p.bg.Wait, closeWait) {
		return fmt.Errorf("pool: close: the store is still being reopened; left to the operating system")
	}
	var err error
	if in != nil {
		if !waitTimeout(in.ops.Wait, closeWait) {
			return fmt.Errorf("pool: close: operations still running after %v; the store is left to the operating system", closeWait)
		}
		err = closeDB(in.db)
	}
	p.mu.Lock()
	if p.lock != nil {
		if lerr := p.lock.Close(); err == nil {
			err = lerr
		}
		p.lock = nil
	}
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("pool: close: %w", err)
	}
	return nil
}

// walFormat is the Pebble format the pool writes.
const walFormat = pebble.FormatWALSyncChunks

// closeWait bounds how long Close and a reopen wait for operations running
// on a store that is closing.
const closeWait = 10 * time.Second

// enter starts an operation on the open store; the returned function ends
// it. With no store open (it failed and is being reopened, or could not be
// opened) it returns an error wrapping ErrPaused.
func (p *Pool) enter(ctx context.Context) (*instance, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, ErrClosed
	}
	if p.cur == nil {
		return nil, nil, p.pausedErr()
	}
	in := p.cur
	in.ops.Add(1)
	return in, in.ops.Done, nil
}

// enterWrite is enter for an operation that records something: it is also
// refused, with ErrPaused, while the free-space guard holds writes back.
func (p *Pool) enterWrite(ctx context.Context) (*instance, func(), error) {
	p.checkSpace()
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	low := p.health.lowSpace
	err = p.pausedErr()
	p.mu.Unlock()
	if low {
		done()
		return nil, nil, err
	}
	return in, done, nil
}

func (p *Pool) stripeIndex(id core.StepID) uint64 {
	return maphash.String(p.seed, string(id)) % stripes
}

func (p *Pool) stripe(in *instance, id core.StepID) *sync.Mutex {
	return &in.stripes[p.stripeIndex(id)]
}

// Put inserts s, or replaces the step with the same id. It returns once the
// write is synced. Put fills in, in s itself, what was left zero: State
// becomes open and Timings.Start becomes Now(). A step in state dropped
// cannot be put.
func (p *Pool) Put(ctx context.Context, s *core.Step) error {
	return p.Apply(ctx, []*core.Step{s}, nil)
}

// prepare fills in what a step to put may leave out (its state is open,
// its time now) and checks that it can be stored.
func (p *Pool) prepare(s *core.Step) error {
	if s.State == core.StateUnknown {
		s.State = core.StateOpen
	}
	if s.Timings.Start.IsZero() {
		s.Timings.Start = p.now()
	}
	return checkStorable(s)
}

func checkStorable(s *core.Step) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if s.State == core.StateDropped {
		return fmt.Errorf("%w: step %s: state dropped is set by retention only", ErrInvalid, s.ID)
	}
	return nil
}

// oldHeader reads the header of the record now stored for id, if any.
func (p *Pool) oldHeader(in *instance, id core.StepID) (header, bool, error) {
	rec, err := getCopy(in.db, stepKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return header{}, false, nil
	}
	if err != nil {
		return header{}, false, err
	}
	h, _, err := decodeHeader(rec)
	if err != nil {
		return header{}, false, fmt.Errorf("step %s: %w", id, err)
	}
	return h, true, nil
}

// Transition reports whether a stored step in state from may be written
// back in state to. States move forward (open → closed → scored → batched →
// shipped, steps skipped or not) and stay; the one way back is scored →
// closed, which sends a step to be scored again (explicit feedback after
// scoring). Held is a dead end beside batched: only a scored step enters
// it, and it stays. Failed is a dead end beside closed: only an open step
// enters it, and it stays. Nothing leaves dropped, and only retention drops.
func Transition(from, to core.State) bool {
	switch {
	case from == core.StateDropped || to == core.StateDropped:
		return false
	case from == core.StateFailed || to == core.StateFailed:
		return to == core.StateFailed && (from == core.StateOpen || from == core.StateFailed)
	case from == core.StateHeld || to == core.StateHeld:
		return to == core.StateHeld && (from == core.StateScored || from == core.StateHeld)
	case to >= from:
		return true
	default:
		return from == core.StateScored && to == core.StateClosed
	}
}

// writeLocked stores steps in one batch committed with opts, replacing any
// records for their ids and moving their index entries. The caller holds the
// write locks of every id, and the ids are distinct. A step already stored
// may only move as Transition allows.
func (p *Pool) writeLocked(in *instance, steps []*core.Step, opts *pebble.WriteOptions) error {
	return p.writeWith(in, steps, nil, opts)
}

// writeWith is writeLocked that also sets the key-value pairs in extra
// (other records that must change with the steps) in the same batch.
func (p *Pool) writeWith(in *instance, steps []*core.Step, extra [][2][]byte, opts *pebble.WriteOptions) error {
	return p.writeKnown(in, steps, nil, extra, opts)
}

// writeKnown is writeWith where olds[i], if olds is not nil and olds[i]
// is not, is the header stored now for steps[i], read under its write
// lock (so that it is not read again).
func (p *Pool) writeKnown(in *instance, steps []*core.Step, olds []*header, extra [][2][]byte, opts *pebble.WriteOptions) error {
	b := in.db.NewBatch()
	defer b.Close()
	for _, kv := range extra {
		if err := b.Set(kv[0], kv[1], nil); err != nil {
			return fmt.Errorf("pool: put: %w", err)
		}
	}
	// Blobs: write only those not yet stored. The sweep must not delete a
	// blob between our check and our commit; see gcState. The known set
	// is consulted under the same lock, as the sweep clears it.
	in.gc.enterWrite()
	defer in.gc.exitWrite()
	var refs []blob
	for i, s := range steps {
		enc, err := p.encodeStep(s)
		if err != nil {
			return err
		}
		var old header
		exists := false
		if olds != nil && olds[i] != nil {
			old, exists = *olds[i], true
		} else if old, exists, err = p.oldHeader(in, s.ID); err != nil {
			return fmt.Errorf("pool: put: %w", err)
		}
		if exists {
			if !Transition(old.state, s.State) {
				return fmt.Errorf("%w: step %s from %s to %s", ErrTransition, s.ID, old.state, s.State)
			}
			deleteIndex(b, s.ID, old)
		}
		setIndex(b, s.ID, enc.hdr)
		if err := b.Set(stepKey(s.ID), enc.record, nil); err != nil {
			return fmt.Errorf("pool: put: %w", err)
		}
		for _, bl := range enc.blobs {
			in.gc.touch(&bl)
			if bl.data == nil { // known to be stored
				continue
			}
			// Not known to be stored: written without looking first. A
			// blob never changes under its hash, so writing one that is
			// stored already costs a few bytes that compaction drops, once
			// per blob (it is known from then on); looking would cost
			// every new blob of every step a read.
			if err := b.Set(bl.key(), bl.data, nil); err != nil {
				return fmt.Errorf("pool: put: %w", err)
			}
		}
		if len(steps) == 1 {
			refs = enc.blobs
		} else {
			refs = append(refs, enc.blobs...)
		}
	}
	commit := in.commit
	if opts == pebble.Sync {
		commit = func(b *pebble.Batch, _ *pebble.WriteOptions) error { return in.commitSync(b) }
	}
	if err := commit(b, opts); err != nil {
		return fmt.Errorf("pool: put: %w", err)
	}
	p.known.add(refs)
	return nil
}

// setIndex adds the index entries for a record with header h.
func setIndex(b *pebble.Batch, id core.StepID, h header) {
	_ = b.Set(stateKey(h.state, h.t, id), nil, nil)
	if h.state == core.StateDropped {
		return // tombstones are only in the state index
	}
	_ = b.Set(sessionKey(h.session, h.t, id), nil, nil)
	_ = b.Set(timeKey(h.t, id), nil, nil)
}

// deleteIndex removes the index entries setIndex added for h.
func deleteIndex(b *pebble.Batch, id core.StepID, h header) {
	_ = b.Delete(stateKey(h.state, h.t, id), nil)
	if h.state == core.StateDropped {
		return
	}
	_ = b.Delete(sessionKey(h.session, h.t, id), nil)
	_ = b.Delete(timeKey(h.t, id), nil)
}

// Get returns the full step with the given id. For a step retention dropped
// it returns an error wrapping ErrNotFound.
func (p *Pool) Get(ctx context.Context, id core.StepID) (*core.Step, error) {
	in, done, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return p.get(in.db, id)
}

func (p *Pool) get(r getter, id core.StepID) (*core.Step, error) {
	s, _, err := p.getHeader(r, id)
	return s, err
}

// getHeader is get that also returns the header of the step's record.
func (p *Pool) getHeader(r getter, id core.StepID) (*core.Step, *header, error) {
	rec, err := getCopy(r, stepKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("pool: get %s: %w", id, err)
	}
	d, err := decodeRecord(rec)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: get %s: %w", id, err)
	}
	if d.state == core.StateDropped {
		return nil, nil, fmt.Errorf("%w: %s was dropped by retention", ErrNotFound, id)
	}
	s, err := d.materialize(r, p.cache)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: get %s: %w", id, err)
	}
	h := d.header
	return s, &h, nil
}

// Update applies fn to the stored step with the given id and writes the
// result back, synced. Updates (and Puts) of the same step are serialized;
// the indices follow changes of State, session and time. fn must not change
// the id, must not move the state backwards (see Transition: ErrTransition),
// and must not call back into the pool (the step's write lock is held); if
// fn returns an error nothing is written and Update returns it.
func (p *Pool) Update(ctx context.Context, id core.StepID, fn func(*core.Step) error) error {
	return p.Apply(ctx, nil, []Change{{ID: id, Fn: fn}})
}

// Change is an update of one stored step, for Apply: Fn is applied to the
// step as stored, as Update's fn is.
type Change struct {
	ID core.StepID
	Fn func(*core.Step) error
}

// Apply writes puts (each as Put would) and changes (each as Update would)
// in one synced commit: when it returns nil all of them are on disk; when it
// returns an error, none was written. A step may appear only once in a
// call. Like Put, Apply fills in the zero State and Timings.Start of puts in
// the steps themselves.
//
// One commit costs one fsync where the same writes made one by one cost one
// each (the gateway stores a step and its parent's next state together).
func (p *Pool) Apply(ctx context.Context, puts []*core.Step, changes []Change) error {
	return p.apply(ctx, puts, changes, pebble.Sync)
}

// ApplyUnsynced is Apply without waiting for the disk: the writes are in
// the WAL when it returns and on disk with the next synced write (any
// Put, Update or Apply) or a clean close, but a crash before that loses
// them. It is for what can be made again (the scorer's verdicts: a step
// whose scoring is lost is closed again and scored again), so that such
// writes neither wait for an fsync nor hold their steps' write locks while
// one runs.
func (p *Pool) ApplyUnsynced(ctx context.Context, changes []Change) error {
	return p.apply(ctx, nil, changes, pebble.NoSync)
}

func (p *Pool) apply(ctx context.Context, puts []*core.Step, changes []Change, sync *pebble.WriteOptions) error {
	in, done, err := p.enterWrite(ctx)
	if err != nil {
		return err
	}
	defer done()
	ids := make([]core.StepID, 0, len(puts)+len(changes))
	for _, s := range puts {
		if err := p.prepare(s); err != nil {
			return err
		}
		ids = append(ids, s.ID)
	}
	for _, c := range changes {
		if c.Fn == nil {
			return fmt.Errorf("%w: change of %s has no function", ErrInvalid, c.ID)
		}
		ids = append(ids, c.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	if len(ids) > 1 {
		seen := make(map[core.StepID]bool, len(ids))
		for _, id := range ids {
			if seen[id] {
				return fmt.Errorf("%w: step %s written twice in one Apply", ErrInvalid, id)
			}
			seen[id] = true
		}
	}
	unlock := p.lockSteps(in, ids)
	defer unlock()
	steps := append(make([]*core.Step, 0, len(ids)), puts...)
	// The changed steps' headers as read here, under their write locks,
	// are those the write replaces.
	var olds []*header
	if len(changes) > 0 {
		olds = make([]*header, len(puts), len(ids))
	}
	for _, c := range changes {
		s, h, err := p.getHeader(in.db, c.ID)
		if err != nil {
			return err
		}
		olds = append(olds, h)
		if err := c.Fn(s); err != nil {
			return err
		}
		if s.ID != c.ID {
			return fmt.Errorf("%w: update of %s changed its id to %s", ErrInvalid, c.ID, s.ID)
		}
		if s.Timings.Start.IsZero() {
			s.Timings.Start = p.now()
		}
		if err := checkStorable(s); err != nil {
			return err
		}
		steps = append(steps, s)
	}
	return p.writeKnown(in, steps, olds, nil, sync)
}

// lockSteps takes the write locks of ids, each stripe once and in stripe
// order (so that writers of several steps cannot deadlock), and returns
// what releases them.
func (p *Pool) lockSteps(in *instance, ids []core.StepID) func() {
	if len(ids) == 1 {
		mu := p.stripe(in, ids[0])
		mu.Lock()
		return mu.Unlock
	}
	idx := make([]uint64, len(ids))
	for i, id := range ids {
		idx[i] = p.stripeIndex(id)
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		in.stripes[i].Lock()
	}
	return func() {
		for _, i := range idx {
			in.stripes[i].Unlock()
		}
	}
}

// pebbleLogger routes Pebble's logs to slog. A fatal error (Pebble's
// commit pipeline cannot write its WAL; its manifest cannot be written)
// marks the instance failed, through fatal, before Fatalf panics as Pebble
// expects; the pool recovers that panic where its own calls made it (see
// instance.commit) and reopens the store in the background.
type pebbleLogger struct {
	log   *slog.Logger
	fatal func(error)
	limit *logLimit // nil: every line
}

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "from", "pebble")
}

// Errorf logs Pebble's error lines, at most pebbleErrorsPerMinute a minute
// (a failing disk makes Pebble repeat itself at every retry): the lines
// left out are counted in the next one logged.
func (l pebbleLogger) Errorf(format string, args ...any) {
	dropped, ok := l.limit.allow()
	if !ok {
		return
	}
	if dropped > 0 {
		l.log.Error(fmt.Sprintf(format, args...), "from", "pebble", "left_out", dropped)
		return
	}
	l.log.Error(fmt.Sprintf(format, args...), "from", "pebble")
}

// pebbleErrorsPerMinute bounds Pebble's error lines in the log.
const pebbleErrorsPerMinute = 10

// logLimit lets through at most pebbleErrorsPerMinute lines a minute.
type logLimit struct {
	now     func() time.Time
	mu      sync.Mutex
	start   time.Time // of the current minute
	n       int       // lines let through in it
	dropped int       // lines left out since the last one let through
}

// allow reports whether a line may be logged now, and how many were left
// out before it.
func (l *logLimit) allow() (dropped int, ok bool) {
	if l == nil {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := l.now(); now.Sub(l.start) >= time.Minute {
		l.start, l.n = now, 0
	}
	if l.n >= pebbleErrorsPerMinute {
		l.dropped++
		return 0, false
	}
	l.n++
	dropped, l.dropped = l.dropped, 0
	return dropped, true
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	l.log.Error(err.Error(), "from", "pebble")
	if l.fatal != nil {
		l.fatal(err)
	}
	if !onPoolCall() {
		select {} // a background job of a failed store: parked, see onPoolCall
	}
	panic(fatalPanic{err})
}

var _ io.Closer = (*Pool)(nil)
