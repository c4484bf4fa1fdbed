"""Weight matrices in their GGUF block formats: repacking into row groups, the integer kernels
(bit-exact with llama.cpp where its lanes allow), activation quantization and the BLAS path
for long prefill chunks."""
