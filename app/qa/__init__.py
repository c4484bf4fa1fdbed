"""Question answering: the answer service (one document, several, a folder or everything),
prompts, page plans, citations, attention-grounded passages, document KV caches, summaries,
exports and the answer history."""
