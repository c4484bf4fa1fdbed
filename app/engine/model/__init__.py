"""A GGUF model: its configuration, the transformer forward pass, the tokenizer and the chat
template."""
