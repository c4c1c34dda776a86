package member

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Every error this package returns wraps exactly one of them
// (check with errors.Is) and adds what was refused and why, in words an end
// user can act on.
var (
	// ErrTampered: the bytes do not decode, are not canonical, or a
	// signature does not verify.
	ErrTampered = errors.New("member: tampered or malformed")
	// ErrExpired: a token or certificate is past its expiry (or not yet
	// valid).
	ErrExpired = errors.New("member: expired")
	// ErrExhausted: a token was redeemed as many times as it allows.
	ErrExhausted = errors.New("member: uses exhausted: this token was already redeemed")
	// ErrRevoked: a certificate, or the certificate of its issuer, was
	// revoked.
	ErrRevoked = errors.New("member: revoked")
	// ErrOtherMesh: the credential belongs to a mesh with another admin key.
	ErrOtherMesh = errors.New("member: belongs to another mesh")
	// ErrNotAllowed: the issuer may not issue this (it may not invite, the
	// role is above its own, the chain is too long, ...).
	ErrNotAllowed = errors.New("member: not allowed")
	// ErrVersion: the encoding has a version this build does not read.
	ErrVersion = errors.New("member: unknown encoding version")
)

// stamp formats t as an RFC 3339 UTC time.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// ago says how long before now t was, or how long after: "24h ago", "in
// 5m".
func ago(t, now time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

// short writes d the way people read it: "45s", "12m5s", "1h30m", "3 days".
func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return trimZero(fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second), "0s")
	case d < 72*time.Hour:
		d = d.Round(time.Minute)
		return trimZero(fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute), "0m")
	default:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
}

// trimZero drops a zero last unit ("1h0m" → "1h") but not a digit of
// another ("1h30m" stays).
func trimZero(s, zero string) string {
	if t, ok := strings.CutSuffix(s, zero); ok && (len(t) == 0 || t[len(t)-1] < '0' || t[len(t)-1] > '9') {
		return t
	}
	return s
}
