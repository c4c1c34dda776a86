// Package mesh is what makes devices a mesh: the Host interface protocol
// code runs on (the real one, on go-libp2p, is mesh/p2p; mesh/peer puts a
// data directory's membership on one), membership (the state on disk, the
// certificate exchange that admits a peer and tells it the peers admitted
// so far, run again with each admitted peer in turn so that every peer
// comes to know every other, and that tells a peer nothing of the mesh
// before it has shown it knows the mesh and its certificate checked out;
// the admitted peers' certificates checked again at every use, and a peer
// disconnected once its certificate expires; the redeeming of invite
// tokens, which answers a stranger only once its token checked out;
// renewal; revocations spread, enforced and shown to the peers they
// revoke, a revoked device that tries to join again told it was removed;
// the record of the peers known; the tokens, certificates and
// revocations themselves are mesh/member), the voter set (the admin's
// signed list of the trainers that vote and certify versions; the others
// volunteer): kept on disk, carried in the certificate exchange to
// admitted peers and on its own gossip topic, the newest the admin signed
// in force, signed anew on the admin's device when a voter invite is
// redeemed or a trainer is trusted or untrusted, and by default making the
// first trainer of a mesh with none a voter; and the shipping of batches:
// announcements on gossip whose payload names no device (the message is
// signed by its author, Message.Author), the pull protocol only trainers
// may use, from the device that signed the announcement and credited to it,
// the bounds on every peer's work (announcements per device, pulls and
// streams at once, memory taken as bytes arrive, a trainer's pull budget,
// strikes that disconnect a peer that keeps overstepping), the signed acks
// that mark a batch shipped, and the announcements made again when a
// trainer is admitted; and the
// plugin protocol, by which an admitted peer fetches, by content hash, the
// reward plugin modules a batch's scores name, to replay them. The batch
// wire format is mesh/batch.
package mesh
