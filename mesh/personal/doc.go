// Package personal is the protocol by which a device has its personal
// adapter trained by a trainer peer the user trusts ([personal] mode =
// mesh): the device's own scrubbed steps go, over one stream of the mesh
// host (Protocol), to that trainer alone, which trains the device's
// adapter and sends it back on the same stream, to that device alone. It
// is never kept, re-served, gossiped, nor put in a round or the shared
// aggregate.
//
// # The exchange
//
// The device opens a stream to one trainer of its trusted list (Client),
// and only to one the mesh admitted as a trainer. It sends a header (a
// uvarint length, then JSON: the device's own peer id, a random nonce,
// the shared version's name, the seed, and the sizes of the four parts
// that follow) and waits for the trainer to take it; then it sends the
// steps and the held-back steps (each a mesh/batch encoding), and the
// previous adapter's adapter_config.json and adapter_model.safetensors
// (none for a fresh one). The trainer answers, once the job ran, with a
// header (status, result, the new adapter's sizes, and its signature)
// followed by the adapter's two files; or with a status and a message
// (refused, busy, too_large, bad_request, unknown_version, failed: the
// errors ErrRefused ... ErrFailed).
//
// # What a trainer takes
//
// A Server takes jobs only from the mesh's admitted member devices (not a
// trainer, not a stranger: the host admits no one else, and the server
// checks the certificate's role again), and only for the device that
// sends it: a request that names another device is refused, so a device
// can have no other's adapter trained, let alone fetched (no adapter is
// kept to fetch). Each device has one stream at a time, every device
// together MaxJobs jobs, each device PerHour jobs an hour (a job the
// handler answers ErrBusy, the trainer not ready, is not counted), each job
// JobTimeout. Every size is checked before anything it sizes is read
// (Limits: the header's own length, the steps' bytes and count, the
// adapter's config and weights), the steps are allocated as they arrive
// and decoded by mesh/batch's checks, the previous adapter goes to disk,
// and a peer that stalls for Stall is cut. A job lives in a directory of
// its own under ServerConfig.TempDir, removed once its reply is sent,
// failed or not; Serve removes the jobs a crash left there.
//
// # What a device takes
//
// The device checks the reply before it writes anything where the node
// reads: its sizes against Limits, its result's numbers, the adapter's
// two files as a JSON object and a safetensors file, and the trainer's
// signature, made with the key of its certificate over the device's peer
// id, the job's nonce, the digest of every byte of the request, the
// adapter's hashes and the result (RATIONALE.md says why, on top of the
// stream's own encryption). Then it renames the adapter's directory to
// the job's Out, whole.
package personal
