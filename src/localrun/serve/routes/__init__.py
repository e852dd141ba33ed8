"""The routes, a module per dialect (each mounting only its own translator) and the operations' own (ops)."""
