// Package member owns the credentials of a clawmesh mesh: invite tokens,
// member certificates and revocations, the admin's VoterSet, and the two
// small pieces of state that go with them, the invite Ledger (uses per
// token) and the RevocationList. Everything here is a pure function of
// bytes, keys and a given time: no network, no disk, no clock, no
// goroutines; randomness comes from an io.Reader the caller passes
// (crypto/rand.Reader in production). The mesh package moves these bytes
// between peers and persists the state.
//
// # Keys and identities
//
// A mesh has one admin Ed25519 key pair; its MeshID is derived from the admin
// public key (MeshIDOf), so nothing can claim a mesh without its key. A peer
// is named by its libp2p peer id, an opaque string here, and also holds an
// Ed25519 signing key for what it issues (tokens, certificates of invitees,
// revocations). A Certificate binds both: peer id and signing key.
//
// # Chain rules
//
// Certificates form chains of at most two links: admin → member, or admin →
// inviter → member. The rules, checked by IssueCertificate and again by
// Certificate.Verify:
//
//   - The admin (its key, with no certificate) may certify any peer as
//     member or trainer, with or without may-invite, and may certify its own
//     key with RoleAdmin (the admin's own certificate; no other key can hold
//     that role).
//   - An inviter is a peer whose admin-issued certificate says may-invite and
//     is valid (not expired, not revoked). It may certify peers with a role no
//     higher than its own (member < trainer < admin) and never with
//     may-invite: an inviter-issued certificate can never issue, which is what
//     keeps chains at two links.
//   - A certificate never outlives its issuer's: IssueCertificate caps the
//     expiry at the inviter certificate's, and Verify refuses a certificate
//     valid outside its issuer's validity. Tokens are capped the same way.
//
// # Revocation
//
// The admin may revoke any peer id: every certificate for it, and every
// certificate it issued as inviter, fails Verify with ErrRevoked. An inviter
// may revoke its own invitees only, and its revocation is scoped: it revokes
// the certificates that inviter issued for the peer, not the peer id as a
// whole. Revocation.Verify checks, when given the subject's certificate, that
// the revoking inviter did issue it; the scoping makes the rule hold even
// without that certificate, since an inviter can always mint a certificate for
// any peer id with its own key and so "prove" it invited anyone. Revocations
// are permanent: a revoked peer rejoins under a new identity.
//
// # Voters
//
// A VoterSet is the admin's signed list of the trainers that vote in the
// trainers' raft group and certify adapter versions (their peer ids and
// keys), numbered: a higher Seq replaces a lower one. Other trainers are
// volunteers. Only the admin key signs a set, so only the admin makes a
// voter: directly, or by a trainer token with TokenSpec.Voter, which
// NewToken refuses to an inviter and Token.Verify refuses when an inviter
// signed it.
//
// # Encodings
//
// Certificates, tokens, revocations and voter sets have one canonical
// binary encoding: a version byte (1), a kind byte ('C', 'T', 'R', 'S'),
// the fields in a fixed order (strings and nested encodings prefixed by
// their uvarint length, keys and nonces as raw bytes, times as uvarint Unix
// seconds), then a 64-byte Ed25519 signature over "clawmesh/member\n"
// followed by every byte before the signature. Decoders refuse anything
// over MaxEncodedSize before reading it, refuse trailing bytes, and
// re-encode what they parsed and refuse the input unless it is byte for
// byte the same, so a parsed value's Marshal is always its input and the
// signature covers exactly the bytes received.
// Signatures are checked by Verify, which knows the keys to trust.
//
// Fields that can be derived are not stored: a certificate's mesh is its
// chain root's issuer key; an inviter-issued certificate's issuer key is its
// issuer certificate's subject key; a token with an inviter certificate takes
// the inviter's peer id and key and the admin key from it.
//
// A token's role byte holds the role offered in its low bits and, in bit 7
// (0x80), the voter flag: set only on a trainer token, so a token that
// makes no voter encodes as tokens did before voters existed.
//
// An invite token travels as one line of text: TokenPrefix
// ("clawmesh-invite1:") then the binary encoding in unpadded base64url. A
// token with two addresses and an inviter certificate is about 500
// characters. ParseToken ignores white space anywhere (line breaks from mail
// clients and terminals).
//
// # Choices
//
//   - A hand-written binary encoding, not JSON, CBOR or protobuf: the token
//     must fit on a line (JSON, with field names and base64 keys and
//     signatures inside the base64 of the token, is much longer), the
//     package keeps to the standard library, and a handful of field types
//     (bytes, uvarints, length-prefixed strings) need no library. Canonical form is
//     enforced by re-encoding, which is simpler to get right than checking
//     each rule of a general format.
//   - Verification is separate from parsing because the keys to trust come
//     from the caller (adminPub); a parser that checked signatures would have
//     to trust the key the bytes carry.
//   - Revocations are permanent and certificates short (DefaultCertTTL, with
//     NeedsRenewal at two thirds): a device that vanishes without being
//     revoked drops out within a month.
//   - Token uses are counted only by the token's inviter (Ledger.Redeem
//     refuses another inviter's token): one ledger, no coordination.
package member
