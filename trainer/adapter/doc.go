// Package adapter handles LoRA adapters as data, whatever engine trained
// them: a Bundle is a PEFT adapter directory (adapter_config.json +
// adapter_model.safetensors) read into float32 tensors; a Delta is the
// tensor-wise difference between two bundles of the same shape, which is
// what a trainer peer sends back after training from the current version;
// Aggregate combines the deltas of one round into the next version's,
// robust to a contributor that sends something enormous.
//
// Everything that arrives from a peer (a bundle directory, a delta's bytes)
// is checked before use: size limits, known dtypes, no duplicate or
// overlapping tensors, no bytes outside a tensor, only finite values.
//
// The package owns the canonical bundle hash (see Hash) that the adapter
// lineage records and downloads are verified against, and the delta wire
// format (see Delta.MarshalBinary). It does no I/O but reading and writing
// the directories it is handed, and keeps no state. RATIONALE.md explains
// the aggregation rule and the hash definition.
package adapter
