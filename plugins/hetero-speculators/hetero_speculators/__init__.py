"""hetero-infer speculators: ``ngram`` (prompt lookup) and ``draft`` (a smaller model)."""
