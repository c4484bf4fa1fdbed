"""Attention: dense (llama.cpp's numerics), the sparse block choice, the question's votes, the
sparse kernels, and the per-question state they keep."""
