// Package mlx writes LoRA adapters in the layout mlx-lm loads (Apple's MLX
// language-model package: `mlx_lm.generate --adapter-path`, mlx_lm.server's
// --adapter-path and its per-request "adapters" field) and reads them back
// the way mlx-lm does. It is pure format code: it reads and writes files
// and knows no engine.
//
// An mlx-lm adapter directory holds two files, as mlx_lm/lora.py's train
// writes them and mlx_lm/tuner/utils.py's load_adapters reads them:
//
//   - adapter_config.json: fine_tune_type ("lora"), num_layers (LoRA goes on
//     the last num_layers decoder layers; -1, as `mlx_lm.lora --num-layers
//     -1`, means all of them: load_adapters slices model.layers[-max(n,0):])
//     and lora_parameters {rank, scale, dropout, keys}. keys are module paths
//     inside a decoder layer ("self_attn.q_proj"), matched against
//     layer.named_modules() by linear_to_lora_layers, which wraps each
//     matched nn.Linear in a LoRALinear.
//   - adapters.safetensors: for every adapted module,
//     "model.layers.<L>.<key>.lora_a" of shape [in, rank] and
//     "model.layers.<L>.<key>.lora_b" of shape [rank, out]: the parameter
//     names of LoRALinear (mlx_lm/tuner/lora.py) inside mlx-lm's Qwen3,
//     Qwen2 and Llama models (mlx_lm/models/{qwen3,qwen2,llama}.py: Model
//     holds the decoder as self.model, its layers as self.layers, each with
//     self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj). load_adapters
//     refuses a tensor whose name is not a lora_a/lora_b of the converted
//     model or whose shape differs, then load_weights(strict=False): a
//     converted module the file does not name keeps lora_b = 0 and so
//     changes nothing.
//
// LoRALinear.__call__ computes y = linear(x) + scale·((x @ lora_a) @
// lora_b), and LoRALinear.fuse folds W + (scale·lora_bᵀ) @ lora_aᵀ. A PEFT
// adapter (adapter_config.json + adapter_model.safetensors) computes
// y = W·x + s·B·A·x with lora_A.weight A of shape [r, in], lora_B.weight B
// of shape [out, r] and s = lora_alpha/r (lora_alpha/√r with use_rslora).
// So Export writes lora_a = Aᵀ, lora_b = Bᵀ and scale = s: mlx-lm's scale
// multiplies the product directly, it is not an alpha. Tensors keep their
// dtype (F32, F16 or BF16), transposed element by element.
//
// What mlx-lm's LoRALinear cannot express is refused with an error naming
// it: DoRA, trained biases, saved whole modules (modules_to_save), per-module
// ranks or alphas (rank_pattern, alpha_pattern: mlx-lm has one rank and one
// scale per adapter), fan_in_fan_out weights, and modules other than the
// seven projections of a decoder layer (embeddings, lm_head).
//
// Read is a reference loader that follows load_adapters and LoRALinear: it
// checks the names and shapes mlx-lm checks (against a model's shape with
// Adapter.Check) and returns each module's factors and scale, and the dense
// delta LoRALinear.fuse adds to its weight.
package mlx
