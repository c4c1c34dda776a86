package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

// Repair salvages a pool Pebble cannot open (ErrDamaged): it reads every
// key-value it can from the tables (through Pebble, without the WAL) and
// from each WAL record whose checksum checks out (skipping the damaged
// ones), writes them into a fresh pool, rebuilds the indices from the step
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
	if db, err := pebble.Open(tmp, &pebble.Options{ReadOnly: true, Logger: quietLogger{}}); err != nil {
		rep.Problems = append(rep.Problems, "the tables cannot be read: "+err.Error())
	} else {
		for _, r := range [][2][]byte{{nil, prefixStep}, {prefixStep, nil}} {
			// Two ranges, so that damage in one half leaves the other.
			err := scan(ctx, db, r[0], r[1], func(k, v []byte) error {
				kv[string(k)] = bytes.Clone(v)
				rep.Tables++
				return nil
			})
			if err != nil {
				rep.Problems = append(rep.Problems, "tables: "+err.Error())
			}
		}
		_ = db.Close()
	}

	// The WAL, oldest first, record by record.
	slices.Sort(wals)
	for _, name := range wals {
		if err := readWAL(filepath.Join(dir, name), kv, &rep); err != nil {
			rep.Problems = append(rep.Problems, name+": "+err.Error())
		}
	}

	// The fresh pool.
	fresh := dir + ".repair-" + now.UTC().Format("20060102T150405")
	db, err := pebble.Open(fresh, &pebble.Options{Logger: quietLogger{}})
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

// readWAL applies to kv every batch of a WAL file whose record checks out,
// skipping damaged records.
func readWAL(path string, kv map[string][]byte, rep *RepairReport) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	num, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".log"), 10, 64)
	if err != nil {
		return err
	}
	// After a damaged record the reader starts again at the next block:
	// records that begin there are whole and checked.
	const block = 32 << 10
	base := 0
	rr := newRecordReader(bytes.NewReader(data), num)
	for {
		r, err := rr.Next()
		var rec []byte
		if err == nil {
			rec, err = io.ReadAll(r)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			rep.BadWALRecords++
			next := (base + int(rr.Offset()) + block) / block * block
			if next >= len(data) {
				return nil
			}
			base = next
			rr = newRecordReader(bytes.NewReader(data[base:]), num)
			continue
		}
		if !applyBatch(rec, kv) {
			rep.BadWALRecords++
			continue
		}
		rep.WALRecords++
	}
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
