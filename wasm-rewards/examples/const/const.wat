;; const: the smallest reward plugin, in the WebAssembly text format (no Go,
;; no kit): it scores every step 0.5 with the label "const". It speaks ABI
;; version 1 (JSON; see ../../ABI.md) and ignores its input.
;;
;;   wat2wasm const.wat -o const.wasm      (wat2wasm is in WABT: apt-get install wabt)
(module
  (memory (export "memory") 1)
  ;; the result, 32 bytes at offset 64
  (data (i32.const 64) "{\"score\":0.5,\"labels\":[\"const\"]}")
  (func (export "clawmesh_abi") (result i32) (i32.const 1))
  ;; every input goes to offset 1024 (inputs up to 63 KiB; a larger one does
  ;; not fit the one page of memory, and the plugin abstains on it)
  (func (export "clawmesh_alloc") (param i32) (result i32) (i32.const 1024))
  ;; returns (64 << 32) | 32: where the result is, and its length
  (func (export "clawmesh_score") (param i32 i32) (result i64) (i64.const 274877906976)))
