package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Faults. Recording must never stop the node serving, and must come back
// by itself. A store whose disk fails (ENOSPC, EIO, a read-only or vanished
// filesystem: Pebble reports it as a fatal commit error, or as a failed
// flush) is marked failed: from then on operations are refused at once
// with ErrPaused instead of reaching a commit pipeline that may never answer
// again. In the background the pool closes the failed instance (waiting a
// bounded time for operations stuck in it) and opens the directory again
// until it works; Pebble recovers every acknowledged write from its WAL.
// The free-space guard (Options.MinFree) pauses writes before the disk is
// full, so that this path is rare. See RATIONALE.md.

// Health is the state of recording.
type Health struct {
	// Recording is false while writes are refused.
	Recording bool `json:"recording"`
	// Paused says why recording is paused ("" while recording).
	Paused string `json:"paused,omitempty"`
	// Since is when recording paused.
	Since time.Time `json:"since,omitzero"`
	// Damaged: the store could not be opened because its files are damaged;
	// `clawmesh pool repair` salvages them.
	Damaged bool `json:"damaged,omitempty"`
	// FreeBytes is the free space on the pool's filesystem when last looked
	// at (the free-space guard looks at most once a second), 0 if unknown.
	FreeBytes int64 `json:"free_bytes,omitempty"`
	// MinFree is the free-space guard's low-water mark (0: no guard).
	MinFree int64 `json:"min_free,omitempty"`
}

// healthState is the pool's side of Health; guarded by Pool.mu.
type healthState struct {
	cause     error // why the store is not open (nil while one is)
	since     time.Time
	lowSpace  bool // the free-space guard holds writes back
	reopening bool
	free      int64
	checked   time.Time
	// damaged is the key range of a table found damaged: a reopened store
	// records again only once that range reads (after a repair).
	damaged *[2][]byte
}

// errNoSpace is the cause the disk-full callback reports.
var errNoSpace = fmt.Errorf("no space left on device: %w", syscall.ENOSPC)

// Health reports whether the pool records, and if not, why.
func (p *Pool) Health() Health {
	p.checkSpace()
	p.mu.Lock()
	defer p.mu.Unlock()
	h := Health{Recording: !p.closed && p.cur != nil && !p.health.lowSpace, FreeBytes: p.health.free, MinFree: p.opts.MinFree}
	if !h.Recording {
		h.Paused = p.pauseCause()
		h.Since = p.health.since
		h.Damaged = errors.Is(p.health.cause, ErrDamaged)
	}
	return h
}

// pauseCause says why writes are refused. The caller holds mu.
func (p *Pool) pauseCause() string {
	switch {
	case p.closed:
		return "the pool is closed"
	case p.health.cause != nil:
		return cause(p.health.cause)
	case p.health.lowSpace:
		return fmt.Sprintf("low disk space: %s free, under the %s kept free (--min-free)", sizeString(p.health.free), sizeString(p.opts.MinFree))
	}
	return ""
}

// pausedErr is the error an operation refused now returns. The caller
// holds mu.
func (p *Pool) pausedErr() error {
	if errors.Is(p.health.cause, ErrDamaged) {
		return fmt.Errorf("%w: %w", ErrPaused, p.health.cause)
	}
	return fmt.Errorf("%w: %s", ErrPaused, p.pauseCause())
}

// pause records that the store is not open, for cause. The caller holds mu.
func (p *Pool) pause(cause error) {
	if p.health.cause == nil && !p.health.lowSpace {
		p.health.since = p.now()
	}
	p.health.cause = cause
}

// cause is the short form of a store error a person reads: the system's
// words for a disk error, else the error.
func cause(err error) string {
	var errno syscall.Errno
	switch {
	case errors.Is(err, ErrDamaged):
		return err.Error()
	case errors.As(err, &errno):
		return errno.Error()
	}
	return err.Error()
}

// diskError reports whether err, from a Pebble background job, means the
// disk is failing rather than a passing condition.
func diskError(err error) bool {
	for _, e := range []syscall.Errno{syscall.ENOSPC, syscall.EIO, syscall.EROFS, syscall.ENOENT, syscall.EDQUOT, syscall.ENXIO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return vfs.IsNoSpaceError(err)
}

// failed marks in failed with cause err, if it is the pool's open instance,
// and starts reopening the store in the background.
func (p *Pool) failed(in *instance, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != in || p.closed {
		return
	}
	p.cur = nil
	p.pause(err)
	p.log.Error("recording paused: the store failed; reopening it in the background", "cause", cause(err))
	p.startReopen(in)
}

// corrupt marks in failed because one of its tables is damaged: reads
// of that key range fail, and recording stays paused until the range reads
// again (after `clawmesh pool repair`), so that the damaged files are kept
// as they are for the repair.
func (p *Pool) corrupt(in *instance, info pebble.DataCorruptionInfo) {
	p.mu.Lock()
	if p.cur == in && !p.closed {
		upper := info.Bounds.End.Key
		if upper != nil {
			upper = append(bytes.Clone(upper), 0) // inclusive or not, past it
		}
		p.health.damaged = &[2][]byte{bytes.Clone(info.Bounds.Start), upper}
	}
	p.mu.Unlock()
	p.failed(in, fmt.Errorf("%w: %s: the table %s is damaged; %s", ErrDamaged, p.dir, filepath.Base(info.Path), repairHint))
}

// readable reports whether the key range of a table found damaged reads
// whole on in.
func (in *instance) readable(r [2][]byte) error {
	return scan(context.Background(), in.db, r[0], r[1], func(k, v []byte) error { return nil })
}

// startReopen starts the background reopening, closing old first (nil if
// none is open). The caller holds mu.
func (p *Pool) startReopen(old *instance) {
	if p.health.reopening {
		return
	}
	p.health.reopening = true
	p.bg.Add(1)
	go p.reopen(old)
}

// reopen closes old, then opens the store until it opens, the pool is
// closed, or the old store cannot be closed (then recording stays paused
// until the process restarts: two instances must never share a directory).
func (p *Pool) reopen(old *instance) {
	defer p.bg.Done()
	defer func() {
		p.mu.Lock()
		p.health.reopening = false
		p.mu.Unlock()
	}()
	if old != nil {
		// Operations stuck in the failed store (a commit that will never
		// be answered) are given a while, then left behind.
		waitTimeout(old.ops.Wait, closeWait)
		closed := make(chan error, 1)
		go func() { closed <- closeDB(old.db) }()
		select {
		case err := <-closed:
			if err != nil {
				p.log.Debug("closing the failed store", "err", err)
			}
		case <-time.After(closeWait):
			p.mu.Lock()
			p.pause(fmt.Errorf("%s; the store does not close: restart the node to record again", cause(p.health.cause)))
			p.mu.Unlock()
			p.log.Error("the failed store does not close; recording stays paused until the node restarts")
			return
		case <-p.stop:
			return
		}
	}
	wait := p.opts.ReopenInterval
	for attempt := 1; ; attempt++ {
		select {
		case <-p.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
		if p.LowSpace() {
			continue // reopening needs room: it flushes what the WAL holds
		}
		// Only this goroutine opens while the pool is open (and Close
		// waits for it), so p.lock is its own here; mu is not held, as
		// Pebble's fatal and disk-full hooks take it.
		in, err := p.openInstance()
		p.mu.Lock()
		if errors.Is(err, errWedged) {
			p.pause(err)
			p.mu.Unlock()
			p.log.Error("the store failed while it was being reopened; recording stays paused until the node restarts", "err", err)
			return
		}
		if err != nil {
			if !errors.Is(err, ErrLocked) {
				p.pause(err)
			}
			p.mu.Unlock()
			if attempt == 1 || attempt%10 == 0 {
				p.log.Warn("the store does not open yet; recording stays paused", "attempt", attempt, "err", err)
			}
			continue
		}
		if p.closed {
			p.mu.Unlock()
			_ = closeDB(in.db)
			return
		}
		if r := p.health.damaged; r != nil {
			p.mu.Unlock()
			if err := in.readable(*r); err != nil {
				// Closed, and the directory let go, so that the repair
				// can take it while the node serves.
				_ = closeDB(in.db)
				p.mu.Lock()
				if p.lock != nil {
					_ = p.lock.Close()
					p.lock = nil
				}
				p.mu.Unlock()
				if attempt == 1 || attempt%10 == 0 {
					p.log.Warn("a table is still damaged; recording stays paused until 'clawmesh pool repair'", "attempt", attempt)
				}
				continue
			}
			p.mu.Lock()
			p.health.damaged = nil
		}
		p.cur = in
		p.health.cause = nil
		p.mu.Unlock()
		p.log.Info("recording resumed: the store is open again", "attempts", attempt)
		return
	}
}

// checkSpace looks at the free space of the pool's filesystem (at most once
// a second) and moves the free-space guard: writes pause below MinFree and
// resume above MinFree and a quarter.
func (p *Pool) checkSpace() {
	if p.opts.MinFree == 0 {
		return
	}
	now := p.now()
	p.mu.Lock()
	if now.Sub(p.health.checked) < time.Second && !p.health.checked.IsZero() {
		p.mu.Unlock()
		return
	}
	p.health.checked = now
	p.mu.Unlock()
	du, err := p.fs.GetDiskUsage(p.dir)
	if err != nil {
		return
	}
	free := int64(min(du.AvailBytes, 1<<62))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.health.free = free
	switch {
	case !p.health.lowSpace && free < p.opts.MinFree:
		if p.health.cause == nil {
			p.health.since = now
		}
		p.health.lowSpace = true
		p.log.Warn("recording paused: low disk space", "free", sizeString(free), "min_free", sizeString(p.opts.MinFree))
	case p.health.lowSpace && free > p.opts.MinFree+p.opts.MinFree/4:
		p.health.lowSpace = false
		p.log.Info("recording resumed: disk space is back", "free", sizeString(free))
	}
}

// LowSpace reports whether the free-space guard holds writes back.
func (p *Pool) LowSpace() bool {
	p.checkSpace()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.health.lowSpace
}

// fatalPanic is what pebbleLogger.Fatalf panics with.
type fatalPanic struct{ err error }

// commit commits b. A fatal commit error (Pebble's WAL cannot be written)
// panics in Pebble's logger, after the instance was marked failed; commit
// turns it into an error wrapping ErrPaused.
func (in *instance) commit(b *pebble.Batch, opts *pebble.WriteOptions) (err error) {
	defer in.recoverFatal(&err)
	return b.Commit(opts)
}

// logSync syncs the WAL (writes made with NoSync before it are then
// durable), recovering a fatal error as commit does.
func (in *instance) logSync() (err error) {
	defer in.recoverFatal(&err)
	return in.db.LogData(nil, pebble.Sync)
}

// recoverFatal turns a fatal error, or a panic Pebble's commit path raises
// on a WAL write it could not make, into an error wrapping ErrPaused, and
// marks the instance failed. Pebble's commit pipeline may be left locked:
// the instance is never used again (see reopen).
func (in *instance) recoverFatal(err *error) {
	r := recover()
	if r == nil {
		return
	}
	var cerr error
	switch v := r.(type) {
	case fatalPanic:
		cerr = v.err
	case error:
		if !diskError(v) {
			panic(r)
		}
		cerr = v
		if in.fail != nil {
			in.fail(v)
		}
	default:
		panic(r)
	}
	*err = fmt.Errorf("%w: the store failed: %s", ErrPaused, cause(cerr))
}

// onPoolCall reports whether the calling goroutine is in one of the pool's
// own commits into Pebble, which recover a fatal error. Pebble also reports
// fatal errors from its background jobs (a manifest it cannot write after a
// flush) and from inside Open, where a panic would end the process or
// leave Pebble half torn down (its deferred clean-up then frees what its
// background jobs still use): there the goroutine is parked instead, the
// instance is marked failed, and the node goes on serving (see
// pebbleLogger, openPebble).
func onPoolCall() bool {
	buf := make([]byte, 64<<10)
	buf = buf[:runtime.Stack(buf, false)]
	return bytes.Contains(buf, []byte("pool.(*instance).commit")) || bytes.Contains(buf, []byte("pool.(*instance).logSync"))
}

// errWedged: Pebble failed fatally while opening the store. Its Open never
// returns and its jobs may still use the directory, so no other instance is
// opened there until the process restarts.
var errWedged = errors.New("the store failed while it was being opened; restart the node to record again")

// openPebble opens Pebble on the pool's directory for in. A fatal error
// inside Open parks Open's goroutine (see pebbleLogger); openPebble then
// returns an error wrapping errWedged.
func (p *Pool) openPebble(in *instance, opts *pebble.Options) (*pebble.DB, error) {
	type result struct {
		db  *pebble.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		db, err := pebble.Open(p.dir, opts)
		done <- result{db, err}
	}()
	select {
	case r := <-done:
		return r.db, r.err
	case err := <-in.openFatal:
		return nil, fmt.Errorf("%w: %s", errWedged, cause(err))
	}
}

// closeDB closes db, turning a panic (a store already broken) into an
// error.
func closeDB(db *pebble.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("closing the store: %v", r)
		}
	}()
	return db.Close()
}

// waitTimeout runs wait and reports whether it returned within d.
func waitTimeout(wait func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// sizeString writes a byte count the way --min-free reads it.
func sizeString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
