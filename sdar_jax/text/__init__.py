"""Layer 0, text: the tokenizer (a `tokenizer.json` read with the tokenizers library) and the chat
templates that turn messages into a prompt string. No JAX; models and rollouts build on it."""
