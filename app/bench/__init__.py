"""Measurement: the speed benchmark against llama.cpp, pass key and needle retrieval, the
KV quality probe and the weight-kernel microbenchmark. Nothing in the product path imports
this package."""
