package member

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"slices"
	"time"
)

// MaxLedgerSize bounds the encoding of a Ledger (about 700,000 tokens).
const MaxLedgerSize = 16 << 20

// A Ledger is an inviter's record of how many times each of its tokens was
// redeemed, so that a token is used no more than it allows: replaying a
// used-up token gets ErrExhausted. It is a plain value: not safe for
// concurrent use, persisted by the caller. Persist it (Marshal) after a
// successful Redeem and before handing out the certificate, so that a crash
// cannot give a use back. Prune drops tokens past their expiry, which
// Redeem refuses anyway.
type Ledger struct {
	admin ed25519.PublicKey
	owner string
	uses  map[[NonceSize]byte]ledgerEntry
}

type ledgerEntry struct {
	uses    int
	expires time.Time
}

// NewLedger returns an empty ledger for the tokens that owner, a peer id,
// issues in the mesh of adminPub.
func NewLedger(adminPub ed25519.PublicKey, owner string) *Ledger {
	return &Ledger{admin: bytes.Clone(adminPub), owner: owner, uses: map[[NonceSize]byte]ledgerEntry{}}
}

// Redeem checks tok for the ledger's mesh and owner at now (Token.VerifyFor,
// then that the owner is the token's inviter, else ErrNotAllowed) and counts
// one use, refusing with ErrExhausted a token already used MaxUses times.
// Nothing is counted when it fails.
func (l *Ledger) Redeem(tok *Token, now time.Time) error {
	if err := tok.VerifyFor(l.admin, now, nil); err != nil {
		return err
	}
	if tok.inviter != l.owner {
		return fmt.Errorf("%w: the invite token was issued by peer %s; only its inviter can redeem it, and this is peer %s",
			ErrNotAllowed, quote(tok.inviter), quote(l.owner))
	}
	e := l.uses[tok.nonce]
	if e.uses >= tok.maxUses {
		return fmt.Errorf("%w (%d of %d uses)", ErrExhausted, e.uses, tok.maxUses)
	}
	l.uses[tok.nonce] = ledgerEntry{uses: e.uses + 1, expires: tok.expires}
	return nil
}

// Uses returns how many times tok was redeemed.
func (l *Ledger) Uses(tok *Token) int { return l.uses[tok.nonce].uses }

// Prune forgets the tokens expired at now and returns how many it forgot.
func (l *Ledger) Prune(now time.Time) int {
	n := 0
	for k, e := range l.uses {
		if !now.Before(e.expires) {
			delete(l.uses, k)
			n++
		}
	}
	return n
}

// Len is the number of tokens the ledger remembers.
func (l *Ledger) Len() int { return len(l.uses) }

// MeshID is the id of the ledger's mesh.
func (l *Ledger) MeshID() string { return MeshIDOf(l.admin) }

// Owner is the peer id whose tokens the ledger counts.
func (l *Ledger) Owner() string { return l.owner }

// Marshal encodes the ledger canonically, tokens in nonce order.
func (l *Ledger) Marshal() []byte {
	b := []byte{encodingVersion, kindLedger}
	b = append(b, l.admin...)
	b = appendString(b, l.owner)
	keys := make([][NonceSize]byte, 0, len(l.uses))
	for k := range l.uses {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [NonceSize]byte) int { return bytes.Compare(a[:], b[:]) })
	b = appendUvarint(b, len(keys))
	for _, k := range keys {
		e := l.uses[k]
		b = append(b, k[:]...)
		b = appendUvarint(b, e.uses)
		b = appendTime(b, e.expires)
	}
	return b
}

// ParseLedger decodes a ledger made by Marshal.
func ParseLedger(b []byte) (*Ledger, error) {
	if err := header(b, MaxLedgerSize, kindLedger, "ledger"); err != nil {
		return nil, err
	}
	d := &decoder{b: b[2:]}
	l := &Ledger{uses: map[[NonceSize]byte]ledgerEntry{}}
	l.admin = bytes.Clone(d.key("admin key"))
	l.owner = d.peerID("owner")
	n := d.uvarint("count")
	for i := uint64(0); i < n && d.err == nil; i++ {
		var k [NonceSize]byte
		copy(k[:], d.take(NonceSize, "nonce"))
		uses := d.uvarint("uses")
		if d.err == nil && (uses < 1 || uses > MaxTokenUses) {
			d.fail("%d uses, want 1 to %d", uses, MaxTokenUses)
		}
		exp := d.time("expiry")
		if _, dup := l.uses[k]; dup && d.err == nil {
			d.fail("nonce %x twice", k)
		}
		l.uses[k] = ledgerEntry{uses: int(uses), expires: exp}
	}
	if err := d.finish("ledger"); err != nil {
		return nil, err
	}
	if err := canonical(b, l.Marshal(), "ledger"); err != nil {
		return nil, err
	}
	return l, nil
}
