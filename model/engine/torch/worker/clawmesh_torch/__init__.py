"""clawmesh's torch worker: a Qwen3 decoder with LoRA in plain PyTorch,
driven by the Go trainer (model/engine/torch) over a Unix socket.

It runs on torch 1.13 on the CPU (Debian's python3-torch, used by CI) and on
torch 2.x with CUDA (bf16 autocast, optional gradient checkpointing, flash
attention through scaled_dot_product_attention where torch has it). With
several GPUs it is launched by torchrun and trains data-parallel; the Go side
sees one engine.

Modules:
  safetensors_io  read and write .safetensors files (standard library + torch)
  model           Qwen3 config, weights, the decoder with LoRA, log-probs,
                  sampling with a KV cache
  peft            PEFT adapter directories: load (with PEFT's field types),
                  export, fresh initialisation
  surrogate       the clipped policy-gradient loss of model/loss (doc.go is
                  the written specification; the Go tests check this
                  implementation against the Go one)
  optim           AdamW as the native engine applies it
  protocol        the framed binary protocol (see PROTOCOL.md)
  engine          the operations: log-probs, train step, gradient, generate,
                  adapters, checkpoints; data-parallel across ranks
  __main__        the worker process: connect, serve requests, log to stderr
  bench           the GPU benchmark and correctness script (python3 -m
                  clawmesh_torch.bench --help)

Only the Python standard library and torch are needed at run time.
"""

PROTOCOL_VERSION = 1
