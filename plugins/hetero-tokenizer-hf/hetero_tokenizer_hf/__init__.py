"""The ``huggingface`` tokenizer for hetero-infer."""

from hetero_tokenizer_hf.tokenizer import HuggingFaceTokenizer, load_tokenizer

__all__ = ["HuggingFaceTokenizer", "load_tokenizer"]
