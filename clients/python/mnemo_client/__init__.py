"""A small typed client for Mnemo's gRPC API, plus agent-tool helpers."""

from mnemo_client.client import MnemoClient, MnemoError, RetryPolicy
from mnemo_client.tools import MemoryTools

__all__ = ["MemoryTools", "MnemoClient", "MnemoError", "RetryPolicy"]
