"""bertgpu: BERT from raw text to a fine-tuned classifier, on one CPU, one GPU or many."""

__version__ = "0.1.0"
