// Package torch is clawmesh's CUDA engine: a Python worker in plain
// PyTorch (worker/clawmesh_torch: its own Qwen3 decoder with LoRA on the
// seven projections, loading Hugging Face safetensors without transformers,
// bf16 autocast on CUDA, optional gradient checkpointing, the surrogate of
// model/loss, AdamW as the native engine applies it, PEFT adapters in and
// out) driven from Go through engine.Engine.
//
// The Go side starts the worker (python3 -m clawmesh_torch, or torchrun
// with one process per GPU for data-parallel training), forwards its JSON
// log lines through slog, and speaks a versioned, length-prefixed binary
// protocol over a Unix socket: a fixed header, a small JSON object of
// scalars, and raw little-endian tensors (PROTOCOL.md). The worker's
// sources are embedded in the binary and written to the engine's state
// directory when it starts.
//
// The worker is a process that can die. The engine keeps what it needs to
// bring a new one to the same state: the last checkpoint of the adapter
// and the optimizer (taken after every adapter load or reset and every
// Options.CheckpointEvery steps) and the train steps since, which it
// replays. A worker that runs out of device memory answers
// engine.ErrOutOfMemory and stays usable; the trainer retries with smaller
// micro-batches.
//
// Both engines start from the same adapter for the same seed (the native
// engine's fresh adapter is written and loaded), and the tests check that
// they give the same log-probs, loss, gradients and adapter after the same
// steps on the shared test vectors (model/engine/native/testdata/vectors;
// on a GPU with CLAWMESH_TORCH_DEVICE=cuda), and that the two
// implementations of the loss agree. worker/clawmesh_torch/
// bench.py is the GPU check and benchmark against transformers + peft.
package torch
