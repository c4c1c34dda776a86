package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/internal/core"
)

// RepairReport says what Repair did.
type RepairReport struct {
	// Moved is where the damaged pool now is (never deleted).
	Moved string `json:"moved"`
	// Steps is how many steps the fresh pool holds; Unreadable those
	// whose records or messages could not be read (not carried over).
	Steps      int `json:"steps"`
	Unreadable int `json:"unreadable"`
	// Tables and WALRecords count the key-values read from the tables and
	// the WAL records that checked out; BadWALRecords those that did not.
	Tables        int      `json:"table_keys"`
	WALRecords    int      `json:"wal_records"`
	BadWALRecords int      `json:"bad_wal_records"`
	Problems      []string `json:"problems,omitempty"`
}

// Repair salvages a damaged pool (ErrDamaged): it reads every key-value
// it can from the tables (through Pebble, without the WAL; past a table
// block that does not check out it goes on at the next key that reads) and
// from each WAL record whose checksums check out and that the tables do not
// already hold (past a damaged record it goes on at the next 32 KiB block),
// writes them into a fresh pool, rebuilds the indices from the step
// records, leaves out steps whose messages are missing, then moves the
// damaged directory aside (dir.damaged-<time>) and puts the fresh one in
// its place. Nothing is deleted. The directory must not be held by another
// process (ErrLocked).
func Repair(ctx context.Context, dir string, now time.Time) (RepairReport, error) {
	var rep RepairReport
	lock, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		return rep, fmt.Errorf("%w: %s: %v", ErrLocked, dir, err)
	}
	defer lock.Close()
	kv := map[string][]byte{} // the salvaged state: key → value (nil: deleted)

	// The tables, as the manifest names them, through Pebble opened read
	// only on a copy without the WAL (which is what fails to replay).
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".repair-tables-")
	if err != nil {
		return rep, fmt.Errorf("pool: repair: %w", err)
	}
	defer os.RemoveAll(tmp)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return rep, fmt.Errorf("pool: repair: %w", err)
	}
	var wals []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".log"):
			wals = append(wals, name)
			continue
		case name == "LOCK" || e.IsDir():
			continue
		}
		if err := os.Link(filepath.Join(dir, name), filepath.Join(tmp, name)); err != nil {
			return rep, fmt.Errorf("pool: repair: %w", err)
		}
	}
	var flushed uint64 // the largest sequence number the tables hold
	if db, err := pebble.Open(tmp, &pebble.Options{ReadOnly: true, Logger: quietLogger{},
		EventListener: &pebble.EventListener{DataCorruption: func(pebble.DataCorruptionInfo) {}}}); err != nil {
		rep.Problems = append(rep.Problems, "the tables cannot be read: "+err.Error())
	} else {
		for _, r := range [][2][]byte{{nil, prefixStep}, {prefixStep, nil}} {
			// Two ranges, so that a problem in one leaves the other.
			bad := salvageRange(ctx, db, r[0], r[1], func(k, v []byte) {
				kv[string(k)] = bytes.Clone(v)
				rep.Tables++
			})
			for _, err := range bad {
				msg, _, _ := strings.Cut(err.Error(), "\n") // Pebble's detail lines say nothing more
				if msg = "tables: " + msg; !slices.Contains(rep.Problems, msg) {
					rep.Problems = append(rep.Problems, msg)
				}
			}
		}
		if levels, err := db.SSTables(); err == nil {
			for _, l := range levels {
				for _, t := range l {
					flushed = max(flushed, uint64(t.LargestSeqNum))
				}
			}
		}
		_ = db.Close()
	}

	// The WAL, oldest first, record by record.
	slices.Sort(wals)
	for _, name := range wals {
		if err := readWAL(filepath.Join(dir, name), flushed, kv, &rep); err != nil {
			rep.Problems = append(rep.Problems, name+": "+err.Error())
		}
	}

	// The fresh pool.
	fresh := dir + ".repair-" + now.UTC().Format("20060102T150405")
	db, err := pebble.Open(fresh, &pebble.Options{FormatMajorVersion: walFormat, Logger: quietLogger{}})
	if err != nil {
		return rep, fmt.Errorf("pool: repair: %w", err)
	}
	b := db.NewBatch()
	keys := make([]string, 0, len(kv))
	for k, v := range kv {
		if v != nil && !strings.HasPrefix(k, string(prefixState[:2])) { // indices are rebuilt
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, string(prefixStep)) {
			d, err := decodeRecord(kv[k])
			ok := err == nil
			if ok {
				d.refs(func(ref []byte) {
					if kv[string(ref)] == nil {
						ok = false
					}
				})
			}
			if !ok {
				rep.Unreadable++
				continue
			}
			setIndex(b, core.StepID(k[len(prefixStep):]), d.header)
			if d.state != core.StateDropped {
				rep.Steps++
			}
		}
		_ = b.Set([]byte(k), kv[k], nil)
	}
	err = b.Commit(pebble.Sync)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("pool: repair: writing the fresh pool: %w", err)
	}
	rep.Moved = dir + ".damaged-" + now.UTC().Format("20060102T150405")
	if err := os.Rename(dir, rep.Moved); err != nil {
		return rep, fmt.Errorf("pool: repair: moving the damaged pool aside: %w", err)
	}
	if err := os.Rename(fresh, dir); err != nil {
		return rep, fmt.Errorf("pool: repair: %w (the salvaged pool is in %s)", err, fresh)
	}
	return rep, nil
}

// Verify reads every key-value of the pool, checking each table block it
// reads; a block that does not check out gives an error wrapping
// ErrDamaged (and recording pauses until a repair).
func (p *Pool) Verify(ctx context.Context) error {
	in, done, err := p.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	err = scan(ctx, in.db, nil, nil, func(k, v []byte) error { return nil })
	if err != nil && pebble.IsCorruptionError(err) {
		msg, _, _ := strings.Cut(err.Error(), "\n")
		return fmt.Errorf("%w: %s: %s", ErrDamaged, p.dir, msg)
	}
	return err
}

// readWAL applies to kv every batch of a WAL file whose record checks out
// and that the tables do not already hold (its sequence number is above
// flushed: a log Pebble keeps for reuse still holds batches flushed since),
// skipping damaged records. Pebble writes the WAL in 32 KiB blocks of
// checksummed chunks; after a chunk that does not check out, the reader
// starts again at the next block boundary after the last whole record, so
// only the records that touch the damaged block are lost.
func readWAL(path string, flushed uint64, kv map[string][]byte, rep *RepairReport) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return readWALData(filepath.Base(path), data, flushed, kv, rep)
}

// readWALData is readWAL on the bytes of the log named name.
func readWALData(name string, data []byte, flushed uint64, kv map[string][]byte, rep *RepairReport) error {
	num, err := strconv.ParseUint(strings.TrimSuffix(name, ".log"), 10, 64)
	if err != nil {
		return err
	}
	const block = 32 << 10
	base := 0
	rr := newRecordReader(bytes.NewReader(data), num)
	// damaged: a record did not check out since the last good one. A
	// damaged stretch counts once, and only when a good record follows it:
	// the end of the newest log may be torn by a crash (a write never
	// acknowledged) or hold a reused log's old records, and is not damage.
	damaged := false
	for {
		good := base + int(rr.Offset()) // the end of the last whole record
		r, err := rr.Next()
		var rec []byte
		if err == nil {
			rec, err = io.ReadAll(r)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			damaged = true
			next := (good/block + 1) * block
			if next >= len(data) {
				return nil
			}
			base = next
			rr = newRecordReader(bytes.NewReader(data[base:]), num)
			continue
		}
		if damaged {
			rep.BadWALRecords++
			damaged = false
		}
		if h, ok := batchrepr.ReadHeader(rec); ok && h.SeqNum != 0 && uint64(h.SeqNum) <= flushed {
			continue // in the tables already
		}
		if !applyBatch(rec, kv) {
			rep.BadWALRecords++
			continue
		}
		rep.WALRecords++
	}
}

// damagedWALs names the WAL segments of the pool in dir that hold a
// record that does not check out followed by one that does (damage, not a
// torn tail), oldest first.
func damagedWALs(fs vfs.FS, dir string) []string {
	names, err := fs.List(dir)
	if err != nil {
		return nil
	}
	slices.Sort(names)
	var bad []string
	for _, name := range names {
		if !strings.HasSuffix(name, ".log") {
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			continue
		}
		data, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			bad = append(bad, name)
			continue
		}
		var rep RepairReport
		if err := readWALData(name, data, 0, map[string][]byte{}, &rep); err == nil && rep.BadWALRecords > 0 {
			bad = append(bad, name)
		}
	}
	return bad
}

// salvageRange calls fn for every key-value of db in [lower, upper) it can
// read. Where a table's block does not check out, it finds by bisection
// the first key past the damaged block that reads, and goes on from there;
// it returns the errors it met (one per damaged stretch).
func salvageRange(ctx context.Context, db *pebble.DB, lower, upper []byte, fn func(k, v []byte)) []error {
	var bad []error
	start := lower
	for range 1 << 16 { // each round ends at a damaged stretch
		var last []byte
		err := scan(ctx, db, start, upper, func(k, v []byte) error {
			fn(k, v)
			last = append(last[:0], k...)
			return nil
		})
		if err == nil {
			return bad
		}
		if ctx.Err() != nil {
			return append(bad, err)
		}
		bad = append(bad, err)
		from := start
		if last != nil {
			from = append(last, 0) // the damage lies past the last key read
		}
		next, ok := pastDamage(db, from, upper)
		if !ok || (start != nil && bytes.Compare(next, start) <= 0) {
			return bad
		}
		start = next
	}
	return bad
}

// pastDamage finds the first key after from at which reading [key, upper)
// works again: reading from `from` fails (a damaged block), reading from
// upper reads nothing. Keys are taken as numbers of a fixed length and the
// boundary is bisected, about eight probes a byte.
func pastDamage(db *pebble.DB, from, upper []byte) ([]byte, bool) {
	n := max(len(from), len(upper)) + 1
	num := func(k []byte) *big.Int {
		return new(big.Int).SetBytes(append(bytes.Clone(k), make([]byte, n-len(k))...))
	}
	fails := func(k *big.Int) bool {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: k.FillBytes(make([]byte, n)), UpperBound: upper})
		if err != nil {
			return true
		}
		if it.First() {
			_, err = it.ValueAndErr()
		}
		return errors.Join(err, it.Error(), it.Close()) != nil
	}
	lo := num(from)
	hi := num(upper)
	if upper == nil {
		hi = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(8*n)), big.NewInt(1))
		if fails(hi) {
			return nil, false
		}
	}
	mid := new(big.Int)
	for range 8*n + 2 {
		mid.Add(lo, hi).Rsh(mid, 1)
		if mid.Cmp(lo) == 0 {
			break
		}
		if fails(mid) {
			lo.Set(mid)
		} else {
			hi.Set(mid)
		}
	}
	if upper != nil && hi.Cmp(num(upper)) == 0 {
		return nil, false // nothing readable is left in the range
	}
	// Trailing zeros are only padding: a key that is a prefix of the
	// boundary sorts before it and must not be skipped.
	return bytes.TrimRight(hi.FillBytes(make([]byte, n)), "\x00"), true
}

// applyBatch applies the sets and deletes of a WAL record (a batch) to kv;
// it reports false, changing nothing, for a record that does not decode.
func applyBatch(rec []byte, kv map[string][]byte) bool {
	if _, ok := batchrepr.ReadHeader(rec); !ok {
		return false
	}
	br := batchrepr.Read(rec)
	ops := map[string][]byte{}
	for {
		kind, k, v, ok, err := br.Next()
		if err != nil {
			return false
		}
		if !ok {
			break
		}
		switch kind {
		case pebble.InternalKeyKindSet:
			ops[string(k)] = bytes.Clone(v)
		case pebble.InternalKeyKindDelete, pebble.InternalKeyKindSingleDelete:
			ops[string(k)] = nil
		}
	}
	for k, v := range ops {
		kv[k] = v
	}
	return true
}

// newRecordReader is record.NewReader for log number num: its parameter
// type is internal to Pebble, so the number is converted by reflection.
func newRecordReader(r io.Reader, num uint64) *record.Reader {
	fn := reflect.ValueOf(record.NewReader)
	arg := reflect.ValueOf(num).Convert(fn.Type().In(1))
	return fn.Call([]reflect.Value{reflect.ValueOf(r), arg})[0].Interface().(*record.Reader)
}

// quietLogger discards Pebble's logs during a repair.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
