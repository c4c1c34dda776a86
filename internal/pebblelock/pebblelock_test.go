package pebblelock

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestHeld(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = pebble.Open(dir, &pebble.Options{})
	if !Held(err) {
		t.Fatalf("a second open of a held directory: %v, not Held", err)
	}
	for _, e := range []error{fmt.Errorf("x: %w", syscall.EAGAIN), syscall.EACCES} {
		if !Held(e) {
			t.Errorf("%v is not Held", e)
		}
	}
	for _, e := range []error{nil, errors.New("disk on fire"), syscall.ENOENT} {
		if Held(e) {
			t.Errorf("%v is Held", e)
		}
	}
}
