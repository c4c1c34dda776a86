package member

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLedgerUses(t *testing.T) {
	w := newWorld(t, 1)
	for _, tc := range []struct {
		name     string
		maxUses  int
		attempts int
	}{
		{"one use, twice", 1, 2},
		{"three uses, four times", 3, 4},
		{"zero means one", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(w.adminPub, w.inviter.id)
			tok := w.token(w.inviter, RoleMember, tc.maxUses)
			for i := 1; i <= tc.attempts; i++ {
				err := l.Redeem(tok, t0.Add(time.Duration(i)*time.Minute))
				if i < tc.attempts {
					checkErr(t, err, nil)
					continue
				}
				checkErr(t, err, ErrExhausted)
				want := "member: uses exhausted: this token was already redeemed (" + strconv.Itoa(tok.MaxUses()) + " of " + strconv.Itoa(tok.MaxUses()) + " uses)"
				if err.Error() != want {
					t.Errorf("error %q, want %q", err, want)
				}
			}
			if l.Uses(tok) != tok.MaxUses() || l.Len() != 1 {
				t.Errorf("%d uses of %d, %d tokens", l.Uses(tok), tok.MaxUses(), l.Len())
			}
			// a token parsed again from its text is the same token
			p, err := ParseToken(tok.String())
			if err != nil {
				t.Fatal(err)
			}
			checkErr(t, l.Redeem(p, t0.Add(time.Hour)), ErrExhausted)
		})
	}
}

func TestLedgerRefusals(t *testing.T) {
	w := newWorld(t, 1)
	other := newWorld(t, 2)
	for _, tc := range []struct {
		name string
		l    *Ledger
		tok  *Token
		now  time.Time
		want error
	}{
		{"valid", NewLedger(w.adminPub, w.inviter.id), w.token(w.inviter, RoleMember, 1), t0, nil},
		{"admin's own token", NewLedger(w.adminPub, w.admin.id), w.token(w.admin, RoleTrainer, 1), t0, nil},
		{"expired", NewLedger(w.adminPub, w.inviter.id), w.token(w.inviter, RoleMember, 1), t0.Add(DefaultTokenTTL), ErrExpired},
		{"another inviter's token", NewLedger(w.adminPub, w.inviter.id), w.token(w.trainer, RoleMember, 1), t0, ErrNotAllowed},
		{"other mesh", NewLedger(w.adminPub, w.inviter.id), other.token(other.inviter, RoleMember, 1), t0, ErrOtherMesh},
		{"other mesh, same peer id", NewLedger(other.adminPub, w.inviter.id), w.token(w.inviter, RoleMember, 1), t0, ErrOtherMesh},
		{"forged", NewLedger(w.adminPub, w.inviter.id), forgeToken(t, w.plain.key, w.inviter.cert, RoleMember, t0.Add(time.Hour)), t0, ErrTampered},
		{"role above the inviter's", NewLedger(w.adminPub, w.inviter.id), forgeToken(t, w.inviter.key, w.inviter.cert, RoleTrainer, t0.Add(time.Hour)), t0, ErrNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Redeem(tc.tok, tc.now)
			checkErr(t, err, tc.want)
			want := 0
			if tc.want == nil {
				want = 1
			}
			if tc.l.Uses(tc.tok) != want || tc.l.Len() != want {
				t.Errorf("%d uses counted, want %d", tc.l.Uses(tc.tok), want)
			}
		})
	}
}

func TestLedgerPersistAndPrune(t *testing.T) {
	w := newWorld(t, 1)
	l := NewLedger(w.adminPub, w.inviter.id)
	tokAt := func(ttl time.Duration, uses int) *Token {
		tok, err := NewToken(w.inviter.key, w.inviter.cert, TokenSpec{Addrs: []string{"/ip4/10.0.0.1/tcp/1"}, TTL: ttl, MaxUses: uses}, t0, w.rnd)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	day := 24 * time.Hour
	once := tokAt(day, 1)
	thrice := tokAt(2*day, 3)
	checkErr(t, l.Redeem(once, t0), nil)
	checkErr(t, l.Redeem(thrice, t0), nil)
	checkErr(t, l.Redeem(thrice, t0), nil)

	b := l.Marshal()
	t.Logf("ledger of %d tokens: %d bytes", l.Len(), len(b))
	r, err := ParseLedger(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Marshal(), b) || r.Len() != 2 || r.Owner() != w.inviter.id || r.MeshID() != MeshIDOf(w.adminPub) {
		t.Fatal("round trip changed the ledger")
	}
	checkErr(t, r.Redeem(once, t0.Add(time.Hour)), ErrExhausted)
	checkErr(t, r.Redeem(thrice, t0.Add(time.Hour)), nil)
	checkErr(t, r.Redeem(thrice, t0.Add(time.Hour)), ErrExhausted)

	if n := r.Prune(t0.Add(day - time.Second)); n != 0 {
		t.Errorf("pruned %d before any token expired", n)
	}
	if n := r.Prune(t0.Add(day)); n != 1 || r.Len() != 1 {
		t.Errorf("pruned %d at the first expiry, %d left", n, r.Len())
	}
	// a pruned token stays refused: it has expired
	checkErr(t, r.Redeem(once, t0.Add(day)), ErrExpired)
	checkErr(t, r.Redeem(thrice, t0.Add(day)), ErrExhausted)
	if n := r.Prune(t0.Add(2 * day)); n != 1 || r.Len() != 0 {
		t.Errorf("pruned %d at the second expiry, %d left", n, r.Len())
	}
	if len(r.Marshal()) >= len(b) {
		t.Error("pruning did not shrink the ledger")
	}
}

func TestParseLedgerErrors(t *testing.T) {
	w := newWorld(t, 1)
	l := NewLedger(w.adminPub, w.inviter.id)
	for range 3 {
		checkErr(t, l.Redeem(w.token(w.inviter, RoleMember, 2), t0), nil)
	}
	good := l.Marshal()
	entry := NonceSize + 1 + 5
	head := len(good) - 3*entry
	swapped := bytes.Clone(good)
	copy(swapped[head:], good[head+entry:head+2*entry])
	copy(swapped[head+entry:], good[head:head+entry])
	twice := bytes.Clone(good)
	copy(twice[head+entry:], good[head:head+entry])
	zeroUses := bytes.Clone(good)
	zeroUses[head+NonceSize] = 0
	for _, tc := range []struct {
		name    string
		b       []byte
		want    error
		wantMsg string
	}{
		{"out of order", swapped, ErrTampered, "canonical"},
		{"nonce twice", twice, ErrTampered, "twice"},
		{"zero uses", zeroUses, ErrTampered, "uses"},
		{"truncated", good[:len(good)-1], ErrTampered, "truncated"},
		{"trailing", append(bytes.Clone(good), 0), ErrTampered, "trailing"},
		{"version 2", append([]byte{2}, good[1:]...), ErrVersion, ""},
		{"a revocation list", NewRevocationList(w.adminPub).Marshal(), ErrTampered, "not an encoded ledger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseLedger(tc.b)
			checkErr(t, err, tc.want)
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
}
