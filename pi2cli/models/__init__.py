"""Models: the registry, the synthetic sparse-model generator, the GGUF twin writer and hub pulls."""
