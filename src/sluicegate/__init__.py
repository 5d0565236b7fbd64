"""sluicegate: an LLM inference server whose boundary is a contract."""

__version__ = "0.1.0"
__all__ = ["__version__"]
