// Package gguf reads and writes GGUF, llama.cpp's model file format
// (version 3, as ggml/include/gguf.h and ggml/src/gguf.cpp define it), and
// exports clawmesh's models to it: ExportLoRA turns a PEFT LoRA adapter
// directory (an adapter version) into a llama.cpp LoRA adapter GGUF, as
// llama.cpp's convert_lora_to_gguf.py writes one, and ExportBase turns a
// Hugging Face model directory (Qwen3, safetensors) into a model GGUF, as
// convert_hf_to_gguf.py writes one.
//
// The codec holds metadata of every GGUF value type, tensor infos and the
// data alignment (general.alignment, default 32). It knows the block sizes
// of ggml's tensor types, so the data sizes of any file are checked, and
// converts F32, F16, BF16 and Q8_0 data to and from float32. Read trusts
// nothing in a file: every count, length and offset is checked against
// the file's size before anything is allocated for it.
//
// The package is pure format code: it imports no engine, so a device's
// node may use it.
package gguf
