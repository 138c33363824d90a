"""The Mnemo ranking sidecar: cross-encoder reranking and a ranker learned from sessions."""

__version__ = "0.1.0"
