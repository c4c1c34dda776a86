// Package peft reads PEFT LoRA adapter directories (adapter_config.json and
// adapter_model.safetensors) and stacks several adapters of one base model
// into one, exactly: pure format code with no engine, which a node may
// import.
//
// Read loads an adapter whole: its config and, for each adapted module,
// lora_A [r, in] and lora_B [out, r] in float32, with the scale PEFT applies
// (lora_alpha/r, or lora_alpha/√r with use_rslora). Module.Delta is what the
// module adds to its base weight, scale·B·A. Module paths are named as
// PEFT saves them, "base_model.model." added where a file lacks it.
//
// Stack writes one adapter whose delta on every module is the sum of the
// inputs' deltas. Concatenating low-rank factors is exact: with A the rows
// of every A_i stacked and B the columns of every scale_i·B_i side by side,
// B·A = Σ scale_i·B_i·A_i. The output has rank Σ r_i, lora_alpha equal to
// that rank and use_rslora false, so its scale is 1 and each input's scale
// lives in its block of B. A module some inputs do not adapt gets zero rows
// and columns for them, so every module has the one rank PEFT requires.
// target_modules is the union of the inputs', base_model_name_or_path the
// first input's; tensors are written as F32 (see RATIONALE.md).
//
// The inputs must name the same base model (base_model_name_or_path equal
// once normalised by baseid.NormName, or empty in all) and agree on every
// shared module's shape. What cannot be stacked exactly is refused with
// ErrUnsupported (DoRA, biases, fan_in_fan_out, modules_to_save, per-module
// rank or alpha patterns, a layer subset); a malformed adapter with
// ErrFormat; inputs of different bases or shapes with ErrMismatch. Reads are
// bounded (MaxConfigSize, MaxWeightsSize) and the output is written to a
// temporary directory beside it and renamed into place; an existing output
// is refused with ErrExists.
package peft
