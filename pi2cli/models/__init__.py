"""Models: file formats (.pi2, GGUF metadata, tokenizer blob), converters, the registry, the synthetic
generator, the GGUF twin writer, hub pulls and the numpy forward (generator pieces and oracle)."""
