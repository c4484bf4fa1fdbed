"""The KV cache: its formats, the contiguous f16 cache (llama.cpp's numerics), the blocked
quantized cache, cache files, sizes per token and the quality probe."""
