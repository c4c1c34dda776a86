package group_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"

	. "github.com/clawmesh/clawmesh/trainer/group"
	"github.com/clawmesh/clawmesh/trainer/group/grouptest"
)

func votes(peers ...string) []Vote {
	var vs []Vote
	for i, p := range peers {
		vs = append(vs, Vote{Peer: mesh.PeerID(p), Sig: bytes.Repeat([]byte{byte(i + 1)}, 64)})
	}
	return vs
}

func certifyV1(f func(*Certify)) *Entry {
	c := &Certify{Version: 1, Hash: grouptest.HashN(1), Voters: []byte("a voter set"), Votes: votes("t1", "t2")}
	if f != nil {
		f(c)
	}
	return &Entry{Certify: c}
}

func TestApplyCertify(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "certified", setup: grouptest.Published, entry: certifyV1(nil), check: func(t *testing.T, s *State) {
			v, _ := s.Current()
			if v.Cert == nil || len(v.Cert.Votes) != 2 || string(v.Cert.Voters) != "a voter set" {
				t.Fatalf("v1's certification: %+v", v.Cert)
			}
		}},
		{name: "version 0", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Version, c.Hash = 0, grouptest.HashN(0) }), want: ErrVersion},
		{name: "unknown version", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Version = 2 }), want: ErrVersion},
		{name: "another hash", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Hash = grouptest.HashN(7) }), want: ErrVersion},
		{name: "no votes", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Votes = nil }), want: ErrEntry},
		{name: "no voter set", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Voters = nil }), want: ErrEntry},
		{name: "a voter twice", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Votes = votes("t1", "t1") }), want: ErrEntry},
		{name: "a short signature", setup: grouptest.Published, entry: certifyV1(func(c *Certify) { c.Votes[0].Sig = c.Votes[0].Sig[:10] }), want: ErrEntry},
	})
}

func retractV1(f func(*Retract)) *Entry {
	r := &Retract{Version: 1, Hash: grouptest.HashN(1), Reason: "no quorum"}
	if f != nil {
		f(r)
	}
	return &Entry{Retract: r}
}

func TestApplyRetract(t *testing.T) {
	certified := func(tb testing.TB) *grouptest.Fixture {
		f := grouptest.Published(tb)
		f.Must(certifyV1(nil))
		return f
	}
	reopened := func(tb testing.TB) *grouptest.Fixture {
		f := grouptest.Published(tb)
		f.Must(&Entry{Start: &Start{Round: 2, Base: 1, Leader: "t1", Deadline: grouptest.T0.Add(time.Hour), Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(4)}}}})
		return f
	}
	runApplyCases(t, []applyCase{
		{name: "retracted", setup: grouptest.Published, entry: retractV1(nil), check: func(t *testing.T, s *State) {
			if v, _ := s.Current(); v.Version != 0 || len(s.Versions) != 1 {
				t.Fatalf("newest is %s of %d", v.Name(), len(s.Versions))
			}
			if len(s.Retracted) != 1 || s.Retracted[0].Version != 1 || s.Retracted[0].Round != 1 || s.Retracted[0].Reason != "no quorum" {
				t.Fatalf("retracted: %+v", s.Retracted)
			}
			for _, n := range []int{1, 2, 3} {
				if b := s.Batches[grouptest.Bid(n)]; b.Status != Pending || b.Version != 0 {
					t.Fatalf("batch %d after the retraction: %+v", n, b)
				}
			}
		}},
		{name: "certified", setup: certified, entry: retractV1(nil), want: ErrVersion},
		{name: "version 0", setup: grouptest.Ready, entry: retractV1(func(r *Retract) { r.Version, r.Hash = 0, grouptest.HashN(0) }), want: ErrVersion},
		{name: "not the newest", setup: grouptest.Published, entry: retractV1(func(r *Retract) { r.Version = 2 }), want: ErrVersion},
		{name: "another hash", setup: grouptest.Published, entry: retractV1(func(r *Retract) { r.Hash = grouptest.HashN(9) }), want: ErrVersion},
		{name: "no reason", setup: grouptest.Published, entry: retractV1(func(r *Retract) { r.Reason = "" }), want: ErrEntry},
		{name: "a round open", setup: reopened, entry: retractV1(nil), want: ErrFenced},
	})
	// After a retraction the next version takes its number, at a later
	// log position.
	f := grouptest.Published(t)
	f.Must(retractV1(nil))
	f.Must(&Entry{Start: &Start{Round: 2, Base: 0, Leader: "t1", Deadline: grouptest.T0.Add(time.Hour), Shares: map[mesh.PeerID][]core.BatchID{"t1": {grouptest.Bid(1)}}}})
	f.Must(&Entry{Publish: &Publish{Round: 2, Version: 1, Parent: 0, Hash: grouptest.HashN(11), Publisher: "t1",
		Contributors: []Contribution{{Trainer: "t1", Batches: []core.BatchID{grouptest.Bid(1)}, Samples: 4}}}})
	if err := grouptest.CheckInvariants(f.S); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.S.Current(); v.Version != 1 || v.Hash != grouptest.HashN(11) {
		t.Fatalf("after the retraction: %s %s", v.Name(), v.Hash)
	}
}
