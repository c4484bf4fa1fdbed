"""What a GGUF file's header says, read without loading a weight: the file's metadata and tensor
table, the model's shape and numerics (ModelConfig), and whether this engine runs it. The lowest
floor of the engine: everything above may ask it, it asks nothing above."""
