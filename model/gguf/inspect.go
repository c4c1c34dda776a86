package gguf

// Info summarizes a GGUF file: what it is, for which architecture, its
// shape as llama.cpp reads it. Numbers the file lacks are 0.
type Info struct {
	// Arch is general.architecture ("qwen3").
	Arch string
	// Type is general.type: "model", "adapter", or "" (llama.cpp reads an
	// absent type as a model).
	Type string
	// Name and Basename are general.name and general.basename.
	Name, Basename string
	// FileType is general.file_type (llama.cpp's LlamaFileType), or -1.
	FileType int
	// AdapterType and LoRAAlpha are adapter.type and adapter.lora.alpha.
	AdapterType string
	LoRAAlpha   float32
	// The shape keys, "<arch>.block_count" and so on.
	BlockCount, ContextLength, EmbeddingLength, FeedForwardLength int
	HeadCount, HeadCountKV, KeyLength, ValueLength                int
	// VocabSize is the length of tokenizer.ggml.tokens.
	VocabSize int
	// Tensors, Elems and DataBytes count the tensors, their elements and
	// the bytes of their data.
	Tensors   int
	Elems     uint64
	DataBytes uint64
}

// Info summarizes f.
func (f *File) Info() Info {
	in := Info{FileType: -1, Tensors: len(f.Tensors)}
	in.Arch, _ = f.String(KeyArchitecture)
	in.Type, _ = f.String(KeyType)
	in.Name, _ = f.String(KeyName)
	in.Basename, _ = f.String(KeyBasename)
	if ft, err := f.Uint32(KeyFileType); err == nil {
		in.FileType = int(ft)
	}
	in.AdapterType, _ = f.String(KeyAdapterType)
	in.LoRAAlpha, _ = f.Float32(KeyLoRAAlpha)
	for _, k := range []struct {
		key string
		dst *int
	}{
		{".block_count", &in.BlockCount}, {".context_length", &in.ContextLength},
		{".embedding_length", &in.EmbeddingLength}, {".feed_forward_length", &in.FeedForwardLength},
		{".attention.head_count", &in.HeadCount}, {".attention.head_count_kv", &in.HeadCountKV},
		{".attention.key_length", &in.KeyLength}, {".attention.value_length", &in.ValueLength},
	} {
		if v, err := f.Uint32(in.Arch + k.key); err == nil {
			*k.dst = int(v)
		}
	}
	if a, err := f.Array("tokenizer.ggml.tokens"); err == nil {
		in.VocabSize = a.Len()
	}
	for _, ti := range f.Tensors {
		in.Elems += ti.Elems()
		in.DataBytes += ti.Size()
	}
	return in
}

// Inspect reads the header of the GGUF file at path and summarizes it.
func Inspect(path string) (Info, error) {
	f, err := Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	return f.Info(), nil
}
